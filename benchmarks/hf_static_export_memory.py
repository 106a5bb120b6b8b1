"""Peak RSS of exporting a causal LM as an hf_static program through etsdk-aoti (both methods), by stage.

The model (embedded Llama-style, random weights, sized by ``--hidden/--layers/--vocab``) is built first;
the baseline is the process RSS then (model, torch, executorch loaded). Peak RSS is sampled at every export
stage: each progress line the export writes to stderr (``etsdk: ...``, ``etsdk-hf-static: ...``; the stage
after an AOTInductor compile starts right after it), so the report says which stage sets it. Run in a fresh
process per measurement (ru_maxrss never goes down).

``--checkpoint float32|bfloat16|float16``: the model is first written as a transformers checkpoint
(safetensors) in that dtype by another process (this one never holds it), and the export reads the directory, as ``etsdk export --model DIR`` does
(weights kept in the checkpoint's dtype, memory-mapped from its file); the baseline is then the process before
loading. Resident memory then counts the checkpoint's mapped file pages (reclaimable page cache) beside the
anonymous memory the export allocates, so ``peak_anon_bytes`` (the largest ``RssAnon`` seen, sampled every 20
ms) is the figure that grows with the model only if something copies it.

Last line: JSON with ``weights_bytes``, ``baseline_rss_bytes``, ``peak_rss_bytes``,
``peak_over_baseline_per_weight``, ``stages`` (stage -> peak RSS bytes when that stage started),
``checkpoint_dtype`` (null without ``--checkpoint``), ``checkpoint_bytes``, ``baseline_anon_bytes``,
``peak_anon_bytes`` and ``peak_anon_over_baseline_per_weight``.

``--smoke``: a 1-layer model of hidden 128 and vocab 256 (the same export, both methods through AOTInductor,
and the same JSON keys; at this size the ratio is meaningless).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

# a progress line of the export: "etsdk: tracing 'prefill' (6.7s)", "etsdk-hf-static: loading the model"
_STAGE = re.compile(r"^(etsdk[\w-]*): (.*?)(?: \(\d+(?:\.\d+)?s\))?$")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


class _AnonPeak:
    """The largest ``RssAnon`` seen while the block runs, sampled every 20 ms on a thread."""

    def __enter__(self) -> _AnonPeak:
        import threading

        self.peak, self.done = _anon(), threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, _anon())

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, _anon())


class _StageRecorder:
    """Stands in for ``sys.stderr``: passes everything through and records the peak RSS at each progress line."""

    def __init__(self, stream: TextIO, stages: dict[str, int]) -> None:
        self.stream, self.stages, self.pending = stream, stages, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            match = _STAGE.match(line)
            if match:
                self.stages[f"{match.group(1)}: {match.group(2)}"[:80]] = _peak()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _model(args: argparse.Namespace) -> Any:
    from etsdk_hf_static.tiny import tiny_model

    return tiny_model("llama", hidden=args.hidden, layers=args.layers, vocab=args.vocab, heads=16, kv_heads=2, positions=512)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--checkpoint", choices=("float32", "bfloat16", "float16"), default=None,
                        help="export from a safetensors checkpoint of this dtype (default: from the model object)")
    parser.add_argument("--smoke", action="store_true", help="1 layer, hidden 128, vocab 256")
    parser.add_argument("--write-checkpoint", default=None, help=argparse.SUPPRESS)  # the --checkpoint writer process
    args = parser.parse_args()
    if args.smoke:
        args.hidden, args.layers, args.vocab = 128, 1, 256
    if args.write_checkpoint:
        import torch

        _model(args).to(getattr(torch, args.checkpoint)).save_pretrained(args.write_checkpoint)
        return

    from etsdk_hf_static.exporter import export

    stages: dict[str, int] = {}

    with tempfile.TemporaryDirectory() as tmp:
        source: Any
        checkpoint_bytes = None
        if args.checkpoint:
            # written by another process: this one never holds the model (its freed pages would hide what the
            # export allocates, and its peak would set ru_maxrss)
            source = Path(tmp) / "checkpoint"
            subprocess.run([sys.executable, __file__, "--write-checkpoint", str(source), "--checkpoint", args.checkpoint,
                            "--hidden", str(args.hidden), "--layers", str(args.layers), "--vocab", str(args.vocab)], check=True)
            checkpoint_bytes = sum(p.stat().st_size for p in source.glob("*.safetensors"))
            weights = checkpoint_bytes
            from transformers import AutoModelForCausalLM  # noqa: F401 - in the baseline, as the model object path has it
        else:
            source = _model(args)
            weights = sum(p.numel() * p.element_size() for p in source.parameters())
        baseline, baseline_anon = _rss(), _anon()
        print(f"weights {weights / 2**20:.0f} MiB{f' ({args.checkpoint} checkpoint)' if args.checkpoint else ''}, "
              f"baseline RSS {baseline / 2**20:.0f} MiB", file=sys.stderr)
        stderr = sys.stderr
        sys.stderr = _StageRecorder(stderr, stages)  # type: ignore[assignment]
        try:
            with _AnonPeak() as anon:
                export(source, Path(tmp) / "model.pte", backend="aoti", prefill_length=32, context_length=256,
                       partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=False)
        finally:
            sys.stderr = stderr
    peak = _peak()
    print(json.dumps({
        "weights_bytes": weights,
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": peak,
        "peak_over_baseline_per_weight": (peak - baseline) / weights,
        "stages": stages,
        "checkpoint_dtype": args.checkpoint,
        "checkpoint_bytes": checkpoint_bytes,
        "baseline_anon_bytes": baseline_anon,
        "peak_anon_bytes": anon.peak,
        "peak_anon_over_baseline_per_weight": (anon.peak - baseline_anon) / weights,
    }))


if __name__ == "__main__":
    main()
