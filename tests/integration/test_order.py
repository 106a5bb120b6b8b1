"""Binding order is asserted by identity at export and at load, never assumed."""

from __future__ import annotations

import json
from pathlib import Path

import etsdk
import pytest
import torch
from etsdk.reference_backend import BACKEND_ID


class TwoInputs(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a * 2 - b, torch.sin(a) + b * b


EXAMPLE = (torch.randn(2, 8), torch.randn(2, 8))


def _edge() -> tuple[object, object]:
    """The reference backend's lowering of TwoInputs, through the core's partitioner wrapper."""
    from etsdk._export.core_partitioner import CorePartitioner, LoweringContext, backend_details_class
    from etsdk.reference_backend.partitioner import ReferencePartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    backend_details_class(BACKEND_ID)
    context = LoweringContext()
    wrapper = CorePartitioner(ReferencePartitioner(), BACKEND_ID, "forward", context)
    context.partitioners["forward"] = [wrapper]
    exported = torch.export.export(TwoInputs(), EXAMPLE)
    with context.current():
        edge = to_edge_transform_and_lower(
            {"forward": exported},
            partitioner={"forward": [wrapper.partitioner]},
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        )
    return edge, context


def _delegate_call(graph_module: torch.fx.GraphModule) -> torch.fx.Node:
    return next(n for n in graph_module.graph.nodes if getattr(n.target, "__name__", "") == "executorch_call_delegate")


def test_signatures_match_the_engine_order() -> None:
    from etsdk._state.signature import check_binding_order

    edge, context = _edge()
    gm = edge.exported_program("forward").graph_module  # type: ignore[attr-defined]
    (record,) = check_binding_order("forward", gm, context.sealed)  # type: ignore[attr-defined]
    assert [a.name for a in record.signature.inputs] == ["a", "b"]
    assert [(a.dtype, a.shape) for a in record.signature.outputs] == [("float32", (2, 8))] * 2
    assert dict(record.signature.operators)["aten::mul.Tensor"] == 2


def test_permuted_engine_arguments_are_an_export_error() -> None:
    from etsdk._state.signature import check_binding_order

    edge, context = _edge()
    gm = edge.exported_program("forward").graph_module  # type: ignore[attr-defined]
    call = _delegate_call(gm)
    lowered, a, b = call.args
    call.args = (lowered, b, a)  # a buggy pass swapping the delegate's arguments
    with pytest.raises(etsdk.ExportError, match="engine binds arguments \\['b', 'a'\\] but the delegate expects \\['a', 'b'\\]"):
        check_binding_order("forward", gm, context.sealed)  # type: ignore[attr-defined]


def test_same_shaped_arguments_from_other_nodes_are_refused_by_identity() -> None:
    """Names and shapes can agree while the nodes differ: identity is what is checked."""
    from etsdk._state.signature import NODE_ID_META, check_binding_order

    edge, context = _edge()
    gm = edge.exported_program("forward").graph_module  # type: ignore[attr-defined]
    call = _delegate_call(gm)
    lowered, a, b = call.args
    with gm.graph.inserting_before(call):
        impostor = gm.graph.call_function(torch.ops.aten.clone.default, (a,))
    impostor.name = "a_clone"
    impostor.meta = {"val": a.meta["val"], NODE_ID_META: "someone-else"}
    call.args = (lowered, impostor, b)
    with pytest.raises(etsdk.ExportError, match="first difference at position 0"):
        check_binding_order("forward", gm, context.sealed)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def pte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("order") / "two.pte"
    etsdk.lower(module=TwoInputs(), example_inputs=EXAMPLE, backend=BACKEND_ID).save(path)
    return path


def _record_span(data: bytes) -> tuple[int, int]:
    start = data.index(b'{"format":"etsdk.program"')
    _, length = json.JSONDecoder().raw_decode(data[start:].decode("latin-1"))
    return start, start + length


def test_a_record_edited_after_export_is_refused_at_load(pte: Path, tmp_path: Path) -> None:
    program = etsdk.load(pte)
    a, b = EXAMPLE
    torch.testing.assert_close(program.run("forward", a, b)[0], a * 2 - b)
    data = pte.read_bytes()
    start, end = _record_span(data)
    record = data[start:end]
    assert record.count(b'"name":"a"') == 1 and record.count(b'"name":"b"') == 1
    swapped = record.replace(b'"name":"a"', b'"name":"#"').replace(b'"name":"b"', b'"name":"a"').replace(b'"name":"#"', b'"name":"b"')
    bad = tmp_path / "swapped.pte"
    bad.write_bytes(data[:start] + swapped + data[end:])
    with pytest.raises(etsdk.IntegrityError, match="named data 'etsdk/program/[0-9a-f]{64}' .* is damaged"):
        etsdk.load(bad)  # the default load hashes every entry, the record's own among them
    # behind the hashes (verify=False), the delegate's record entry is checked against its uid
    with pytest.raises(etsdk.ProgramError, match="program record's entry for this delegate was altered"):
        etsdk.load(bad, verify=False).load_method("forward")


def test_arguments_not_matching_the_signature_are_refused_before_the_binding_runs(pte: Path, tmp_path: Path) -> None:
    """A consistent record (uid recomputed) that disagrees with what the runtime binds: the first call refuses."""
    from etsdk._state.signature import DelegateSignature

    data = pte.read_bytes()
    start, end = _record_span(data)
    obj = json.loads(data[start:end])
    signature = obj["methods"]["forward"][0]["signature"]
    old_uid = signature["uid"]
    signature["inputs"][0]["shape"] = [8, 2]
    new_uid = DelegateSignature.from_json(signature, "test").computed_uid()
    signature["uid"] = new_uid
    new_record = json.dumps(obj, separators=(",", ":")).encode()
    assert len(new_record) == end - start
    patched = (data[:start] + new_record + data[end:]).replace(old_uid.encode(), new_uid.encode())
    bad = tmp_path / "reshaped.pte"
    bad.write_bytes(patched)
    with pytest.raises(etsdk.IntegrityError, match="is damaged"):
        etsdk.load(bad)
    program = etsdk.load(bad, verify=False)  # a record edited consistently, behind the hashes
    with pytest.raises(etsdk.ProgramError, match="argument 0 is float32 \\[2, 8\\], the signature binds 'a' float32 \\[8, 2\\]"):
        program.run("forward", *EXAMPLE)


def test_a_flipped_payload_byte_is_refused_before_the_backend_parses_it(pte: Path, tmp_path: Path) -> None:
    data = bytearray(pte.read_bytes())
    at = data.index(b'"nodes":[') + 12  # inside the reference backend's graph JSON
    data[at] ^= 0x01
    bad = tmp_path / "flipped.pte"
    bad.write_bytes(bytes(data))
    with pytest.raises(etsdk.ProgramError, match="payload is corrupted"):
        etsdk.load(bad).load_method("forward")
