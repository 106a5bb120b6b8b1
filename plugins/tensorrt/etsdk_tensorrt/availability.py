"""Whether TensorRT engines can run here, decided without importing tensorrt or torch.

Running needs the ``tensorrt`` Python package (which brings its runtime
libraries) and a CUDA GPU. Exporting needs neither: without TensorRT the blob
carries the ONNX and the engine is built on first load on the target, so the
reason given for an unavailable backend says that export still works.
"""

from __future__ import annotations

import importlib.util

from etsdk.backend import Availability

from etsdk_tensorrt import device

EXPORT_NOTE = "export still works: the engine is then built on first load on the target"


def missing_pieces() -> list[str]:
    """What this machine lacks to run TensorRT engines, each said the way ``etsdk plugins`` shows it (empty: nothing)."""
    missing = []
    if importlib.util.find_spec("tensorrt") is None:
        missing.append(
            "TensorRT runtime libraries not found (the Python package 'tensorrt', TensorRT 10.15+ or 11.x: "
            "pip install tensorrt)"
        )
    if not device.gpu_present():
        missing.append("no CUDA GPU (no /dev/nvidia* device)")
    return missing


def probe() -> Availability:
    missing = missing_pieces()
    if missing:
        return Availability.unavailable(f"{'; '.join(missing)}; {EXPORT_NOTE}")
    return Availability.ok()
