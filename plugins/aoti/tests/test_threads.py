"""etsdk_aoti.threads: the per-call OpenMP team size (decisions, the real OpenMP setting, the real load signal).

The load signal is replaced by a plain object in the decision tests (what /proc/stat says is the machine's
business); one test reads the real /proc/stat beside a real busy process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest
from etsdk import BackendUnavailableError
from etsdk_aoti import threads


@dataclass
class _Load:
    """What ``_OtherLoad`` reports: ``cores`` other processes used of ``cpus`` over the last window."""

    cpus: frozenset[int] = field(default_factory=lambda: frozenset({0, 1}))
    cores: float | None = 0.0
    available: bool = True

    def update(self) -> None:
        pass


def _team(load: _Load) -> threads.TeamSize:
    team = threads.TeamSize("adaptive")
    if team.mode != "adaptive":
        pytest.skip("no OpenMP runtime loaded: the team size is the caller's")
    team.load = load
    return team


@pytest.fixture
def two_threads():
    gomp = threads._libgomp()
    if gomp is None:
        pytest.skip("no OpenMP runtime")
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(2)
    yield gomp
    gomp.omp_set_num_threads(before)


def test_one_thread_while_another_process_takes_a_core_and_all_again_after(two_threads) -> None:
    load = _Load()
    team = _team(load)
    seen: list[int] = []
    call = lambda: seen.append(two_threads.omp_get_max_threads())  # noqa: E731
    team.run(call)
    load.cores = 1.0  # one of our two cores busy elsewhere
    team.run(call)
    team.run(call)
    load.cores = 0.1
    team.run(call)
    assert seen == [2, 1, 1, 2]
    assert list(team.history) == ["all", "one", "one", "all"]
    assert two_threads.omp_get_max_threads() == 2  # restored after every call


def test_hysteresis_and_a_big_machine_keeps_all_threads(two_threads) -> None:
    load = _Load(cores=0.6)
    team = _team(load)
    team.run(lambda: None)
    assert team.best == "one"
    load.cores = 0.4  # between the thresholds: stays where it is
    team.run(lambda: None)
    assert team.best == "one"
    # 16 cores, 5 used by others, a team of 2: plenty of idle cores
    big = _team(_Load(cpus=frozenset(range(16)), cores=5.0))
    big.run(lambda: None)
    assert list(big.history) == ["all"]


def test_the_setting_is_restored_when_the_call_raises(two_threads) -> None:
    team = _team(_Load(cores=2.0))
    with pytest.raises(RuntimeError, match="kernel"):
        team.run(lambda: (_ for _ in ()).throw(RuntimeError("kernel failed")))
    assert two_threads.omp_get_max_threads() == 2


def test_without_a_load_signal_timing_keeps_the_faster_size(two_threads, monkeypatch) -> None:
    team = _team(_Load(available=False))
    clock = {"all": 0.010, "one": 0.004}  # one thread is faster (a core is taken)
    now = [0.0]

    def call() -> None:
        now[0] += clock["one" if two_threads.omp_get_max_threads() == 1 else "all"]

    monkeypatch.setattr(threads.time, "perf_counter", lambda: now[0])
    for _ in range(threads._FIRST_INTERVAL + 3):
        team.run(call)
    assert team.best == "one", list(team.history)
    clock.update({"all": 0.004, "one": 0.010})  # the core is free again: all threads win the next exploration
    for _ in range(threads._BLIND_INTERVAL + 3):
        team.run(call)
    assert team.best == "all", list(team.history)[-10:]


def test_the_team_size_reaches_torch_itself(two_threads) -> None:
    """The entry points are torch's own OpenMP runtime (not merely the first libgomp mapped in the process)."""
    import torch

    team = _team(_Load(cores=2.0))
    seen: list[int] = []
    team.run(lambda: seen.append(torch.get_num_threads()))
    assert seen == [1] and torch.get_num_threads() == 2


@pytest.mark.parametrize(("others_busy", "expected"), [(1.0, "one"), (0.0, "all")])
def test_a_window_spanning_an_idle_spell_is_measured(monkeypatch, two_threads, others_busy, expected) -> None:
    """The first call after an idle spell (a fresh process, a new turn) follows what others did during the spell:
    treating it as unknown ran every first prefill of a turn with the whole team, under contention too."""
    load = threads._OtherLoad()
    if not load.available:
        pytest.skip("no /proc/stat")
    load.cpus, load.hz = frozenset({0, 1}), 100
    load.mark = (0, 0, 0.0, 0.0)
    # 10 s later: 2 cores x 1000 ticks, of which others kept `others_busy` cores busy and we used 0.5 s of CPU
    busy = int(others_busy * 1000) + 50
    monkeypatch.setattr(load, "_now", lambda: (busy, 2000, 0.5, 10.0))
    monkeypatch.setattr(threads.time, "monotonic", lambda: 10.0)
    team = _team(load)  # type: ignore[arg-type]
    team.run(lambda: None)
    assert load.cores == pytest.approx(others_busy) and list(team.history) == [expected] and load.mark[3] == 10.0


def test_every_library_shares_one_load_signal() -> None:
    """Prefill is called once per turn: it reads the signal the decode calls keep fresh."""
    first, second = threads.TeamSize("adaptive"), threads.TeamSize("adaptive")
    if first.mode != "adaptive":
        pytest.skip("no OpenMP runtime")
    assert first.load is second.load is threads.shared_load()


def test_fixed_mode_and_a_wrong_setting(monkeypatch, two_threads) -> None:
    monkeypatch.setenv("ETSDK_AOTI_THREADS", "fixed")
    team = threads.TeamSize()
    seen: list[int] = []
    team.run(lambda: seen.append(two_threads.omp_get_max_threads()))
    assert team.mode == "fixed" and seen == [2]
    monkeypatch.setenv("ETSDK_AOTI_THREADS", "fast")
    with pytest.raises(BackendUnavailableError, match=r"ETSDK_AOTI_THREADS='fast': expected one of adaptive, fixed"):
        threads.TeamSize()


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the load signal reads /proc/stat (Linux)")
def test_the_real_load_signal_sees_a_busy_process() -> None:
    load = threads._OtherLoad()
    if len(load.cpus) < 2:
        pytest.skip("one core: nothing to share")
    busy = subprocess.Popen([sys.executable, "-S", "-c", "while True:\n    pass\n"])
    try:
        time.sleep(0.3)
        load.update()  # the mark taken at construction covered the start; measure a clean window
        time.sleep(threads._WINDOW * 4)
        load.update()
    finally:
        busy.kill()
        busy.wait()
    assert load.cores is not None and load.cores >= 0.5, load.cores
