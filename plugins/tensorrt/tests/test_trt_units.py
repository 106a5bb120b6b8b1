"""Small pieces on their own: the blob format, the options, the operator table."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import etsdk
import pytest
import torch
from etsdk_tensorrt import blob_format
from etsdk_tensorrt.options import BuildOptions
from etsdk_tensorrt.partitioner import OPERATORS

README = Path(__file__).resolve().parents[1] / "README.md"


def _description(**changes: object) -> blob_format.BlobDescription:
    base = blob_format.BlobDescription(
        device="cuda",
        inputs=(blob_format.TensorSpec("input.0.x", "float32", (1, 4)),),
        outputs=(blob_format.TensorSpec("output.0.y", "float32", (1, 4)),),
        states=(blob_format.StateTensor("k", "state.k", "state.k.updated", "float32", (1, 2, 8, 4)),),
        aliases=(blob_format.Alias("state.k.updated", "state.k", "kv_cache_update", "caller", "k"),),
        engine=None,
        onnx=blob_format.OnnxRecord(24, "0" * 64, None, None),
        build={"precision": "fp32"},
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_blob_round_trips_and_requires_what_it_uses() -> None:
    description = _description()
    payload = blob_format.write(description, b"onnx-graph")
    read, graph = blob_format.read(payload)
    assert read == description and bytes(graph or b"") == b"onnx-graph"
    assert etsdk.BlobReader.declared_features(payload)[0] == (
        "tensorrt.alias.kv_cache_update.v1", "tensorrt.blob.v1", "tensorrt.onnx.v1"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"aliases": ()}, "every written state needs exactly one alias"),
        ({"aliases": (blob_format.Alias("state.k.updated", "state.k", "user", "runtime", "k"),)}, "binds only caller-owned"),
        ({"aliases": (blob_format.Alias("state.k.updated", "input.0.x", "user", "caller", "k"),)}, "disagrees with the state table"),
        ({"outputs": (blob_format.TensorSpec("state.k", "float32", (1, 4)),)}, "bound twice"),
    ],
    ids=["no-alias", "runtime-ownership", "alias-elsewhere", "duplicate-name"],
)
def test_an_inconsistent_blob_is_refused(changes: dict[str, object], message: str) -> None:
    payload = blob_format.write(_description(**changes), b"onnx-graph")
    with pytest.raises(etsdk.BlobFormatError, match=message):
        blob_format.read(payload)


def test_an_unknown_alias_kind_is_refused_by_writer_and_reader() -> None:
    import json

    unknown = (blob_format.Alias("state.k.updated", "state.k", "runtime_magic", "caller", "k"),)
    with pytest.raises(etsdk.BlobFormatError, match="runtime_magic are not one of"):
        blob_format.write(_description(aliases=unknown), b"onnx-graph")
    table = _description().to_json()
    table["aliases"][0]["kind"] = "runtime_magic"
    writer = etsdk.BlobWriter(required_features=[blob_format.BLOB_FEATURE, blob_format.ONNX_FEATURE])
    writer.add_section(blob_format.JSON_SECTION, json.dumps(table).encode())
    writer.add_section(blob_format.ONNX_SECTION, b"onnx-graph")
    with pytest.raises(etsdk.BlobFormatError, match="'runtime_magic' is not one of"):
        blob_format.read(writer.to_bytes())


TENSORS = (
    blob_format.OnnxTensor("w0", 0, 256, "weights/" + "a" * 64),
    blob_format.OnnxTensor("w1", 256, 64, "weights/" + "b" * 64),
)


def _with_tensors(tensors: object, location: object = "model.onnx.data", weights: object = None) -> bytes:
    """A blob whose ONNX weights are given per initializer, its JSON written as given (so the writer's own
    dataclasses cannot stop a malformed one)."""
    import json

    table = _description(onnx=blob_format.OnnxRecord(24, "0" * 64, None, "model.onnx.data", TENSORS)).to_json()
    table["onnx"].update(tensors=tensors, weights_location=location, weights=weights)
    writer = etsdk.BlobWriter(required_features=[blob_format.BLOB_FEATURE, blob_format.ONNX_FEATURE, blob_format.ONNX_TENSORS_FEATURE])
    writer.add_section(blob_format.JSON_SECTION, json.dumps(table).encode())
    writer.add_section(blob_format.ONNX_SECTION, b"onnx-graph")
    return writer.to_bytes()


def test_onnx_weights_per_initializer_round_trip_and_are_required() -> None:
    description = _description(onnx=blob_format.OnnxRecord(24, "0" * 64, None, "model.onnx.data", TENSORS))
    payload = blob_format.write(description, b"onnx-graph")
    read, _ = blob_format.read(payload)
    assert read == description
    assert "tensorrt.onnx.tensors.v1" in etsdk.BlobReader.declared_features(payload)[0]  # an older reader refuses it
    assert read.onnx is not None and read.onnx.weights_identity() != blob_format.OnnxRecord(
        24, "0" * 64, None, "model.onnx.data", TENSORS[:1]
    ).weights_identity()


@pytest.mark.parametrize(
    ("tensors", "location", "message"),
    [
        ([{"name": "w0", "offset": 0, "nbytes": 256, "key": "k0"}, {"name": "w1", "offset": 100, "nbytes": 8, "key": "k1"}],
         "model.onnx.data", r"onnx.tensors\[1\] \('w1'\) starts at byte 100, inside the previous initializer \(which ends at 256\)"),
        ([{"name": "w0", "offset": -1, "nbytes": 256, "key": "k0"}], "model.onnx.data", r"onnx.tensors\[0\].offset must be a non-negative"),
        ([{"name": "w0", "offset": 0, "nbytes": 256}], "model.onnx.data", r"onnx.tensors\[0\] has no 'key'"),
        ("all", "model.onnx.data", "onnx.tensors must be a list"),
        ([{"name": "w0", "offset": 0, "nbytes": 8, "key": "k0"}], None, "rebuilds the external-data file named by onnx.weights_location"),
        ([{"name": "w0", "offset": 0, "nbytes": 8, "key": "k0"}], "../../etc/x", "must be a plain file name beside the graph, found '../../etc/x'"),
    ],
    ids=["overlap", "negative-offset", "no-key", "not-a-list", "no-file", "path-outside"],
)
def test_malformed_onnx_weight_entries_are_refused(tensors: object, location: object, message: str) -> None:
    with pytest.raises(etsdk.BlobFormatError, match=message):
        blob_format.read(_with_tensors(tensors, location))


def test_a_blob_with_neither_engine_nor_onnx_cannot_be_written() -> None:
    with pytest.raises(etsdk.BlobFormatError, match="needs an engine, its ONNX, or both"):
        blob_format.write(_description(onnx=None), None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"device": "tpu"}, "device must be 'cuda' or 'cpu'"),
        ({"precision": "int4"}, "precision must be one of"),
        ({"build": "never"}, "build must be one of"),
        ({"optimization_level": 9}, "optimization_level must be an integer from 0 to 5"),
        ({"workspace_mib": 0}, "workspace_mib must be a positive integer"),
        ({"colour": "red"}, "has no option"),
    ],
)
def test_options_are_checked(options: dict[str, object], message: str) -> None:
    with pytest.raises(etsdk.ExportError, match=message):
        BuildOptions.from_options(options)


def test_state_lives_where_the_engine_runs() -> None:
    assert BuildOptions.from_options({}).state_device == "cuda"
    assert BuildOptions.from_options({"device": "cpu"}).state_device == "cpu"


def test_the_readme_table_is_the_partitioners() -> None:
    section = README.read_text().split("### Claimed operators", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([A-Za-z_:.]+)` \| (.+?) \|$", section, flags=re.MULTILINE))  # "ns::op.overload" too
    assert rows == dict(OPERATORS)


def test_the_onnx_weights_file_is_rebuilt_from_its_entries_and_a_wrong_size_is_refused(tmp_path: Path) -> None:
    from etsdk_tensorrt.runtime import _rebuild_weights

    entries = {TENSORS[0].key: memoryview(bytes(range(256))), TENSORS[1].key: memoryview(b"\x07" * 64)}
    _rebuild_weights("method 'step'", TENSORS, entries, tmp_path / "model.onnx.data")
    assert (tmp_path / "model.onnx.data").read_bytes() == bytes(range(256)) + b"\x07" * 64
    entries[TENSORS[1].key] = memoryview(b"\x07" * 60)
    with pytest.raises(etsdk.ProgramError, match=r"method 'step': ONNX initializer 'w1' \('weights/b+'\) is 60 bytes, the blob says 64"):
        _rebuild_weights("method 'step'", TENSORS, entries, tmp_path / "model.onnx.data")


def test_a_stripped_engine_needs_onnx_weights_to_refit_from() -> None:
    import json

    engine = blob_format.EngineRecord(blob_format.NamedBytes("e", 10, "0" * 64), "10.16.1", "8.9", "fp32", stripped=True)
    with_weights = _description(engine=engine, onnx=blob_format.OnnxRecord(24, "0" * 64, None, "model.onnx.data", TENSORS))
    payload = blob_format.write(with_weights, b"onnx-graph")
    assert blob_format.read(payload)[0] == with_weights
    assert "tensorrt.engine.stripped.v1" in etsdk.BlobReader.declared_features(payload)[0]
    table = _description(engine=engine).to_json()  # its ONNX has no weights
    writer = etsdk.BlobWriter(required_features=[blob_format.BLOB_FEATURE, blob_format.ENGINE_FEATURE,
                                                 blob_format.ENGINE_STRIPPED_FEATURE, blob_format.ONNX_FEATURE])
    writer.add_section(blob_format.JSON_SECTION, json.dumps(table).encode())
    writer.add_section(blob_format.ONNX_SECTION, b"onnx-graph")
    with pytest.raises(etsdk.BlobFormatError, match="a weight-stripped engine needs the ONNX weights to refit it from"):
        blob_format.read(writer.to_bytes())


def _onnx_with_weight(path: Path, weight: list[float]) -> Path:
    """``y = x + w`` with ``w`` an initializer stored beside the graph (external data, as the exporter writes it)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.array(weight, dtype=np.float32), name="w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [len(weight)])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [len(weight)])], [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=0)
    return path


