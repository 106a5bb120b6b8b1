"""Claims the edge-dialect aten calls the reference runtime can compute with torch."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from etsdk.backends.reference import BACKEND_ID
from etsdk.backends.reference.graph_format import EXTERNAL_DATA_SPEC

#: Operator namespaces the reference runtime can call: aten, and ExecuTorch's
#: dim-order variants of clone / to_copy that edge lowering inserts.
NAMESPACES = frozenset({"aten", "dim_order_ops"})


def aten_name(target: Any) -> str | None:
    """``aten::add.Tensor`` for an aten (or dim_order_ops) / edge op overload, else None."""
    op = getattr(target, "_op", target)
    if isinstance(op, torch._ops.OpOverload) and op.namespace in NAMESPACES:
        return op.name()
    return None


def _matches(name: str, allowed: frozenset[str]) -> bool:
    # "aten::add" allows every overload of add; "aten::add.Tensor" only that one.
    return name in allowed or name.split(".")[0] in allowed


class _Support(OperatorSupportBase):
    def __init__(self, ops: frozenset[str] | None) -> None:
        self.ops = ops

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            return True
        name = aten_name(node.target)
        if name is None:
            return False
        op: Any = getattr(node.target, "_op", node.target)
        if op._schema.is_mutable:
            return False
        return self.ops is None or _matches(name, self.ops)


class ReferencePartitioner(Partitioner):
    """Delegate supported calls to the reference backend.

    ``ops``: aten names to claim (``"aten::linear"`` for every overload, or
    ``"aten::add.Tensor"``); all functional aten calls when omitted.
    ``external_data``: put the partition's constants in ``<external_data>.ptd``
    instead of the ``.pte``. ``backend_id``: tag partitions for another backend
    that reuses this partitioner and serializer with its own runtime binding.
    """

    def __init__(
        self,
        ops: Iterable[str] | None = None,
        external_data: str | None = None,
        backend_id: str = BACKEND_ID,
    ) -> None:
        specs = []
        if external_data:
            specs.append(CompileSpec(EXTERNAL_DATA_SPEC, external_data.encode()))
        self.delegation_spec = DelegationSpec(backend_id, specs)
        self.ops = frozenset(ops) if ops is not None else None

    def partition(self, exported_program: torch.export.ExportedProgram) -> PartitionResult:
        partitioner = CapabilityBasedPartitioner(
            exported_program.graph_module, _Support(self.ops), allows_single_node_partition=True
        )
        tags: dict[str, DelegationSpec] = {}
        for partition in partitioner.propose_partitions():
            if all(n.target is operator.getitem for n in partition.nodes):
                continue
            tag = f"{self.delegation_spec.backend_id}_{partition.id}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)
