"""Delegate signatures: what a delegate binds, in which order, checked by identity.

Every blob a plugin's ``preprocess`` returns is wrapped by the core in an etsdk
container with two sections: ``etsdk.io`` (this module's
:class:`DelegateSignature`) and ``payload`` (the plugin's bytes, handed to its
runtime binding untouched). The signature lists the delegate's engine-bound
inputs and outputs *by name* in the order the binding will receive them, and
the state it reads and updates.

Order is asserted, never assumed (idea 4 of DESIGN.md):

* at export, :func:`check_binding_order` matches each ``executorch_call_delegate``
  node's arguments, by node name, against the signature's inputs, and its
  outputs by position, dtype and shape;
* the program embeds a :class:`ProgramRecord` listing every delegate's
  signature in engine order; at load the bridge matches each delegate's own
  signature against it, and at the first call (and whenever the runtime hands
  over different memory) the actual tensors against the signature.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from etsdk.blob import BlobReader, BlobWriter
from etsdk.contract import Contract
from etsdk.dtypes import dtype_name as _dtype_name
from etsdk.errors import ExportError, ProgramError
from etsdk.fingerprint import ModelFingerprint
from etsdk.versioning import check_format

__all__ = [
    "ArgSpec",
    "DelegateSignature",
    "ProgramRecord",
    "STATE_COMPILE_SPEC",
    "StateBinding",
    "check_binding_order",
    "unwrap_blob",
    "wrap_blob",
]

DELEGATE_FEATURE = "etsdk.delegate.v1"
IO_SECTION = "etsdk.io"
PAYLOAD_SECTION = "payload"
#: Compile spec the core adds to a delegate that binds state: JSON {buffer FQN: state identity}.
STATE_COMPILE_SPEC = "etsdk.states"
#: Named-data key of the program record inside the .pte.
PROGRAM_RECORD_KEY = "etsdk/program"
PROGRAM_FORMAT = "etsdk.program"
PROGRAM_FORMAT_MAJOR = 1
PROGRAM_FORMAT_MINOR = 1  # 1.1: the model fingerprint (etsdk.fingerprint)


@dataclass(frozen=True, slots=True)
class ArgSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    def describe(self) -> str:
        return f"'{self.name}' {self.dtype} {list(self.shape)}"


@dataclass(frozen=True, slots=True)
class StateBinding:
    """A state buffer inside a delegate: its placeholder, module FQN and state identity."""

    placeholder: str
    fqn: str
    state: str
    dtype: str
    shape: tuple[int, ...]
    written: bool


@dataclass(frozen=True, slots=True)
class DelegateSignature:
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    states: tuple[StateBinding, ...] = ()
    uid: str = ""

    @property
    def state_by_placeholder(self) -> dict[str, StateBinding]:
        return {s.placeholder: s for s in self.states}

    @property
    def state_by_fqn(self) -> dict[str, StateBinding]:
        return {s.fqn: s for s in self.states}

    @classmethod
    def from_edge_program(cls, edge_program: Any, compile_specs: Sequence[Any]) -> DelegateSignature:
        """Read the signature of a partition's ExportedProgram (at preprocess time)."""
        from torch.export.graph_signature import InputKind, OutputKind

        states = state_map_from_compile_specs(compile_specs)
        signature = edge_program.graph_signature
        kinds = {spec.arg.name: spec for spec in signature.input_specs}
        mutated = {
            spec.target for spec in signature.output_specs if spec.kind == OutputKind.BUFFER_MUTATION
        }
        inputs: list[ArgSpec] = []
        bound: list[StateBinding] = []
        for node in edge_program.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = kinds[node.name]
            if spec.kind == InputKind.USER_INPUT:
                inputs.append(_arg(node))
            elif spec.kind == InputKind.BUFFER and spec.target in states:
                arg = _arg(node)
                bound.append(
                    StateBinding(node.name, spec.target, states[spec.target], arg.dtype, arg.shape, spec.target in mutated)
                )
        undeclared = sorted(mutated - set(states))
        if undeclared:
            raise ExportError(
                f"delegate mutates buffer(s) {', '.join(undeclared)} that are not declared as state; declare them "
                "(MethodSource(state={fqn: identity})) so the core owns their storage"
            )
        output_node = next(n for n in edge_program.graph.nodes if n.op == "output")
        values = list(output_node.args[0])
        outputs = [
            _arg(value)
            for value, spec in zip(values, signature.output_specs)
            if spec.kind == OutputKind.USER_OUTPUT
        ]
        return cls(tuple(inputs), tuple(outputs), tuple(bound))

    def with_uid(self, payload: bytes) -> DelegateSignature:
        h = hashlib.sha256(payload)
        h.update(json.dumps(self.to_json(include_uid=False), sort_keys=True).encode())
        return DelegateSignature(self.inputs, self.outputs, self.states, h.hexdigest()[:24])

    def to_json(self, *, include_uid: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
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
                }
                for s in self.states
            ],
        }
        if include_uid:
            out["uid"] = self.uid
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str) -> DelegateSignature:
        try:
            return cls(
                inputs=tuple(_arg_from(a) for a in obj["inputs"]),
                outputs=tuple(_arg_from(a) for a in obj["outputs"]),
                states=tuple(
                    StateBinding(
                        str(s["placeholder"]),
                        str(s["fqn"]),
                        str(s["state"]),
                        str(s["dtype"]),
                        _shape(s["shape"]),
                        bool(s["written"]),
                    )
                    for s in obj.get("states", [])
                ),
                uid=str(obj.get("uid", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProgramError(f"{where}: malformed delegate signature ({type(exc).__name__}: {exc})") from None



def _arg(node: Any) -> ArgSpec:
    value = node.meta.get("val")
    if value is None or not hasattr(value, "shape"):
        raise ExportError(f"node '{node.name}' has no tensor metadata; etsdk binds tensors only")
    try:
        shape = tuple(int(d) for d in value.shape)
    except TypeError:
        raise ExportError(f"node '{node.name}' has a symbolic shape {list(value.shape)}; dynamic shapes are not supported yet") from None
    return ArgSpec(node.name, _dtype_name(value.dtype), shape)


def _shape(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in raw):
        raise ValueError(f"shape must be a list of integers, found {raw!r}")
    return tuple(raw)


def _arg_json(a: ArgSpec) -> dict[str, Any]:
    return {"name": a.name, "dtype": a.dtype, "shape": list(a.shape)}


def _arg_from(obj: Any) -> ArgSpec:
    return ArgSpec(str(obj["name"]), str(obj["dtype"]), _shape(obj["shape"]))


def state_map_from_compile_specs(compile_specs: Iterable[Any]) -> dict[str, str]:
    for spec in compile_specs:
        if spec.key == STATE_COMPILE_SPEC:
            return dict(json.loads(bytes(spec.value).decode()))
    return {}


def wrap_blob(payload: bytes, signature: DelegateSignature) -> tuple[bytes, DelegateSignature]:
    signature = signature.with_uid(payload)
    writer = BlobWriter(required_features=[DELEGATE_FEATURE], producer="etsdk")
    writer.add_section(IO_SECTION, json.dumps(signature.to_json(), separators=(",", ":")).encode())
    writer.add_section(PAYLOAD_SECTION, payload, alignment=64)
    return writer.to_bytes(), signature


def unwrap_blob(blob: memoryview | bytes, where: str) -> tuple[DelegateSignature, memoryview]:
    reader = BlobReader(blob, known_features={DELEGATE_FEATURE})
    try:
        io = json.loads(bytes(reader.section(IO_SECTION)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProgramError(f"{where}: delegate signature is not valid JSON: {exc}") from None
    return DelegateSignature.from_json(io, where), reader.section(PAYLOAD_SECTION)


# ----------------------------------------------------------------------------- program record


@dataclass(frozen=True, slots=True)
class DelegateRecord:
    backend: str
    signature: DelegateSignature


@dataclass(frozen=True, slots=True)
class ProgramRecord:
    """Embedded in every program etsdk writes: its contract and each delegate's signature, in engine order."""

    methods: Mapping[str, tuple[DelegateRecord, ...]]
    contract: Contract | None = None
    producer: str = ""
    state_fqns: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: weights + state-spec fingerprint (None in records written before format 1.1)
    model: ModelFingerprint | None = None

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "format": PROGRAM_FORMAT,
                "format_version": [PROGRAM_FORMAT_MAJOR, PROGRAM_FORMAT_MINOR],
                "model": self.model.to_json() if self.model is not None else None,
                "producer": self.producer,
                "contract": self.contract.to_json() if self.contract is not None else None,
                "state_fqns": {m: dict(v) for m, v in self.state_fqns.items()},
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
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProgramError(f"{where}: etsdk program record is not valid JSON: {exc}") from None
        check_format(
            obj, expected=PROGRAM_FORMAT, major=PROGRAM_FORMAT_MAJOR, minor=PROGRAM_FORMAT_MINOR, where=where, error=ProgramError,
            what="etsdk program record",
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
        fqns = obj.get("state_fqns") or {}
        if not isinstance(fqns, dict):
            raise ProgramError(f"{where}: state_fqns must be an object")
        model = obj.get("model")
        if model is not None:
            model = ModelFingerprint.from_json(model, f"{where}: etsdk program record")
        return cls(methods=methods, contract=contract, producer=str(obj.get("producer", "")), state_fqns=fqns, model=model)


def check_binding_order(method: str, graph_module: Any, etsdk_backends: Iterable[str]) -> tuple[DelegateRecord, ...]:
    """Match every etsdk delegate call in ``graph_module`` against its signature; return the records in engine order.

    Delegates of backends outside etsdk (e.g. XNNPACK in a mixed program) carry no etsdk signature and are skipped.
    """
    import operator

    ours = set(etsdk_backends)
    records: list[DelegateRecord] = []
    # A delegate's placeholders carry the names its inputs had before partitioning;
    # an input produced by an earlier delegate is now that delegate's getitem node.
    # ``original`` maps such getitem names back to the producing delegate's output name.
    original: dict[str, str] = {}
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "__name__", "") != "executorch_call_delegate":
            continue
        lowered = getattr(graph_module, node.args[0].target)
        if lowered.backend_id not in ours:
            continue
        signature, _ = unwrap_blob(lowered.processed_bytes, f"method '{method}', delegate {lowered.backend_id}")
        where = f"method '{method}', delegate {len(records)} ({lowered.backend_id})"
        for user in node.users:
            if user.op == "call_function" and user.target is operator.getitem and user.args[1] < len(signature.outputs):
                original[user.name] = signature.outputs[user.args[1]].name
        engine_args = [original.get(a.name, a.name) if hasattr(a, "name") else repr(a) for a in node.args[1:]]
        expected = [a.name for a in signature.inputs]
        if engine_args != expected:
            first = next(
                (i for i, (e, g) in enumerate(zip(expected, engine_args)) if e != g), min(len(expected), len(engine_args))
            )
            raise ExportError(
                f"{where}: the engine binds arguments {engine_args} but the delegate expects {expected} "
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
            found = (_dtype_name(value.dtype), tuple(int(d) for d in value.shape))
            if found != (out.dtype, out.shape):
                raise ExportError(
                    f"{where}: output {index} is bound as {found[0]} {list(found[1])} but the delegate produces "
                    f"{out.describe()}"
                )
        records.append(DelegateRecord(lowered.backend_id, signature))
    return tuple(records)
