"""Cost of a delegate call through the etsdk bridge, against peers in the same run.

Single call: the same tiny method (``x + y`` on 16 floats), called through the
same API (``etsdk.load(...)``), exported as

* ``bridge``: delegated through the bridge to a minimal Python binding that does
  the work itself (``torch.add(x, y, out=out)``);
* ``peer``: delegated to XNNPACK (built into the executorch wheel);
* ``portable``: not delegated (ExecuTorch's portable kernel);
* ``reference``: delegated to the core's reference backend (its graph
  interpreter plus ``out.copy_``), for context.

Chain: a method of 32 ``add`` / ``neg`` pairs where only the adds are delegated,
to a binding that does nothing, against the same method left undelegated. The
difference divided by 32 is the bridge's own added cost per delegate call
(native forwarding, argument wrapping, the Python call), minus a 16-float
portable add (tens of nanoseconds).

The two bench backends are a plugin registered in-process, written against the
public plugin API (``etsdk.backend``): an ``OperatorPartitioner``, a preprocess
that records only the partition's argument counts (the binding needs nothing
else), and the bindings above.

Programs are timed interleaved over several rounds and medians reported, since
these machines are shared and noisy. The last line is JSON.

``--smoke``: 200 calls per sample, one round (the same programs, checks and
JSON keys; the figures are too noisy to compare).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import etsdk
import torch
from etsdk.backend import (
    BackendSpec,
    BlobReader,
    BlobWriter,
    Capability,
    InitContext,
    OperatorPartitioner,
    Option,
    Partition,
)

CHAIN = 32
BLOB_FEATURE = "etsdk-bench.bridge.v1"


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Chain(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for _ in range(CHAIN):
            x = -(x + y)
        return x


class _AddHandle:
    def execute(self, args: tuple[Any, ...], state: tuple[Any, ...]) -> None:
        x, y, out = args
        torch.add(x, y, out=out)


class _NoopHandle:
    def execute(self, args: tuple[Any, ...], state: tuple[Any, ...]) -> None:
        pass


def _check_blob(context: InitContext, inputs: int, outputs: int) -> None:
    """The payload is the bench container and the delegate has the argument counts the handle assumes."""
    counts = json.loads(bytes(BlobReader(context.blob, known_features={BLOB_FEATURE}).section("counts")))
    if counts != {"inputs": inputs, "outputs": outputs}:
        raise etsdk.BlobFormatError(
            f"{context.backend_id}: expected {inputs} inputs and {outputs} outputs, found {counts}"
        )


class AddBinding:
    def init(self, context: InitContext) -> _AddHandle:
        _check_blob(context, 2, 1)
        return _AddHandle()


class NoopBinding:
    def init(self, context: InitContext) -> _NoopHandle:
        _check_blob(context, 2, 1)
        return _NoopHandle()


def _preprocess(partition: Partition) -> BlobWriter:
    counts = {"inputs": len(partition.signature.inputs), "outputs": len(partition.signature.outputs)}
    writer = BlobWriter(required_features=[BLOB_FEATURE], producer="etsdk-bench")
    writer.add_section("counts", json.dumps(counts).encode())
    return writer


def _plugin(bindings: dict[str, Any]) -> types.ModuleType:
    """Plugin API v2 backends: claim the given aten ops (default: every op), run them with their own binding."""
    module = types.ModuleType("bench_bridge_plugin")
    module.ETSDK_PLUGIN_API = ">=2,<3"  # type: ignore[attr-defined]

    def spec(backend_id: str, binding: Any) -> BackendSpec:
        def partitioner(ops: list[str] | None = None) -> OperatorPartitioner:
            return OperatorPartitioner(backend_id, ops=ops)

        return BackendSpec(
            id=backend_id,
            version="0",
            partitioner=partitioner,
            preprocess=_preprocess,
            runtime=binding,
            capabilities=frozenset({Capability.CPU}),
            options=(Option("ops", (list, tuple), None, "aten operator names to claim (default: every one)"),),
        )

    @etsdk.hookimpl
    def etsdk_register_backends() -> list[BackendSpec]:
        return [spec(backend_id, binding) for backend_id, binding in bindings.items()]

    module.etsdk_register_backends = etsdk_register_backends  # type: ignore[attr-defined]
    return module


def _export(directory: Path, name: str, model: torch.nn.Module, *, backend: str | None = None,
            partitioner: Any | None = None, ops: list[str] | None = None) -> Path:
    from executorch.exir import to_edge_transform_and_lower

    example = (torch.randn(16), torch.randn(16))
    path = directory / f"{name}.pte"
    if backend is not None:
        options = {"ops": ops} if ops else {}
        etsdk.lower(module=model, example_inputs=example, backend=backend, partitioner_options=options).save(path)
        return path
    exported = torch.export.export(model, example)
    edge = to_edge_transform_and_lower(exported, partitioner=[partitioner] if partitioner else [])
    with path.open("wb") as f:
        edge.to_executorch().write_to_file(f)
    return path


def _time_per_call(method: Any, inputs: tuple[torch.Tensor, ...], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        method.execute(inputs)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="200 calls, one round: checks the script, not the figures")
    args = parser.parse_args()
    warmup = 300
    if args.smoke:
        args.calls, args.rounds, warmup = 200, 1, 20
    torch.set_num_threads(1)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    etsdk.register_plugin(
        _plugin({"EtsdkBenchAddBackend": AddBinding, "EtsdkBenchNoopBackend": NoopBinding}), "bench-bridge"
    )
    reference = etsdk.resolve_backend_id("reference")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        paths = {
            "bridge": _export(directory, "bridge", Add(), backend="EtsdkBenchAddBackend"),
            "peer": _export(directory, "xnnpack", Add(), partitioner=XnnpackPartitioner()),
            "portable": _export(directory, "portable", Add()),
            "reference": _export(directory, "reference", Add(), backend=reference),
            "chain_bridge_noop": _export(
                directory, "chain_noop", Chain(), backend="EtsdkBenchNoopBackend", ops=["aten::add"]
            ),
            "chain_portable": _export(directory, "chain_portable", Chain()),
        }
        methods = {name: etsdk.load(path).load_method("forward") for name, path in paths.items()}
        assert methods["bridge"].info.backends == ("EtsdkBenchAddBackend",)
        assert methods["peer"].info.backends == ("XnnpackBackend",)
        assert methods["portable"].info.backends == ()
        assert methods["reference"].info.backends == (reference,)
        assert methods["chain_portable"].info.backends == ()
        assert methods["chain_bridge_noop"].info.backends == ("EtsdkBenchNoopBackend",) * CHAIN
        inputs = (torch.randn(16), torch.randn(16))
        expected = inputs[0] + inputs[1]
        for name in ("bridge", "peer", "portable", "reference"):
            torch.testing.assert_close(methods[name].execute(inputs)[0], expected)
        samples: dict[str, list[float]] = {name: [] for name in methods}
        for method in methods.values():
            _time_per_call(method, inputs, warmup)  # warm-up
        for _ in range(args.rounds):
            for name, method in methods.items():
                samples[name].append(_time_per_call(method, inputs, args.calls))
    median = {name: statistics.median(values) for name, values in samples.items()}
    for name, value in median.items():
        print(f"{name:18s} {value:8.2f} us/call  (rounds: {', '.join(f'{v:.2f}' for v in samples[name])})")
    added = (median["chain_bridge_noop"] - median["chain_portable"]) / CHAIN
    result = {
        "us_per_call_bridge": round(median["bridge"], 3),
        "us_per_call_peer": round(median["peer"], 3),
        "us_per_call_portable": round(median["portable"], 3),
        "us_per_call_reference_backend": round(median["reference"], 3),
        "us_added_bridge_vs_peer": round(median["bridge"] - median["peer"], 3),
        "us_added_per_delegate_call": round(added, 3),
        "ratio_bridge_to_peer": round(median["bridge"] / median["peer"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
