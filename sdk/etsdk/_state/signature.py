"""Delegate signatures and the program record: what each delegate binds, in which order, checked by identity.

A :class:`DelegateSignature` lists a delegate's engine-bound inputs and outputs
in the order its runtime binding receives them, the state it binds (each state
buffer's placeholder, module FQN, state identity, dtype, shape, whether it is
written) and the operators it claimed. Signatures live in one place in the
``.pte``: the :class:`ProgramRecord` (named data ``etsdk/program/<sha256 hex of the
record>``, content-addressed like every other entry etsdk writes, so ``etsdk verify``
checks it; ``etsdk/program`` in programs written before), one list per method in engine order. Each delegate blob is wrapped by the core in an
etsdk container holding only the delegate's ``uid`` and the plugin's payload;
the uid names the record entry and the payload's SHA-256 is recorded with it.

Order is asserted, never assumed (idea 4 of docs/architecture.md):

* at export, :func:`check_binding_order` matches each ``executorch_call_delegate``
  node's arguments against the signature's inputs **by node identity** (an id
  stamped on every node before partitioning, which ExecuTorch carries into the
  partition's placeholders and the getitems replacing earlier delegates), so
  delegates of different partitioner passes chain in any order; outputs are
  matched by position, dtype and shape;
* at load, the bridge finds each delegate's record entry by position, checks the
  uid and the payload's hash, and at the first call (and whenever the runtime
  hands over different memory) checks the actual tensors against the signature.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from etsdk._format.blob import BlobReader
from etsdk._format.content_hash import FAST, content_digest
from etsdk._format.dtypes import dtype_name as _dtype_name
from etsdk._format.fingerprint import ModelFingerprint
from etsdk._format.versioning import check_format
from etsdk._state.contract import Contract
from etsdk.errors import ExportError, ProgramError

__all__ = [
    "ArgSpec",
    "DelegateRecord",
    "DelegateSignature",
    "PROGRAM_RECORD_KEY",
    "ProgramRecord",
    "StateBinding",
    "WeightRecord",
    "check_binding_order",
    "find_program_record_key",
    "is_program_record_key",
    "program_record_key",
]

#: Named-data key of the program record inside the .pte: ``etsdk/program/<sha256 hex of the record>`` (see
#: :func:`program_record_key`); programs written before records were content-addressed use this key itself.
PROGRAM_RECORD_KEY = "etsdk/program"
PROGRAM_FORMAT = "etsdk.program"
PROGRAM_FORMAT_MAJOR = 2
PROGRAM_FORMAT_MINOR = 3  # 2.1: model fingerprint; 2.2: delegates' quantized weights; 2.3: BLAKE3 of named data
#: Node meta key carrying a node's identity through partitioning (export only, never serialized).
NODE_ID_META = "etsdk_node_id"
#: Node meta key the core puts on a declared state's buffer placeholder before each partitioner pass: the state
#: identity (export only, never serialized; ``OperatorPartitioner(state_claims="all_or_none")`` reads it).
STATE_META = "etsdk_state"


@dataclass(frozen=True, slots=True)
class ArgSpec:
    """One engine-bound delegate input or output: the partition's name for it, dtype and shape."""

    #: The partition graph's name for the value (error messages name it).
    name: str
    #: The dtype's name (``float32``; :func:`torch_dtype` turns it back into a ``torch.dtype``).
    dtype: str
    #: The static shape.
    shape: tuple[int, ...]

    def describe(self) -> str:
        """``'name' dtype [shape]``: how error messages name the argument."""
        return f"'{self.name}' {self.dtype} {list(self.shape)}"


@dataclass(frozen=True, slots=True)
class StateBinding:
    """A state buffer inside a delegate: its placeholder, module FQN and state identity.

    ``written``: the delegate updates it (it was a ``BUFFER_MUTATION`` output).
    At run time the binding receives the session's tensor for it, in the
    position of this binding in :attr:`DelegateSignature.states`.
    """

    #: The buffer's placeholder name in the partition's graph.
    placeholder: str
    #: The module buffer it came from (``k_cache_0``), as declared in ``MethodSource(state=...)``.
    fqn: str
    #: The state identity in the contract (``k0``): what the session's storage is keyed by.
    state: str
    #: The dtype's name (``float32``).
    dtype: str
    #: The state's shape (as the contract record fixes it).
    shape: tuple[int, ...]
    written: bool
    #: Which of the call's sessions holds the storage: slot ``j`` binds the ``j``-th of
    #: ``Program.run(..., sessions=...)`` (0 for a method over one session; a contract method's ``slots``).
    slot: int = 0


