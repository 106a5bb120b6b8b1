"""Time from process start to the first generated token, by start-up stage: ``etsdk generate`` vs transformers eager.

Each round starts two fresh processes, interleaved (order reversed every other round):

* ``etsdk``: ``python -m etsdk generate PTE --chat --prompt P --max-new-tokens 1 --json`` with ``ETSDK_TIMING=1``;
  the command prints one ``etsdk-timing:`` line per start-up stage on stderr (wall clock, see
  ``etsdk_hf_static.runtime.startup.py``): ``start``, ``program``, ``tokenizer``, ``methods``, ``prompt``, ``first_token``.
* ``eager``: a Python process that imports torch and transformers, loads the same model directory with
  ``AutoModelForCausalLM.from_pretrained`` and its tokenizer, applies the chat template and runs one forward
  pass for the first token (stages ``imports``, ``model``, ``tokenizer``, ``prompt``, ``first_token``).

Times are seconds from the moment before the process is spawned (the wall clock of both processes), medians
over the rounds; the 1-minute load average is recorded beside each round.

Model: ``--pte PTE --model DIR`` (a program and the model directory it was exported from; the benchmark does not
export), or an embedded random-weight model exported here: ``--shape smollm2-135m`` (SmolLM2-135M's shape, see
``hf_static_decode.py``; the AOTI export takes 5-10 minutes on 2 cores: give ``--workdir`` to keep it) or the
default small Llama-style model. ``--cold`` evicts the program's and the model's files from the page cache
before every process (``posix_fadvise(DONTNEED)`` on those files only).

``--smoke``: a 1-layer model (hidden 64, T=4, S=32), one round: checks the script, not the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is the capital of France? Answer in one short sentence."
ETSDK_STAGES = ("start", "program", "tokenizer", "methods", "prompt", "first_token")
EAGER_STAGES = ("imports", "model", "tokenizer", "prompt", "first_token")

EAGER = r"""
import json, sys, time
def mark(stage):
    print("eager-timing: " + json.dumps({"stage": stage, "t": time.time()}), file=sys.stderr, flush=True)
import torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
mark("imports")
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
mark("model")
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
mark("tokenizer")
ids = tokenizer.apply_chat_template([{"role": "user", "content": sys.argv[2]}], add_generation_prompt=True, tokenize=True)
ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
mark("prompt")
with torch.no_grad():
    logits = model(torch.tensor([list(ids)])).logits
