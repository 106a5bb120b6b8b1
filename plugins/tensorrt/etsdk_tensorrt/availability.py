"""Whether TensorRT can run here, decided without importing tensorrt or torch."""

from __future__ import annotations

import ctypes.util
import importlib.util
import os

from etsdk.backend import Availability


def _cuda_device_present() -> bool:
    return any(os.path.exists(f"/dev/nvidia{i}") for i in range(16))


def probe() -> Availability:
    missing = []
    if importlib.util.find_spec("tensorrt") is None:
        missing.append("Python package 'tensorrt'")
    if ctypes.util.find_library("nvinfer") is None and not os.environ.get("ETSDK_TENSORRT_LIBRARY"):
        missing.append("libnvinfer")
    if missing:
        return Availability.unavailable(f"TensorRT runtime libraries not found (missing: {', '.join(missing)})")
    if not _cuda_device_present():
        return Availability.unavailable("no CUDA device")
    return Availability.unavailable(
        "TensorRT was found, but this etsdk-tensorrt release is a registration shell: its partitioner, "
        "serializer and runtime binding land with the TensorRT issue"
    )
