"""The host's CPU: its architecture and instruction-set features, and the named targets code is compiled for.

Native code (an AOTInductor library, a plugin's kernels) is compiled for a target: ``native`` (everything the
exporting host has) or a baseline such as ``x86-64-v3`` that a fleet of machines shares. Code for a target runs
only on a host that has every feature the target implies; anything else dies of an illegal instruction. This module
is the one place that knows what a host has (:func:`host_cpu`) and what a target needs (:func:`cpu_target`), so an
export can record a program's target and a load can refuse it on a host that lacks a feature, before any compiled
code is loaded.

Feature names are Linux's (``/proc/cpuinfo``: ``avx2``, ``avx512f``, ``avx512_vnni``, ``asimddp``); on macOS the
``hw.optional`` sysctl keys are translated to them. ``ETSDK_HIDE_CPU_FEATURES`` (comma-separated names) removes
features from what the host is said to have: for tests of the refusals and of the lower kernel levels, and for
bug reports ("does it still happen without AVX-512?"). It is read here and nowhere else.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["HIDE_VARIABLE", "CpuTarget", "HostCpu", "cpu_target", "cpu_target_names", "host_cpu"]

#: Features named here (comma-separated) are treated as absent from the host.
HIDE_VARIABLE = "ETSDK_HIDE_CPU_FEATURES"

_X86_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"})
_X86_V3 = _X86_V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_X86_V4 = _X86_V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}

#: The x86-64 micro-architecture levels (the psABI's) and aarch64 baselines: name -> features it implies.
_TARGETS: dict[str, tuple[str, frozenset[str]]] = {
    "x86-64": ("x86_64", frozenset()),
    "x86-64-v2": ("x86_64", _X86_V2),
    "x86-64-v3": ("x86_64", _X86_V3),
    "x86-64-v4": ("x86_64", _X86_V4),
    "armv8-a": ("aarch64", frozenset({"asimd"})),
    "armv8.2-a+dotprod": ("aarch64", frozenset({"asimd", "asimddp"})),
    "armv8.6-a+i8mm": ("aarch64", frozenset({"asimd", "asimddp", "i8mm"})),
}

#: Features that say what instructions compiled code may use (a ``native`` target records the host's among these).
_ISA_FEATURES = _X86_V4 | {
    "sse", "sse2", "sse3", "avx_vnni", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx512ifma", "avx512vbmi",
    "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "amx_tile", "amx_int8", "amx_bf16", "adx", "aes", "gfni",
    "vaes", "vpclmulqdq", "pclmulqdq", "sha_ni", "rdrand", "rdseed", "clflushopt", "clwb",
    "asimd", "asimddp", "asimdhp", "fphp", "i8mm", "bf16", "sve", "sve2", "atomics", "sha2", "crc32",
}

_MACOS_KEYS = {  # hw.optional sysctl key -> Linux feature name
    "hw.optional.AdvSIMD": "asimd",
    "hw.optional.arm.FEAT_DotProd": "asimddp",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.arm.FEAT_FP16": "asimdhp",
    "hw.optional.arm.FEAT_LSE": "atomics",
    "hw.optional.avx2_0": "avx2",
    "hw.optional.avx512f": "avx512f",
}


def _machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


@dataclass(frozen=True, slots=True)
class HostCpu:
    """This machine's CPU as compiled code sees it.

    ``machine``: ``x86_64``, ``aarch64``, ...; ``model``: the CPU's name where the OS says it; ``features``: the
    instruction-set features it has (Linux names), less those hidden by :data:`HIDE_VARIABLE`; ``hidden``: those;
    ``known``: False where the features could not be read (then nothing can be checked against them).
    """

    machine: str
    model: str
    features: frozenset[str]
    hidden: frozenset[str] = frozenset()
    known: bool = True

    def lacks(self, needed: frozenset[str] | set[str]) -> list[str]:
        """The features of ``needed`` this host does not have, sorted (empty where it has them all or where the
        host's features are unknown)."""
        return sorted(set(needed) - self.features) if self.known else []

    def isa_features(self) -> list[str]:
        """The host's instruction-set features (those compiled code can depend on), sorted."""
        return sorted(self.features & _ISA_FEATURES)

    def describe(self) -> str:
        """One line: machine, model, ISA features, and what is hidden."""
        if not self.known:
            return f"{self.machine} ({self.model or 'unknown model'}; instruction-set features unknown)"
        hidden = f"; hidden by {HIDE_VARIABLE}: {' '.join(sorted(self.hidden))}" if self.hidden else ""
        return f"{self.machine} ({self.model or 'unknown model'}): {' '.join(self.isa_features()) or 'baseline only'}{hidden}"


@dataclass(frozen=True, slots=True)
class CpuTarget:
    """What code compiled for a target needs: ``machine`` and ``features``; ``march`` the compiler's ``-march``
    value (``None`` for ``native``: the compiler's own view of the host)."""

    #: ``native``, ``x86-64-v3``, ``armv8.2-a+dotprod``, ... (:func:`cpu_target_names`)
    name: str
    machine: str
    features: frozenset[str]
    march: str | None

    def runs_on(self, host: HostCpu) -> bool:
        """Whether ``host`` runs code compiled for this target (its machine, and every feature the target needs)."""
        return self.refusal(host) is None

    def refusal(self, host: HostCpu) -> str | None:
        """Why ``host`` cannot run code for this target (one line), or None where it can."""
        if host.machine != self.machine:
            return f"it is built for {self.machine} ({self.name}); this host is {host.machine}"
        missing = host.lacks(self.features)
        if missing:
            return f"it is built for {self.name}, which needs {' '.join(missing)}; this host has {host.describe()}"
        return None


def cpu_target_names(machine: str | None = None) -> list[str]:
    """The named targets (``native`` first) for ``machine`` (default: this host's)."""
    machine = machine or _machine()
    return ["native", *(name for name, (m, _) in _TARGETS.items() if m == machine)]


def cpu_target(name: str, host: HostCpu | None = None) -> CpuTarget:
    """The target ``name``: ``native`` (the host's instruction-set features) or one of :func:`cpu_target_names`.
    Raises ``ValueError`` naming the choices for an unknown name."""
    host = host or host_cpu()
    if name == "native":
        return CpuTarget("native", host.machine, frozenset(host.isa_features()), None)
    if name not in _TARGETS:
        raise ValueError(f"unknown CPU target {name!r}; choose one of: {', '.join(cpu_target_names(host.machine))}")
    machine, features = _TARGETS[name]
    return CpuTarget(name, machine, features, name)


def host_cpu() -> HostCpu:
    """This host's CPU (read once per process; the hidden features are applied on every call)."""
    machine, model, features, known = _read_host()
    hidden = frozenset(f.strip() for f in os.environ.get(HIDE_VARIABLE, "").split(",") if f.strip())
    return HostCpu(machine, model, features - hidden, hidden & features, known)


@functools.cache
def _read_host() -> tuple[str, str, frozenset[str], bool]:
    machine = _machine()
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return machine, "", frozenset(), False
        features: set[str] = set()
        model = ""
        for line in text.splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in ("flags", "features") and not features:
                features = set(value.split())
            elif key in ("model name", "cpu model", "hardware") and not model:
                model = value.strip()
        if machine == "x86_64":
            features |= {"sse", "sse2"}  # the x86-64 baseline
        return machine, model, frozenset(features), bool(features)
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-a"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return machine, "", frozenset(), False
        values = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
        found = {name for key, name in _MACOS_KEYS.items() if values.get(key, "0").strip() == "1"}
        if machine == "aarch64":
            found.add("asimd")
        return machine, values.get("machdep.cpu.brand_string", "").strip(), frozenset(found), True
    return machine, platform.processor(), frozenset(), False
