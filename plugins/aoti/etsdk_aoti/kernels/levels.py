"""The instruction-set levels etsdk-aoti's kernels are built at, and which one a process uses.

Each level is one build of the same sources (``vec.h`` picks its section from the compiler's target macros) into
its own library, ``libetsdk_aoti_kernels_<level>.so``, built on the machine that runs it (cached by content) and
only when used. The process uses the highest level its host runs, or the one ``ETSDK_AOTI_ISA`` names: a lower one
for tests, A/B timing and bug reports. A level the host cannot run is refused with one line naming what is missing,
before any of its code is loaded (it would die of an illegal instruction).

=============  =======================================  ===============================================
level          compiler flags                           the host needs (Linux feature names)
=============  =======================================  ===============================================
portable       ``-march=x86-64`` / ``-march=armv8-a``   nothing beyond the architecture's baseline (plain C++ loops)
avx2           ``-march=x86-64-v3``                     x86-64-v3: avx2 fma f16c bmi1 bmi2 abm movbe ...
avx2vnni       ``-march=x86-64-v3 -mavxvnni``           x86-64-v3 + avx_vnni (Alder Lake, Zen 5, ...)
avx512         ``-march=x86-64-v4``                     x86-64-v4: + avx512f avx512bw avx512cd avx512dq avx512vl
avx512vnni     ``-march=x86-64-v4 -mavx512vnni``        x86-64-v4 + avx512_vnni
neonv8         ``-march=armv8-a``                       asimd (aarch64: Cortex-A72, Graviton 1, ...)
neon           ``-march=armv8.2-a+dotprod``             asimd asimddp (Apple M1 and later, Graviton 2+, ...)
=============  =======================================  ===============================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from etsdk import BackendUnavailableError
from etsdk.backend import HostCpu, cpu_target, host_cpu

__all__ = ["ISA_VARIABLE", "LEVELS", "KernelLevel", "best_level", "level_named", "requested_level", "runnable_levels"]

#: Names the level to use instead of the host's best (a lower one; one the host cannot run is refused).
ISA_VARIABLE = "ETSDK_AOTI_ISA"


@dataclass(frozen=True, slots=True)
class KernelLevel:
    """One build of the kernels: its ``name`` (what ``vec::kLevel`` says in a library built with ``flags``), the
    ``machine`` it is for, and the host ``features`` it needs."""

    name: str
    machine: str
    flags: tuple[str, ...]
    features: frozenset[str]

    def refusal(self, host: HostCpu) -> str | None:
        """Why ``host`` cannot run this level (one line), or None."""
        if host.machine != self.machine:
            return f"level {self.name} is for {self.machine}; this host is {host.machine}"
        missing = host.lacks(self.features)
        return f"level {self.name} needs {' '.join(missing)}, which this host lacks" if missing else None


_V3 = cpu_target("x86-64-v3").features
_V4 = cpu_target("x86-64-v4").features

#: Every level, lowest first within each machine.
LEVELS: tuple[KernelLevel, ...] = (
    KernelLevel("portable", "x86_64", ("-march=x86-64", "-DETSDK_KERNELS_PORTABLE"), frozenset()),
    KernelLevel("avx2", "x86_64", ("-march=x86-64-v3",), _V3),
    KernelLevel("avx2vnni", "x86_64", ("-march=x86-64-v3", "-mavxvnni"), _V3 | {"avx_vnni"}),
    KernelLevel("avx512", "x86_64", ("-march=x86-64-v4",), _V4),
    KernelLevel("avx512vnni", "x86_64", ("-march=x86-64-v4", "-mavx512vnni"), _V4 | {"avx512_vnni"}),
    KernelLevel("portable", "aarch64", ("-march=armv8-a", "-DETSDK_KERNELS_PORTABLE"), frozenset()),
    KernelLevel("neonv8", "aarch64", ("-march=armv8-a",), frozenset({"asimd"})),
    KernelLevel("neon", "aarch64", ("-march=armv8.2-a+dotprod",), frozenset({"asimd", "asimddp"})),
)


def _portable(machine: str) -> KernelLevel:
    """Any other architecture: the portable code with the compiler's default target."""
    return next(
        (lv for lv in LEVELS if lv.machine == machine and lv.name == "portable"),
        KernelLevel("portable", machine, ("-DETSDK_KERNELS_PORTABLE",), frozenset()),
    )


def level_names() -> list[str]:
    return sorted({lv.name for lv in LEVELS}, key=[lv.name for lv in LEVELS].index)


def runnable_levels(host: HostCpu | None = None) -> list[KernelLevel]:
    """The levels this host runs, lowest first (``portable`` always)."""
    host = host or host_cpu()
    found = [lv for lv in LEVELS if lv.refusal(host) is None]
    return found or [_portable(host.machine)]


def best_level(host: HostCpu | None = None) -> KernelLevel:
    return runnable_levels(host)[-1]


def level_named(name: str, host: HostCpu | None = None) -> KernelLevel:
    """The level ``name`` for this host; :class:`etsdk.BackendUnavailableError` (one line) where the host cannot
    run it or no level has that name."""
    host = host or host_cpu()
    if name == "portable":
        return _portable(host.machine)
    candidates = [lv for lv in LEVELS if lv.name == name]
    if not candidates:
        raise BackendUnavailableError(f"unknown etsdk-aoti kernel level {name!r}; the levels are: {', '.join(level_names())}")
    level = next((lv for lv in candidates if lv.machine == host.machine), candidates[0])
    refusal = level.refusal(host)
    if refusal:
        runnable = ", ".join(lv.name for lv in runnable_levels(host))
        raise BackendUnavailableError(f"{refusal} (host: {host.describe()}); levels this host runs: {runnable}")
    return level


def requested_level(host: HostCpu | None = None) -> KernelLevel:
    """The level this process uses: ``ETSDK_AOTI_ISA``'s, else the host's best."""
    host = host or host_cpu()
    name = os.environ.get(ISA_VARIABLE, "").strip()
    if not name:
        return best_level(host)
    try:
        return level_named(name, host)
    except BackendUnavailableError as exc:
        raise BackendUnavailableError(f"{ISA_VARIABLE}={name}: {exc}") from None
