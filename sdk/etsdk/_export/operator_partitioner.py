"""A partitioner that claims a set of operators: what most backends need, without ExecuTorch's plumbing.

:class:`OperatorPartitioner` tags every supported operator that no earlier
backend of the same method claimed, as convex partitions (one delegate per
partition), with the constants they read. A backend author says *what* it
supports (operator names, or a predicate); the ``DelegationSpec``,
``tag_constant_data`` and ``PartitionResult`` details stay here. Declared state
is tagged by the core, which wraps every partitioner.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import get_non_lowered_nodes, tag_constant_data
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from etsdk.errors import BackendError

__all__ = ["OperatorPartitioner", "aten_name"]

#: Operator namespaces whose overloads have an ``aten::name.overload`` style name.
_NAMESPACES = frozenset({"aten", "dim_order_ops"})


def aten_name(target: Any) -> str | None:
    """``"aten::add.Tensor"`` for an aten / dim_order_ops (edge) operator overload, else None."""
    op = target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", None)
    if isinstance(op, torch._ops.OpOverload) and op.namespace in _NAMESPACES:
        return op.name()
    return None


def _matches(name: str, allowed: frozenset[str]) -> bool:
    # "aten::add" allows every overload of add; "aten::add.Tensor" only that one.
    return name in allowed or name.split(".")[0] in allowed


class _Support(OperatorSupportBase):
    def __init__(self, candidates: set[torch.fx.Node], accept: Callable[[torch.fx.Node], bool]) -> None:
        self.candidates = candidates
        self.accept = accept

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node not in self.candidates:
            return False
        if node.target is operator.getitem:
            return True
        return self.accept(node)


class OperatorPartitioner(Partitioner):
    """Claims supported operators for ``backend_id``.

    ``ops``: operator names to claim (``"aten::linear"`` for every overload,
    ``"aten::add.Tensor"`` for one); ``supports(node)``: a predicate instead of (or
    on top of) ``ops``; neither: every operator not claimed yet. Mutating
    operators are never claimed (export has functionalised the graph).
    ``keep_whole``: operators to keep out of ExecuTorch's decompositions because
    the backend computes them better whole (the core keeps them whole for every
    backend of the method, and refuses an export where nobody claims one).
    ``compile_specs``: key -> bytes handed to ``preprocess`` as
    ``partition.compile_specs``. ``state_device``: where caller-owned state must
    live for this backend (the core records it in the program's contract).
    ``max_partitions``: claim at most this many convex groups per method, the
    largest (most operators) first; the rest stay for later backends or the
    portable kernels (a backend that builds one engine per method: 1).
    """

    def __init__(
        self,
        backend_id: str,
        *,
        ops: Iterable[str] | None = None,
        supports: Callable[[torch.fx.Node], bool] | None = None,
        keep_whole: Iterable[Any] = (),
        compile_specs: Mapping[str, bytes] | None = None,
        state_device: str = "cpu",
        max_partitions: int | None = None,
    ) -> None:
        super().__init__()
        if max_partitions is not None and (isinstance(max_partitions, bool) or not isinstance(max_partitions, int) or max_partitions < 1):
            raise BackendError(f"{backend_id}: max_partitions must be a positive int or None, found {max_partitions!r}", backend_id=backend_id)
        self.backend_id = backend_id
        self.max_partitions = max_partitions
        self.ops = frozenset(ops) if ops is not None else None
        self.supports = supports
        self.keep_whole = tuple(keep_whole)
        self.state_device = state_device
        specs = [CompileSpec(key, bytes(value)) for key, value in (compile_specs or {}).items()]
        self.delegation_spec = DelegationSpec(backend_id, specs)

    def is_supported(self, node: torch.fx.Node) -> bool:
        op: Any = getattr(node.target, "_op", node.target)
        schema = getattr(op, "_schema", None)
        if schema is not None and schema.is_mutable:
            return False
        if self.ops is not None:
            name = aten_name(node.target)
            if name is None or not _matches(name, self.ops):
                return False
        return self.supports(node) if self.supports is not None else True

    def partition(self, exported_program: torch.export.ExportedProgram) -> PartitionResult:
        candidates = set(get_non_lowered_nodes(exported_program.graph))
        support = _Support(candidates, self.is_supported)
        proposer = CapabilityBasedPartitioner(exported_program.graph_module, support, allows_single_node_partition=True)
        groups = [p for p in proposer.propose_partitions() if any(n.target is not operator.getitem for n in p.nodes)]
        if self.max_partitions is not None:
            groups = sorted(groups, key=lambda p: -sum(n.target is not operator.getitem for n in p.nodes))
            groups = groups[: self.max_partitions]
        tags: dict[str, DelegationSpec] = {}
        for partition in groups:
            tag = f"{self.backend_id}_{partition.id}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    def ops_to_not_decompose(self, ep: torch.export.ExportedProgram) -> tuple[list[Any], None]:
        keep = {n.target for n in ep.graph.nodes if n.op == "call_function" and n.target in self.keep_whole}
        return sorted(keep, key=str), None
