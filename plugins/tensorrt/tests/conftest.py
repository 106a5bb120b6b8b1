"""The tests' TensorRT: the ONNX Runtime stand-in in ``standin/`` is imported as ``tensorrt``.

Only two things are substituted, both at the edges the plugin is written
against (``standin/seams.py``): the ``tensorrt`` module (``standin/tensorrt``,
whose limits are written in its docstring) and the plugin's one CUDA module,
``etsdk_tensorrt.device`` (this machine has no GPU: it reports one with the
stand-in's compute capability, and stream 0). Everything else is the real
thing: torch.export, torch's ONNX exporter, ExecuTorch's
``to_edge_transform_and_lower`` / ``to_executorch``, the ``.pte`` and the
ExecuTorch runtime through ``etsdk.load``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "standin"))

import seams  # noqa: E402

tensorrt = seams.import_standin()


@pytest.fixture(scope="session", autouse=True)
def standin_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    patch = pytest.MonkeyPatch()
    seams.install(patch, tmp_path_factory.mktemp("engine-cache"))
    yield tensorrt.STANDIN
    patch.undo()


@pytest.fixture(autouse=True)
def standin() -> Iterator[Any]:
    """The stand-in's configuration, reset around every test."""
    tensorrt.STANDIN.reset()
    yield tensorrt.STANDIN
    tensorrt.STANDIN.reset()
