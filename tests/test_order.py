"""Binding order is asserted by identity at export and at load, never assumed."""

from __future__ import annotations

from pathlib import Path

import etsdk
import pytest
import torch
from etsdk.backends.reference import BACKEND_ID


class TwoInputs(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a * 2 - b, torch.sin(a) + b * b


EXAMPLE = (torch.randn(2, 8), torch.randn(2, 8))


def _edge() -> object:
    from etsdk.backends.reference.partitioner import ReferencePartitioner
    from etsdk.lowering import backend_details_class
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    backend_details_class(BACKEND_ID)
    exported = torch.export.export(TwoInputs(), EXAMPLE)
    return to_edge_transform_and_lower(
        exported, partitioner=[ReferencePartitioner()], compile_config=EdgeCompileConfig(_check_ir_validity=False)
    )


def _delegate_call(graph_module: torch.fx.GraphModule) -> torch.fx.Node:
    return next(n for n in graph_module.graph.nodes if getattr(n.target, "__name__", "") == "executorch_call_delegate")


def test_signatures_match_the_engine_order() -> None:
    from etsdk.signature import check_binding_order

    gm = _edge().exported_program().graph_module  # type: ignore[attr-defined]
    (record,) = check_binding_order("forward", gm, {BACKEND_ID})
    assert [a.name for a in record.signature.inputs] == ["a", "b"]
    assert [(a.dtype, a.shape) for a in record.signature.outputs] == [("float32", (2, 8))] * 2


def test_permuted_engine_arguments_are_an_export_error() -> None:
    from etsdk.signature import check_binding_order

    gm = _edge().exported_program().graph_module  # type: ignore[attr-defined]
    call = _delegate_call(gm)
    lowered, a, b = call.args
    call.args = (lowered, b, a)  # a buggy pass swapping the delegate's arguments
    with pytest.raises(etsdk.ExportError, match="engine binds arguments \\['b', 'a'\\] but the delegate expects \\['a', 'b'\\]"):
        check_binding_order("forward", gm, {BACKEND_ID})


@pytest.fixture(scope="module")
def pte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("order") / "two.pte"
    etsdk.lower(module=TwoInputs(), example_inputs=EXAMPLE, backend=BACKEND_ID).save(path)
    return path


def _record_span(data: bytes) -> tuple[int, int]:
    """Where the program record's JSON lies in the .pte (not the blob's own signature)."""
    import json

    start = data.index(b'{"format":"etsdk.program"')
    _, length = json.JSONDecoder().raw_decode(data[start:].decode("latin-1"))
    return start, start + length


def test_record_disagreeing_with_delegate_order_is_refused_at_load(pte: Path, tmp_path: Path) -> None:
    program = etsdk.load(pte)
    a, b = EXAMPLE
    torch.testing.assert_close(program.run("forward", a, b)[0], a * 2 - b)
    data = pte.read_bytes()
    start, end = _record_span(data)
    record = data[start:end]
    assert record.count(b'"name":"a"') == 1 and record.count(b'"name":"b"') == 1
    swapped = record.replace(b'"name":"a"', b'"name":"#"').replace(b'"name":"b"', b'"name":"a"').replace(b'"name":"#"', b'"name":"b"')
    bad = tmp_path / "swapped.pte"
    bad.write_bytes(data[:start] + swapped + data[start + len(record) :])
    with pytest.raises(etsdk.ProgramError, match="signature does not match the program record \\(binding order or types differ\\)"):
        etsdk.load(bad).load_method("forward")


def test_arguments_not_matching_the_signature_are_refused_before_the_binding_runs(pte: Path, tmp_path: Path) -> None:
    # Record and blob agree with each other but not with what the runtime binds.
    data = pte.read_bytes()
    assert data.count(b'"name":"a","dtype":"float32","shape":[2,8]') == 2
    bad = tmp_path / "reshaped.pte"
    bad.write_bytes(data.replace(b'"name":"a","dtype":"float32","shape":[2,8]', b'"name":"a","dtype":"float32","shape":[8,2]'))
    program = etsdk.load(bad)
    with pytest.raises(etsdk.ProgramError, match="argument 0 is float32 \\[2, 8\\], the signature binds 'a' float32 \\[8, 2\\]"):
        program.run("forward", *EXAMPLE)
