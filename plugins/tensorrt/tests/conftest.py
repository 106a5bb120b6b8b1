"""The tests' TensorRT: the ONNX Runtime stand-in in ``standin/`` is imported as ``tensorrt``.

Only two things are substituted, both at the edges the plugin is written
against: the ``tensorrt`` module (``standin/tensorrt``, whose limits are written
in its docstring) and the plugin's one CUDA module, ``etsdk_tensorrt.device``
(this machine has no GPU: it reports one with the stand-in's compute capability
and stream 0). Everything else is the real thing: torch.export, ExecuTorch's
``to_edge_transform_and_lower`` / ``to_executorch``, the ``.pte`` and the
ExecuTorch runtime through ``etsdk.load``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

STANDIN_DIR = Path(__file__).resolve().parent / "standin"
sys.path.insert(0, str(STANDIN_DIR))

import tensorrt  # noqa: E402  (the stand-in)

if not str(getattr(tensorrt, "__file__", "")).startswith(str(STANDIN_DIR)):
    raise RuntimeError(f"a real TensorRT ({tensorrt.__file__}) shadows the stand-in; these tests run on the stand-in")


def install_standin(patch: pytest.MonkeyPatch, cache: Path) -> None:
    """Make this process see the stand-in as TensorRT on a GPU (also used by the CLI subprocess harness)."""
    import etsdk
    from etsdk_tensorrt import device, engine

    patch.setattr(device, "gpu_present", lambda: True)
    patch.setattr(device, "compute_capability", lambda: tensorrt.STANDIN.compute_capability)
    patch.setattr(device, "current_stream", lambda: 0)
    patch.setattr(engine, "cache_root", lambda: cache)
    etsdk.reset_registry()  # availability is probed at discovery: probe again with the stand-in in place


@pytest.fixture(scope="session", autouse=True)
def standin_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    patch = pytest.MonkeyPatch()
    install_standin(patch, tmp_path_factory.mktemp("engine-cache"))
    yield tensorrt.STANDIN
    patch.undo()


@pytest.fixture(autouse=True)
def standin() -> Iterator[Any]:
    """The stand-in's configuration, reset around every test."""
    tensorrt.STANDIN.reset()
    yield tensorrt.STANDIN
    tensorrt.STANDIN.reset()