@dataclass(frozen=True, slots=True)
class StateSlot:
    """A state identity in one slot of a method over several sessions: ``MethodSource(state={"k0_s1":
    StateSlot("k0", 1)})`` binds buffer ``k0_s1`` to state ``k0`` of the call's second session (a plain identity
    string means slot 0)."""

    #: The state identity in the contract (``k0``).
    state: str
    #: Which of the call's sessions (0-based, below the contract method's ``slots``).
    slot: int = 0


@dataclass(frozen=True, slots=True)
class WeightRecord:
    """A quantized weight a delegate reads: its module name, format name, logical ``[N, K]`` and use."""

    #: The weight's module name (``model.layers.0.mlp.up_proj``).
    name: str
    #: The :class:`etsdk.backend.WeightFormat` name (``int4:g32``).
    format: str
    #: The weight's logical ``[N, K]`` (``[out_features, in_features]`` of a linear layer).
    shape: tuple[int, ...]
    #: ``linear`` or ``embedding`` (:class:`etsdk.backend.WeightUse`).
    use: str


@dataclass(frozen=True, slots=True)
class DelegateSignature:
    """What a delegate binds: inputs and outputs in binding order, state, claimed operators.

    ``uid`` identifies the delegate (hash of its payload and this signature);
    ``payload_sha256`` is the SHA-256 of the plugin's payload, checked at load;
    ``payload_features``: the features the payload requires when it is an etsdk
    blob container (``None`` for an opaque payload); ``operators``:
    ``(operator name, count)`` of what the delegate computes.
    """

    #: The engine inputs, in the order ``execute`` receives them (first in ``args``).
    inputs: tuple[ArgSpec, ...]
    #: The engine outputs, in the order ``execute`` receives them (after the inputs in ``args``).
    outputs: tuple[ArgSpec, ...]
    #: The state bindings, in the order ``execute`` receives the session's tensors.
    states: tuple[StateBinding, ...] = ()
    operators: tuple[tuple[str, int], ...] = ()
    payload_sha256: str = ""
    payload_features: tuple[str, ...] | None = None
    uid: str = ""
    #: The quantized weights the delegate reads, in graph order (none in records before format 2.2).
    weights: tuple[WeightRecord, ...] = ()

    @property
    def state_by_placeholder(self) -> dict[str, StateBinding]:
        """The state bindings by placeholder name (to find a graph node's state at preprocess)."""
        return {s.placeholder: s for s in self.states}

    @property
    def state_by_fqn(self) -> dict[str, StateBinding]:
        """The state bindings by module buffer name."""
        return {s.fqn: s for s in self.states}

    @classmethod
    def from_edge_program(
        cls, edge_program: Any, state: Mapping[str, str], slots: Mapping[str, int] | None = None
    ) -> DelegateSignature:
        """The signature of a partition's ExportedProgram; ``state``: buffer FQN -> state identity, ``slots``:
        buffer FQN -> slot for those bound to a session other than the call's first."""
        from torch.export.graph_signature import InputKind, OutputKind

        signature = edge_program.graph_signature
        kinds = {spec.arg.name: spec for spec in signature.input_specs}
        mutated = {spec.target for spec in signature.output_specs if spec.kind == OutputKind.BUFFER_MUTATION}
        inputs: list[ArgSpec] = []
        bound: list[StateBinding] = []
        for node in edge_program.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = kinds[node.name]
            if spec.kind == InputKind.USER_INPUT:
                inputs.append(_arg(node))
            elif spec.kind == InputKind.BUFFER and spec.target in state:
                arg = _arg(node)
                bound.append(
                    StateBinding(
                        node.name, spec.target, state[spec.target], arg.dtype, arg.shape, spec.target in mutated,
                        (slots or {}).get(spec.target, 0),
                    )
                )
        output_node = next(n for n in edge_program.graph.nodes if n.op == "output")
        outputs = [
            _arg(value)
            for value, spec in zip(output_node.args[0], signature.output_specs)
            if spec.kind == OutputKind.USER_OUTPUT
        ]
        counts: dict[str, int] = {}
        for node in edge_program.graph.nodes:
            if node.op == "call_function" and node.target is not operator.getitem:
                name = operator_name(node.target)
                counts[name] = counts.get(name, 0) + 1
        weights = _weight_records(edge_program) if any(n.startswith("etsdk::") for n in counts) else ()
        return cls(tuple(inputs), tuple(outputs), tuple(bound), tuple(sorted(counts.items())), weights=weights)

    def sealed(self, payload: bytes | memoryview) -> DelegateSignature:
        """This signature with the payload's hash and the uid derived from both."""
        try:
            features: tuple[str, ...] | None = BlobReader.declared_features(payload)[0]
        except Exception:  # noqa: BLE001 - an opaque payload (not an etsdk container) is allowed
            features = None
        unsealed = replace(self, payload_sha256=hashlib.sha256(payload).hexdigest(), payload_features=features, uid="")
        return replace(unsealed, uid=unsealed.computed_uid())

    def computed_uid(self) -> str:
        """The uid this signature's content implies (everything but the uid itself): a changed record shows."""
        content = self.to_json()
        content["uid"] = ""
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        """The signature as stored in the program record (:meth:`from_json` reads it back)."""
        return {
            "uid": self.uid,
            "payload_sha256": self.payload_sha256,
            "payload_features": list(self.payload_features) if self.payload_features is not None else None,
            "inputs": [_arg_json(a) for a in self.inputs],
            "outputs": [_arg_json(a) for a in self.outputs],
            "states": [
                {
                    "placeholder": s.placeholder,
                    "fqn": s.fqn,
                    "state": s.state,
                    "dtype": s.dtype,
                    "shape": list(s.shape),
                    "written": s.written,
                    **({"slot": s.slot} if s.slot else {}),
                }
                for s in self.states
            ],
            "operators": [[name, count] for name, count in self.operators],
            **({"weights": [[w.name, w.format, list(w.shape), w.use] for w in self.weights]} if self.weights else {}),
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> DelegateSignature:
        """Parse a signature from a program record; raises :class:`etsdk.ProgramError` starting with ``where``."""
        try:
            return cls(
                inputs=tuple(_arg_from(a) for a in obj["inputs"]),
                outputs=tuple(_arg_from(a) for a in obj["outputs"]),
                states=tuple(
                    StateBinding(
                        _str(s["placeholder"]),
                        _str(s["fqn"]),
                        _str(s["state"]),
                        _str(s["dtype"]),
                        _shape(s["shape"]),
                        _bool(s["written"]),
                        _count(s.get("slot", 0)),
                    )
                    for s in obj["states"]
                ),
                operators=tuple((_str(name), _count(count)) for name, count in obj["operators"]),
                payload_sha256=_str(obj["payload_sha256"]),
                payload_features=(
                    None if obj["payload_features"] is None else tuple(_str(f) for f in obj["payload_features"])
                ),
                uid=_str(obj["uid"]),
                weights=tuple(
                    WeightRecord(_str(name), _str(fmt), _shape(shape), _str(use)) for name, fmt, shape, use in obj.get("weights", [])
                ),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProgramError(f"{where}: malformed delegate signature ({type(exc).__name__}: {exc})") from None


def _weight_records(edge_program: Any) -> tuple[WeightRecord, ...]:
    from etsdk._quant.ops import quantized_call

    found = []
    for node in edge_program.graph.nodes:
        call = quantized_call(node)
        if call is not None:
            found.append(WeightRecord(call.weight_name(edge_program), call.format.name, call.shape, call.use.value))
    return tuple(found)


def operator_name(target: Any) -> str:
    """``aten::add.Tensor`` for an aten or edge operator overload; the callable's name otherwise."""
    import torch

    op = target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", None)
    if isinstance(op, torch._ops.OpOverload):
        return str(op.name())
    return str(getattr(target, "__name__", target))


def _arg(node: Any) -> ArgSpec:
    value = node.meta.get("val")
    if value is None or not hasattr(value, "shape"):
        raise ExportError(f"node '{node.name}' has no tensor metadata; etsdk binds tensors only")
    try:
        shape = tuple(int(d) for d in value.shape)
    except TypeError:
        raise ExportError(f"node '{node.name}' has a symbolic shape {list(value.shape)}; dynamic shapes are not supported yet") from None
    return ArgSpec(node.name, _dtype_name(value.dtype), shape)


def _str(raw: Any) -> str:
    if not isinstance(raw, str):
        raise TypeError(f"expected a string, found {raw!r}")
    return raw


def _bool(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise TypeError(f"expected true or false, found {raw!r}")
    return raw


def _count(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ValueError(f"expected a count, found {raw!r}")
    return raw


def _shape(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw):
        raise ValueError(f"shape must be a list of non-negative integers, found {raw!r}")
    return tuple(raw)


def _arg_json(a: ArgSpec) -> dict[str, Any]:
    return {"name": a.name, "dtype": a.dtype, "shape": list(a.shape)}


def _arg_from(obj: Any) -> ArgSpec:
    return ArgSpec(_str(obj["name"]), _str(obj["dtype"]), _shape(obj["shape"]))


# ----------------------------------------------------------------------------- blob wrapper


# ----------------------------------------------------------------------------- program record


def program_record_key(data: bytes) -> str:
    """The key a program record's bytes are stored under: ``etsdk/program/<sha256 hex of data>``."""
    return f"{PROGRAM_RECORD_KEY}/{hashlib.sha256(data).hexdigest()}"


def is_program_record_key(key: str) -> bool:
    """Whether ``key`` names a program record: content-addressed, or ``etsdk/program`` of an older program."""
    if key == PROGRAM_RECORD_KEY:
        return True
    prefix = PROGRAM_RECORD_KEY + "/"
    return key.startswith(prefix) and content_digest(key) == key[len(prefix):]


def find_program_record_key(keys: Iterable[str], where: str) -> str | None:
    """The one program-record key among a ``.pte``'s named-data keys, None if there is none; two are refused."""
    found = [key for key in keys if is_program_record_key(key)]
    if len(found) > 1:
        raise ProgramError(f"{where}: holds {len(found)} etsdk program records ({', '.join(found)}); a program has one")
    return found[0] if found else None


@dataclass(frozen=True, slots=True)
class DelegateRecord:
    """One etsdk delegate of a method, in engine order: its backend and signature."""

    backend: str
    signature: DelegateSignature


@dataclass(frozen=True, slots=True)
class ProgramRecord:
    """Embedded in every program etsdk writes: its contract and each delegate's signature, in engine order."""

    methods: Mapping[str, tuple[DelegateRecord, ...]]
    contract: Contract | None = None
    producer: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: weights + state-spec fingerprint (None in records written before format 2.1)
    model: ModelFingerprint | None = None
    #: named-data key -> BLAKE3 hex of its bytes: what every load checks each entry by (empty before format 2.3,
    #: or where ``blake3`` was not installed at export; the SHA-256 in the key is checked then)
    checks: Mapping[str, str] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "format": PROGRAM_FORMAT,
                "format_version": [PROGRAM_FORMAT_MAJOR, PROGRAM_FORMAT_MINOR],
                **({"checks": {FAST: dict(sorted(self.checks.items()))}} if self.checks else {}),
                "model": self.model.to_json() if self.model is not None else None,
                "producer": self.producer,
                "contract": self.contract.to_json() if self.contract is not None else None,
                "methods": {
                    method: [{"backend": d.backend, "signature": d.signature.to_json()} for d in delegates]
                    for method, delegates in self.methods.items()
                },
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, where: str) -> ProgramRecord:
        try:
            obj = json.loads(bytes(data).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ProgramError(f"{where}: etsdk program record is not valid JSON: {type(exc).__name__}") from None
        major, _ = check_format(
            obj, expected=PROGRAM_FORMAT, major=PROGRAM_FORMAT_MAJOR, minor=PROGRAM_FORMAT_MINOR, where=where, error=ProgramError,
            what="etsdk program record",
        )
        if major < PROGRAM_FORMAT_MAJOR:
            raise ProgramError(
                f"{where}: etsdk program record format {major} was written by an older etsdk; this etsdk reads "
                f"format {PROGRAM_FORMAT_MAJOR}: re-export the program"
            )
        contract = None
        if obj.get("contract") is not None:
            contract = Contract.from_json(obj["contract"], where=f"{where}: contract record")
        methods_raw = obj.get("methods")
        if not isinstance(methods_raw, dict):
            raise ProgramError(f"{where}: etsdk program record has no 'methods' object")
        methods: dict[str, tuple[DelegateRecord, ...]] = {}
        for method, delegates in methods_raw.items():
            if not isinstance(delegates, list):
                raise ProgramError(f"{where}: methods.{method} must be a list of delegates")
            records = []
            for i, d in enumerate(delegates):
                if not isinstance(d, dict) or not isinstance(d.get("backend"), str):
                    raise ProgramError(f"{where}: methods.{method}[{i}] must name its backend")
                records.append(
                    DelegateRecord(d["backend"], DelegateSignature.from_json(d.get("signature"), f"{where}: methods.{method}[{i}]"))
                )
            methods[method] = tuple(records)
        producer = obj.get("producer", "")
        model = obj.get("model")
        if model is not None:
            model = ModelFingerprint.from_json(model, f"{where}: etsdk program record")
        return cls(
            methods=methods, contract=contract, producer=producer if isinstance(producer, str) else "", model=model,
            checks=_checks(obj.get("checks"), where),
        )


def _checks(raw: Any, where: str) -> dict[str, str]:
    """The record's ``checks`` (``{"blake3": {key: hex}}``), each digest 64 lowercase hex digits."""
    if raw is None:
        return {}
    table = raw.get(FAST) if isinstance(raw, dict) else None
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)
        for k, v in table.items()
    ):
        raise ProgramError(f"{where}: etsdk program record: checks.{FAST} must map named-data keys to 64 hex digits")
    return dict(table)


# ----------------------------------------------------------------------------- export-time order check


def check_binding_order(
    method: str,
    graph_module: Any,
    signatures: Mapping[str, tuple[str, DelegateSignature, tuple[str | None, ...]]],
) -> tuple[DelegateRecord, ...]:
    """Match every etsdk delegate call in ``graph_module`` against its signature; return the records in engine order.

    ``signatures``: uid -> (backend id, signature, the node ids its inputs came from), as preprocess recorded
    them. A call's arguments must be exactly those nodes, in that order (by identity, whichever partitioner
    pass produced them). Delegates of backends outside etsdk (e.g. XNNPACK) carry no etsdk wrapper and are
    skipped.
    """
    records: list[DelegateRecord] = []
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "__name__", "") != "executorch_call_delegate":
            continue
        lowered = getattr(graph_module, node.args[0].target)
        where = f"method '{method}', delegate {len(records)} ({lowered.backend_id})"
        try:
            from etsdk._format.envelope import unwrap_blob

            uid, _ = unwrap_blob(lowered.processed_bytes, where)
        except Exception:  # noqa: BLE001 - not an etsdk-wrapped delegate (another backend family)
            continue
        if uid not in signatures:
            raise ExportError(f"{where}: the delegate's uid {uid} was not produced by this export")
        backend, signature, sources = signatures[uid]
        engine_args = list(node.args[1:])
        found = [a.meta.get(NODE_ID_META) if hasattr(a, "meta") else None for a in engine_args]
        if len(found) != len(sources) or any(f is None or f != s for f, s in zip(found, sources)):
            names = [getattr(a, "name", repr(a)) for a in engine_args]
            expected = [a.name for a in signature.inputs]
            first = next(
                (i for i, (f, s) in enumerate(zip(found, sources)) if f is None or f != s), min(len(found), len(sources))
            )
            raise ExportError(
                f"{where}: the engine binds arguments {names} but the delegate expects {expected} "
                f"(first difference at position {first}); refusing to emit a program with swapped bindings"
            )
        getitems = {
            user.args[1]: user for user in node.users if user.op == "call_function" and user.target is operator.getitem
        }
        for index, out in enumerate(signature.outputs):
            user = getitems.get(index)
            value = user.meta.get("val") if user is not None else (node.meta.get("val") if len(signature.outputs) == 1 else None)
            if isinstance(value, (list, tuple)):
                value = value[index] if index < len(value) else None
            if value is None:
                continue
            got = (_dtype_name(value.dtype), tuple(int(d) for d in value.shape))
            if got != (out.dtype, out.shape):
                raise ExportError(
                    f"{where}: output {index} is bound as {got[0]} {list(got[1])} but the delegate produces "
                    f"{out.describe()}"
                )
        records.append(DelegateRecord(backend, signature))
    return tuple(records)


def input_sources(edge_program: Any) -> tuple[str | None, ...]:
    """The node ids the partition's user inputs came from, in binding order (export only)."""
    from torch.export.graph_signature import InputKind

    user = {spec.arg.name for spec in edge_program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT}
    return tuple(
        node.meta.get(NODE_ID_META) for node in edge_program.graph.nodes if node.op == "placeholder" and node.name in user
    )

