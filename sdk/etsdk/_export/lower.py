"""Export side: lower a model's methods to plugin backends and write ``.pte`` / ``.ptd``.

State (KV caches, counters) is declared, never inferred: each method maps the
module buffers that hold state to state identities of the contract
(``MethodSource(state={"layers.0.k_cache": "k0"})``). Those buffers are tagged
into the one delegate that uses them (whichever backend of the method claims
it), so they leave the top-level program (no planning, no copy-back, no
constant freezing); the delegate's runtime binding receives the session's
storage at run time. A mutated buffer that is not declared is an error.

The per-backend machinery (the ``BackendDetails`` class ExecuTorch looks up,
the core's partitioner wrapper, preprocess) lives in :mod:`etsdk._export.core_partitioner`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from etsdk._export.output import Lowered
from etsdk._format.dtypes import dtype_name as _dtype_name
from etsdk._state.signature import StateSlot
from etsdk.errors import EtsdkError, ExportError

__all__ = [
    "MethodSource",
    "PartitionPlan",
    "check_delegation",
    "check_request",
    "check_traced",
    "emit",
    "lower",
    "lower_to_edge",
    "resolve_partitioners",
    "trace",
]


@dataclass(frozen=True, slots=True)
class MethodSource:
    """One method to export.

    ``module``: the ``torch.nn.Module`` whose ``forward`` becomes the method.
    ``example_inputs``: positional inputs for ``torch.export``; their shapes and dtypes become the method's
    (shapes are static). ``partitioner_options``: backend id or short name -> that backend's options, each
    checked against its declared :class:`etsdk.Option` s.
    ``backends``: ids to lower to, each claiming what it supports, in order.
    ``state``: module buffer FQN -> state identity of the contract, for every
    buffer that holds state (read or written); in a method over several sessions
    (the contract method's ``slots``), FQN -> :class:`etsdk.StateSlot` (identity
    and slot) for the buffers of the later sessions. ``example_kwargs`` are passed by
    name (the engine binds them after the positional inputs, in this order).
    ``strict``: use strict ``torch.export`` (Hugging Face static caches need it).
    """

    module: Any
    example_inputs: tuple[Any, ...]
    backends: tuple[str, ...] = ()
    partitioner_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    strict: bool = False
    state: Mapping[str, str | StateSlot] = field(default_factory=dict)
    example_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def identities(self) -> dict[str, str]:
        """Module buffer FQN -> state identity (whichever slot)."""
        return {fqn: v.state if isinstance(v, StateSlot) else v for fqn, v in self.state.items()}

    @property
    def slots(self) -> dict[str, int]:
        """Module buffer FQN -> slot, for every declared state buffer (0 where ``state`` names a plain identity)."""
        return {fqn: v.slot if isinstance(v, StateSlot) else 0 for fqn, v in self.state.items()}


def lower(
    methods: Mapping[str, MethodSource] | None = None,
    *,
    module: Any = None,
    example_inputs: Sequence[Any] | None = None,
    backend: str | Sequence[str] | None = None,
    partitioner_options: Mapping[str, Any] | None = None,
    contract: Any = None,
    external_data: str | None = None,
    weights: Mapping[str, Any] | None = None,
    quiet: bool = True,
) -> Lowered:
    """Export and lower a model.

    Either one method (``module``, ``example_inputs``, ``backend``: exported as
    ``forward``) or several (``methods``: name -> :class:`MethodSource`), each
    with its own backends, in the order they claim operators (for example
    prefill on one backend, decode on another, or several backends inside one
    method). Backends are ids or short names (``aoti``). ``partitioner_options``:
    the options of the one backend, or a mapping backend id -> options; every
    option is checked against the backend's declared :class:`etsdk.Option` s.
    ``contract``: a bound :class:`etsdk.Contract` record the methods follow; it
    is checked here and embedded in the program. ``external_data``: put every
    backend's named data (weights) in ``<external_data>.ptd`` beside the
    ``.pte`` instead of inside it. Progress goes to stderr unless ``quiet``.

    ``weights``: the values of the modules' tensors that are on the meta device, by their name in the module
    (a model built on the meta device is traced against its tensors' descriptions, and the values are bound in
    before anything reads a weight: nothing model-sized is built to trace it; :mod:`etsdk._export.described`).
    Each value must be a CPU tensor of the described dtype, shape and stride, checked before tracing; a tied
    tensor takes the value of any of its names.

    The stages, in order (each a function of this module): :func:`check_request`,
    :func:`resolve_partitioners`, :func:`trace` (which binds ``weights``), :func:`check_traced`,
    :func:`lower_to_edge`, :func:`check_delegation`, :func:`emit`.
    """
    from etsdk._export.core_partitioner import LoweringContext
    from etsdk._export.described import described_weights

    methods = check_request(methods, module, example_inputs, backend, partitioner_options, contract, external_data)
    described = described_weights({name: source.module for name, source in methods.items()}, weights)
    context = LoweringContext(quiet=quiet, external_data=external_data)
    plan = resolve_partitioners(methods, context)
    exported = trace(methods, context, described)
    contract, model = check_traced(methods, exported, contract, plan, context.stored_weights.digest)
    edge = lower_to_edge(exported, plan, context)
    records = check_delegation(methods, edge, context)
    return emit(edge, records, contract, model, context)


# ----------------------------------------------------------------------------- the stages


@dataclass
class PartitionPlan:
    """What :func:`resolve_partitioners` found: per method the partitioners in claim order, the backends'
    edge passes, and the devices on which the backends taking state want its storage."""

    partitioners: dict[str, list[Any]] = field(default_factory=dict)
    passes: list[Any] = field(default_factory=list)
    state_devices: set[str] = field(default_factory=set)


def check_request(
    methods: Mapping[str, MethodSource] | None,
    module: Any,
    example_inputs: Sequence[Any] | None,
    backend: str | Sequence[str] | None,
    partitioner_options: Mapping[str, Any] | None,
    contract: Any,
    external_data: str | None,
) -> Mapping[str, MethodSource]:
    """Stage 1: the arguments of :func:`lower` as ``{method: MethodSource}``, checked before any work."""
    if methods is None:
        if module is None or example_inputs is None:
            raise ExportError("lower() needs either methods= or module= and example_inputs=")
        backends = (backend,) if isinstance(backend, str) else tuple(backend or ())
        methods = {
            "forward": MethodSource(
                module, tuple(example_inputs), backends, _keyed_options(backends, partitioner_options)
            )
        }
    elif partitioner_options is not None:
        raise ExportError("with methods=, give partitioner options per method: MethodSource(partitioner_options=...)")
    if contract is not None and not contract.is_bound:
        raise ExportError(f"contract '{contract.name}' must be bound to sizes (contract.bind(...)) before export")
    if external_data is not None and (not external_data or "/" in external_data or external_data.startswith(".")):
        raise ExportError(f"external_data names a .ptd beside the .pte (a plain file stem), found {external_data!r}")
    _check_state_identities(methods)
    return methods


def resolve_partitioners(methods: Mapping[str, MethodSource], context: Any) -> PartitionPlan:
    """Stage 2: each method's backends resolved, options checked, partitioners made and wrapped by the core."""
    from etsdk._export.core_partitioner import CorePartitioner, backend_details_class
    from etsdk._plugins.registry import edge_transform_passes, get_backend, resolve_backend_id

    plan = PartitionPlan()
    for name, source in methods.items():
        resolved = tuple(resolve_backend_id(b) for b in source.backends)
        options = {resolve_backend_id(b): dict(o) for b, o in source.partitioner_options.items()}
        unknown = sorted(set(options) - set(resolved))
        if unknown:
            raise ExportError(
                f"method '{name}': partitioner options given for backend(s) {', '.join(unknown)}, which the method "
                f"does not use (backends: {', '.join(resolved) or 'none'})"
            )
        context.states[name] = source.identities
        context.slots[name] = {fqn: slot for fqn, slot in source.slots.items() if slot}
        wrappers: list[CorePartitioner] = []
        for backend_id in resolved:
            spec = get_backend(backend_id)
            backend_details_class(backend_id)
            inner = _make_partitioner(spec, options.get(backend_id, {}), name)
            wrappers.append(CorePartitioner(inner, backend_id, name, context))
            for p in edge_transform_passes(backend_id):
                if p not in plan.passes:
                    plan.passes.append(p)
        context.partitioners[name] = wrappers
        plan.partitioners[name] = [w.partitioner for w in wrappers]
        if source.state:
            plan.state_devices.update(w.state_device for w in wrappers)
    return plan