token = int(logits[0, -1].argmax())
mark("first_token")
print(json.dumps({"prompt_tokens": len(ids), "token": token}))
"""


def _evict(paths: list[Path]) -> None:
    for path in paths:
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for file in files:
            fd = os.open(file, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _run(command: list[str], prefix: str, env: dict[str, str]) -> tuple[dict[str, float], float, str]:
    """Run ``command``; (stage -> seconds since spawn, seconds to exit, stdout)."""
    started = time.time()
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    ended = time.time()
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({result.returncode}):\n{result.stderr[-4000:]}")
    stages = {}
    for line in result.stderr.splitlines():
        if line.startswith(prefix):
            record = json.loads(line[len(prefix) :])
            stages[record["stage"]] = record["t"] - started
    return stages, ended - started, result.stdout


def _median_stages(rounds: list[dict[str, float]], names: tuple[str, ...]) -> dict[str, float | None]:
    return {n: (round(statistics.median(r[n] for r in rounds), 3) if all(n in r for r in rounds) else None) for n in names}


def _prepare(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    """The program and its model directory: given, or an embedded model written and exported under ``work``."""
    if args.pte:
        if not args.model:
            raise SystemExit("--pte needs --model (the directory it was exported from: the eager peer loads it)")
        return Path(args.pte), Path(args.model)
    import torch
    from etsdk_hf_static.exporting.exporter import export
    from etsdk_hf_static.exporting.tiny import char_tokenizer, tiny_model

    model_dir, pte = work / "model", work / "model.pte"
    stamp = json.dumps({k: getattr(args, k) for k in ("shape", "hidden", "layers", "prefill", "context")})
    if (work / "programs.json").is_file() and (work / "programs.json").read_text() == stamp and pte.is_file():
        return pte, model_dir
    if args.shape == "smollm2-135m":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from hf_static_decode import smollm2_135m_shape

        model = smollm2_135m_shape()
    else:
        model = tiny_model("llama", hidden=args.hidden, layers=args.layers, vocab=256, heads=4, kv_heads=2,
                           positions=args.context)
    model.save_pretrained(model_dir)
    char_tokenizer().save_pretrained(model_dir)
    print(f"exporting {model_dir} (T={args.prefill}, S={args.context}) ...", file=sys.stderr, flush=True)
    with torch.no_grad():
        export(model_dir, pte, backend="aoti", prefill_length=args.prefill, context_length=args.context,
               partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=True)
    (work / "programs.json").write_text(stamp)
    return pte, model_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pte", default=None, help="an exported hf_static program (with --model)")
    parser.add_argument("--model", default=None, help="the transformers model directory the program came from")
    parser.add_argument("--shape", choices=("default", "smollm2-135m"), default="default")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prefill", type=int, default=64, help="T of an embedded model's export")
    parser.add_argument("--context", type=int, default=512, help="S of an embedded model's export")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--cold", action="store_true", help="evict the files from the page cache before each process")
    parser.add_argument("--no-eager", action="store_true", help="skip the transformers peer (its keys are null)")
    parser.add_argument("--workdir", default=None, help="keep an embedded model's export here and reuse it")
    parser.add_argument("--smoke", action="store_true", help="1 layer, hidden 64, T=4, S=32, one round")
    args = parser.parse_args()
    if args.smoke:
        args.shape, args.hidden, args.layers, args.prefill, args.context, args.rounds = "default", 64, 1, 4, 32, 1
        args.prompt = "Hi?"

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.workdir) if args.workdir else Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        pte, model_dir = _prepare(args, work)
        env = {**os.environ, "ETSDK_TIMING": "1"}
        etsdk_cmd = [sys.executable, "-m", "etsdk", "generate", str(pte), "--chat", "--prompt", args.prompt,
                     "--max-new-tokens", "1", "--json"]
        eager_cmd = [sys.executable, "-c", EAGER, str(model_dir), args.prompt]
        paths = ["etsdk"] if args.no_eager else ["etsdk", "eager"]
        found: dict[str, list[dict[str, float]]] = {p: [] for p in ("etsdk", "eager")}
        exits: dict[str, list[float]] = {p: [] for p in ("etsdk", "eager")}
        loads, prefill_ms, prompt_tokens = [], [], None
        for index in range(args.rounds):
            order = paths if index % 2 == 0 else paths[::-1]
            loads.append(os.getloadavg()[0])
            for path in order:
                if args.cold:
                    _evict([pte, model_dir, *pte.parent.glob(pte.stem + ".ptd")])
                if path == "etsdk":
                    stages, exit_s, out = _run(etsdk_cmd, "etsdk-timing: ", env)
                    result = json.loads(out.strip().splitlines()[-1])
                    prefill_ms.append(result["prefill_ms"])
                    prompt_tokens = len(result["prompt_ids"])
                else:
                    stages, exit_s, out = _run(eager_cmd, "eager-timing: ", env)
                found[path].append(stages)
                exits[path].append(exit_s)
                shown = ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
                print(f"round {index + 1} {path}: {shown}; exit {exit_s:.2f} s (load {loads[-1]:.2f})", file=sys.stderr,
                      flush=True)

    def first(path: str) -> float | None:
        values = [r.get("first_token") for r in found[path]]
        return round(statistics.median(values), 3) if values and None not in values else None

    etsdk_first, eager_first = first("etsdk"), first("eager")
    figures: dict[str, Any] = {
        "program": str(pte),
        "rounds": args.rounds,
        "cold": args.cold,
        "prompt_tokens": prompt_tokens,
        "loadavg_1min_per_round": [round(x, 2) for x in loads],
        "etsdk_first_token_s": etsdk_first,
        "eager_first_token_s": eager_first,
        "etsdk_over_eager_first_token": round(etsdk_first / eager_first, 3) if etsdk_first and eager_first else None,
        "etsdk_stages_s": _median_stages(found["etsdk"], ETSDK_STAGES),
        "eager_stages_s": _median_stages(found["eager"], EAGER_STAGES) if found["eager"] else None,
        "etsdk_exit_s": round(statistics.median(exits["etsdk"]), 3),
        "eager_exit_s": round(statistics.median(exits["eager"]), 3) if exits["eager"] else None,
        "etsdk_prefill_ms": round(statistics.median(prefill_ms), 1),
        "etsdk_first_token_s_per_round": [r.get("first_token") and round(r["first_token"], 3) for r in found["etsdk"]],
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
