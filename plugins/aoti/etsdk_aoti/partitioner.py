"""Claims every operator no earlier partitioner took, as convex partitions for AOTInductor.

Declared state is tagged into the delegate by the core (it wraps every plugin
partitioner); this partitioner only says what AOTInductor computes (everything
left) and on which device.
"""

from __future__ import annotations

import torch
from etsdk.backend import OperatorPartitioner

from etsdk_aoti import BACKEND_ID

DEVICE_SPEC = "device"
#: Operators kept out of ExecuTorch's decompositions: Inductor has a fused attention lowering for SDPA.
#: Measured on a 26M-parameter decoder (decode ms/step, 2 cores, alternating runs): attention kept whole
#: 7.1-9.3, nothing kept 6.7-9.4, every ATen op kept whole (as ExecuTorch's stock AOTI partitioner does) 9.5-11.8.
KEEP_WHOLE = (torch.ops.aten.scaled_dot_product_attention.default,)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class AotiPartitioner(OperatorPartitioner):
    """``device``: ``"cpu"`` or ``"cuda"`` (default: cuda when available)."""

    def __init__(self, device: str | None = None) -> None:
        self.device = device or default_device()
        if self.device not in {"cpu", "cuda"} and not self.device.startswith("cuda:"):
            raise ValueError(f"etsdk-aoti compiles for 'cpu' or 'cuda', got device {self.device!r}")
        super().__init__(
            BACKEND_ID,
            keep_whole=KEEP_WHOLE,
            compile_specs={DEVICE_SPEC: self.device.encode()},
            state_device="cuda" if self.device.startswith("cuda") else "cpu",
        )
