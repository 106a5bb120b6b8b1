"""OperatorPartitioner: what it claims, and ``max_partitions`` (the largest groups only)."""

from __future__ import annotations

import pytest
import torch
from etsdk import BackendError
from etsdk.backend import OperatorPartitioner, aten_name


class TwoGroups(torch.nn.Module):
    """add, mul, add | floor (never claimed) | mul: a group of three claimable operators, then one of one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x + 1) * 2 + 3
        return torch.floor(y) * 5


def _claimed(partitioner: OperatorPartitioner) -> list[list[str]]:
    from executorch.exir import to_edge

    edge = to_edge(torch.export.export(TwoGroups(), (torch.randn(4),))).exported_program()
    result = partitioner.partition(edge)
    groups: dict[str, list[str]] = {}
    for node in result.tagged_exported_program.graph.nodes:
        tag = node.meta.get("delegation_tag")
        if tag is not None and node.op == "call_function":
            groups.setdefault(tag, []).append(str(aten_name(node.target)).split("::")[1].split(".")[0])
    assert set(groups) == set(result.partition_tags)
    return sorted(groups.values(), key=len, reverse=True)


def test_every_convex_group_by_default_and_the_largest_with_max_partitions() -> None:
    ops = {"aten::add", "aten::mul"}
    assert _claimed(OperatorPartitioner("X", ops=ops)) == [["add", "mul", "add"], ["mul"]]
    assert _claimed(OperatorPartitioner("X", ops=ops, max_partitions=1)) == [["add", "mul", "add"]]
    assert len(_claimed(OperatorPartitioner("X", ops=ops, max_partitions=5))) == 2


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1"])
def test_max_partitions_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(BackendError, match=r"X: max_partitions must be a positive int or None, found"):
        OperatorPartitioner("X", max_partitions=bad)  # type: ignore[arg-type]


class CacheThenRead(torch.nn.Module):
    """A cache write read by a mul; a read-only buffer read by a sub and a mul; the sums never claimed below."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(4, 2))
        self.register_buffer("ro", torch.ones(4, 2))  # read only: state only where the core marks it

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.k.index_copy_(0, positions, x)
        return (self.k * 2).sum() + ((self.ro - x) * self.ro).sum()


def _claimed_ops(partitioner: OperatorPartitioner, mark_ro: bool = False) -> set[str]:
    from etsdk._state.signature import STATE_META
    from executorch.exir import to_edge

    ep = to_edge(torch.export.export(CacheThenRead(), (torch.randn(1, 2), torch.tensor([1])))).exported_program()
    if mark_ro:  # what the core does for every declared state before a partitioner pass
        (placeholder,) = [n for n in ep.graph.nodes if ep.graph_signature.inputs_to_buffers.get(n.name) == "ro"]
        placeholder.meta[STATE_META] = "ro"
    tagged = partitioner.partition(ep).tagged_exported_program
    nodes = [n for n in tagged.graph.nodes if n.op == "call_function" and n.meta.get("delegation_tag")]
    return {str(aten_name(n.target)).split("::")[1].split(".")[0] for n in nodes}


def test_state_claims_all_or_none_claims_a_states_operators_only_together() -> None:
    ops = {"aten::index_put", "aten::sub", "aten::add"}  # not the muls reading the cache and the read-only buffer
    assert _claimed_ops(OperatorPartitioner("X", ops=ops)) == {"index_put", "sub", "add"}
    whole = OperatorPartitioner("X", ops=ops, state_claims="all_or_none")
    assert _claimed_ops(whole) == {"sub", "add"}  # the cache write is left: the mul reading the new cache is not ours
    assert _claimed_ops(whole, mark_ro=True) == {"add"}  # a buffer the core marks as declared state is left the same way
    every = OperatorPartitioner("X", ops=ops | {"aten::mul"}, state_claims="all_or_none")
    assert _claimed_ops(every, mark_ro=True) == {"index_put", "sub", "mul", "add"}


@pytest.mark.parametrize("bad", ["whole", None, True])
def test_state_claims_must_be_a_known_mode(bad: object) -> None:
    with pytest.raises(BackendError, match=r"X: state_claims must be 'per_operator' or 'all_or_none', found"):
        OperatorPartitioner("X", state_claims=bad)  # type: ignore[arg-type]
