"""The README's main job: a causal LM exported through etsdk and generating text in the ExecuTorch runtime.

Everything is embedded (no download): a random-weight Llama-style model (grouped-query attention) and a
character tokenizer are written as a transformers model directory, exported with ``etsdk export`` as an
hf_static v1 program through etsdk-aoti (progress on stderr), then ``etsdk generate`` streams text from it.
The generated ids are checked against transformers' own eager ``generate`` on the same weights. The demo ends by
saying where it left the model directory and the program (they stay: ``--out-dir``, by default
``demo/`` in etsdk's cache directory, ``$ETSDK_CACHE_DIR`` or ``~/.cache/etsdk``, rewritten by each run), that
the text is random because the weights are, and the commands to try next (``etsdk chat``, ``etsdk generate``).

``python -m etsdk_hf_static.apps.demo [--out-dir DIR] [--backend aoti|reference] [--prompt TEXT] [--verbose]``

Only etsdk's own progress and results are printed; ``--verbose`` also shows other libraries' warnings.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

PROMPT = "Hello, ExecuTorch!"
NEW_TOKENS = 16


_VERBOSE: list[str] = []  # ["--verbose"] when the demo runs with --verbose


def _etsdk(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "etsdk", *args, *_VERBOSE], text=True, capture_output=capture)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m etsdk_hf_static.apps.demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out-dir", default=None,
        help="where to write the model and program, kept after the demo (default: demo/ in etsdk's cache directory)",
    )
    parser.add_argument("--backend", default="aoti", help="backend for both methods (default: aoti)")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--verbose", action="store_true", help="also show other libraries' warnings and logs")
    args = parser.parse_args(argv)
    from etsdk import quiet_command_line

    quiet_command_line(verbose=args.verbose)  # before torch and transformers are imported
    _VERBOSE[:] = ["--verbose"] if args.verbose else []

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from etsdk_hf_static.exporting.tiny import save_tiny_model

    out = Path(args.out_dir) if args.out_dir else default_out_dir()
    out.mkdir(parents=True, exist_ok=True)
    print("== installed plugins", flush=True)
    subprocess.run([sys.executable, "-m", "etsdk", "plugins"])
    model_dir = save_tiny_model(out / "tiny-llama", "llama")
    print(f"== wrote an embedded random-weight Llama (GQA) with a character tokenizer to {model_dir}", flush=True)
    pte = out / "tiny-llama.pte"
    print(f"== etsdk export --model {model_dir} --backend {args.backend} -o {pte}", flush=True)
    exported = _etsdk("export", "--model", str(model_dir), "--backend", args.backend, "--context-length", "64",
                      "--prefill-length", "8", "-o", str(pte))
    if exported.returncode != 0:
        return exported.returncode
    print(f"== etsdk generate {pte.name} --prompt {args.prompt!r} --max-new-tokens {NEW_TOKENS}", flush=True)
    streamed = _etsdk("generate", str(pte), "--prompt", args.prompt, "--max-new-tokens", str(NEW_TOKENS))
    if streamed.returncode != 0:
        return streamed.returncode
    checked = _etsdk("generate", str(pte), "--prompt", args.prompt, "--max-new-tokens", str(NEW_TOKENS), "--json", capture=True)
    if checked.returncode != 0:
        print(checked.stderr, file=sys.stderr)
        return checked.returncode
    result = json.loads(checked.stdout.strip().splitlines()[-1])
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt_ids = torch.tensor([result["prompt_ids"]])
    with torch.no_grad():
        eager = model.generate(prompt_ids, max_new_tokens=len(result["token_ids"]), do_sample=False, pad_token_id=0)
    expected = eager[0, prompt_ids.shape[1]:].tolist()
    print(f"== etsdk:        {result['token_ids']}")
    print(f"== transformers: {expected}  ({tokenizer.decode(expected)!r})")
    if expected != result["token_ids"]:
        print("MISMATCH against transformers' eager generate")
        return 1
    print("matches transformers' eager generate")
    rate = result["decode_tokens_per_s"]
    print(
        f"== {len(result['token_ids'])} tokens: prefill {result['prefill_ms']:.1f} ms, "
        + (f"decode {rate:.1f} tokens/s" if rate is not None else "decode n/a (one token)")
    )
    print(ending(model_dir, pte, default=not args.out_dir), end="")
    return 0


def default_out_dir() -> Path:
    """Where the demo writes by default: ``demo/`` in etsdk's cache directory (``$ETSDK_CACHE_DIR``, else
    ``~/.cache/etsdk``), kept after the demo and rewritten by the next run."""
    from etsdk.backend import cache_dir

    return Path(cache_dir()) / "demo"


def ending(model_dir: Path, pte: Path, *, default: bool) -> str:
    """The demo's last words: where its files are, why its text is gibberish, what to run next."""
    program = shlex.quote(str(pte))
    where = "in etsdk's cache directory; --out-dir DIR writes elsewhere" if default else "in --out-dir"
    return (
        f"\n== the demo kept its files ({where}):\n"
        f"   model directory: {model_dir}\n"
        f"   program:         {pte}  (its tokenizer: {pte.with_name(pte.stem + '.tokenizer')})\n"
        "== the text above is random because the model's weights are: an embedded test model, drawn at random "
        "(no download).\n   Export a trained model (etsdk export --model DIR -o model.pte) for real text.\n"
        "== try next:\n"
        f"   etsdk chat {program}\n"
        f"   etsdk generate {program} --prompt 'Once upon a time' --max-new-tokens 32\n"
    )


if __name__ == "__main__":
    sys.exit(main())