def test_a_weight_stripped_engine_runs_only_once_refitted_from_matching_weights(tmp_path: Path, standin: object) -> None:
    from etsdk_tensorrt import engine

    trt = engine.import_tensorrt()
    assert engine.can_strip(trt)
    built = _onnx_with_weight(tmp_path / "built.onnx", [1.0, 2.0, 3.0, 4.0])
    plan = engine.build(trt, built, BuildOptions(device="cpu"), {}, say=lambda _: None, error=etsdk.ProgramError, strip=True)
    assert b"\x00\x00\x80?" not in bytes(plan)  # 1.0f: the weights are not in the plan
    found = trt.Runtime(trt.Logger()).deserialize_cuda_engine(plan)
    assert not found.create_execution_context().execute_async_v3(0)  # not refitted: refuses to run
    wrong = _onnx_with_weight(tmp_path / "wrong.onnx", [1.0, 2.0, 3.0])
    with pytest.raises(etsdk.ProgramError, match="method 'm': refitting the weight-stripped engine .* failed: .*weights 'w': count or type differs"):
        engine.refit(trt, found, wrong, error=etsdk.ProgramError, where="method 'm'")
    engine.refit(trt, found, built, error=etsdk.ProgramError, where="method 'm'")
    assert not found._weightless  # the stand-in's record of values still missing


def test_an_index_is_claimed_only_as_a_gather() -> None:
    from etsdk_tensorrt.partitioner import supported
    from executorch.exir import to_edge

    class Pick(torch.nn.Module):
        def forward(self, x: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return x[:, rows, :], x[:, mask, :], x[rows, rows]  # a Gather; a boolean mask; two index tensors

    x, rows, mask = torch.randn(2, 5, 3), torch.tensor([4]), torch.tensor([True, False, True, False, True])
    graph = to_edge(torch.export.export(Pick(), (x, rows, mask))).exported_program().graph
    indexing = [n for n in graph.nodes if n.op == "call_function" and "index" in str(n.target)]
    assert [supported(n) for n in indexing] == [True, False, False], [str(n.target) for n in indexing]