def trace(methods: Mapping[str, MethodSource], context: Any, described: Any = None) -> dict[str, Any]:
    """Stage 3: ``torch.export`` of every method (weights shared with the module, not cloned); a module's meta
    tensors are traced as fake CPU tensors and ``described``'s values (:func:`~etsdk._export.described.
    described_weights`) bound into the programs afterwards."""
    import torch

    from etsdk._export.described import bind_described, fake_while_tracing
    from etsdk._export.tracing import weights_shared_while_tracing

    exported: dict[str, Any] = {}
    for name, source in methods.items():
        context.progress(f"tracing '{name}'")
        try:
            with weights_shared_while_tracing(), fake_while_tracing(source.module):
                exported[name] = torch.export.export(
                    source.module,
                    tuple(source.example_inputs),
                    kwargs=dict(source.example_kwargs) or None,
                    strict=source.strict,
                )
        except Exception as exc:
            raise ExportError(f"torch.export of method '{name}' failed: {type(exc).__name__}: {exc}") from exc
    if described is not None:
        bind_described(exported, described)
    return exported


def check_traced(
    methods: Mapping[str, MethodSource],
    exported: Mapping[str, Any],
    contract: Any,
    plan: PartitionPlan,
    digest: Callable[[Any], str] | None = None,
) -> tuple[Any, Any]:
    """Stage 4: declared state and engine I/O against the contract; returns the contract as recorded (state on
    the backends' device) and the model's fingerprint (read before edge lowering: backend-independent; ``digest``
    hashes one weight, :meth:`~etsdk._export.partition.StoredWeights.digest` for a lowering)."""
    from etsdk._format.fingerprint import model_fingerprint

    for name, source in methods.items():
        _check_state_declarations(name, source, exported[name], contract)
        if contract is not None:
            _check_engine_io(name, exported[name], contract)
    if contract is not None:
        try:
            contract = contract.for_methods(methods)  # the record lists the optional methods the program has
        except EtsdkError as exc:
            raise ExportError(str(exc)) from None
    if contract is not None and contract.states:
        contract = _with_state_device(contract, plan.state_devices)
    model = model_fingerprint(exported.values(), {fqn for s in methods.values() for fqn in s.state}, contract, digest)
    return contract, model


