"""Peak RSS of exporting a causal LM as an hf_static program through etsdk-aoti (both methods), by stage.

The model (embedded Llama-style, random weights, sized by ``--hidden/--layers/--vocab``) is built first;
the baseline is the process RSS then (model, torch, executorch loaded). Peak RSS is sampled at every export
stage (etsdk's progress points and after each AOTInductor compile), so the report says which stage sets it.
Run in a fresh process per measurement (ru_maxrss never goes down).

Last line: JSON with ``weights_bytes``, ``baseline_rss_bytes``, ``peak_rss_bytes``,
``peak_over_baseline_per_weight`` and ``stages`` (stage -> peak RSS bytes when that stage started).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()

    import etsdk.lowering as lowering
    import etsdk_aoti.serializer as serializer
    from etsdk_hf_static.exporter import export
    from etsdk_hf_static.tiny import tiny_model

    stages: dict[str, int] = {}
    progress = lowering._progress
    compile_partition = serializer.compile_partition

    def record(stage: str, quiet: bool, started: float) -> None:
        stages[stage.split(" (")[0][:60]] = _peak()
        progress(stage, quiet, started)

    def compiled(*a: Any, **k: Any) -> Any:
        out = compile_partition(*a, **k)
        stages[f"after AOTInductor compile {sum(s.startswith('after AOT') for s in stages) + 1}"] = _peak()
        return out

    # measurement hooks only, set and left for this one-shot process
    lowering._progress = record  # type: ignore[assignment]
    serializer.compile_partition = compiled  # type: ignore[assignment]

    model = tiny_model("llama", hidden=args.hidden, layers=args.layers, vocab=args.vocab, heads=16, kv_heads=2, positions=512)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    baseline = _rss()
    print(f"weights {weights / 2**20:.0f} MiB, baseline RSS {baseline / 2**20:.0f} MiB", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        export(model, Path(tmp) / "model.pte", backend="aoti", prefill_length=32, context_length=256,
               partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=False)
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
