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
