"""Every CUDA call etsdk-tensorrt makes, in one place.

TensorRT binds raw addresses and runs on a CUDA stream; the plugin asks this
module, and only this module, whether a GPU is present, which compute
capability it has, which stream the caller is on, and for device memory.
Everything goes through torch's CUDA runtime (no second CUDA binding), except
:func:`gpu_present`, which the availability probe calls and which must not
import torch.
"""

from __future__ import annotations

import os
from typing import Any

from etsdk import BackendUnavailableError

from etsdk_tensorrt import BACKEND_ID

__all__ = ["compute_capability", "current_stream", "empty", "gpu_present", "is_device_tensor"]


def gpu_present() -> bool:
    """Whether this machine exposes an NVIDIA GPU, decided without importing torch or CUDA libraries."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return any(os.path.exists(f"/dev/nvidia{i}") for i in range(64))


def _torch_cuda() -> Any:
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            "TensorRT engines run on a CUDA GPU, and torch sees none here "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})",
            backend_id=BACKEND_ID,
        )
    return torch.cuda


def compute_capability() -> str:
    """The current CUDA device's compute capability, ``"major.minor"`` (engines are tied to it)."""
    major, minor = _torch_cuda().get_device_capability()
    return f"{major}.{minor}"


def current_stream() -> int:
    """The caller's current CUDA stream, as the raw handle ``execute_async_v3`` takes."""
    return int(_torch_cuda().current_stream().cuda_stream)


def empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """Device memory for one tensor on the current CUDA device."""
    import torch

    _torch_cuda()
    return torch.empty(shape, dtype=dtype, device="cuda")


def is_device_tensor(tensor: Any) -> bool:
    """Whether ``tensor``'s memory is CUDA device memory (what a ``DEVICE`` engine tensor needs)."""
    return bool(tensor.device.type == "cuda")
