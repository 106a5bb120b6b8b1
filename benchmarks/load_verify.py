"""Load time with every weight hashed (the default ``etsdk.load``) against ``verify=False``, and ``verify=True``.

Each measurement is a fresh process (``etsdk.load`` then every method loaded, timed inside the process after
its imports; and the whole process, spawn to exit), the three modes interleaved round by round, the page cache
warm for all (one untimed load first): the default (BLAKE3 digests of the program record), ``verify=False`` (no
hashing) and ``verify=True`` (SHA-256 of every entry). Program: ``--pte PATH`` (e.g. a 135M-parameter export),
or an embedded model exported here (``hf_static_decode.py``'s default 26M-parameter model through etsdk-aoti).

Last line: JSON with ``load_s`` (default), ``unverified_load_s``, ``sha256_load_s``, ``process_s`` /
``unverified_process_s`` (whole processes), ``default_over_unverified`` (load, in-process: the figure the
issue's target is about), ``default_over_unverified_process``, ``weight_bytes`` (the named data hashed).

``--smoke``: a one-layer model, two rounds: the same code and keys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {"default": "None", "unverified": "False", "sha256": "True"}
CHILD = (
    "import sys, time\n"
    "import etsdk\n"
    "started = time.perf_counter()\n"
    "program = etsdk.load(sys.argv[1], verify={mode})\n"
    "for method in program.methods:\n"
    "    program.load_method(method)\n"
    "print(time.perf_counter() - started)\n"
)


def _export(path: Path, smoke: bool) -> None:
    from etsdk_hf_static.exporting.exporter import export
    from etsdk_hf_static.exporting.tiny import tiny_model

    model = tiny_model("llama", hidden=64 if smoke else 512, layers=1 if smoke else 8, vocab=256 if smoke else 8192, heads=8, kv_heads=2)
    export(model, path, backend="aoti", prefill_length=8, context_length=64,
           partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=True)


def _run(pte: Path, mode: str) -> tuple[float, float]:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", CHILD.format(mode=MODES[mode]), str(pte)], capture_output=True, text=True)
    whole = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"load ({mode}) failed:\n{result.stderr[-3000:]}")
    return float(result.stdout.strip().splitlines()[-1]), whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pte", default=None, help="the program to load (default: an embedded model exported here)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="a one-layer model, two rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        pte = Path(args.pte) if args.pte else Path(scratch) / "model.pte"
        if not args.pte:
            _export(pte, args.smoke)
        import etsdk

        report = etsdk.verify(pte, etsdk.data_beside(pte), methods=False)
        weight_bytes = sum(e.size for e in report.entries)
        _run(pte, "unverified")  # warm the page cache
        rounds = 2 if args.smoke else args.rounds
        times: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
        for r in range(rounds):
            order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
            for mode in order:
                times[mode].append(_run(pte, mode))
            print(f"round {r}: " + ", ".join(f"{m} {times[m][-1][0]:.3f} s" for m in MODES), file=sys.stderr, flush=True)
    load = {mode: statistics.median(t for t, _ in values) for mode, values in times.items()}
    process = {mode: statistics.median(w for _, w in values) for mode, values in times.items()}
    out = {
        "program": str(args.pte or "embedded"),
        "weight_bytes": weight_bytes,
        "rounds": rounds,
        "load_s": load["default"],
        "unverified_load_s": load["unverified"],
        "sha256_load_s": load["sha256"],
        "process_s": process["default"],
        "unverified_process_s": process["unverified"],
        "default_over_unverified": load["default"] / load["unverified"],
        "default_over_unverified_process": process["default"] / process["unverified"],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
