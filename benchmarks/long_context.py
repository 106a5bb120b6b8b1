"""Decode tokens/s as the context capacity S grows: attention over the filled rows vs over every row.

The same model exported as hf_static programs through etsdk-aoti at each S of ``--contexts`` (default 256, 2048,
8192) with attention over the filled rows (``etsdk export``'s default, ``etsdk::attention``), and at the largest S
also in full-length mode (``--attention full``: SDPA over every row, masked; what every export did before), the
peer. Each round runs every program once, interleaved: a conversation of ``--prompt`` tokens (default T = 32,
one prefill call), then ``--new`` greedy decode steps (32); and, with ``--fill N``, the largest-S programs once
more after a prompt of N tokens (attention then reads N rows per step whatever the mode).

Model: ``--shape smollm2-135m`` (the random-weight model of SmolLM2-135M's shape from ``hf_static_decode.py``;
decode speed does not depend on weight values) or by default the embedded 26M-parameter Llama-style model.
``--workdir DIR`` keeps the exported programs and reuses them.

Last line: JSON with ``contexts``, ``filled_tokens_per_s`` (per S), ``full_tokens_per_s`` (largest S),
``filled_over_smallest`` (decode at the largest S over the smallest, filled: the issue's target is >= 0.9),
``full_over_smallest``, ``filled_over_full`` (at the largest S), ``fill``, ``filled_fill_tokens_per_s``,
``full_fill_tokens_per_s`` (null without ``--fill``), ``rounds``, ``parameters``.

``--smoke``: a 1-layer model, S = 16 and 32, T = 4, 4 decode steps, one round: the same exports, runs and keys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from etsdk_hf_static.exporter import export
from etsdk_hf_static.runner import HfStaticRunner
from etsdk_hf_static.tiny import tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_static_decode import smollm2_135m_shape  # noqa: E402


def _program(model: Any, workdir: Path, S: int, T: int, attention: str) -> HfStaticRunner:
    path = workdir / f"S{S}-T{T}-{attention}.pte"
    if not path.exists():
        print(f"long_context: exporting S={S} ({attention}) ...", file=sys.stderr, flush=True)
        export(model, path, backend="aoti", prefill_length=T, context_length=S, attention=attention,
               partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=True)
    return HfStaticRunner.from_file(path)


def _decode(runner: HfStaticRunner, prompt: list[int], new: int) -> float:
    conversation = runner.new_conversation()
    result = conversation.generate(prompt, max_new_tokens=new, stop_at_eos=False)
    return result.decode_tokens_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=("default", "smollm2-135m"), default="default")
    parser.add_argument("--contexts", default="256,2048,8192", help="S values, comma-separated")
    parser.add_argument("--prompt", type=int, default=32, help="T: prompt length = tokens per prefill call")
    parser.add_argument("--new", type=int, default=32, help="decode steps per conversation")
    parser.add_argument("--fill", type=int, default=None, help="also decode after a prompt of N tokens at the largest S")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--smoke", action="store_true", help="smallest sizes, one round, same keys")
    args = parser.parse_args()
    if args.smoke:
        args.contexts, args.prompt, args.new, args.rounds, args.fill = "16,32", 4, 4, 1, 20
    contexts = sorted(int(c) for c in args.contexts.split(","))
    largest = contexts[-1]
    if args.fill is not None and not args.prompt <= args.fill <= largest - args.new:
        parser.error(f"--fill must be in {args.prompt}..{largest - args.new} (prompt .. S - new)")
    if args.smoke:
        model = tiny_model("llama", hidden=64, layers=1, vocab=256, heads=4, kv_heads=2, positions=largest)
    elif args.shape == "smollm2-135m":
        model = smollm2_135m_shape()
    else:
        model = tiny_model("llama", hidden=512, layers=8, vocab=8192, heads=8, kv_heads=2, positions=largest)
    parameters = sum(p.numel() for p in model.parameters())
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="etsdk-long-context-"))
    workdir.mkdir(parents=True, exist_ok=True)
    T = args.prompt
    runners = {("filled", S): _program(model, workdir, S, T, "auto") for S in contexts}
    runners[("full", largest)] = _program(model, workdir, largest, T, "full")
    del model
    vocab = runners[("filled", largest)].metadata.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (T,), generator=generator).tolist()
    long_prompt = torch.randint(3, vocab, (args.fill,), generator=generator).tolist() if args.fill else None
    speeds: dict[tuple[str, int], list[float]] = {key: [] for key in runners}
    fill_speeds: dict[str, list[float]] = {"filled": [], "full": []}
    for round_index in range(args.rounds):
        for key, runner in runners.items():
            speeds[key].append(_decode(runner, prompt, args.new))
        if long_prompt is not None:
            for mode in ("filled", "full"):
                fill_speeds[mode].append(_decode(runners[(mode, largest)], long_prompt, args.new))
        row = ", ".join(f"{m} S={S}: {speeds[(m, S)][-1]:.1f}" for m, S in runners)
        print(f"long_context: round {round_index + 1}: {row} tok/s", file=sys.stderr, flush=True)
    median = {key: statistics.median(values) for key, values in speeds.items()}
    smallest = median[("filled", contexts[0])]
    out = {
        "contexts": contexts,
        "rounds": args.rounds,
        "parameters": parameters,
        "prompt_tokens": T,
        "new_tokens": args.new,
        "filled_tokens_per_s": {str(S): median[("filled", S)] for S in contexts},
        "full_tokens_per_s": {str(largest): median[("full", largest)]},
        "filled_over_smallest": median[("filled", largest)] / smallest,
        "full_over_smallest": median[("full", largest)] / smallest,
        "filled_over_full": median[("filled", largest)] / median[("full", largest)],
        "fill": args.fill,
        "filled_fill_tokens_per_s": statistics.median(fill_speeds["filled"]) if long_prompt else None,
        "full_fill_tokens_per_s": statistics.median(fill_speeds["full"]) if long_prompt else None,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
