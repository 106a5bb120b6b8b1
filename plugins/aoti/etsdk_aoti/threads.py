"""Per-call OpenMP team size for the compiled library: all threads on free cores, one thread under contention.

The library's GEMV / attention calls each open an OpenMP parallel region (a
few hundred per decode step; generated kernels run on the calling thread, see
the serializer's ``cpp.threads``). With every thread on its own core a region
costs microseconds; when another process takes a core, every region waits for
a descheduled thread and a decode step gets 3-10x slower, while one thread
alone keeps a full core. :class:`TeamSize` picks the team size per call: from
how much of this process's cores other processes used since the last look
(/proc/stat minus this process's own CPU time, Linux), or, where /proc/stat
cannot be read, by timing both sizes now and then. Where torch's own OpenMP
entry points cannot be found (a torch built with another OpenMP runtime) the
caller's team size is kept. The size is set on the calling thread only, for
the call only: ``omp_set_num_threads`` (an OpenMP ICV of that thread) and MKL's
thread-local team size (its GEMMs keep their own). Nothing process-wide changes
(``torch.set_num_threads`` would also switch MKL's dynamic mode off).
``ETSDK_AOTI_THREADS=fixed`` keeps the caller's team size.

Limits: the load signal sees other processes only; other threads of this
process (a second program decoding on another thread, a busy tokenizer) count
as ours and never make the team smaller."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from etsdk import BackendUnavailableError

MODES = ("adaptive", "fixed")

_FIRST_INTERVAL = 8  # on all threads: calls before one thread is tried again; doubles while all threads stay faster
_MAX_INTERVAL = 256
_BLIND_INTERVAL = 256  # on one thread, where idle cores cannot be read: re-check all threads this rarely
_SLOW = 1.5  # a call this much slower than its recent ones re-checks one thread at once
_SHORT = 0.5  # idle cores this much fewer than the team: one thread
_ENOUGH = 0.3  # ... at most this much fewer: all threads again
_WINDOW = 0.1  # seconds: the shortest window other processes' load is measured over (/proc/stat counts in ticks)


def _cpu_times(cpus: frozenset[int]) -> tuple[int, int] | None:
    """(busy, total) jiffies summed over ``cpus`` (the cores this process may run on), from /proc/stat."""
    busy = total = 0
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *values = line.split()
                if not name[3:].isdigit() or int(name[3:]) not in cpus:
                    continue
                fields = [int(x) for x in values[:8]]
                idle = fields[3] + fields[4]
                total += sum(fields)
                busy += sum(fields) - idle
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total) if total else None


class _OtherLoad:
    """How many of our cores other processes kept busy since the last look: /proc/stat minus our own CPU time."""

    def __init__(self) -> None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
        self.cpus = frozenset(cpus)
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.mark = self._now()
        self.cores: float | None = None  # others' cores over the last window of at least _WINDOW seconds
        self._lock = threading.Lock()

    def _now(self) -> tuple[int, int, float, float] | None:
        times = _cpu_times(self.cpus)
        return None if times is None else (*times, time.process_time(), time.monotonic())

    @property
    def available(self) -> bool:
        return self.mark is not None

    def update(self) -> None:
        # the clock first: /proc/stat is read at most once per window, not once per call (by any library)
        if self.mark is None or time.monotonic() - self.mark[3] < _WINDOW:
            return
        with self._lock:
            if time.monotonic() - self.mark[3] < _WINDOW:  # another thread took this window
                return
            self._update()

    def _update(self) -> None:
        assert self.mark is not None
        now = self._now()
        if now is None:
            return
        # A window spanning an idle spell (the user typing between two turns, a fresh process loading) is still
        # measured: what other processes did over the last seconds is the best guess for the call about to run.
        # Treating it as unknown ran every first prefill of a turn with the whole team, and under contention a
        # 64-token prefill of a 135M model took 7-10 s instead of 2 (benchmarks/README.md, first_token).
        busy, total = now[0] - self.mark[0], now[1] - self.mark[1]
        ours = (now[2] - self.mark[2]) * self.hz
        per_core = total / len(self.cpus)
        if per_core > 0:
            self.cores = max(0.0, busy - ours) / per_core
        self.mark = now


_shared: list[_OtherLoad] = []
_shared_lock = threading.Lock()


def shared_load() -> _OtherLoad:
    """The process's one load signal: every library reads and refreshes it (the load is the process's, and a
    library called once per turn, like prefill, then sees what the decode calls measured a moment ago)."""
    with _shared_lock:
        if not _shared:
            _shared.append(_OtherLoad())
        return _shared[0]


@functools.lru_cache(maxsize=1)
def _torch_cpu() -> Any:
    """torch's ``libtorch_cpu`` (already loaded), or None where there is none (a torch without it)."""
    try:
        import torch

        return ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    except OSError:
        return None


