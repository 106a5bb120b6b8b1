"""Export-time delegation: the core's wrapper around every plugin partitioner and preprocess.

ExecuTorch finds a backend's ``preprocess`` by the *class name* of a
``BackendDetails`` subclass equal to the backend id. For each plugin backend
used, etsdk creates that class once per process; its ``preprocess`` builds an
:class:`etsdk._export.partition.Partition`, calls the plugin, seals the signature (the
payload's hash and the delegate's uid) and wraps the payload. Plugins never
subclass ExecuTorch internals themselves.

Every plugin partitioner is wrapped by :class:`CorePartitioner`, which

* stamps an identity on every node before the plugin sees the graph (binding
  order is later checked by identity across partitioner passes);
* checks what the plugin tagged (its own backend id only);
* marks each declared state's buffer placeholder (``STATE_META``: the state
  identity) before the plugin sees the graph, so an ``OperatorPartitioner``
  with ``state_claims="all_or_none"`` knows every state, not only the mutated;
* marks each quantized-weight call whose format the backend does not declare
  (``BackendSpec.weight_formats``), and refuses a result that claims one
  (:mod:`etsdk._export.weight_claims`);
* tags declared state into the one delegate that reads and writes it, in
  whichever pass that delegate is claimed, and refuses a state split across
  delegates or updated outside its delegate, naming the operators and both
  fixes (claim the rest in this backend, or leave the state's operators to one
  other backend);
* answers ``ops_to_not_decompose`` with the union of every backend of the
  method, so one backend's kept-whole operators survive the next backend's
  decompositions.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from etsdk._channels import EXPORT_HOOKS, LOWERING
from etsdk._export.partition import StoredWeights
from etsdk._export.weight_claims import check_claims, mark_refusals
from etsdk._format.envelope import wrap_blob
from etsdk._state.signature import NODE_ID_META, STATE_META, DelegateSignature, input_sources, operator_name
from etsdk.errors import EtsdkError, ExportError

__all__ = ["CorePartitioner", "LoweringContext", "backend_details_class", "current_lowering", "export_hooks"]

_details_lock = threading.Lock()
_details_classes: dict[str, type] = {}

#: ``transform(backend_id, method, payload) -> payload``: applied before the payload is sealed.
PayloadTransform = Callable[[str, str, bytes], bytes]
#: ``observe(partition, sealed_signature, payload)``: called for each sealed delegate.
DelegateObserver = Callable[[Any, DelegateSignature, bytes], None]


@contextmanager
def export_hooks(
    *, transform: PayloadTransform | None = None, observe: DelegateObserver | None = None
) -> Iterator[None]:
    """Hooks for tools and tests (the conformance kit): every ``etsdk.lower`` on this thread uses them."""
    with EXPORT_HOOKS.bound((*(EXPORT_HOOKS.get() or ()), (transform, observe))):
        yield


@dataclass
class LoweringContext:
    """What one ``etsdk.lower`` call shares with its partitioners and preprocess calls (one thread)."""

    quiet: bool = True
    started: float = field(default_factory=time.perf_counter)
    external_data: str | None = None
    states: dict[str, dict[str, str]] = field(default_factory=dict)  # method -> {buffer fqn: state identity}
    slots: dict[str, dict[str, int]] = field(default_factory=dict)  # method -> {buffer fqn: slot}, slots > 0 only
    partitioners: dict[str, list[CorePartitioner]] = field(default_factory=dict)  # method -> wrappers, in order
    sealed: dict[str, tuple[str, DelegateSignature, tuple[str | None, ...]]] = field(default_factory=dict)
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)  # method -> operators kept whole (seen at decomposition)
    transforms: list[PayloadTransform] = field(default_factory=list)
    observers: list[DelegateObserver] = field(default_factory=list)
    #: node id -> why each backend that saw a quantized call could not claim it (etsdk._export.weight_claims)
    weight_refusals: dict[str, list[str]] = field(default_factory=dict)
    #: named-data key -> BLAKE3 hex of its bytes, from every delegate's writer (the program record keeps them)
    fast_digests: dict[str, str] = field(default_factory=dict)
    #: weights every delegate's writer has stored, so a weight read by several delegates is read and spooled once
    stored_weights: StoredWeights = field(default_factory=StoredWeights)
    _next_id: int = 0

    def __post_init__(self) -> None:
        for transform, observe in EXPORT_HOOKS.get() or ():
            if transform is not None:
                self.transforms.append(transform)
            if observe is not None:
                self.observers.append(observe)

    def progress(self, stage: str) -> None:
        if not self.quiet:
            print(f"etsdk: {stage} ({time.perf_counter() - self.started:.1f}s)", file=sys.stderr, flush=True)

    def node_id(self) -> str:
        self._next_id += 1
        return f"n{self._next_id}"

    def kept_whole(self, method: str, ep: Any) -> list[Any]:
        """The union of every partitioner's ``ops_to_not_decompose`` for ``method``."""
        ops: dict[str, Any] = {}
        for wrapper in self.partitioners.get(method, []):
            for op in wrapper.inner_ops_to_not_decompose(ep):
                ops.setdefault(str(op), op)
        return [ops[k] for k in sorted(ops)]

    @contextmanager
    def current(self) -> Iterator[LoweringContext]:
        """This lowering is the one the partitioner wrappers and preprocess calls on this thread see."""
        with LOWERING.bound(self):
            yield self


