"""Where the tests substitute: the ``tensorrt`` module (this directory's stand-in) and ``etsdk_tensorrt.device``.

Shared by ``conftest.py`` and ``run_etsdk.py`` (the CLI in a subprocess), so both see the same machine: the
stand-in as TensorRT, a GPU with the stand-in's compute capability, stream 0, and an engine cache of their own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def import_standin() -> Any:
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import tensorrt

    if not str(getattr(tensorrt, "__file__", "")).startswith(str(HERE)):
        raise RuntimeError(f"a real TensorRT ({tensorrt.__file__}) shadows the stand-in; these tests run on the stand-in")
    return tensorrt


def install(patch: Any, cache: Path, *, default_device: str | None = None) -> Any:
    """Make this process see the stand-in as TensorRT on a GPU; ``patch`` is a pytest MonkeyPatch."""
    import etsdk
    from etsdk_tensorrt import device, engine, options

    tensorrt = import_standin()
    patch.setattr(device, "gpu_present", lambda: True)
    patch.setattr(device, "compute_capability", lambda: tensorrt.STANDIN.compute_capability)
    patch.setattr(device, "current_stream", lambda: 0)
    patch.setattr(engine, "cache_root", lambda: cache)
    if default_device is not None:
        patch.setattr(options, "DEFAULT_DEVICE", default_device)
    etsdk.reset_registry()  # availability is probed at discovery: probe again with the stand-in in place
    return tensorrt
