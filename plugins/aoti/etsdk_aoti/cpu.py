"""What CPU an etsdk-aoti library is compiled for: Inductor's options for a target, the record, the check at load.

AOTInductor compiles a partition's C++ for the exporting host unless told otherwise (``-march=native`` and the
host's best vector ISA); such a library dies of an illegal instruction on a machine that lacks one of the host's
features. A CPU target (:func:`etsdk.backend.cpu_target`: ``native``, or a baseline a fleet shares such as
``x86-64-v3``) says what to compile for instead: :func:`plan` turns it into Inductor's ``cpp.march`` and
``cpp.simdlen`` and finds the vector ISA Inductor picks under them; the blob records the result
(:class:`etsdk_aoti.blob_format.CpuRecord`); :func:`refusal` is the check the runtime makes against the host
before the library is written to the cache or loaded.

A target's vector width is the widest whose ISA needs nothing beyond the target. Inductor picks the first ISA of
a width that the *exporting* host has: 512 bits on a host with AMX is Inductor's AMX ISA, whose compiler flags
add VNNI, AMX and AVX-512 BF16, which an ``x86-64-v4`` machine need not have, so ``x86-64-v4`` gets 256-bit AVX2
vector code there (``-march=x86-64-v4`` still applies to everything else), and 512-bit AVX-512 code on a host
whose 512-bit ISA is plain AVX-512. ``native`` records the host's own features, including those
``ETSDK_HIDE_CPU_FEATURES`` hides (``-march=native`` does not see that variable).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from etsdk.backend import HostCpu, cpu_target, cpu_target_names, host_cpu

from etsdk_aoti.blob_format import KERNELS_PORTABLE, CpuRecord

__all__ = ["Build", "best_target", "plan", "refusal", "vec_isa_features"]

#: Inductor ``cpp.simdlen`` values tried for a target, widest first; 0 matches no vector ISA (no vector code)
_SIMDLEN: dict[str, tuple[int, ...]] = {"x86-64": (0,), "x86-64-v2": (0,), "x86-64-v3": (256,), "x86-64-v4": (512, 256)}
_MACHINE_SIMDLEN: dict[str, tuple[int, ...]] = {"aarch64": (128,)}

#: GCC ``-m`` flags of Inductor's vector ISAs -> Linux feature names (others: the flag with '-' as '_')
_FLAG_FEATURES = {
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avxvnni": "avx_vnni",
}
#: ``-march=...+ext`` extensions of Inductor's aarch64 vector ISAs -> Linux feature names
_ARM_EXTENSIONS = {"dotprod": "asimddp", "fp16": "asimdhp", "fp16fml": "asimdfhm"}


def vec_isa_features(isa: Any, machine: str) -> frozenset[str]:
    """The CPU features code compiled with Inductor's vector ISA ``isa`` may use (read from its compiler flags)."""
    if not isa:
        return frozenset()
    found = {"asimd"} if machine == "aarch64" else set()
    for flag in str(isa.build_arch_flags()).split():
        if flag.startswith(("-march=", "-mcpu=")):
            found.update(_ARM_EXTENSIONS.get(ext, ext) for ext in flag.split("=", 1)[1].split("+")[1:])
        elif flag.startswith("-m") and not flag.startswith("-msve-vector-bits"):
            name = flag[2:]
            found.add(_FLAG_FEATURES.get(name, name.replace("-", "_")))
    return frozenset(found)


def _isa_name(isa: Any) -> str:
    return str(isa) if isa else "none"


@dataclass(frozen=True)
class Build:
    """How a CPU partition is compiled: Inductor's options for the target and what the blob records."""

    target: str
    machine: str
    #: what the compiled code needs: the target's features and those of the vector ISA
    features: frozenset[str]
    vec_isa: str
    march: str
    #: Inductor options (``cpp.march``, ``cpp.simdlen``); empty for ``native``
    options: Mapping[str, Any]
    #: a progress line when the target's widest vector ISA was not used on this host, else None
    note: str | None = None

    def runs_on(self, host: HostCpu) -> bool:
        """Whether ``host`` can run the compiled code (its machine, every feature)."""
        return host.machine == self.machine and not host.lacks(self.features)

    def record(self, host: HostCpu) -> CpuRecord:
        """The blob's ``config.cpu`` for this build on the exporting ``host``."""
        return CpuRecord(
            target=self.target, machine=self.machine, features=tuple(sorted(self.features)), vec_isa=self.vec_isa,
            march=self.march, built_on=host.describe(), kernels=KERNELS_PORTABLE,
        )


def plan(name: str) -> Build:
    """The build of CPU target ``name`` on this host; ``ValueError`` (one line, naming the choices) for a name
    that is not one of :func:`etsdk.backend.cpu_target_names` or is for another machine."""
    from torch._inductor import config as inductor_config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    host = host_cpu()
    if name == "native":
        # the code is compiled for the real host: what ETSDK_HIDE_CPU_FEATURES hides is still used
        real = dataclasses.replace(host, features=host.features | host.hidden, hidden=frozenset())
        native = cpu_target("native", real)
        isa = pick_vec_isa()
        march = inductor_config.cpp.march
        return Build(
            "native", native.machine, native.features | vec_isa_features(isa, native.machine), _isa_name(isa),
            "native" if march is None else march or "(none)", {},
        )
    target = cpu_target(name, host)
    if target.machine != host.machine or name not in cpu_target_names(host.machine):
        raise ValueError(
            f"CPU target {name!r} is for {target.machine}; this host compiles for {host.machine} "
            f"(choose one of: {', '.join(cpu_target_names(host.machine))})"
        )
    widths = (*_SIMDLEN.get(name, _MACHINE_SIMDLEN.get(target.machine, ())), 0)
    passed: list[str] = []
    for simdlen in dict.fromkeys(widths):
        options = {"cpp.march": target.march, "cpp.simdlen": simdlen}
        with inductor_config.patch(options):
            isa = pick_vec_isa()
        extra = vec_isa_features(isa, target.machine) - target.features
        if extra:
            passed.append(f"{simdlen}-bit {_isa_name(isa)} (it also needs {' '.join(sorted(extra))})")
            continue
        note = None
        if passed:
            note = (
                f"{name}: Inductor's vector code for this host would be {'; '.join(passed)}, beyond {name}; "
                f"the vector code is {_isa_name(isa)} instead"
            )
        return Build(name, target.machine, target.features, _isa_name(isa), str(target.march), options, note)
    raise AssertionError("simdlen 0 selects no vector ISA")  # pragma: no cover - 0 is always tried last


def best_target(host: HostCpu) -> str | None:
    """The highest named (non-native) target ``host`` runs, or None."""
    runnable = [n for n in cpu_target_names(host.machine)[1:] if cpu_target(n, host).runs_on(host)]
    return runnable[-1] if runnable else None


def refusal(record: CpuRecord, host: HostCpu) -> str | None:
    """Why ``host`` cannot run a library compiled as ``record`` says (one line), or None where it can (or where
    the host's features are unknown: nothing to check them against)."""
    needs = f"needs {' '.join(record.features)}" if record.features else "baseline only"
    head = f"this program's etsdk-aoti code was compiled for {record.target} ({record.machine}, {needs})"
    if host.machine != record.machine:
        return f"{head}; this host is {host.describe()}; re-export it on this machine"
    missing = host.lacks(frozenset(record.features))
    if not missing:
        return None
    best = best_target(host)
    advice = f"--cpu-target {best} or on this machine" if best else "on this machine"
    return f"{head}; this host lacks {' '.join(missing)}: {host.describe()}; re-export it with {advice}"
