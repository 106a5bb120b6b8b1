"""The tests' TensorRT: the ONNX Runtime stand-in in ``standin/`` is imported as ``tensorrt``.

Only two things are substituted, both at the edges the plugin is written
against (``standin/trt_seams.py``): the ``tensorrt`` module (``standin/tensorrt``,
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

import trt_seams  # noqa: E402

tensorrt = trt_seams.import_standin()


@pytest.fixture(scope="session", autouse=True)
def standin_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    patch = pytest.MonkeyPatch()
    trt_seams.install(patch, tmp_path_factory.mktemp("engine-cache"))
    yield tensorrt.STANDIN
    patch.undo()


@pytest.fixture(autouse=True)
def standin() -> Iterator[Any]:
    """The stand-in's configuration, reset around every test."""
    tensorrt.STANDIN.reset()
    yield tensorrt.STANDIN
    tensorrt.STANDIN.reset()


@pytest.fixture
def fresh_engine_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty engine cache for this test (tests that count builds)."""
    from etsdk_tensorrt import engine

    cache = tmp_path / "engines"
    monkeypatch.setattr(engine, "cache_root", lambda: cache)
    return cache


# ----------------------------------------------------------------------------- shared exports


@pytest.fixture(scope="session")
def toy_model() -> Any:
    from etsdk.testing import ToyDecoder

    return ToyDecoder(seed=1).eval()


@pytest.fixture(scope="session")
def toy_export(standin_session: Any, toy_model: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """The kv_decoder toy (prefill T=4, decode 1) through TensorRT, and the delegates as the core sealed them.

    Its cache writes land at ``positions`` (a user input, not provably contiguous): plain scatters with
    ``user`` aliases.
    """
    import etsdk
    import torch
    from etsdk.testing import capture_delegates, kv_decoder_contract, kv_decoder_methods
    from etsdk_tensorrt import BACKEND_ID

    path = tmp_path_factory.mktemp("toy") / "toy.pte"
    methods = kv_decoder_methods(
        toy_model, 4, prefill_backends=(BACKEND_ID,), decode_backends=(BACKEND_ID,),
        partitioner_options={BACKEND_ID: {"device": "cpu"}},
    )
    with capture_delegates() as captured, torch.no_grad():
        etsdk.lower(methods, contract=kv_decoder_contract(toy_model, 4)).save(path)
    return path, list(captured)


@pytest.fixture(scope="session")
def seam_export(standin_session: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """``trt_models.Seam`` through TensorRT, engine built at export, ONNX kept."""
    from etsdk.testing import capture_delegates
    from trt_models import export_seam

    with capture_delegates() as captured:
        path = export_seam(tmp_path_factory.mktemp("seam") / "seam.pte")
    return path, list(captured)
