"""The ONNX each delegate carries: valid with full shape inference, and ONNX Runtime computes what eager does.

State is explicit in it (an input per state, an output per written state), never an initializer: the
exporter's default would have frozen the cache's example value into the model.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from trt_helpers import by_method, onnx_files, run_onnx
from trt_models import H, Seam, T, seam_inputs

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def _check(path: Path) -> onnx.ModelProto:
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path), load_external_data=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    for value in (*inferred.graph.input, *inferred.graph.output):
        dims = value.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), f"{value.name} has a dynamic dimension"
    return model


@pytest.mark.parametrize("method", ["prefill", "decode"])
def test_toy_onnx_is_valid_and_equals_eager(method: str, toy_export: tuple[Path, list[Any]], toy_model: Any, tmp_path: Path) -> None:
    _, captured = toy_export
    path, description = onnx_files(by_method(captured, method), tmp_path)
    model = _check(path)
    initializers = {i.name for i in model.graph.initializer}
    assert not initializers & {s.input for s in description.states}, "state frozen into the weights"
    assert [a.kind for a in description.aliases] == ["user"] * 4  # writes at `positions`: plain scatters

    eager = copy.deepcopy(toy_model)
    eager.reset_caches()
    rows = 4 if method == "prefill" else 1
    tokens = torch.tensor([[3, 5, 7, 9][:rows]])
    positions = torch.arange(rows) + (0 if method == "prefill" else 6)
    history = torch.randn(1, eager.heads, eager.capacity, eager.head_dim, generator=torch.Generator().manual_seed(2))
    for i in range(eager.layers):  # a cache that already holds something: the update must keep it
        getattr(eager, f"k_cache_{i}").copy_(history)
        getattr(eager, f"v_cache_{i}").copy_(-history)
    feeds = {s.input: getattr(eager, f"{s.state[0]}_cache_{s.state[1:]}").numpy().copy() for s in description.states}
    feeds[description.inputs[0].name] = tokens.numpy()
    feeds[description.inputs[1].name] = positions.numpy()
    got = run_onnx(path, feeds)
    with torch.no_grad():
        want = eager(tokens, positions)
    np.testing.assert_allclose(got[description.outputs[0].name], want.numpy(), **TOLERANCE)
    for s in description.states:
        cache = getattr(eager, f"{s.state[0]}_cache_{s.state[1:]}")
        np.testing.assert_allclose(got[s.output], cache.numpy(), **TOLERANCE)


def test_seam_onnx_updates_the_cache_with_tensor_scatter(seam_export: tuple[Path, list[Any]], tmp_path: Path) -> None:
    _, captured = seam_export
    path, description = onnx_files(by_method(captured, "step"), tmp_path)
    model = _check(path)
    scatters = [n for n in model.graph.node if n.op_type == "TensorScatter"]
    assert [n.input[0] for n in scatters] == ["state.cache"]
    assert {a.state: a.kind for a in description.aliases} == {"cache": "kv_cache_update", "count": "user"}

    eager = Seam().eval()
    previous = torch.randn(1, H, 8, 4, generator=torch.Generator().manual_seed(9))
    eager.cache.copy_(previous)
    eager.count.fill_(3)
    (x,) = seam_inputs(1)
    feeds = {"state.cache": previous.numpy(), "state.count": np.array(3, dtype=np.int64), description.inputs[0].name: x.numpy()}
    got = run_onnx(path, feeds)
    with torch.no_grad():
        y, z = eager(x)
    np.testing.assert_allclose(got[description.outputs[0].name], y.numpy(), **TOLERANCE)
    np.testing.assert_allclose(got[description.outputs[1].name], z.numpy(), **TOLERANCE)
    np.testing.assert_allclose(got["state.cache.updated"], eager.cache.numpy(), **TOLERANCE)
    assert int(got["state.count.updated"]) == int(eager.count) == 3 + T
