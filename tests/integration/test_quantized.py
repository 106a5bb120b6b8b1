"""Quantized weights through export and the runtime: the reference backend, claims by declared format, the
program record, load-time refusals, verify. (The formats and the math alone: tests/unit/test_weight_formats.py;
etsdk-aoti's kernels: plugins/aoti/tests/test_quantized_aoti.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import etsdk
import pytest
import torch
from etsdk import QuantizationPlan, WeightFormat, quantize_model
from etsdk.backend import OperatorPartitioner, quantized_call
from etsdk.reference_backend import BACKEND_ID
from etsdk.reference_backend.runtime import ReferenceBinding

from tests.backends import make_backend_plugin, patched_record

IDS = torch.tensor([[1, 7, 49, 3]])
PLANES = ["int8", "int8:g32", "int4:g32", "int4:g64:min", "int4:g32:f16", "int8:bf16"]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 64)
        self.proj = torch.nn.Linear(64, 128)
        self.head = torch.nn.Linear(128, 50, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.proj(self.embed(ids))))

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head


def quantized(linear: str, **others: str) -> Net:
    net = Net().eval()
    quantize_model(net, QuantizationPlan.for_format(linear, **others))
    return net


@pytest.fixture(scope="module", autouse=True)
def backends() -> None:
    etsdk.register_plugin(make_backend_plugin("EtsdkNoFormats", ReferenceBinding), "no-formats")
    etsdk.register_plugin(make_backend_plugin("EtsdkInt8Only", ReferenceBinding, weight_formats=("int8",)), "int8-only")

    def greedy(**options: Any) -> Any:  # claims every operator, whatever its weight format
        return OperatorPartitioner("EtsdkGreedy", supports=lambda node: True)

    class Greedy(OperatorPartitioner):
        def is_supported(self, node: Any) -> bool:
            return True

        def _groups(self, ep: Any, candidates: Any) -> Any:  # ignores the core's marks: a partitioner that cheats
            from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
            from torch.fx.passes.operator_support import OperatorSupportBase

            class Everything(OperatorSupportBase):
                def is_node_supported(self, submodules: Any, node: Any) -> bool:
                    return node.op == "call_function" and node in candidates

            return CapabilityBasedPartitioner(ep.graph_module, Everything(), allows_single_node_partition=True).propose_partitions()

    etsdk.register_plugin(make_backend_plugin("EtsdkCheats", ReferenceBinding, partitioner=lambda **o: Greedy("EtsdkCheats")), "cheats")


@pytest.mark.parametrize("name", PLANES)
def test_the_reference_backend_computes_every_format_like_eager(name: str, tmp_path: Path) -> None:
    net = quantized(name, embedding=name if WeightFormat.parse(name).group_size else "int8")
    path = tmp_path / "q.pte"
    etsdk.lower(module=net, example_inputs=(IDS,), backend=BACKEND_ID).save(path)
    program = etsdk.load(path)
    with torch.no_grad():
        torch.testing.assert_close(program.run("forward", IDS)[0], net(IDS), atol=1e-5, rtol=1e-5)
    (delegate,) = program.record.methods["forward"]
    by_name = {w.name: w for w in delegate.signature.weights}
    assert {n: (w.format, w.shape, w.use) for n, w in by_name.items()} == {
        "embed": (net.embed.format, (50, 64), "embedding"),
        "proj": (name, (128, 64), "linear"),
        "head": ("int8", (50, 128), "linear"),
    }


def test_a_backend_that_declares_no_format_leaves_the_weights_and_the_export_names_them(tmp_path: Path) -> None:
    net = quantized("int4:g32")
    with pytest.raises(etsdk.ExportError) as caught:
        etsdk.lower(module=net, example_inputs=(IDS,), backend="EtsdkNoFormats")
    message = str(caught.value)
    assert "method 'forward': 3 quantized weight(s) would run outside every delegate" in message
    assert "'proj' (int4:g32 [128, 64], linear): EtsdkNoFormats does not declare weight format int4:g32 (it declares: none)" in message
    assert "'embed' (int8 [50, 64], embedding)" in message and "quantize to one it declares" in message


def test_a_weight_left_by_one_backend_is_claimed_by_the_next_that_declares_its_format(tmp_path: Path) -> None:
    net = quantized("int4:g32")  # proj int4 (EtsdkInt8Only leaves it), embed and head int8 (it takes them)
    path = tmp_path / "two.pte"
    etsdk.lower(module=net, example_inputs=(IDS,), backend=("EtsdkInt8Only", BACKEND_ID)).save(path)
    program = etsdk.load(path)
    formats: dict[str, list[str]] = {}
    for delegate in program.record.methods["forward"]:
        formats.setdefault(delegate.backend, []).extend(w.format for w in delegate.signature.weights)
    assert sorted(formats["EtsdkInt8Only"]) == ["int8", "int8"] and formats[BACKEND_ID] == ["int4:g32"]
    with torch.no_grad():
        torch.testing.assert_close(program.run("forward", IDS)[0], net(IDS), atol=1e-5, rtol=1e-5)


def test_a_partitioner_that_claims_an_undeclared_format_anyway_is_refused() -> None:
    with pytest.raises(etsdk.ExportError, match=r"backend 'EtsdkCheats': the partitioner claimed weight 'embed' \(int8 \[50, 64\], embedding\), but EtsdkCheats does not declare weight format int8 \(it declares: none\)"):
        etsdk.lower(module=quantized("int4:g32"), example_inputs=(IDS,), backend="EtsdkCheats")


def test_a_program_whose_backend_does_not_declare_a_weights_format_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "q.pte"
    etsdk.lower(module=quantized("int4:g32"), example_inputs=(IDS,), backend=BACKEND_ID).save(path)
    other = patched_record(path, tmp_path / "other.pte", b'"proj","int4:g32"', b'"proj","int4:g99"')
    with pytest.raises(etsdk.ProgramError, match=r"other.pte: method 'forward', delegate 0 \(EtsdkReferenceBackend\) reads weight 'proj' in format int4:g99, which the installed EtsdkReferenceBackend does not declare"):
        etsdk.load(other)


def test_quantized_calls_carry_their_format_to_partitioners() -> None:
    net = quantized("int4:g64:min")
    ep = torch.export.export(net, (IDS,))
    calls = {c.weight_name(ep): c for n in ep.graph.nodes if (c := quantized_call(n))}
    assert {k: (v.format.name, v.use.value, v.shape) for k, v in calls.items()} == {
        "embed": ("int8", "embedding", (50, 64)),
        "proj": ("int4:g64:min", "linear", (128, 64)),
        "head": ("int8", "linear", (50, 128)),
    }
    assert calls["proj"].mins is not None and calls["embed"].mins is None


def test_inspect_shows_each_weights_format_and_verify_catches_a_flipped_byte_in_packed_weights_and_scales(tmp_path: Path) -> None:
    net = quantized("int4:g32")
    path = tmp_path / "q.pte"
    etsdk.lower(module=net, example_inputs=(IDS,), backend=BACKEND_ID, external_data="q").save(path)
    from etsdk._runtime.inspection import inspect_program

    text = inspect_program(path).render()
    assert "weights: 3 quantized (int4:g32 x 1, int8 x 2)" in text, text
    assert "proj: int4:g32 [128, 64] linear" in text
    ptd = tmp_path / "q.ptd"
    assert etsdk.verify(path, ptd).ok
    data = ptd.read_bytes()
    for tensor in (net.proj.qdata, net.proj.scales):
        raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
        at = data.index(raw)
        damaged = bytearray(data)
        damaged[at + len(raw) // 2] ^= 0x10
        ptd.write_bytes(bytes(damaged))
        report = etsdk.verify(path, ptd, methods=False)
        assert not report.ok and [c.status for c in report.entries].count("mismatch") == 1, report
        ptd.write_bytes(data)


def test_the_record_of_a_program_without_quantized_weights_is_unchanged() -> None:
    from etsdk.backend import DelegateSignature

    record = DelegateSignature((), ()).to_json()
    assert "weights" not in record and json.loads(json.dumps(record)) == record