def _libgomp() -> Any:
    """The OpenMP entry points torch itself uses, or None.

    Looked up through ``libtorch_cpu``'s handle (dlsym searches that library's own dependencies): the first
    libgomp mapped in the process may be another package's copy (scikit-learn ships one), whose settings torch
    never reads. Never loads an OpenMP runtime of its own.
    """
    library = _torch_cpu()
    try:
        if library is not None and library.omp_set_num_threads and library.omp_get_max_threads:
            return library
    except AttributeError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def _mkl_local() -> Any:
    """MKL's thread-local team size setter where torch's MKL exports it, else None.

    ``MKL_Set_Num_Threads_Local`` takes its argument by value; the lower-case ``mkl_set_num_threads_local`` that
    torch's build exports is the Fortran entry point (by reference: called with an int it crashes).

    The library's GEMMs run in MKL, which keeps its own team size (torch sets it at start-up): without the
    thread-local setting they would still open two-thread regions while the generated kernels run on one.
    """
    try:
        setter = _torch_cpu().MKL_Set_Num_Threads_Local
    except AttributeError:  # no libtorch_cpu (None) or no MKL in it
        return None
    setter.restype = ctypes.c_int
    setter.argtypes = [ctypes.c_int]
    return setter


class TeamSize:
    """Chooses, per call of one compiled library, between the caller's OpenMP team size ("all") and one thread.

    Where /proc/stat is readable (Linux): from how many of this process's cores other processes kept busy since
    the last look: one thread when the cores left are ``_SHORT`` fewer than the team, all threads again when they
    are at most ``_ENOUGH`` fewer (hysteresis; a 16-core machine running something on 5 cores still gives a team
    of 8 all its threads). Where /proc/stat cannot be read: by timing, trying the other size now and then and
    keeping the faster.
    """

    def __init__(self, mode: str | None = None) -> None:
        mode = mode or os.environ.get("ETSDK_AOTI_THREADS") or "adaptive"  # "fixed": always the caller's team size
        if mode not in MODES:
            raise BackendUnavailableError(f"ETSDK_AOTI_THREADS={mode!r}: expected one of {', '.join(MODES)}")
        self._gomp = _libgomp()
        self._mkl = _mkl_local()
        self.mode = mode if self._gomp is not None else "fixed"
        self.best = "all"
        self.load = shared_load() if self.mode == "adaptive" else None
        self.average: dict[str, float] = {}
        self._recent: dict[str, list[float]] = {}
        self.interval = _FIRST_INTERVAL
        self.since = 0
        self._sudden = False  # timing fallback: the next exploring call follows a sudden slowdown
        self.history: deque[str] = deque(maxlen=1024)  # the sizes of the latest calls (benchmarks, tests)

    def _pick(self, team: int) -> str:
        if self.load is not None and self.load.available:
            self.load.update()
            others = self.load.cores
            if others is None:  # not measured yet (the first window is still open): the caller's team
                self.best = "all"
            else:
                short = team - (len(self.load.cpus) - others)  # threads of the team without an idle core
                if self.best == "all" and short >= _SHORT:
                    self.best = "one"
                elif self.best == "one" and short <= _ENOUGH:
                    self.best = "all"
            return self.best
        other = "one" if self.best == "all" else "all"
        limit = self.interval if self.best == "all" else _BLIND_INTERVAL
        return other if self.since >= limit else self.best

    def _record(self, size: str, seconds: float) -> None:
        """Timing fallback only (no load signal): keep the recent times per size and explore now and then."""
        samples = self._recent.setdefault(size, [])
        samples.append(seconds)
        del samples[:-3]
        self.average[size] = sorted(samples)[len(samples) // 2]
        if size == self.best:
            self.since += 1
            if size == "all" and len(samples) > 1 and seconds > _SLOW * min(samples[:-1]):
                self.since = self.interval  # suddenly slow (a core was taken?): try one thread on the next call
                self._sudden = True
            return
        # an exploring call: compare with the current choice's recent calls (its latest one after a sudden slowdown)
        self.since = 0
        recent = self._recent.get(self.best)
        current = recent[-1] if self._sudden and recent else self.average.get(self.best, float("inf"))
        self._sudden = False
        if seconds < 0.9 * current:
            self.best, self.interval = size, _FIRST_INTERVAL
        else:
            self.interval = min(self.interval * 2, _MAX_INTERVAL)

    def run(self, call: Callable[[], Any]) -> Any:
        if self.mode != "adaptive":
            return call()
        before = int(self._gomp.omp_get_max_threads())  # the caller's setting (torch.set_num_threads, OMP_NUM_THREADS)
        if before <= 1:
            return call()
        size = self._pick(before)
        mkl_before = None
        if size == "one":
            self._gomp.omp_set_num_threads(1)
            if self._mkl is not None:
                mkl_before = self._mkl(1)  # returns the thread's previous local setting (0: none)
        timed = self.load is None or not self.load.available  # the load signal decides where it exists
        started = time.perf_counter() if timed else 0.0
        try:
            return call()
        finally:
            elapsed = time.perf_counter() - started if timed else 0.0
            if size == "one":
                self._gomp.omp_set_num_threads(before)
                if mkl_before is not None:
                    self._mkl(mkl_before)
            if timed:
                self._record(size, elapsed)
            self.history.append(size)
