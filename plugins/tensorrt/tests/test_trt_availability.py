"""Availability: what ``etsdk plugins`` says, and that export does not need TensorRT.

On this machine (no TensorRT, no GPU) the plugin is reported unavailable naming
both missing pieces, and ``etsdk export --backend tensorrt`` still writes a
program whose blobs carry the ONNX and no engine (built on first load on the
target). In-process, with the stand-in and a GPU reported by the device seam,
the backend is available.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import etsdk
import pytest
from etsdk_tensorrt import BACKEND_ID, availability, device

pytest.importorskip("transformers")

STANDIN = str(Path(__file__).resolve().parent / "standin")


def _without_standin() -> dict[str, str]:
    """This machine as it is: PYTHONPATH without the stand-in (a real TensorRT would show up here)."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not p.startswith(STANDIN)]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(parts))


def _real_tensorrt_installed() -> bool:
    found = importlib.util.find_spec("tensorrt")
    return found is not None and not str(found.origin).startswith(STANDIN)


def _plugin(plugins: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [p for p in plugins if BACKEND_ID in p["backends"]]
    return found


def test_etsdk_plugins_reports_the_missing_pieces_on_this_machine() -> None:
    has_tensorrt = _real_tensorrt_installed()
    has_gpu = any(os.path.exists(f"/dev/nvidia{i}") for i in range(64))  # what the (unpatched) probe looks at
    if has_tensorrt and has_gpu:
        pytest.skip("this machine can run TensorRT engines")
    result = subprocess.run(
        [sys.executable, "-m", "etsdk", "plugins", "--json"], capture_output=True, text=True, env=_without_standin(), timeout=300
    )
    assert result.returncode == 0, result.stderr
    entry = _plugin(json.loads(result.stdout))
    assert entry["status"] == "unavailable"
    assert ("'tensorrt'" in entry["reason"]) != has_tensorrt
    assert ("no CUDA GPU" in entry["reason"]) != has_gpu
    assert "export still works" in entry["reason"]


def test_the_probe_names_each_missing_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    assert availability.probe().available  # the stand-in and the device seam: TensorRT on a GPU
    monkeypatch.setattr(device, "gpu_present", lambda: False)
    reason = availability.probe().reason or ""
    assert "no CUDA GPU" in reason and "'tensorrt'" not in reason
    etsdk.reset_registry()
    try:
        with pytest.raises(etsdk.BackendUnavailableError, match="no CUDA GPU"):
            etsdk.get_backend(BACKEND_ID, require_available=True)
    finally:
        monkeypatch.undo()
        etsdk.reset_registry()
    assert etsdk.get_backend(BACKEND_ID, require_available=True).id == BACKEND_ID


def test_export_without_tensorrt_defers_the_engine_build(tmp_path: Path) -> None:
    from etsdk_hf_static.exporting.tiny import save_tiny_model
    from test_trt_mixed_delegates import payloads_in

    if _real_tensorrt_installed():
        pytest.skip("this machine has TensorRT: export would build the engine")
    model = save_tiny_model(tmp_path / "model", "llama", seed=0)
    out = tmp_path / "deferred.pte"
    result = subprocess.run(
        [sys.executable, "-m", "etsdk", "export", "--model", str(model), "--backend", "tensorrt",
         "--prefill-length", "4", "--context-length", "12", "-o", str(out)],
        capture_output=True, text=True, env=_without_standin(), timeout=1500,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    descriptions = payloads_in(out)
    assert len(descriptions) == 2  # prefill and decode
    for description in descriptions:
        assert description.engine is None and description.onnx is not None
        assert description.device == "cuda"  # the default: sessions allocate the state on the GPU that runs it
    program = etsdk.load(out)
    assert program.contract is not None and {s.device for s in program.contract.states} == {"cuda"}