def current_lowering() -> LoweringContext:
    context: LoweringContext | None = LOWERING.get()
    if context is None:
        raise ExportError(
            "an etsdk backend was asked to preprocess outside etsdk.lower(); export with etsdk.lower so the core "
            "can build the partition's signature and named data"
        )
    return context


class CorePartitioner:
    """Wraps one plugin partitioner for one method (see the module docstring)."""

    def __init__(self, inner: Any, backend_id: str, method: str, context: LoweringContext) -> None:
        from executorch.exir.backend.partitioner import Partitioner

        self.inner = inner
        self.backend_id = backend_id
        self.method = method
        self.context = context
        wrapper = self

        class _Wrapped(Partitioner):
            def partition(self, exported_program: Any) -> Any:
                return wrapper.partition(exported_program)

            def ops_to_not_decompose(self, ep: Any) -> Any:
                ops = wrapper.context.kept_whole(wrapper.method, ep)
                wrapper.context.kept.setdefault(wrapper.method, {}).update((str(op), op) for op in ops)
                return ops, None

        self.partitioner = _Wrapped()

    @property
    def weight_formats(self) -> tuple[str, ...]:
        """The quantized weight formats the backend declares (``BackendSpec.weight_formats``)."""
        from etsdk._plugins.registry import get_backend

        try:
            return get_backend(self.backend_id).weight_formats
        except EtsdkError:
            return ()

    @property
    def state_device(self) -> str:
        return str(getattr(self.inner, "state_device", "cpu"))

    def inner_ops_to_not_decompose(self, ep: Any) -> list[Any]:
        found = self.inner.ops_to_not_decompose(ep)
        ops = found[0] if isinstance(found, tuple) else found
        return list(ops or [])

    def partition(self, exported_program: Any) -> Any:
        from executorch.exir.backend.partitioner import PartitionResult

        states = self.context.states.get(self.method, {})
        buffers = exported_program.graph_signature.inputs_to_buffers
        for node in exported_program.graph.nodes:
            if NODE_ID_META not in node.meta:
                node.meta[NODE_ID_META] = self.context.node_id()
            if node.op == "placeholder" and buffers.get(node.name) in states:
                node.meta[STATE_META] = states[buffers[node.name]]
        where = f"method '{self.method}', backend '{self.backend_id}'"
        mark_refusals(exported_program, self.backend_id, self.weight_formats, self.context.weight_refusals)
        try:
            result = self.inner.partition(exported_program)
        except EtsdkError:
            raise
        except Exception as exc:
            raise ExportError(f"{where}: the partitioner raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(result, PartitionResult):
            raise ExportError(f"{where}: the partitioner returned {type(result).__name__}, expected a PartitionResult")
        check_claims(exported_program, result.partition_tags, where)
        wrong = sorted({spec.backend_id for spec in result.partition_tags.values()} - {self.backend_id})
        if wrong:
            raise ExportError(
                f"{where}: the partitioner tagged partitions for backend id(s) {', '.join(wrong)}; a backend's "
                f"partitioner may only tag its own id '{self.backend_id}' (BackendSpec.id)"
            )
        if self.context.partitioners[self.method][0] is self:  # the first pass sees the functional graph whole
            check_mutations_declared(self.method, exported_program.graph_signature.buffers_to_mutate.values(), states)
        if states:
            self._tag_state(exported_program, result, states, where)
        return result

    def _tag_state(self, ep: Any, result: Any, states: Mapping[str, str], where: str) -> None:
        signature = ep.graph_signature
        buffers = signature.inputs_to_buffers
        output = next(n for n in ep.graph.nodes if n.op == "output")
        produced = dict(zip([s.arg.name for s in signature.output_specs], output.args[0]))
        updates: dict[str, list[Any]] = {}
        for out_name, fqn in signature.buffers_to_mutate.items():
            updates.setdefault(fqn, []).append(produced[out_name])
        ours = set(result.partition_tags)
        for node in ep.graph.nodes:
            if node.op != "placeholder" or buffers.get(node.name) not in states:
                continue
            fqn = buffers[node.name]
            identity = states[fqn]
            users = list(node.users)
            tags = {u.meta.get("delegation_tag") for u in users}
            if not users or tags == {None}:
                continue  # not claimed in this pass: a later backend may claim it
            claimed = tags & ours
            inside = sorted(u.name for u in users if u.meta.get("delegation_tag") in claimed)
            outside = sorted(u.name for u in users if u.meta.get("delegation_tag") not in claimed)
            if outside or len(claimed) != 1:
                split = f"{outside} are outside it" if outside else f"they fall into {len(claimed)} delegates"
                raise ExportError(
                    f"{where}: state '{identity}' (buffer '{fqn}') must be read and written by one delegate; this "
                    f"backend claimed {inside} but {split}. Claim every operator that uses a state in one backend: "
                    f"either claim those here too, or claim none of them here{_WHOLE_STATE_HINT}"
                )
            tag = next(iter(claimed))
            for value in updates.get(fqn, []):
                if getattr(value, "meta", {}).get("delegation_tag") != tag:
                    raise ExportError(
                        f"{where}: state '{identity}' (buffer '{fqn}') is read inside a delegate of this backend but "
                        f"updated outside it (by '{getattr(value, 'name', value)}'); the update must be claimed by "
                        f"the same delegate: either claim it here too, or claim none of the state's operators "
                        f"here{_WHOLE_STATE_HINT}"
                    )
                readers = sorted(u.name for u in value.users if u.op != "output" and u.meta.get("delegation_tag") != tag)
                if readers:
                    raise ExportError(
                        f"{where}: the new value of state '{identity}' (buffer '{fqn}') is read outside its delegate "
                        f"by {readers}; the core updates state in place inside one delegate, so the state's operators "
                        f"must stay together in one backend. Either claim those readers in this backend too, or do "
                        f"not claim the state's write here{_WHOLE_STATE_HINT}"
                    )
            node.meta["delegation_tag"] = tag


#: How a partial backend leaves a state's operators to one other backend (ends the three state-split errors).
_WHOLE_STATE_HINT = (
    " (a partial backend: OperatorPartitioner(..., state_claims=\"all_or_none\") claims a state's operators only "
    "when it can claim every one of them, and otherwise leaves them all to the next backend of the method)"
)


def check_mutations_declared(method: str, mutated: Iterable[str], declared: Mapping[str, str]) -> None:
    """The one undeclared-mutation check: every buffer a method mutates must be declared state.

    Run on the functional graph (in-place ops turned into mutation outputs), before anything is delegated.
    """
    undeclared = sorted(set(mutated) - set(declared))
    if undeclared:
        raise ExportError(
            f"method '{method}' mutates buffer(s) {', '.join(undeclared)} that are not declared as state; map each "
            "to a state identity of a contract: MethodSource(state={fqn: identity})"
        )


def _preprocess(backend_id: str, method: str, edge_program: Any, compile_specs: Sequence[Any]) -> Any:
    from executorch.exir.backend.backend_details import PreprocessResult

    from etsdk._export.partition import NamedDataWriter, Partition
    from etsdk._format.blob import BlobWriter
    from etsdk._plugins.registry import get_backend

    context = current_lowering()
    where = f"method '{method}', backend '{backend_id}'"
    signature = DelegateSignature.from_edge_program(edge_program, context.states.get(method, {}), context.slots.get(method))
    writer = NamedDataWriter(backend_id, external=context.external_data, stored=context.stored_weights)
    partition = Partition(
        backend_id=backend_id,
        method=method,
        program=edge_program,
        signature=signature,
        compile_specs={spec.key: bytes(spec.value) for spec in compile_specs},
        named_data=writer,
        reporter=context.progress,
    )
    nodes = sum(1 for n in edge_program.graph.nodes if n.op == "call_function")
    context.progress(f"compiling a {nodes}-operator partition of '{method}' with {backend_id}")
    spec = get_backend(backend_id)
    try:
        payload = spec.preprocess(partition)
    except EtsdkError:
        raise
    except Exception as exc:
        raise ExportError(f"{where}: preprocess raised {type(exc).__name__}: {exc}{_availability_hint(backend_id)}") from exc
    if isinstance(payload, BlobWriter):
        payload = payload.to_bytes()
    elif isinstance(payload, (bytearray, memoryview)):
        payload = bytes(payload)
    if not isinstance(payload, bytes):
        raise ExportError(f"{where}: preprocess returned {type(payload).__name__}, expected bytes or an etsdk.BlobWriter")
    for transform in context.transforms:
        payload = transform(backend_id, method, payload)
    sealed = signature.sealed(payload)
    context.sealed[sealed.uid] = (backend_id, sealed, input_sources(edge_program))
    context.fast_digests.update(writer.fast_digests)
    for observe in context.observers:
        observe(partition, sealed, payload)
    return PreprocessResult(processed_bytes=wrap_blob(payload, sealed.uid), data_store_output=writer.output())


def _availability_hint(backend_id: str) -> str:
    from etsdk._plugins.registry import backend_availability

    availability = backend_availability(backend_id)
    if availability is None or availability.available:
        return ""
    return f" (the backend reports it cannot run on this machine: {availability.reason})"


def backend_details_class(backend_id: str) -> type:
    """The ``BackendDetails`` subclass ExecuTorch will look up for ``backend_id`` (created once per process)."""
    from executorch.exir.backend.backend_details import BackendDetails

    with _details_lock:
        found = _details_classes.get(backend_id)
        if found is not None:
            return found
        for existing in BackendDetails.__subclasses__():
            if existing.__name__ == backend_id:
                raise ExportError(
                    f"backend id '{backend_id}' is already defined by {existing.__module__}.{existing.__qualname__}; "
                    "an etsdk plugin cannot reuse a backend id ExecuTorch already has"
                )

        def preprocess(edge_program: Any, compile_specs: list[Any]) -> Any:
            # ExecuTorch's own lowering calls preprocess_multimethod (below), which knows the method.
            return _preprocess(backend_id, "", edge_program, compile_specs)

        def preprocess_multimethod(cls: type, edge_programs: dict[str, list[Any]], compile_specs: dict[str, list[Any]]) -> Any:
            out: dict[str, list[Any]] = {}
            for method, programs in edge_programs.items():
                specs = compile_specs[method]
                if len(specs) != len(programs):
                    raise ExportError(f"method '{method}': {len(programs)} partitions but {len(specs)} compile-spec lists")
                out[method] = [_preprocess(backend_id, method, p, s) for p, s in zip(programs, specs)]
            return out

        def copy_for_preprocess(cls: type, edge_program: Any, compile_specs: list[Any]) -> Any:
            # ExecuTorch deep-copies every partition before preprocess; copying the
            # weights too would hold a second model-sized copy during export. Plugins
            # may change the graph they are given but never its tensors, so the copy
            # shares them.
            import copy

            import torch

            tensors = [*edge_program.state_dict.values(), *edge_program.constants.values()]
            memo = {id(t): t for t in tensors if isinstance(t, torch.Tensor)}
            return copy.deepcopy(edge_program, memo)

        cls = type(
            backend_id,
            (BackendDetails,),
            {
                "preprocess": staticmethod(preprocess),
                "preprocess_multimethod": classmethod(preprocess_multimethod),
                "copy_exported_program_for_preprocess": classmethod(copy_for_preprocess),
                "__module__": __name__,
                "__doc__": f"etsdk backend {backend_id}",
            },
        )
        _details_classes[backend_id] = cls
        return cls


def kept_whole_left(method: str, graph_module: Any, kept: Sequence[Any]) -> list[str]:
    """Names of operators kept whole for some backend that no backend claimed (left at the top level)."""
    names = {operator_name(op) for op in kept}
    if not names:
        return []
    return sorted(
        {
            operator_name(n.target)
            for n in graph_module.graph.nodes
            if n.op == "call_function" and operator_name(n.target) in names
        }
    )
