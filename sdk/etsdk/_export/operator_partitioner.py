"""A partitioner that claims a set of operators: what most backends need, without ExecuTorch's plumbing.

:class:`OperatorPartitioner` tags every supported operator that no earlier
backend of the same method claimed, as convex partitions (one delegate per
partition), with the constants they read. A backend author says *what* it
supports (operator names, or a predicate); the ``DelegationSpec``,
``tag_constant_data`` and ``PartitionResult`` details stay here. Declared state
is tagged by the core, which wraps every partitioner; ``state_claims="all_or_none"``
makes a partial backend claim a state's operators only together.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import get_non_lowered_nodes, tag_constant_data
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from etsdk._export.weight_claims import REFUSED_META
from etsdk._state.signature import STATE_META
from etsdk.errors import BackendError

__all__ = ["OperatorPartitioner", "aten_name", "state_operators"]

#: The values of ``OperatorPartitioner(state_claims=...)`` (see its docstring).
_STATE_CLAIMS = ("per_operator", "all_or_none")

#: Operator namespaces whose overloads have an ``aten::name.overload`` style name (``etsdk``: the quantized-weight
#: operators ``etsdk::linear_q`` and ``etsdk::embedding_q``).
_NAMESPACES = frozenset({"aten", "dim_order_ops", "etsdk"})


def aten_name(target: Any) -> str | None:
    """The operator name ``OperatorPartitioner(ops=...)`` matches, for an aten / dim_order_ops / etsdk overload, else None.

    ``"aten::add.Tensor"`` for ``aten.add.Tensor`` (ATen or edge dialect alike); a *default* overload is spelled
    without ``.default``: ``"aten::relu"`` for ``aten.relu.default``, ``"aten::addmm"`` for ``aten.addmm.default``.
    So in ``ops``, ``"aten::relu"`` claims every overload of ``relu`` (its default one included) and
    ``"aten::relu.default"`` matches nothing; to claim only a default overload, use ``supports``.
    """
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
        if node.op != "call_function" or node not in self.candidates or REFUSED_META in node.meta:
            return False  # REFUSED_META: a quantized weight in a format the backend does not declare
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
    ``state_claims``: ``"per_operator"`` (the default) claims every supported
    operator, state or not; ``"all_or_none"`` is for a partial backend (one
    that computes, say, the linear layers and the cache write but not the
    attention reading the cache). For each state (a buffer the method mutates,
    or one the core marked as declared state) it claims the operators that
    touch it (those reading the state, the write-back computing its new value,
    and those reading that new value) only if it can claim all of them in one
    partition; otherwise it claims none of them and leaves them to the next
    backend of the method, so the state stays in exactly one delegate (the core
    requires it and tags the state there).
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
        state_claims: Literal["per_operator", "all_or_none"] = "per_operator",
    ) -> None:
        super().__init__()
        if max_partitions is not None and (isinstance(max_partitions, bool) or not isinstance(max_partitions, int) or max_partitions < 1):
            raise BackendError(f"{backend_id}: max_partitions must be a positive int or None, found {max_partitions!r}", backend_id=backend_id)
        if state_claims not in _STATE_CLAIMS:
            choices = " or ".join(repr(c) for c in _STATE_CLAIMS)
            raise BackendError(f"{backend_id}: state_claims must be {choices}, found {state_claims!r}", backend_id=backend_id)
        self.backend_id = backend_id
        self.max_partitions = max_partitions
        self.state_claims = state_claims
        self.ops = frozenset(ops) if ops is not None else None
        self.supports = supports
        self.keep_whole = tuple(keep_whole)
        self.state_device = state_device
        specs = [CompileSpec(key, bytes(value)) for key, value in (compile_specs or {}).items()]
        self.delegation_spec = DelegationSpec(backend_id, specs)

    def is_supported(self, node: torch.fx.Node) -> bool:
        """Whether this backend would claim ``node`` (a ``call_function``): never a mutating operator, then
        ``ops`` (matched by :func:`aten_name`), then ``supports``. Override for a rule of your own."""
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
        """ExecuTorch's partitioner entry point: tags the claimed convex groups and the constants they read.

        Only operators no earlier backend of the method claimed are candidates; the core wraps this (node
        identities, state tagging, checks), so a subclass should not need to override it.
        """
        candidates = set(get_non_lowered_nodes(exported_program.graph))
        groups = self._groups(exported_program, candidates)
        if self.state_claims == "all_or_none":
            groups = self._whole_states(exported_program, candidates, groups)
        tags: dict[str, DelegationSpec] = {}
        for partition in groups:
            tag = f"{self.backend_id}_{partition.id}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    def _groups(self, ep: torch.export.ExportedProgram, candidates: set[torch.fx.Node]) -> list[Any]:
        support = _Support(candidates, self.is_supported)
        proposer = CapabilityBasedPartitioner(ep.graph_module, support, allows_single_node_partition=True)
        groups = [p for p in proposer.propose_partitions() if any(n.target is not operator.getitem for n in p.nodes)]
        if self.max_partitions is not None:
            groups = sorted(groups, key=lambda p: -sum(n.target is not operator.getitem for n in p.nodes))
            groups = groups[: self.max_partitions]
        return groups

    def _whole_states(self, ep: torch.export.ExportedProgram, candidates: set[torch.fx.Node], groups: list[Any]) -> list[Any]:
        # A state whose operators would be claimed only in part (or across partitions) is left out whole and the
        # partitions proposed again without its operators; leaving one out may split another, hence the loop
        # (it ends: each round leaves out at least one more state).
        touching = state_operators(ep)
        left_out: set[str] = set()
        while True:
            group_of = {node: i for i, group in enumerate(groups) for node in group.nodes}
            split = [
                fqn
                for fqn, nodes in touching.items()
                if fqn not in left_out and any(n in group_of for n in nodes) and len({group_of.get(n) for n in nodes}) > 1
            ]
            if not split:
                return groups
            left_out.update(split)
            excluded = {node for fqn in left_out for node in touching[fqn]}
            groups = self._groups(ep, candidates - excluded)

    def ops_to_not_decompose(self, ep: torch.export.ExportedProgram) -> tuple[list[Any], None]:
        """The ``keep_whole`` operators present in ``ep``: what ExecuTorch must not decompose for this backend."""
        keep = {n.target for n in ep.graph.nodes if n.op == "call_function" and n.target in self.keep_whole}
        return sorted(keep, key=str), None


def state_operators(ep: torch.export.ExportedProgram) -> dict[str, set[torch.fx.Node]]:
    """Buffer fqn -> the operators touching that state: a buffer the method mutates or one the core marked.

    The operators are those the core requires in the state's one delegate: the readers of the state, the
    operators computing its new value (the write-back), and the readers of that new value.
    """
    signature = ep.graph_signature
    buffers = signature.inputs_to_buffers
    mutated = set(signature.buffers_to_mutate.values())
    output = next(n for n in ep.graph.nodes if n.op == "output")
    produced = dict(zip([s.arg.name for s in signature.output_specs], output.args[0]))
    updates: dict[str, list[torch.fx.Node]] = {}
    for out_name, fqn in signature.buffers_to_mutate.items():
        value = produced.get(out_name)
        if isinstance(value, torch.fx.Node):
            updates.setdefault(fqn, []).append(value)
    found: dict[str, set[torch.fx.Node]] = {}
    for node in ep.graph.nodes:
        fqn = buffers.get(node.name) if node.op == "placeholder" else None
        if fqn is None or (fqn not in mutated and STATE_META not in node.meta):
            continue
        nodes = found.setdefault(fqn, set())
        nodes.update(u for u in node.users if u.op == "call_function")
        for value in updates.get(fqn, []):
            if value.op == "call_function":
                nodes.add(value)
            nodes.update(u for u in value.users if u.op == "call_function")
    return found