def lower_to_edge(exported: Mapping[str, Any], plan: PartitionPlan, context: Any) -> Any:
    """Stage 5: ExecuTorch's ``to_edge_transform_and_lower`` with every method's wrapped partitioners; each
    claimed partition is compiled by its backend's ``preprocess`` here (through the core's wrapper)."""
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    context.progress("lowering to edge and partitioning")
    with context.current(), _os_errors_as_export_errors("lowering"):
        return to_edge_transform_and_lower(
            dict(exported),
            partitioner=plan.partitioners,
            transform_passes=plan.passes or None,
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        )


def check_delegation(methods: Mapping[str, MethodSource], edge: Any, context: Any) -> dict[str, Any]:
    """Stage 6: per method, state left no trace in the top-level program, every operator kept whole and every
    quantized weight was claimed, and the engine's binding order equals each delegate's signature (by node
    identity)."""
    from etsdk._export.core_partitioner import check_mutations_declared, kept_whole_left
    from etsdk._export.weight_claims import check_weights_claimed
    from etsdk._state.signature import check_binding_order

    context.progress("checking binding order and state placement")
    records = {}
    for name, source in methods.items():
        lowered_program = edge.exported_program(name)
        if not source.backends:  # nothing was partitioned: every mutation is visible at the top level
            check_mutations_declared(name, lowered_program.graph_signature.buffers_to_mutate.values(), source.identities)
        left = sorted(set(source.state) & set(lowered_program.graph_signature.buffers))
        if left:
            raise ExportError(
                f"method '{name}': state buffer(s) {', '.join(left)} stayed in the top-level program; every operator "
                "using declared state must be claimed by one delegate"
            )
        unclaimed = kept_whole_left(name, lowered_program.graph_module, list(context.kept.get(name, {}).values()))
        if unclaimed:
            raise ExportError(
                f"method '{name}': operator(s) {', '.join(unclaimed)} were kept whole for a backend of this method "
                "(ops_to_not_decompose) but no backend claimed them, and the portable kernels need them decomposed"
            )
        check_weights_claimed(name, lowered_program, context.weight_refusals)
        records[name] = check_binding_order(name, lowered_program.graph_module, context.sealed)
    return records


