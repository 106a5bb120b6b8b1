"""Peak RSS of exporting a causal LM as an hf_static program through etsdk-aoti (both methods), by stage.

The model (embedded Llama-style, random weights, sized by ``--hidden/--layers/--vocab``) is built first;
the baseline is the process RSS then (model, torch, executorch loaded). Peak RSS is sampled at every export
stage: each progress line the export writes to stderr (``etsdk: ...``, ``etsdk-hf-static: ...``; the stage
after an AOTInductor compile starts right after it), so the report says which stage sets it. Run in a fresh
process per measurement (ru_maxrss never goes down).

Last line: JSON with ``weights_bytes``, ``baseline_rss_bytes``, ``peak_rss_bytes``,
``peak_over_baseline_per_weight`` and ``stages`` (stage -> peak RSS bytes when that stage started).

``--smoke``: a 1-layer model of hidden 128 and vocab 256 (the same export, both methods through AOTInductor,
and the same JSON keys; at this size the ratio is meaningless).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--smoke", action="store_true", help="1 layer, hidden 128, vocab 256")
    args = parser.parse_args()
    if args.smoke:
        args.hidden, args.layers, args.vocab = 128, 1, 256

    from etsdk_hf_static.exporter import export
    from etsdk_hf_static.tiny import tiny_model

    stages: dict[str, int] = {}

    model = tiny_model("llama", hidden=args.hidden, layers=args.layers, vocab=args.vocab, heads=16, kv_heads=2, positions=512)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    baseline = _rss()
    print(f"weights {weights / 2**20:.0f} MiB, baseline RSS {baseline / 2**20:.0f} MiB", file=sys.stderr)
    stderr = sys.stderr
    sys.stderr = _StageRecorder(stderr, stages)  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            export(model, Path(tmp) / "model.pte", backend="aoti", prefill_length=32, context_length=256,
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
    }))


if __name__ == "__main__":
    main()
