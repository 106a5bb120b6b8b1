"""One decode step of a small Llama-style decoder: etsdk vs calling the same compiled library directly.

``--hidden/--layers/--vocab`` size the decoder (default 22.5M parameters).

The decoder (transformers config, random weights, static cache, grouped-query
attention) is exported once through etsdk-aoti on CPU. Two ways to run one
decode step, interleaved over several rounds (medians reported):

* ``etsdk``: ``program.run("decode", ids, position, session=session)``: the
  ExecuTorch runtime, the bridge, the etsdk-aoti binding (state already bound),
  the container's ``Run``, the logits copied into the runtime's output;
* ``direct``: the same compiled ``.so`` loaded by etsdk-aoti's binding straight
  from the decode delegate's payload (captured at export with
  ``etsdk.testing.capture_delegates``) with the same weights, and its ``Run``
  called with the same inputs plus caches of its own (state is a library input),
  under the same per-call OpenMP team policy as the binding (its own
  ``etsdk_aoti.threads.TeamSize``): under load the binding runs the kernels on one
  thread, and a direct call on the caller's whole team would compare thread
  counts, not etsdk's cost.

Where the time goes: etsdk's own work per step (runtime, bridge, binding,
output copies) is measured separately with ``Run`` replaced by a stub that
returns a finished result.

Last line: JSON with ``etsdk_us_per_step``, ``direct_us_per_step`` and
``overhead_pct`` (the median over rounds of etsdk / direct, the two
interleaved step by step in alternating order), plus ``etsdk_structural_us_per_step``
and ``parameters``.

``--smoke``: a 1-layer decoder (hidden 64, vocab 256, capacity 16), 4 steps, one
round: the same export (both methods through AOTInductor: two compiles, most of
its time), checks and JSON keys; the figures are too noisy to compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import etsdk
import torch
from etsdk.backend import InitContext
from etsdk.testing import CapturedDelegate, NamedDataStub, capture_delegates
from etsdk_aoti import BACKEND_ID
from etsdk_aoti.library import Library
from etsdk_aoti.runtime import AotiBinding
from etsdk_aoti.testing import llama_methods, tiny_llama
from etsdk_aoti.threads import TeamSize


def _direct(delegate: CapturedDelegate) -> tuple[Library, list[torch.Tensor]]:
    """The decode library with exactly the weights etsdk binds, and caches of its own (library inputs, in order)."""
    # every entry the delegate wrote (one per constant): the binding reads the blob and takes what it names
    named = NamedDataStub({key: memoryview(value) for key, value in delegate.named_data.items()})
    payload = memoryview(delegate.payload)
    context = InitContext(BACKEND_ID, delegate.method, payload, {}, named, delegate.signature)  # type: ignore[arg-type]
    handle = AotiBinding().init(context)
    library = handle._library
    states = [torch.zeros(binding.shape, dtype=getattr(torch, binding.dtype)) for binding in delegate.signature.states]
    caches = [states[index] for index, _, _ in handle._state_inputs]
    library._keep = (delegate, handle)  # type: ignore[attr-defined]
    return library, caches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    # Default: 22.5M parameters (90 MB fp32), larger than the last-level cache, as a
    # real decoder is; with weights that fit in cache the direct loop keeps them hot
    # between steps and any interleaved work (etsdk's included) shows up as refetches.
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--capacity", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--et-threads", type=int, default=None, help="resize ExecuTorch's own threadpool first")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (AOTInductor's OpenMP kernels)")
    parser.add_argument("--smoke", action="store_true", help="1 layer, hidden 64, 4 steps, one round")
    args = parser.parse_args()
    if args.smoke:
        args.hidden, args.layers, args.vocab, args.capacity, args.steps, args.rounds = 64, 1, 256, 16, 4, 1
    torch.set_num_threads(args.threads)
    if args.et_threads is not None:
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(args.et_threads)
    model = tiny_llama(vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=8, kv_heads=4, capacity=args.capacity)
    params = sum(p.numel() for p in model.parameters())
    methods, contract = llama_methods(
        model, args.capacity, 8, prefill_backends=(BACKEND_ID,), decode_backends=(BACKEND_ID,), options={"device": "cpu"}
    )
    with tempfile.TemporaryDirectory() as tmp:
        pte = Path(tmp) / "llama.pte"
        started = time.perf_counter()
        with capture_delegates() as captured:
            etsdk.lower(methods, contract=contract).save(pte)
        export_s = time.perf_counter() - started
        program = etsdk.load(pte)
        session = program.new_session()
        decode = program.load_method("decode")
        assert decode.info.backends == (BACKEND_ID,)
        (delegate,) = (d for d in captured if d.method == "decode")
        library, caches = _direct(delegate)
        ids = torch.tensor([[11]])
        positions = [torch.tensor([i % args.capacity]) for i in range(args.steps)]
        # the library takes the delegate's arguments in the delegate's order, which
        # need not be the method's: bind by name, as the program record says
        order = [a.name for a in delegate.signature.inputs]

        def direct_inputs(position: torch.Tensor) -> list[torch.Tensor]:
            by_name = {"input_ids": ids, "cache_position": position}
            return [*(by_name[name] for name in order), *caches]

        # same compiled code, same weights: the same logits on a fresh cache
        etsdk_logits = decode.execute((ids, positions[0]), session=session)[0]
        team = TeamSize()  # the binding's per-call team policy, for the direct calls
        direct_logits = team.run(lambda: library.run(direct_inputs(positions[0])))[0]
        torch.testing.assert_close(etsdk_logits, direct_logits)

        def run_etsdk() -> None:
            for p in positions:
                decode.execute((ids, p), session=session)

        direct_args = [direct_inputs(p) for p in positions]

        def run_direct() -> None:
            for a in direct_args:
                team.run(lambda a=a: library.run(a))

        samples: dict[str, list[float]] = {"etsdk": [], "direct": []}
        original_run = Library.run

        run_etsdk(), run_direct()  # warm-up
        # Interleaved step by step (etsdk, direct, direct, etsdk, ...): the load on this
        # shared machine drifts over seconds, a step takes milliseconds, so each etsdk
        # step is compared with a direct step taken right beside it.
        ratios: list[float] = []
        for round_index in range(args.rounds):
            totals = {"etsdk": 0.0, "direct": 0.0}
            for step, (position, direct_args_step) in enumerate(zip(positions, direct_args)):
                order = ("etsdk", "direct") if (step + round_index) % 2 == 0 else ("direct", "etsdk")
                for name in order:
                    if name == "etsdk":
                        t = time.perf_counter()
                        decode.execute((ids, position), session=session)
                        totals["etsdk"] += time.perf_counter() - t
                    else:
                        t = time.perf_counter()
                        team.run(lambda a=direct_args_step: library.run(a))
                        totals["direct"] += time.perf_counter() - t
            for name in ("etsdk", "direct"):
                samples[name].append(totals[name] / args.steps * 1e6)
            ratios.append(totals["etsdk"] / totals["direct"])
        # etsdk's own cost per step with the library's work taken out: Run replaced
        # by a stub returning a finished result
        canned: list[Any] = []

        def stub_run(self: Library, inputs: Any, stream: Any = None) -> Any:
            if not canned:
                canned.extend(t.clone() for t in original_run(self, inputs, stream))
            return canned

        Library.run = stub_run  # type: ignore[method-assign]
        run_etsdk()
        structural = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            run_etsdk()
            structural.append((time.perf_counter() - t) / args.steps * 1e6)
        Library.run = original_run  # type: ignore[method-assign]
        library.close()
    e, d = statistics.median(samples["etsdk"]), statistics.median(samples["direct"])
    print(f"model: {params / 1e6:.1f}M parameters, capacity {args.capacity}; export took {export_s:.1f}s")
    print(f"etsdk  {e:9.1f} us/step  (rounds: {', '.join(f'{v:.0f}' for v in samples['etsdk'])})")
    print(f"direct {d:9.1f} us/step  (rounds: {', '.join(f'{v:.0f}' for v in samples['direct'])})")
    print(f"etsdk's own work per step with Run stubbed out: {statistics.median(structural):.1f} us")
    print(f"etsdk / direct per round: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(json.dumps({
        "etsdk_us_per_step": round(e, 2),
        "direct_us_per_step": round(d, 2),
        "overhead_pct": round((statistics.median(ratios) - 1) * 100, 2),
        "etsdk_structural_us_per_step": round(statistics.median(structural), 2),
        "parameters": params,
    }))


if __name__ == "__main__":
    main()