def emit(edge: Any, records: Mapping[str, Any], contract: Any, model: Any, context: Any) -> Lowered:
    """Stage 7: the program record stored as named data (under its content hash), then ExecuTorch's ``to_executorch``."""
    from executorch.exir import ExecutorchBackendConfig

    from etsdk._state.signature import ProgramRecord, program_record_key

    record = ProgramRecord(
        methods=dict(records), contract=contract, producer=f"etsdk {_version()}", model=model, checks=dict(context.fast_digests)
    )
    store = getattr(edge, "_named_data_store", None)
    if store is None:
        raise ExportError(
            "this executorch release has no program-level named data store; etsdk needs executorch==1.5.1"
        )
    data = record.to_bytes()
    store.add_named_data(program_record_key(data), data)  # content-addressed: `etsdk verify` checks it too
    context.progress("emitting the ExecuTorch program")
    with _os_errors_as_export_errors("emitting the program"):
        manager = edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=True))
    context.progress("ready to write")
    return Lowered(manager, record=record, quiet=context.quiet)


@contextlib.contextmanager
def _os_errors_as_export_errors(stage: str) -> Iterator[None]:
    """ExecuTorch and compilers write temporary files: a full disk or a file-size limit is an ExportError."""
    try:
        yield
    except OSError as exc:
        raise ExportError(f"{stage} failed: {type(exc).__name__}: {exc}") from exc


