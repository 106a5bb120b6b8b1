"""Load / run / free cycles keep memory and file descriptors flat (measured in a fresh subprocess).

A cycle loads a program, creates a session, runs prefill and two decode steps
and drops everything. After warm-up cycles, hundreds more must not grow the
resident set by more than a few MB nor leave a single file descriptor open (a
few new memory mappings are the allocator warming up; a per-cycle leak shows
as hundreds).
``mixed_ext`` decodes with etsdk-aoti (AOTInductor on CPU): its user-managed
constants and state re-binding are what leaked before (tests/cross_plugin/_artifacts.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.cross_plugin._artifacts import artifact
from tests.hostile._hostile import worker_env

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import gc, json, os, sys
    import torch
    torch.set_num_threads(1)
    import etsdk

    pte, ptd, cycles = sys.argv[1], sys.argv[2] or None, int(sys.argv[3])
    prompt, positions = torch.tensor([[3, 5, 7, 9]]), torch.arange(4)

    def rss_mb():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    def fds():
        return len(os.listdir("/proc/self/fd"))

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    def cycle():
        program = etsdk.load(pte, ptd)
        session = program.new_session()
        program.run("prefill", prompt, positions, session=session)
        for step in range(2):
            program.run("decode", torch.tensor([[step + 1]]), torch.tensor([4 + step]), session=session)

    for _ in range(20):
        cycle()
    gc.collect()
    start = (rss_mb(), fds(), maps())
    for _ in range(cycles):
        cycle()
    gc.collect()
    end = (rss_mb(), fds(), maps())
    print(json.dumps({"rss_mb": end[0] - start[0], "fds": end[1] - start[1], "maps": end[2] - start[2]}))
    """
)


def _measure(kind: str, cycles: int, tmp_path: Path) -> dict[str, float]:
    art = artifact(kind)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(art["pte"]), str(art["ptd"] or ""), str(cycles)],
        cwd=ROOT,
        env=worker_env(tmp_path / "cache"),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    measured: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    return measured


def test_reference_backend_cycles_are_flat(tmp_path: Path) -> None:
    grown = _measure("ref_ext", 300, tmp_path)
    assert grown["fds"] == 0 and grown["maps"] <= 8 and grown["rss_mb"] < 10, grown


def test_aoti_cycles_are_flat(tmp_path: Path) -> None:
    """300 cycles of a program that decodes with etsdk-aoti: RSS grows < 10 MB, no descriptor, no mapping left."""
    grown = _measure("mixed_ext", 300, tmp_path)
    assert grown["fds"] == 0 and grown["maps"] <= 8 and grown["rss_mb"] < 10, grown
