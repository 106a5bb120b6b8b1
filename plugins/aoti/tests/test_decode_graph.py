"""A decode step reads every weight in place: the graph etsdk-aoti hands AOTInductor has no per-call weight copy.

Edge lowering writes ``linear`` as ``permute_copy(weight)`` + ``mm`` and transformers widens the key / value
cache to the query heads (``repeat_kv``) on every call; compiled as is, a decode step copies every weight matrix
and every cache (issue 13: three times the weight traffic). ``prepare_graph`` must leave none of that, and must
not change what the graph computes. Runs on the edge program of a tiny transformers Llama (no compile).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from etsdk_aoti.serializer import _copy_to_view_targets, _op_name, prepare_graph  # noqa: E402
from etsdk_aoti.testing import static_cache_module, tiny_llama  # noqa: E402

CAPACITY, LAYERS = 32, 2
LAYOUT_COPIES = {"permute_copy", "t_copy", "transpose_copy", "expand_copy", "clone", "_clone_dim_order", "view_copy"}
VIEWS = {"permute", "t", "transpose", "expand", "unsqueeze", "squeeze", "reshape", "view", "_unsafe_view"}


def _edge_decode() -> tuple[object, dict[str, torch.Tensor]]:
    from executorch.exir import EdgeCompileConfig, to_edge

    module = static_cache_module(tiny_llama(capacity=CAPACITY, layers=LAYERS, heads=4, kv_heads=2), CAPACITY)
    example = {"input_ids": torch.tensor([[3]]), "cache_position": torch.tensor([4])}
    exported = torch.export.export(module, (), example, strict=True)  # as etsdk.lower exports it
    config = EdgeCompileConfig(_check_ir_validity=False, preserve_ops=[torch.ops.aten.scaled_dot_product_attention.default])
    return to_edge(exported, compile_config=config).exported_program(), example


def _weight_copies(program: object, weights: set[str]) -> list[str]:
    """Layout copies whose input is a weight, directly or through views: each is a per-call copy of that weight."""
    in_place = {n for n in program.graph.nodes if n.op == "placeholder" and n.name in weights}
    copies = []
    for node in program.graph.nodes:
        if node.op != "call_function" or not node.args or node.args[0] not in in_place:
            continue
        if _op_name(node) in VIEWS:
            in_place.add(node)
        elif _op_name(node) in LAYOUT_COPIES:
            copies.append(f"{node.name} ({_op_name(node)} of {node.args[0].name})")
    return copies


def test_decode_reads_weights_and_grouped_heads_in_place() -> None:
    program, example = _edge_decode()
    signature = program.graph_signature
    weights = set(signature.inputs_to_parameters)
    with torch.no_grad():
        want = program.module()(**example)
    before = _weight_copies(program, weights)
    # 7 projections per layer and the (tied) output head: the problem this guards against exists upstream
    assert len(before) >= 7 * LAYERS + 1, before
    prepared = prepare_graph(program.graph_module, weights)
    assert _weight_copies(program, weights) == []
    assert prepared.weight_copies_to_views >= 7 * LAYERS + 1
    attentions = [n for n in program.graph.nodes if _op_name(n) == "scaled_dot_product_attention"]
    assert len(attentions) == LAYERS and prepared.grouped_attentions == LAYERS
    for node in attentions:
        assert node.kwargs.get("enable_gqa") is True
        for kv in node.args[1:3]:  # the cache rows themselves, not a copy widened to the query heads
            assert _op_name(kv) not in ("expand_copy", "expand", "clone", "view_copy", "view"), kv.name
    with torch.no_grad():
        got = program.module()(**example)  # the same position again: the cache writes are idempotent
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert set(_copy_to_view_targets())  # the table the pass uses exists on this ExecuTorch


def test_an_output_that_is_a_weight_view_keeps_its_copy() -> None:
    """An output must never alias a weight (the runtime hands it to the caller): its copy stays."""
    from executorch.exir import EdgeCompileConfig, to_edge

    class Transposed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(3, 5))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x @ self.weight.t(), self.weight.t()

    program = to_edge(torch.export.export(Transposed(), (torch.randn(2, 5),)), compile_config=EdgeCompileConfig()).exported_program()
    weights = set(program.graph_signature.inputs_to_parameters)
    prepare_graph(program.graph_module, weights)
    outputs = next(n for n in program.graph.nodes if n.op == "output").args[0]
    assert _op_name(outputs[1]) in LAYOUT_COPIES, outputs[1].name


def test_state_becomes_an_input_updated_in_place_even_without_other_inputs() -> None:
    """A partition fed by state alone (no engine input) still gets its state as inputs, written in place."""
    from etsdk.backend import StateBinding
    from etsdk_aoti.serializer import state_as_inputs

    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("count", torch.zeros((), dtype=torch.int64))

        def forward(self) -> torch.Tensor:
            self.count.add_(1)
            return self.count * 2

    module = torch.export.export(Counter(), ()).module()
    binding = StateBinding(placeholder="b_count", fqn="count", state="c", dtype="int64", shape=(), written=True)
    module = state_as_inputs(module, [binding])
    assert "count" not in dict(module.named_buffers())
    caller_owned = torch.tensor(5)
    assert int(module(caller_owned)) == 12 and int(caller_owned) == 6  # read from and written to the caller's tensor
