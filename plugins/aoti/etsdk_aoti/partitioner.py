"""Claims every operator no earlier partitioner took, as convex partitions for AOTInductor.

Declared state is tagged into the delegate by the core (it wraps every plugin
partitioner); this partitioner only says what AOTInductor computes (everything
left) and on which device.
"""

from __future__ import annotations

import torch
from etsdk import ExportError
from etsdk.backend import OperatorPartitioner

from etsdk_aoti import BACKEND_ID

DEVICE_SPEC = "device"
KERNEL_THREADS_SPEC = "kernel_threads"
CPU_TARGET_SPEC = "cpu_target"
#: Operators kept out of ExecuTorch's decompositions: Inductor has a fused attention lowering for SDPA.
#: Measured on a 26M-parameter decoder (decode ms/step, 2 cores, alternating runs): attention kept whole
#: 7.1-9.3, nothing kept 6.7-9.4, every ATen op kept whole (as ExecuTorch's stock AOTI partitioner does) 9.5-11.8.
KEEP_WHOLE = (torch.ops.aten.scaled_dot_product_attention.default,)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class AotiPartitioner(OperatorPartitioner):
    """``device``: ``"cpu"`` or ``"cuda"`` (default: cuda when available).

    ``kernel_threads``: OpenMP threads of Inductor's generated CPU kernels (``cpp.threads``): 1 (default) runs
    them on the calling thread, -1 uses the caller's team. In LLM decode they are small (norms, rotary, SiLU,
    cache writes) and each parallel region is a point where a step waits for a descheduled thread under
    contention; a model dominated by large elementwise work may want -1. GEMMs and attention always use the
    caller's team.

    ``cpu_target``: the CPU the generated C++ is compiled for (every device): ``native`` (default: this
    host's every feature) or a baseline a fleet shares, one of :func:`etsdk.backend.cpu_target_names`
    (``x86-64-v3``: AVX2; ``x86-64-v4``: AVX-512); :mod:`etsdk_aoti.cpu`. The blob records it and a host that
    lacks one of its features refuses the program at load. Device ``cuda`` too: its library's host code (the
    wrapper that launches the kernels, any work left on the CPU) is C++ compiled for a CPU like a CPU library's.
    """

    def __init__(self, device: str | None = None, kernel_threads: int = 1, cpu_target: str = "native") -> None:
        from etsdk.backend import cpu_target_names

        self.device = device or default_device()
        if self.device not in {"cpu", "cuda"} and not self.device.startswith("cuda:"):
            raise ValueError(f"etsdk-aoti compiles for 'cpu' or 'cuda', got device {self.device!r}")
        if isinstance(kernel_threads, bool) or not isinstance(kernel_threads, int) or not (kernel_threads == -1 or kernel_threads >= 1):
            raise ExportError(f"etsdk-aoti kernel_threads must be -1 (the caller's team) or >= 1, found {kernel_threads!r}")
        if not isinstance(cpu_target, str) or cpu_target not in cpu_target_names():
            raise ExportError(f"etsdk-aoti cpu_target must be one of {', '.join(cpu_target_names())}, found {cpu_target!r}")
        self.kernel_threads = kernel_threads
        self.cpu_target = cpu_target
        specs = {DEVICE_SPEC: self.device.encode(), KERNEL_THREADS_SPEC: str(kernel_threads).encode()}
        if cpu_target != "native":  # the serializer's default: programs exported for native keep their specs
            specs[CPU_TARGET_SPEC] = cpu_target.encode()
        super().__init__(
            BACKEND_ID,
            keep_whole=KEEP_WHOLE,
            compile_specs=specs,
            state_device="cuda" if self.device.startswith("cuda") else "cpu",
        )
