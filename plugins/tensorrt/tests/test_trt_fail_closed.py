"""Fail closed: each case is a clear etsdk error when the method loads, before any engine runs.

A blob requiring a feature this plugin lacks; an engine stamped for another
TensorRT version or compute capability with no ONNX to rebuild it from (with
the ONNX it is rebuilt and cached); an engine whose I/O names, dtypes, shapes or
aliases differ from the blob; caller-owned state on the host for an engine whose
tensors live on the device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import etsdk
import pytest
import torch
from etsdk_tensorrt import BACKEND_ID
from etsdk_tensorrt.runtime import EngineMismatchError
from trt_models import Seam, export_seam, seam_inputs


@pytest.fixture(scope="module")
def seam_without_onnx(standin_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_seam(tmp_path_factory.mktemp("no-onnx") / "seam.pte", keep_onnx=False)


def _refused(path: Path, standin: Any, error: type[Exception], *fragments: str) -> str:
    program = etsdk.load(path)
    with pytest.raises(error) as caught:
        program.load_method("step")
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"
    assert standin.executions == 0
    return message


def _runs_like_eager(path: Path) -> None:
    program = etsdk.load(path)
    session = program.new_session()
    (x,) = seam_inputs(1, seed=11)
    got_y, _ = program.run("step", x, session=session)
    with torch.no_grad():
        want_y, _ = Seam().eval()(x)
    torch.testing.assert_close(got_y, want_y)


def test_a_blob_requiring_an_unknown_feature_is_refused(tmp_path: Path, standin: Any) -> None:
    from etsdk.testing import transform_payloads, with_required_feature

    def future(backend: str, method: str, payload: bytes) -> bytes:
        return with_required_feature(payload, "tensorrt.from-the-future.v9") if backend == BACKEND_ID else payload

    with transform_payloads(future):
        path = export_seam(tmp_path / "future.pte")
    _refused(path, standin, etsdk.UnsupportedFeatureError, "tensorrt.from-the-future.v9")


@pytest.mark.parametrize(
    ("field", "value", "found"),
    [("version", "10.17.0", "TensorRT 10.17.0"), ("compute_capability", "9.0", "compute capability 9.0")],
)
def test_an_engine_for_another_tensorrt_or_gpu_without_onnx_is_refused_naming_both(
    field: str, value: str, found: str, seam_without_onnx: Path, standin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tensorrt

    if field == "version":
        monkeypatch.setattr(tensorrt, "__version__", value)
    else:
        standin.compute_capability = value
    built = "TensorRT 10.16.1" if field == "version" else "compute capability 8.9"
    _refused(seam_without_onnx, standin, EngineMismatchError, built, found, "no ONNX to rebuild")


@pytest.mark.parametrize("field", ["version", "compute_capability"])
def test_an_engine_for_another_tensorrt_or_gpu_is_rebuilt_from_its_onnx_once(
    field: str, seam_export: tuple[Path, list[Any]], standin: Any, monkeypatch: pytest.MonkeyPatch, fresh_engine_cache: Path
) -> None:
    import tensorrt

    if field == "version":
        monkeypatch.setattr(tensorrt, "__version__", "10.17.0")
    else:
        standin.compute_capability = "9.0"
    path, _ = seam_export
    _runs_like_eager(path)
    assert standin.builds == 1
    _runs_like_eager(path)  # a second load deserializes the cached engine
    assert standin.builds == 1


def test_a_tensorrt_without_tensor_scatter_cannot_rebuild_and_says_why(
    seam_export: tuple[Path, list[Any]], standin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tensorrt

    monkeypatch.setattr(tensorrt, "__version__", "10.14.1")
    _refused(seam_export[0], standin, etsdk.ProgramError, "TensorRT 10.14.1's ONNX parser refused", "TensorScatter")


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ({"input.0.x": {"name": "input.0.renamed"}}, ["missing: ['input.0.x']", "unknown: ['input.0.renamed']"]),
        ({"output.0.aten_add_tensor_2": {"dtype": "HALF"}}, ["'output.0.aten_add_tensor_2' is output float16", "float32"]),
        ({"state.cache": {"shape": (1, 2, 16, 4)}}, ["'state.cache' is input float32 [1, 2, 16, 4]", "[1, 2, 8, 4]"]),
        ({"state.cache.updated": {"aliased": None}}, ["kv_cache_update alias of 'state.cache'", "reports it aliases None"]),
        ({"state.count.updated": {"aliased": "input.0.x"}}, ["writes output 'state.count.updated' through input 'input.0.x'"]),
    ],
    ids=["name", "dtype", "shape", "kv-alias-missing", "undeclared-alias"],
)
def test_engine_io_that_differs_from_the_blob_is_refused(
    override: dict[str, dict[str, Any]], fragments: list[str], seam_export: tuple[Path, list[Any]], standin: Any
) -> None:
    import tensorrt

    for changes in override.values():
        if "dtype" in changes:
            changes["dtype"] = tensorrt.DataType[changes["dtype"]]
    standin.io_overrides = override
    _refused(seam_export[0], standin, EngineMismatchError, *fragments)


def test_caller_owned_state_on_the_host_for_a_device_engine_is_refused(seam_export: tuple[Path, list[Any]], standin: Any) -> None:
    standin.location = "DEVICE"
    message = _refused(seam_export[0], standin, EngineMismatchError, "state 'cache'", "on the device", "never staged")
    assert "cpu memory" in message
