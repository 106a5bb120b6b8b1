"""The parent side of the hostile-input suite: regions of files, seeded cases, a crash-tolerant worker pool of one.

:func:`run_cases` feeds cases to ``tests/hostile/hostile_worker.py`` in a subprocess;
a worker that dies mid-case (a signal) has that case recorded as ``crash`` and
a fresh worker continues with the rest; a case that runs longer than its
deadline is recorded as ``hang``.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CASE_DEADLINE_S = 300.0


@dataclass(frozen=True)
class Region:
    name: str
    start: int
    end: int
    payload: bool = False  # inside a delegate's payload (covered by the core's payload hash)
    weights: bool = False  # named data (covered by content hashes with verify=True)


def _blob_regions(data: bytes, start: int, end: int, label: str) -> list[Region]:
    """A delegate's segment: the core's container (header, signature), the payload's head, the payload's bulk."""
    from etsdk._format.blob import BLOB_MAGIC

    inner = data.find(BLOB_MAGIC, start + 8, min(end, start + 65536))  # the plugin's own container, if it has one
    payload = inner if inner != -1 else min(end, start + 512)
    head_end = min(end, payload + 4096)
    out = [
        Region(f"{label} container", start, payload),
        Region(f"{label} payload head", payload, head_end, payload=True),
        Region(f"{label} payload bulk", head_end, end, payload=True),
    ]
    return [r for r in out if r.end > r.start]


def pte_regions(path: Path) -> list[Region]:
    """Header, flatbuffer, padding, then every segment: delegate blobs split by part, named data by key."""
    from etsdk._format.program_file import read_program_file

    data = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        layout = read_program_file(fd)
    finally:
        os.close(fd)
    first = min((o for o, n in layout.segments if n), default=len(data))
    regions = [Region("header", 0, 48), Region("flatbuffer", 48, layout.program_size)]
    if first > layout.program_size:
        regions.append(Region("padding", layout.program_size, first))
    named = {(e.offset, e.size): e.key for e in layout.entries}
    delegate = 0
    for offset, size in layout.segments:
        if not size:
            continue
        key = named.get((offset, size))
        if key is None:
            regions += _blob_regions(data, offset, offset + size, f"delegate {delegate}")
            delegate += 1
        elif key == "etsdk/program" or key.startswith("etsdk/program/"):  # etsdk/program/<sha256>, or an old record
            regions.append(Region("program record", offset, offset + size))
        else:
            regions.append(Region(f"named data {key}", offset, offset + size, weights=True))
    return regions


def ptd_regions(path: Path) -> list[Region]:
    data = path.read_bytes()
    magic, _, fb_offset, fb_size, base, size = struct.unpack_from("<4sIQQQQ", data, 8)
    assert magic == b"FH01"
    regions = [Region("header", 0, fb_offset), Region("flatbuffer", fb_offset, fb_offset + fb_size)]
    if base > fb_offset + fb_size:
        regions.append(Region("padding", fb_offset + fb_size, base))
    regions.append(Region("weights", base, base + size, weights=True))
    return regions


def mutations(regions: Sequence[Region], size: int, rng: random.Random, per_region: int) -> list[tuple[Region | None, list[Any]]]:
    """Seeded byte flips in every region (its first and last byte, then random ones) and truncations."""
    out: list[tuple[Region | None, list[Any]]] = []
    for region in regions:
        span = region.end - region.start
        offsets = {region.start, region.end - 1} | {region.start + rng.randrange(span) for _ in range(per_region)}
        for offset in sorted(offsets):
            out.append((region, ["flip", offset, rng.choice([0x01, 0x80, 0x5A, 0xFF, 0x10])]))
        out.append((region, ["truncate", region.start + rng.randrange(span)]))
    out.append((None, ["truncate", 0]))
    out.append((None, ["truncate", size - 1]))
    return out


def worker_env(cache: Path) -> dict[str, str]:
    """The worker's environment: this checkout first on the path, a private etsdk cache (the bridge shared)."""
    from etsdk._runtime.bridge.build import cache_dir

    cache.mkdir(parents=True, exist_ok=True)
    bridge = cache_dir() / "bridge"
    if bridge.is_dir() and not (cache / "bridge").exists():
        (cache / "bridge").symlink_to(bridge, target_is_directory=True)
    env = dict(os.environ)
    paths = [str(ROOT / "sdk"), str(ROOT / "plugins" / "aoti"), str(ROOT / "plugins" / "hf_static"), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["ETSDK_CACHE_DIR"] = str(cache)
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_cases(cases: Iterable[dict[str, Any]], *, cache: Path | None = None) -> dict[int, dict[str, Any]]:
    """Run every case in a worker subprocess; crashed and hung cases are recorded, the rest continue."""
    pending = list(cases)
    results: dict[int, dict[str, Any]] = {}
    own_cache = cache is None
    cache = cache or Path(tempfile.mkdtemp(prefix="etsdk-hostile-cache-"))
    scratch = Path(tempfile.mkdtemp(prefix="etsdk-hostile-scratch-"))  # the workers' TMPDIR: a crashed one leaves its files here
    env = dict(worker_env(cache), TMPDIR=str(scratch))
    try:
        while pending:
            _run_worker(pending, results, env)
            pending = [c for c in pending if c["id"] not in results]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if own_cache:
            shutil.rmtree(cache, ignore_errors=True)
    return results


def _run_worker(cases: list[dict[str, Any]], results: dict[int, dict[str, Any]], env: dict[str, str]) -> None:
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.hostile.hostile_worker"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        assert proc.stdin is not None and proc.stdout is not None

        def feed() -> None:
            try:
                for case in cases:
                    proc.stdin.write(json.dumps(case) + "\n")  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                pass

        threading.Thread(target=feed, daemon=True).start()
        current: int | None = None
        started = time.monotonic()
        buffered = ""
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], 5.0)
            if not ready:
                if current is not None and time.monotonic() - started > CASE_DEADLINE_S:
                    proc.kill()
                    proc.wait()
                    results[current] = {"id": current, "outcome": "hang"}
                    return
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            buffered = line
            message = json.loads(line)
            if "start" in message:
                current, started = message["start"], time.monotonic()
            else:
                results[message["id"]] = message
                current = None
        code = proc.wait()
        if current is not None:
            stderr.seek(0)
            tail = stderr.read()[-1500:].decode(errors="replace")
            results[current] = {"id": current, "outcome": "crash", "returncode": code, "stderr": tail}
        elif code != 0 and len(results) < len(cases):
            # died between cases: blame the next one so the loop always progresses
            nxt = next(c["id"] for c in cases if c["id"] not in results)
            results[nxt] = {"id": nxt, "outcome": "crash", "returncode": code, "stderr": buffered}


def summary(cases: Sequence[dict[str, Any]], results: dict[int, dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for case in cases:
        outcome = results[case["id"]]["outcome"]
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def describe(case: dict[str, Any], result: dict[str, Any]) -> str:
    what = case.get("label") or case.get("call") or case.get("argv") or case.get("mutation")
    detail = result.get("message") or result.get("stderr") or ""
    return f"{what}: {result['outcome']} {result.get('error', '')} {str(detail)[:300]}"
