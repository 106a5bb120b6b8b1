"""The seam: a user output beside an aliased cache output, through ``to_edge_transform_and_lower`` ->
``to_executorch`` -> the ExecuTorch runtime.

The engine orders its outputs states first (``state.cache.updated``,
``state.count.updated``, then ``y``, ``z``); ExecuTorch hands the delegate
``y, z``. ``y`` has exactly the cache's shape and dtype, so only binding by name
keeps the cache out of ``y``'s slot. The last test writes the blob's binding
table in the engine's order instead (as a serializer that trusted the engine's
order would) and shows the program then refuses to run or computes wrong
values: the seam test would catch it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import etsdk
import onnx
import pytest
import torch
from etsdk_tensorrt import BACKEND_ID, blob_format
from trt_helpers import by_method
from trt_models import Seam, T, export_seam, seam_inputs


def _eager_steps(inputs: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    eager = Seam().eval()
    out = []
    with torch.no_grad():
        for x in inputs:
            y, z = eager(x)
            out.append((y, z, eager.cache.clone()))
    return out


def test_user_outputs_land_in_their_slots_and_the_cache_in_the_session(seam_export: tuple[Path, list[Any]]) -> None:
    path, captured = seam_export
    description, graph = blob_format.read(by_method(captured, "step").payload)
    engine_outputs = [o.name for o in onnx.load_from_string(bytes(graph)).graph.output]  # type: ignore[arg-type]
    delegate_outputs = [o.name for o in description.outputs]
    assert engine_outputs[: len(delegate_outputs)] != delegate_outputs, "the orders must differ for this test to bite"
    assert engine_outputs[0] == "state.cache.updated"

    program = etsdk.load(path)
    session = program.new_session()
    pointer = session.state["cache"].data_ptr()
    inputs = seam_inputs(3)
    for step, (x, (y, z, cache)) in enumerate(zip(inputs, _eager_steps(inputs))):
        got_y, got_z = program.run("step", x, session=session)
        torch.testing.assert_close(got_y, y, msg=f"y, step {step}")
        torch.testing.assert_close(got_z, z, msg=f"z, step {step}")
        torch.testing.assert_close(session.state["cache"], cache, msg=f"cache, step {step}")
        assert int(session.state["count"]) == T * (step + 1)
    assert session.state["cache"].data_ptr() == pointer


def _engine_order(payload: bytes) -> bytes:
    """The payload with its output table in the engine's order: what a serializer trusting the engine would write."""
    reader = etsdk.BlobReader(payload, known_features=blob_format.KNOWN_FEATURES)
    table = json.loads(bytes(reader.section(blob_format.JSON_SECTION)))
    graph = onnx.load_from_string(bytes(reader.section(blob_format.ONNX_SECTION)))
    names = {7: "int64", 1: "float32"}  # ONNX element types
    engine = [
        {"name": o.name, "dtype": names[o.type.tensor_type.elem_type], "shape": [d.dim_value for d in o.type.tensor_type.shape.dim]}
        for o in graph.graph.output
    ]
    table["outputs"] = engine[: len(table["outputs"])]
    writer = etsdk.BlobWriter(required_features=list(reader.required_features), producer=reader.producer)
    writer.add_section(blob_format.JSON_SECTION, json.dumps(table).encode())
    writer.add_section(blob_format.ONNX_SECTION, reader.section(blob_format.ONNX_SECTION), alignment=64)
    return writer.to_bytes()


def test_a_table_in_engine_order_would_fail_the_seam_test(tmp_path: Path) -> None:
    from etsdk.testing import transform_payloads

    with transform_payloads(lambda backend, method, payload: _engine_order(payload) if backend == BACKEND_ID else payload):
        path = export_seam(tmp_path / "engine-order.pte")
    program = etsdk.load(path)
    session = program.new_session()
    inputs = seam_inputs(2)
    try:
        results = [program.run("step", x, session=session) for x in inputs]
    except etsdk.EtsdkError:
        return  # refused: the cache output and a user output were bound to one slot
    wrong = any(
        not torch.allclose(got_y, y) or not torch.allclose(got_z, z)
        for (got_y, got_z), (y, z, _) in zip(results, _eager_steps(inputs))
    )
    assert wrong, "engine-order binding went unnoticed"


@pytest.mark.parametrize("build", ["export", "load"])
def test_the_seam_holds_whether_the_engine_is_built_at_export_or_at_load(
    build: str, tmp_path: Path, standin: Any, fresh_engine_cache: Path
) -> None:
    path = export_seam(tmp_path / f"{build}.pte", build=build)
    builds = standin.builds
    program = etsdk.load(path)
    session = program.new_session()
    (x,) = seam_inputs(1, seed=4)
    got_y, got_z = program.run("step", x, session=session)
    assert standin.builds == builds + (1 if build == "load" else 0)
    ((y, z, cache),) = _eager_steps([x])
    torch.testing.assert_close(got_y, y)
    torch.testing.assert_close(got_z, z)
    torch.testing.assert_close(session.state["cache"], cache)
