"""Decode tokens/s and prefill ms of a small causal LM: etsdk (hf_static + AOTI) vs eager vs XNNPACK, one run.

``--model DIR``: a transformers model directory (default: the embedded tiny Llama-style model, sized by
``--hidden/--layers/--vocab``; nothing is downloaded).

The prompt is exactly T tokens (one prefill call everywhere), then ``--new`` decode steps:

* ``etsdk``: the hf_static program (both methods through etsdk-aoti on CPU) driven by the hf_static runner:
  counters, positions and mask written every step, logits read, greedy choice;
* ``eager``: transformers' model over its ``StaticCache`` (the same :class:`StaticCausalLM` wrapper, run
  eagerly under ``torch.no_grad``), same inputs and counter writes;
* ``xnnpack``: the same wrapper (counters written from the positions inside the graph) exported by stock
  ExecuTorch with ``XnnpackPartitioner`` (caches left as ExecuTorch mutable buffers), run through
  ``executorch.runtime``. Each ExecuTorch method keeps its own
  mutable buffers, so its decode does not see its prefill's cache: its timings are valid, its tokens are
  not compared.

Rounds interleave the three (medians reported). Where etsdk's time goes: ``etsdk_runner_us_per_step`` (a whole
runner decode step) splits into ``etsdk_program_run_us_per_step`` (runtime + bridge + AOTI binding + compiled
code) and the runner's own Python work (the difference).

Last line: JSON with ``etsdk_tokens_per_s``, ``eager_tokens_per_s``, ``xnnpack_tokens_per_s``,
``etsdk_prefill_ms``, ``eager_prefill_ms``, ``xnnpack_prefill_ms``, plus the breakdown and the parameter count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from etsdk_hf_static.exporter import export
from etsdk_hf_static.module import StaticCausalLM, causal_mask
from etsdk_hf_static.runner import HfStaticRunner, Step
from etsdk_hf_static.tiny import tiny_model


def _model(args: argparse.Namespace) -> Any:
    if args.model:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    return tiny_model("llama", hidden=args.hidden, layers=args.layers, vocab=args.vocab, heads=8, kv_heads=2, positions=2 * args.context)


class _SelfPositioned(StaticCausalLM):
    """Writes its counters from ``positions[0]`` inside the graph, as transformers' ExecuTorch wrapper does: with
    the counters left as ExecuTorch mutable buffers, a decode counter read back garbage after a few hundred calls
    here (index -4.7e18 in ``index_put``), so the XNNPACK peer must not depend on one surviving across calls."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.cache.layers:
            layer.cumulative_length.copy_(positions[0])
        return super().forward(input_ids, positions, attention_mask)


def _xnnpack_program(model: Any, T: int, S: int, path: Path) -> Any:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    wrapper = _SelfPositioned(model, S).eval()
    exported = {}
    for name, rows in (("prefill", T), ("decode", 1)):
        example = (torch.zeros(1, rows, dtype=torch.long), torch.arange(rows), causal_mask(0, rows, rows, S))
        exported[name] = torch.export.export(wrapper, example, strict=True)
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    path.write_bytes(edge.to_executorch().buffer)
    return Runtime.get().load_program(path)