def _keyed_options(backends: tuple[str, ...], options: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``lower(module=..., partitioner_options=...)``: flat options of one backend, or keyed by backend."""
    if not options:
        return {}
    if all(isinstance(v, Mapping) for v in options.values()) and set(options) <= set(backends):
        return {b: dict(v) for b, v in options.items()}
    if len(backends) != 1:
        raise ExportError(
            f"partitioner_options for several backends ({', '.join(backends)}) must be keyed by backend: "
            "{backend_id: {option: value}}"
        )
    return {backends[0]: dict(options)}


def _make_partitioner(spec: Any, options: Mapping[str, Any], method: str) -> Any:
    """The plugin's partitioner, after checking ``options`` against the backend's declared options."""
    where = f"method '{method}', backend '{spec.id}'"
    declared = {o.name: o for o in spec.options}
    for key, value in options.items():
        option = declared.get(key)
        if option is None:
            takes = ", ".join(o.describe() for o in spec.options) or "no options"
            raise ExportError(f"{where}: unknown partitioner option '{key}'; the backend takes {takes}")
        problem = option.check(value)
        if problem is not None:
            raise ExportError(f"{where}: partitioner option '{key}': {problem}")
    try:
        return spec.partitioner(**options)
    except EtsdkError:
        raise
    except Exception as exc:
        raise ExportError(f"{where}: creating the partitioner raised {type(exc).__name__}: {exc}") from exc


def _check_state_identities(methods: Mapping[str, MethodSource]) -> None:
    """Every declared state is an identity or a :class:`StateSlot`; one buffer is one state (and slot) in every
    method of a program (the record names state by identity once), and one state of one slot is one buffer."""
    seen: dict[str, tuple[str, str]] = {}
    for name, source in methods.items():
        held: dict[tuple[str, int], str] = {}
        identities, slots = source.identities, source.slots
        for fqn, value in source.state.items():
            valid = isinstance(value, str) and value or (
                isinstance(value, StateSlot) and isinstance(value.state, str) and value.state
                and isinstance(value.slot, int) and not isinstance(value.slot, bool) and value.slot >= 0
            )
            if not valid:
                raise ExportError(
                    f"method '{name}': state of buffer '{fqn}' must be a state identity or an etsdk.StateSlot(state, "
                    f"slot >= 0), found {value!r}"
                )
            key = (identities[fqn], slots[fqn])
            shown = key[0] if not key[1] else f"{key[0]} of slot {key[1]}"
            other = seen.setdefault(fqn, (shown, name))
            if other[0] != shown:
                raise ExportError(
                    f"buffer '{fqn}' is state '{other[0]}' in method '{other[1]}' but state '{shown}' in method "
                    f"'{name}'; a buffer holds one state"
                )
            twin = held.setdefault(key, fqn)
            if twin != fqn:
                raise ExportError(
                    f"method '{name}': buffers '{twin}' and '{fqn}' both hold state '{shown}'; one state of one "
                    "session is one buffer"
                )


def _with_state_device(contract: Any, devices: set[str]) -> Any:
    """The record with state stored where the backends taking it run (a partitioner's ``state_device``)."""
    if len(devices) > 1:
        raise ExportError(
            f"contract '{contract.name}': the backends sharing its state want it on different devices "
            f"({', '.join(sorted(devices))}); one session storage cannot live on all of them"
        )
    device = next(iter(devices), "cpu")
    return contract if device == "cpu" else contract.with_state_device(device)


def _version() -> str:
    from etsdk._version import __version__

    return __version__


def _check_state_declarations(method: str, source: MethodSource, exported: Any, contract: Any) -> None:
    """Declared state must be real buffers of the right shape, dtype and initial value."""
    if source.state and contract is None:
        raise ExportError(
            f"method '{method}' declares state but no contract was given; state is described by a contract"
        )
    buffers = dict(exported.named_buffers())
    for fqn, identity in source.identities.items():
        if fqn not in buffers:
            raise ExportError(
                f"method '{method}': state '{identity}' names buffer '{fqn}', which the module does not have "
                f"(buffers: {', '.join(sorted(buffers)) or 'none'})"
            )
        spec = contract.state(identity)
        tensor = buffers[fqn]
        found = (_dtype_name(tensor.dtype), tuple(tensor.shape))
        if found != (spec.dtype, tuple(spec.shape)):
            raise ExportError(
                f"method '{method}': buffer '{fqn}' is {found[0]} {list(found[1])} but state '{identity}' is declared "
                f"{spec.dtype} {list(spec.shape)}"
            )
        if tensor.numel() and not bool((tensor == spec.initial).all()):
            raise ExportError(
                f"method '{method}': buffer '{fqn}' holds values other than state '{identity}''s declared initial "
                f"value {spec.initial}; reset the module's buffers before export (the program starts from the "
                "declared initial value, not from the buffer's contents)"
            )
    method_spec = contract.method(method) if contract is not None else None
    if method_spec is not None:
        slots = int(method_spec.slots)
        beyond = sorted(f"'{fqn}' (slot {slot})" for fqn, slot in source.slots.items() if slot >= slots)
        if beyond:
            raise ExportError(
                f"method '{method}': buffer(s) {', '.join(beyond)} name a slot the method lacks: contract "
                f"'{contract.name}' runs it over {slots} session(s) (slots 0 to {slots - 1})"
            )
        used = set(method_spec.states_read) | set(method_spec.states_written)
        mapped = set(zip(source.identities.values(), source.slots.values()))
        unmapped = sorted(
            state if slots == 1 else f"{state} of slot {slot}"
            for state in used for slot in range(slots) if (state, slot) not in mapped
        )
        if unmapped:
            example = "{fqn: identity}" if slots == 1 else "{fqn: etsdk.StateSlot(identity, slot)}"
            raise ExportError(
                f"method '{method}' uses state(s) {', '.join(unmapped)} per contract '{contract.name}' but maps no "
                f"buffer to them (MethodSource(state={example}))"
            )


def _check_engine_io(method: str, exported: Any, contract: Any) -> None:
    """The exported method's user inputs and outputs must be the contract's engine-bound ones, in order."""
    placeholders = {n.name: n for n in exported.graph.nodes if n.op == "placeholder"}
    output_node = next(n for n in exported.graph.nodes if n.op == "output")
    produced = dict(zip([s.arg.name for s in exported.graph_signature.output_specs], output_node.args[0]))

    def described(node: Any) -> tuple[str, tuple[int, ...]] | None:
        value: Any = node.meta.get("val") if hasattr(node, "meta") else None
        return (_dtype_name(value.dtype), tuple(value.shape)) if hasattr(value, "dtype") else None

    contract.check_engine_io(
        method,
        [described(placeholders[n]) for n in exported.graph_signature.user_inputs],
        [described(produced[n]) for n in exported.graph_signature.user_outputs],
        where="export",
        error=ExportError,
    )
