"""Reading what an export produced: a delegate's ONNX back on disk, run by ONNX Runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from etsdk_tensorrt import blob_format


def onnx_files(captured: Any, directory: Path) -> tuple[Path, blob_format.BlobDescription]:
    """Write a captured delegate's ONNX graph and its weights (from named data) into ``directory``, as the runtime
    does before it builds an engine."""
    from etsdk_tensorrt.runtime import _onnx_files

    description, graph = blob_format.read(captured.payload)
    assert description.onnx is not None and graph is not None
    entries = {key: memoryview(data) for key, data in captured.named_data.items()}
    return _onnx_files("captured", description.onnx, graph, entries, directory), description


def run_onnx(path: Path, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # as the stand-in runs it
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {k: np.array(v, order="C") for k, v in feeds.items()})))


def by_method(captured: list[Any], method: str) -> Any:
    (found,) = [c for c in captured if c.method == method]
    return found