def _time(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a transformers model directory (default: embedded tiny model)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--prefill", type=int, default=32, help="T: prompt length = tokens per prefill call")
    parser.add_argument("--context", type=int, default=256, help="S: cache rows")
    parser.add_argument("--new", type=int, default=32, help="decode steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    T, S = args.prefill, args.context
    if T + args.new > S:
        parser.error("prefill + new must fit the context")
    torch.set_num_threads(torch.get_num_threads())
    model = _model(args)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {type(model).__name__}, {params / 1e6:.1f}M parameters, T={T}, S={S}", file=sys.stderr)
    prompt = torch.randint(0, model.config.vocab_size, (T,), generator=torch.Generator().manual_seed(0)).tolist()

    with tempfile.TemporaryDirectory() as tmp:
        pte = Path(tmp) / "model.pte"
        export(model, pte, backend="aoti", prefill_length=T, context_length=S,
               partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=True)
        runner = HfStaticRunner.from_file(pte)
        xnn = _xnnpack_program(model, T, S, Path(tmp) / "xnnpack.pte")
        xnn_prefill, xnn_decode = xnn.load_method("prefill"), xnn.load_method("decode")
        eager = StaticCausalLM(model, S).eval()
        eager_counters = [b for n, b in eager.named_buffers() if n.startswith("cumulative_length")]

        def run_etsdk() -> tuple[float, float]:
            conversation = runner.new_conversation()
            result = conversation.generate(prompt, max_new_tokens=args.new + 1, stop_at_eos=False)
            return result.prefill_ms, result.decode_tokens_per_s

        def run_eager() -> tuple[float, float]:
            with torch.no_grad():
                for c in eager_counters:
                    c.fill_(0)
                prefill_s = _time(lambda: eager(torch.tensor([prompt]), torch.arange(T), causal_mask(0, T, T, S)))
                pos, token = T, 1

                def steps() -> None:
                    nonlocal pos, token
                    for _ in range(args.new):
                        for c in eager_counters:
                            c.fill_(pos)
                        logits = eager(torch.tensor([[token]]), torch.tensor([pos]), causal_mask(pos, 1, 1, S))
                        token, pos = int(logits[0, -1].argmax()), pos + 1

                return prefill_s * 1e3, args.new / _time(steps)

        def run_xnnpack() -> tuple[float, float]:
            prefill_s = _time(lambda: xnn_prefill.execute([torch.tensor([prompt]), torch.arange(T), causal_mask(0, T, T, S)]))
            pos, token = T, 1

            def steps() -> None:
                nonlocal pos, token
                for _ in range(args.new):
                    (logits,) = xnn_decode.execute([torch.tensor([[token]]), torch.tensor([pos]), causal_mask(pos, 1, 1, S)])
                    token, pos = int(logits[0, -1].argmax()), pos + 1

            return prefill_s * 1e3, args.new / _time(steps)

        def breakdown() -> tuple[float, float]:
            conversation = runner.new_conversation()
            conversation.generate(prompt, max_new_tokens=1, stop_at_eos=False)
            inputs = runner._inputs["decode"].fill(Step("decode", T, (1,), 1))
            whole = _time(lambda: [conversation.run_step(Step("decode", T + i, (1,), 1)) for i in range(args.new)])
            run = _time(lambda: [runner.program.run("decode", *inputs, session=conversation.session) for _ in range(args.new)])
            return whole / args.new * 1e6, run / args.new * 1e6

        peers = {"etsdk": run_etsdk, "eager": run_eager, "xnnpack": run_xnnpack}
        for fn in peers.values():  # warm-up
            fn()
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in peers}
        splits = []
        for r in range(args.rounds):
            order = list(peers) if r % 2 == 0 else list(reversed(peers))
            for name in order:
                results[name].append(peers[name]())
            splits.append(breakdown())
            print(f"round {r}: " + ", ".join(f"{n} {results[n][-1][1]:.1f} tok/s" for n in peers), file=sys.stderr)

    out: dict[str, Any] = {"parameters": params, "prefill_length": T, "context_length": S, "new_tokens": args.new}
    for name in peers:
        out[f"{name}_tokens_per_s"] = statistics.median(d for _, d in results[name])
        out[f"{name}_prefill_ms"] = statistics.median(p for p, _ in results[name])
    out["etsdk_runner_us_per_step"] = statistics.median(w for w, _ in splits)
    out["etsdk_program_run_us_per_step"] = statistics.median(r for _, r in splits)
    out["etsdk_vs_eager_decode"] = out["etsdk_tokens_per_s"] / out["eager_tokens_per_s"]
    out["etsdk_vs_xnnpack_decode"] = out["etsdk_tokens_per_s"] / out["xnnpack_tokens_per_s"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
