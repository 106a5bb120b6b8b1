"""I/O contracts: which inputs and outputs of each method are tokens, positions,
masks, KV caches, counters or logits, and which outputs update which inputs.

A contract *specification* lives as JSON data in ``contracts/`` (symbolic dims
such as ``"S"``, entries repeated per layer); :meth:`Contract.bind` turns it
into a *record* with every size concrete, which is embedded in the exported
program and validated at load. Parsing is strict: every problem raises
:class:`ContractError` naming where it is (``methods.decode.inputs[2].role``),
what was expected and what was found.

Aliasing (idea 1 of docs/architecture.md): an aliased output names its ``input``, a
``kind`` (who enforces the alias) and, independently, an ``ownership`` (where
the storage lives), plus the stable ``state`` identity it updates. Inputs bound
to a state and aliased outputs are *off-engine*: the core binds them from the
session's storage; they are not passed through the ExecuTorch method.

An engine input may declare ``bound``: its values must lie in ``[0, bound)``
(positions against the cache rows ``S``, token ids against the vocabulary
``V``). The core checks it before every call, for every backend.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from etsdk._format.versioning import check_format
from etsdk.errors import ContractError, EtsdkError, UnsupportedFeatureError

__all__ = [
    "CONTRACT_FORMAT",
    "KNOWN_CONTRACT_FEATURES",
    "Alias",
    "AliasKind",
    "Contract",
    "ContractError",
    "IOSpec",
    "MethodSpec",
    "Ownership",
    "Role",
    "StateSpec",
]

CONTRACT_FORMAT = "etsdk.contract"
FORMAT_MAJOR = 1
FORMAT_MINOR = 0
#: Features a contract record may require that this core implements.
KNOWN_CONTRACT_FEATURES = frozenset(
    {"state.caller_owned", "alias.kv_cache_update", "alias.user", "method.slots", "method.optional"}
)
#: The feature a contract must require to declare a method over several sessions (``"slots"``), and one that
#: declares a method a program may leave out (``"optional"``): a reader without it refuses the contract instead of
#: binding one session where the method reads several, or calling a program incomplete.
SLOTS_FEATURE = "method.slots"
OPTIONAL_FEATURE = "method.optional"
DTYPES = frozenset({"float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.{}]*$")
#: where state storage may live: the CPU or a CUDA device
_DEVICE = re.compile(r"^(cpu|cuda(:(0|[1-9][0-9]{0,3}))?)$")
#: the values each dtype can hold exactly (initial values must be among them)
_FLOAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}
_INT_RANGE = {
    "bool": (0, 1), "uint8": (0, 255), "int8": (-128, 127), "int16": (-(1 << 15), (1 << 15) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 53), 1 << 53),  # larger ints are not exact as JSON numbers
}
#: deepest nesting accepted in free-form metadata (a record is written and read again as JSON)
MAX_METADATA_DEPTH = 32


class Role(str, enum.Enum):
    TOKENS = "tokens"
    POSITIONS = "positions"
    MASK = "mask"
    KV_CACHE_KEY = "kv_cache_key"
    KV_CACHE_VALUE = "kv_cache_value"
    #: the scales of an int8 key or value cache (one per row and head), held beside it
    KV_CACHE_SCALE = "kv_cache_scale"
    COUNTER = "counter"
    LOGITS = "logits"
    HIDDEN = "hidden"
    USER = "user"


class AliasKind(str, enum.Enum):
    #: the engine enforces the alias: the method updates the cache in place
    KV_CACHE_UPDATE = "kv_cache_update"
    #: the model author declares the alias
    USER = "user"


class Ownership(str, enum.Enum):
    """Who owns an aliased state's storage, declared separately from the alias kind.

    Only ``caller`` exists: storage lives above every delegate, in the core's session,
    and is bound in. A contract declaring any other ownership (for example ``runtime``,
    storage kept below the delegate) is refused when it is read, naming the state.
    """

    CALLER = "caller"


Dim = int | str


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One piece of state: a KV cache of a layer, a position counter, ..."""

    name: str
    role: Role
    dtype: str
    shape: tuple[Dim, ...]
    initial: float = 0.0
    ownership: Ownership = Ownership.CALLER
    device: str = "cpu"
    layer: int | None = None
    repeat: str | None = None


@dataclass(frozen=True, slots=True)
class Alias:
    input: str
    kind: AliasKind
    ownership: Ownership
    state: str


@dataclass(frozen=True, slots=True)
class IOSpec:
    """One input or output of a method.

    ``state`` on an input binds it to session state (off-engine); ``alias`` on an
    output makes it an in-place update of an input (off-engine).
    """

    name: str
    role: Role
    dtype: str
    shape: tuple[Dim, ...]
    state: str | None = None
    alias: Alias | None = None
    layer: int | None = None
    repeat: str | None = None
    #: values must lie in [0, bound) (checked before every call); a dim name in a specification
    bound: Dim | None = None

    @property
    def on_engine(self) -> bool:
        return self.state is None and self.alias is None


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """One method: its inputs and outputs in engine order.

    ``slots``: how many sessions one call binds (a dim name in a specification). Every state-bound input and
    aliased output is bound once per slot, slot ``j`` to the ``j``-th session of
    ``Program.run(..., sessions=...)``; 1 (the default) is an ordinary method over one session. ``optional``: a
    program may leave the method out (a record lists only the methods its program has).
    """

    name: str
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    slots: Dim = 1
    optional: bool = False

    @property
    def engine_inputs(self) -> tuple[IOSpec, ...]:
        return tuple(i for i in self.inputs if i.on_engine)

    @property
    def engine_outputs(self) -> tuple[IOSpec, ...]:
        return tuple(o for o in self.outputs if o.on_engine)

    @property
    def states_read(self) -> tuple[str, ...]:
        return tuple(i.state for i in self.inputs if i.state is not None)

    @property
    def states_written(self) -> tuple[str, ...]:
        return tuple(o.alias.state for o in self.outputs if o.alias is not None)


@dataclass(frozen=True, slots=True)
class Contract:
    """An I/O contract: what each method's inputs and outputs *are*, and the state the methods share.

    The same class holds a *specification* (``contracts/<name>/<version>.json``: symbolic dims, ``repeat``
    entries) and a *record* (:meth:`bind`: every size concrete, repeats expanded, aliases checked), which is
    what :func:`etsdk.lower` takes and a program embeds. Parsing is strict: every problem is a
    :class:`etsdk.ContractError` naming where (``methods.decode.inputs[2].role``), what was expected and what was
    found. Immutable; ``docs/contracts.md`` describes the format.
    """

    #: The contract's name (``kv_decoder``); with ``version``, the key a specification is registered under.
    name: str
    #: The contract's version (an integer).
    version: int
    #: Each method's inputs and outputs, in engine order.
    methods: tuple[MethodSpec, ...]
    #: The caller-owned state the methods bind (KV caches, counters), by identity.
    states: tuple[StateSpec, ...] = ()
    #: Symbolic sizes: ``None`` must be given to :meth:`bind`, an integer is fixed; all integers in a record.
    dims: Mapping[str, int | None] = field(default_factory=dict)
    #: Features a reader must implement; one it lacks makes it refuse the contract (fail closed).
    required_features: tuple[str, ...] = ()
    #: Free-form JSON for runners (``hf_static``'s tokenizer and model settings), nested at most 32 levels.
    metadata: Mapping[str, Any] = field(default_factory=dict)

    # ----------------------------------------------------------------- lookups

    def method(self, name: str) -> MethodSpec:
        """The method ``name``; raises :class:`etsdk.ContractError` listing the methods when there is none."""
        for m in self.methods:
            if m.name == name:
                return m
        raise ContractError(
            f"contract '{self.name}' v{self.version} has no method '{name}' "
            f"(methods: {', '.join(m.name for m in self.methods)})"
        )

    def slots_of(self, method: str) -> int:
        """How many sessions one call of ``method`` binds (its ``slots``; 1 for a method this record lacks)."""
        return next((int(m.slots) for m in self.methods if m.name == method), 1)

    def state(self, name: str) -> StateSpec:
        """The state with identity ``name``; raises :class:`etsdk.ContractError` when there is none."""
        for s in self.states:
            if s.name == name:
                return s
        raise ContractError(f"contract '{self.name}' declares no state '{name}'")

    def with_state_device(self, device: str) -> Contract:
        """The same record with every state stored on ``device`` (e.g. ``"cuda"`` for a CUDA export).

        Where storage lives is chosen at export for the backend's device; it is not
        part of the contract, so records on any device conform to one specification.
        """
        return replace(self, states=tuple(replace(s, device=device) for s in self.states))

    @property
    def sized_dims(self) -> frozenset[str]:
        """Dims that size a shape or bound a value somewhere in this contract (they must be positive). Any other
        dim only counts ``repeat`` entries and may be 0 (no such entry: e.g. the sliding-window layers of a model
        that has none)."""
        io = [i for m in self.methods for i in (*m.inputs, *m.outputs)]
        shapes = [s.shape for s in self.states] + [i.shape for i in io]
        sized = {d for shape in shapes for d in shape if isinstance(d, str)}
        slots = {m.slots for m in self.methods if isinstance(m.slots, str)}
        return frozenset(sized | slots | {i.bound for i in io if isinstance(i.bound, str)})

    @property
    def is_bound(self) -> bool:
        """True for a record: every dim an integer and no ``repeat`` left (what export and load require)."""
        return all(isinstance(v, int) for v in self.dims.values()) and not any(
            s.repeat for s in self.states
        )

    # ----------------------------------------------------------------- binding

    def bind(self, **sizes: int) -> Contract:
        """A record: every symbolic dim replaced by ``sizes``, repeated entries expanded."""
        dims = dict(self.dims)
        for key, value in sizes.items():
            if key not in dims:
                raise ContractError(f"contract '{self.name}' has no dim '{key}' (dims: {', '.join(dims)})")
            floor = 1 if key in self.sized_dims else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < floor:
                kind = "a non-negative integer (it only counts repeated entries)" if floor == 0 else "a positive integer"
                raise ContractError(f"dim '{key}' must be {kind}, found {value!r}")
            fixed = dims[key]
            if fixed is not None and fixed != value:
                raise ContractError(f"dim '{key}' is fixed to {fixed} by the contract, found {value}")
            dims[key] = value
        unbound = {k for k, v in dims.items() if v is None}
        # an optional method sized by a dim left unbound is left out of the record (a program without it)
        methods = [m for m in self.methods if not (m.optional and _dims_of(m) & unbound)]
        needed = sorted(k for k in unbound if any(k in _dims_of(m) for m in methods) or k in _state_dims(self.states))
        if needed:
            raise ContractError(f"contract '{self.name}': dims {', '.join(needed)} need sizes to bind")
        dims = {k: v for k, v in dims.items() if v is not None}

        def size(d: Dim, where: str) -> int:
            if isinstance(d, int):
                return d
            if d not in dims:
                raise ContractError(f"{where}: unknown dim '{d}' (dims: {', '.join(dims)})")
            value = dims[d]
            if value is None:
                raise ContractError(f"{where}: dim '{d}' is not bound")
            return value

        def expand(items: Iterable[Any], where: str) -> list[Any]:
            out = []
            for item in items:
                shape = tuple(size(d, f"{where}.{item.name}") for d in item.shape)
                if isinstance(item, IOSpec) and item.bound is not None:
                    item = replace(item, bound=size(item.bound, f"{where}.{item.name}.bound"))
                if item.repeat is None:
                    out.append(replace(item, shape=shape))
                    continue
                for layer in range(size(item.repeat, f"{where}.{item.name}")):
                    fmt = {"layer": layer}
                    extra: dict[str, Any] = {}
                    if isinstance(item, IOSpec):
                        extra["state"] = item.state.format(**fmt) if item.state else None
                        extra["alias"] = (
                            replace(item.alias, input=item.alias.input.format(**fmt), state=item.alias.state.format(**fmt))
                            if item.alias
                            else None
                        )
                    out.append(replace(item, name=item.name.format(**fmt), shape=shape, layer=layer, repeat=None, **extra))
            return out

        bound = tuple(
            MethodSpec(
                m.name,
                tuple(expand(m.inputs, f"methods.{m.name}.inputs")),
                tuple(expand(m.outputs, f"methods.{m.name}.outputs")),
                size(m.slots, f"methods.{m.name}.slots"),
                m.optional,
            )
            for m in methods
        )
        record = Contract(
            name=self.name,
            version=self.version,
            methods=bound,
            states=tuple(expand(self.states, "states")),
            dims=dims,
            required_features=_features_for(self.required_features, bound),
            metadata=dict(self.metadata),
        )
        record.validate()
        return record

    # -------------------------------------------------------------- validation

    def validate(self) -> None:
        """Internal consistency of a bound record; raises :class:`ContractError`."""
        states = {}
        for s in self.states:
            if s.name in states:
                raise ContractError(f"states: duplicate state '{s.name}'")
            states[s.name] = s
        if len({m.name for m in self.methods}) != len(self.methods):
            raise ContractError("methods: duplicate method names")
        for m in self.methods:
            if not isinstance(m.slots, int) or isinstance(m.slots, bool) or m.slots < 1:
                raise ContractError(f"methods.{m.name}.slots: expected a positive integer, found {m.slots!r}")
            names = [i.name for i in m.inputs] + [o.name for o in m.outputs]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ContractError(f"methods.{m.name}: duplicate input/output names {', '.join(dup)}")
            inputs = {i.name: i for i in m.inputs}
            for index, i in enumerate(m.inputs):
                if i.state is not None:
                    _check_state_side(states, i, f"methods.{m.name}.inputs[{index}] ('{i.name}')", i.state)
            for index, o in enumerate(m.outputs):
                where = f"methods.{m.name}.outputs[{index}] ('{o.name}')"
                if o.alias is None:
                    continue
                target = inputs.get(o.alias.input)
                if target is None:
                    raise ContractError(f"{where}: aliases input '{o.alias.input}', which method '{m.name}' lacks")
                if target.state != o.alias.state:
                    raise ContractError(
                        f"{where}: aliases input '{target.name}' bound to state {target.state!r} but declares state "
                        f"'{o.alias.state}'"
                    )
                if (target.shape, target.dtype) != (o.shape, o.dtype):
                    raise ContractError(
                        f"{where}: alias sides differ: input '{target.name}' is {target.dtype} {list(target.shape)}, "
                        f"output is {o.dtype} {list(o.shape)}"
                    )
                state = _check_state_side(states, o, where, o.alias.state)
                if state.ownership != o.alias.ownership:
                    raise ContractError(
                        f"{where}: alias ownership '{o.alias.ownership.value}' differs from state '{state.name}' "
                        f"ownership '{state.ownership.value}'"
                    )

    def check_conforms_to(self, spec: Contract) -> None:
        """A record must follow the registered specification of its name and version."""
        if (self.name, self.version) != (spec.name, spec.version):
            raise ContractError(f"record is {self.name} v{self.version}, specification is {spec.name} v{spec.version}")
        unbound = sorted(k for k, v in self.dims.items() if v is None)
        if unbound:
            raise ContractError(f"record of {self.name} v{self.version} leaves dim(s) {', '.join(unbound)} unbound")
        sizes = {k: v for k, v in self.dims.items() if k in spec.dims and spec.dims[k] is None and v is not None}
        expected = spec.bind(**sizes)
        present = {m.name for m in self.methods}
        for want in expected.methods:
            if want.optional and want.name not in present:
                continue
            try:
                got = self.method(want.name)
            except ContractError:
                raise ContractError(
                    f"program lacks method '{want.name}' required by contract {spec.name} v{spec.version} "
                    f"(program methods: {', '.join(m.name for m in self.methods)})"
                ) from None
            if (got.slots, got.optional) != (want.slots, want.optional):
                raise ContractError(
                    f"method '{want.name}': contract {spec.name} v{spec.version} declares {_describe_method(want)}, "
                    f"record has {_describe_method(got)}"
                )
            for side in ("inputs", "outputs"):
                w_items, g_items = getattr(want, side), getattr(got, side)
                if len(w_items) != len(g_items):
                    raise ContractError(
                        f"method '{want.name}': contract {spec.name} v{spec.version} expects {len(w_items)} {side}, "
                        f"record has {len(g_items)}"
                    )
                for index, (w, g) in enumerate(zip(w_items, g_items)):
                    # a record written before value bounds existed carries none: the specification's applies
                    if g.bound is not None and g.bound != w.bound:
                        raise ContractError(
                            f"method '{want.name}' {side[:-1]} {index} ('{g.name}'): expected values < {w.bound}, "
                            f"found values < {g.bound}"
                        )
                    if (w.name, w.role, w.dtype, w.shape, w.state, w.alias) != (g.name, g.role, g.dtype, g.shape, g.state, g.alias):
                        raise ContractError(
                            f"method '{want.name}' {side[:-1]} {index}: expected {_describe(w)}, found {_describe(g)}"
                        )
        extra = {m.name for m in self.methods} - {m.name for m in expected.methods}
        if extra:
            raise ContractError(
                f"record has method(s) {', '.join(sorted(extra))} not in contract {spec.name} v{spec.version}"
            )
        for want_state in expected.states:
            got_state = self.state(want_state.name)
            # where the storage lives is chosen when a program is exported for a device, not by the contract
            if replace(got_state, device=want_state.device) != want_state:
                raise ContractError(f"state '{want_state.name}': expected {want_state}, found {got_state}")

    def for_methods(self, names: Iterable[str]) -> Contract:
        """This record without the optional methods a program leaves out (``names``: the methods it has), which is
        what the program embeds; raises :class:`etsdk.ContractError` naming a required method that is missing."""
        have = set(names)
        missing = [m.name for m in self.methods if m.name not in have and not m.optional]
        if missing:
            raise ContractError(f"contract '{self.name}' needs method(s) {', '.join(missing)} that were not given")
        kept = tuple(m for m in self.methods if m.name in have)
        if len(kept) == len(self.methods):
            return self
        return replace(self, methods=kept, required_features=_features_for(self.required_features, kept))

    def check_engine_io(
        self,
        method: str,
        inputs: Sequence[tuple[str, tuple[int, ...]] | None],
        outputs: Sequence[tuple[str, tuple[int, ...]] | None],
        *,
        where: str,
        error: type[EtsdkError] | None = None,
    ) -> None:
        """The one engine-I/O check (export, load, runners): ``(dtype name, shape)`` per engine input / output.

        ``None`` stands for a non-tensor value. Raises ``error`` (default
        :class:`ContractError`) naming the method, side, index, name, role,
        what the contract expects and what was found.
        """
        error = error or ContractError
        spec = self.method(method)
        for side, wanted, found in (("input", spec.engine_inputs, inputs), ("output", spec.engine_outputs, outputs)):
            if len(wanted) != len(found):
                raise error(
                    f"{where}: method '{method}' has {len(found)} engine {side}(s), contract '{self.name}' "
                    f"v{self.version} binds {len(wanted)} through the engine ({', '.join(w.name for w in wanted)})"
                )
            for index, (want, got) in enumerate(zip(wanted, found)):
                if got is None or (got[0], tuple(got[1])) != (want.dtype, tuple(want.shape)):
                    got_desc = "a non-tensor value" if got is None else f"{got[0]} {list(got[1])}"
                    raise error(
                        f"{where}: method '{method}' {side} {index} ('{want.name}', role {want.role.value}): "
                        f"expected {want.dtype} {list(want.shape)}, found {got_desc}"
                    )

    # --------------------------------------------------------------- (de)serialise

    def to_json(self) -> dict[str, Any]:
        """The contract as the JSON object :meth:`from_json` reads (format and format version included)."""
        return {
            "format": CONTRACT_FORMAT,
            "format_version": [FORMAT_MAJOR, FORMAT_MINOR],
            "name": self.name,
            "version": self.version,
            "required_features": list(self.required_features),
            "dims": dict(self.dims),
            "metadata": dict(self.metadata),
            "states": [_state_json(s) for s in self.states],
            "methods": {m.name: _method_json(m) for m in self.methods},
        }

    def to_bytes(self) -> bytes:
        """:meth:`to_json` as compact UTF-8 JSON (what a program embeds in its record)."""
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, *, where: str = "contract") -> Contract:
        """Parse UTF-8 JSON strictly (:meth:`from_json`); ``where`` starts every error message (a file name)."""
        try:
            obj = json.loads(bytes(data).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ContractError(f"{where}: not valid UTF-8 JSON: {exc}") from None
        except RecursionError:
            raise ContractError(f"{where}: JSON nested too deeply to be a contract") from None
        return cls.from_json(obj, where=where)

    @classmethod
    def from_json(cls, obj: Any, *, where: str = "contract") -> Contract:
        """Parse a decoded JSON object strictly; raises :class:`etsdk.ContractError` naming the field on any problem.

        A newer format major version, or a required feature this etsdk lacks, is an
        :class:`etsdk.UnsupportedFeatureError` (fail closed).
        """
        p = _Parser(where)
        o = p.obj(obj, "")
        check_format(
            o, expected=CONTRACT_FORMAT, major=FORMAT_MAJOR, minor=FORMAT_MINOR, where=where, error=ContractError,
            what="contract",
        )
        features = tuple(p.string(f, f"required_features[{i}]") for i, f in enumerate(p.sequence(o.get("required_features", []), "required_features")))
        unknown = [f for f in features if f not in KNOWN_CONTRACT_FEATURES]
        if unknown:
            raise UnsupportedFeatureError(
                f"{where}: requires feature(s) {', '.join(unknown)} that this etsdk does not support "
                f"(supported: {', '.join(sorted(KNOWN_CONTRACT_FEATURES))})",
                feature=unknown[0],
            )
        dims_raw = p.obj(o.get("dims", {}), "dims")
        dims: dict[str, int | None] = {}
        for key, value in dims_raw.items():
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ContractError(f"{where}.dims.{key}: expected a positive integer or null, found {value!r}")
            dims[key] = value
        methods_raw = p.obj(o.get("methods"), "methods")
        if not methods_raw:
            raise ContractError(f"{where}.methods: a contract needs at least one method")
        methods = tuple(p.method(name, m, features) for name, m in methods_raw.items())
        states = tuple(p.state(s, f"states[{i}]") for i, s in enumerate(p.sequence(o.get("states", []), "states")))
        contract = cls(
            name=p.string(o.get("name"), "name"),
            version=p.integer(o.get("version"), "version"),
            methods=methods,
            states=states,
            dims=dims,
            required_features=features,
            metadata=p.metadata(o.get("metadata", {}), "metadata"),
        )
        zero = sorted(k for k, v in dims.items() if v == 0 and k in contract.sized_dims)
        if zero:
            raise ContractError(
                f"{where}.dims.{zero[0]}: expected a positive integer or null, found 0 (only a dim that counts "
                f"repeated entries and sizes no shape may be 0)"
            )
        if contract.is_bound and not any(i.repeat for m in methods for i in (*m.inputs, *m.outputs)):
            try:
                contract.validate()
            except ContractError as exc:
                raise ContractError(f"{where}: {exc}") from None
        return contract


def _dims_of(method: MethodSpec) -> set[str]:
    """The dim names ``method`` uses: in its shapes, bounds, repeats and slots."""
    found = {method.slots} if isinstance(method.slots, str) else set()
    for io in (*method.inputs, *method.outputs):
        found.update(d for d in (*io.shape, io.bound, io.repeat) if isinstance(d, str))
    return found


def _state_dims(states: Sequence[StateSpec]) -> set[str]:
    return {d for s in states for d in (*s.shape, s.repeat) if isinstance(d, str)}


def _features_for(features: Sequence[str], methods: Sequence[MethodSpec]) -> tuple[str, ...]:
    """``features`` without ``method.slots`` / ``method.optional`` when none of ``methods`` uses them: a record
    that leaves its optional methods out is the record an older reader knows."""
    unused = {SLOTS_FEATURE} if all(m.slots == 1 for m in methods) else set()
    unused |= {OPTIONAL_FEATURE} if not any(m.optional for m in methods) else set()
    return tuple(f for f in features if f not in unused)


def _check_state_side(states: Mapping[str, StateSpec], item: IOSpec, where: str, name: str) -> StateSpec:
    state = states.get(name)
    if state is None:
        raise ContractError(f"{where}: refers to undeclared state '{name}'")
    if (state.shape, state.dtype) != (item.shape, item.dtype):
        raise ContractError(
            f"{where}: state '{name}' is {state.dtype} {list(state.shape)}, the method binds {item.dtype} {list(item.shape)}"
        )
    return state


def _describe_method(m: MethodSpec) -> str:
    return f"{'an optional' if m.optional else 'a required'} method over {m.slots} session(s)"


def _describe(io: IOSpec) -> str:
    text = f"'{io.name}' ({io.role.value}, {io.dtype} {list(io.shape)}"
    if io.state:
        text += f", state {io.state}"
    if io.alias:
        text += f", alias of {io.alias.input} [{io.alias.kind.value}, {io.alias.ownership.value}]"
    return text + ")"


def _state_json(s: StateSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": s.name,
        "role": s.role.value,
        "dtype": s.dtype,
        "shape": list(s.shape),
        "initial": s.initial,
        "ownership": s.ownership.value,
        "device": s.device,
    }
    if s.layer is not None:
        out["layer"] = s.layer
    if s.repeat is not None:
        out["repeat"] = s.repeat
    return out


def _method_json(m: MethodSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"inputs": [_io_json(i) for i in m.inputs], "outputs": [_io_json(o) for o in m.outputs]}
    if m.slots != 1:
        out["slots"] = m.slots
    if m.optional:
        out["optional"] = True
    return out


def _io_json(i: IOSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": i.name, "role": i.role.value, "dtype": i.dtype, "shape": list(i.shape)}
    if i.state is not None:
        out["state"] = i.state
    if i.alias is not None:
        out["alias"] = {
            "input": i.alias.input,
            "kind": i.alias.kind.value,
            "ownership": i.alias.ownership.value,
            "state": i.alias.state,
        }
    if i.layer is not None:
        out["layer"] = i.layer
    if i.repeat is not None:
        out["repeat"] = i.repeat
    if i.bound is not None:
        out["bound"] = i.bound
    return out


class _Parser:
    """Strict JSON readers that say where a value is, what was expected and found."""

    def __init__(self, where: str) -> None:
        self.where = where

    def _fail(self, path: str, expected: str, value: Any) -> ContractError:
        shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
        return ContractError(f"{self.where}.{path}: expected {expected}, found {shown}")

    def obj(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self._fail(path or "<root>", "an object", value)
        return value

    def sequence(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise self._fail(path, "a list", value)
        return value

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self._fail(path, "a non-empty string", value)
        return value

    def integer(self, value: Any, path: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._fail(path, "an integer", value)
        return value

    def name(self, value: Any, path: str) -> str:
        text = self.string(value, path)
        if not _NAME.match(text):
            raise self._fail(path, "a name (letters, digits, '_', '.')", value)
        return text

    def enum(self, kind: type[enum.Enum], value: Any, path: str) -> Any:
        try:
            return kind(value)
        except ValueError:
            raise ContractError(
                f"{self.where}.{path}: unknown {kind.__name__.lower()} {value!r} "
                f"(known: {', '.join(m.value for m in kind)})"
            ) from None

    def dtype(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or value not in DTYPES:
            raise ContractError(f"{self.where}.{path}: unknown dtype {value!r} (known: {', '.join(sorted(DTYPES))})")
        return str(value)

    def dim(self, value: Any, path: str) -> Dim:
        if isinstance(value, bool) or not isinstance(value, (int, str)) or (isinstance(value, int) and value < 0):
            raise self._fail(path, "a non-negative integer or a dim name", value)
        if isinstance(value, str) and not value:
            raise self._fail(path, "a non-negative integer or a dim name", value)
        return value

    def shape(self, value: Any, path: str) -> tuple[Dim, ...]:
        return tuple(self.dim(d, f"{path}[{i}]") for i, d in enumerate(self.sequence(value, path)))

    def metadata(self, value: Any, path: str) -> dict[str, Any]:
        """Free-form JSON, nested at most :data:`MAX_METADATA_DEPTH` deep, without NaN or infinities."""
        top = self.obj(value, path)
        stack: list[tuple[Any, str, int]] = [(top, path, 1)]
        while stack:
            item, where, depth = stack.pop()
            if depth > MAX_METADATA_DEPTH:
                raise ContractError(f"{self.where}.{path}: nested deeper than {MAX_METADATA_DEPTH} levels (at {where})")
            if isinstance(item, float) and not math.isfinite(item):
                raise self._fail(where, "a finite number", item)
            if isinstance(item, dict):
                stack.extend((v, f"{where}.{k}", depth + 1) for k, v in item.items())
            elif isinstance(item, list):
                stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
        return top

    def device(self, value: Any, path: str) -> str:
        text = self.string(value, path)
        if not _DEVICE.match(text):
            raise ContractError(
                f"{self.where}.{path}: unknown device {text!r} (expected 'cpu', 'cuda' or 'cuda:<index>')"
            )
        return text

    def initial(self, value: Any, dtype: str, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(path, "a number", value)
        if not math.isfinite(value):
            raise self._fail(path, "a finite number", value)
        if dtype in _INT_RANGE:
            low, high = _INT_RANGE[dtype]
            if isinstance(value, float) and not value.is_integer() or not low <= value <= high:
                raise self._fail(path, f"an integer in [{low}, {high}] for a {dtype} state", value)
        elif dtype in _FLOAT_MAX and abs(value) > _FLOAT_MAX[dtype]:
            raise self._fail(path, f"a number a {dtype} state can hold (magnitude <= {_FLOAT_MAX[dtype]:g})", value)
        return float(value)

    def optional_int(self, value: Any, path: str) -> int | None:
        return None if value is None else self.integer(value, path)

    def method(self, name: str, value: Any, features: Sequence[str]) -> MethodSpec:
        path = f"methods.{name}"
        o = self.obj(value, path)
        sides = [
            tuple(self.io(x, f"{path}.{side}[{i}]", output=side == "outputs") for i, x in enumerate(self.sequence(o.get(side), f"{path}.{side}")))
            for side in ("inputs", "outputs")
        ]
        slots = self.dim(o.get("slots", 1), f"{path}.slots")
        optional = o.get("optional", False)
        if not isinstance(optional, bool):
            raise self._fail(f"{path}.optional", "true or false", optional)
        for used, feature, key in ((slots != 1, SLOTS_FEATURE, "slots"), (optional, OPTIONAL_FEATURE, "optional")):
            if used and feature not in features:
                raise ContractError(
                    f"{self.where}.{path}.{key}: a contract declaring '{key}' must require feature {feature} "
                    f"(required_features: {', '.join(features) or 'none'})"
                )
        return MethodSpec(self.name(name, path), sides[0], sides[1], slots, optional)

    def io(self, value: Any, path: str, *, output: bool) -> IOSpec:
        o = self.obj(value, path)
        alias = None
        if "alias" in o:
            if not output:
                raise ContractError(f"{self.where}.{path}: only outputs may alias an input")
            a = self.obj(o["alias"], f"{path}.alias")
            alias = Alias(
                input=self.name(a.get("input"), f"{path}.alias.input"),
                kind=self.enum(AliasKind, a.get("kind"), f"{path}.alias.kind"),
                ownership=self.enum(Ownership, a.get("ownership"), f"{path}.alias.ownership"),
                state=self.name(a.get("state"), f"{path}.alias.state"),
            )
        state = o.get("state")
        if state is not None and output:
            raise ContractError(f"{self.where}.{path}: outputs update state through 'alias', not 'state'")
        return IOSpec(
            name=self.name(o.get("name"), f"{path}.name"),
            role=self.enum(Role, o.get("role"), f"{path}.role"),
            dtype=self.dtype(o.get("dtype"), f"{path}.dtype"),
            shape=self.shape(o.get("shape"), f"{path}.shape"),
            state=None if state is None else self.name(state, f"{path}.state"),
            alias=alias,
            layer=self.optional_int(o.get("layer"), f"{path}.layer"),
            repeat=None if o.get("repeat") is None else self.string(o.get("repeat"), f"{path}.repeat"),
            bound=self._bound(o, path, output),
        )

    def _bound(self, o: dict[str, Any], path: str, output: bool) -> Dim | None:
        if o.get("bound") is None:
            return None
        if output or o.get("state") is not None:
            raise ContractError(f"{self.where}.{path}.bound: only engine inputs take a value bound")
        return self.dim(o["bound"], f"{path}.bound")

    def state(self, value: Any, path: str) -> StateSpec:
        o = self.obj(value, path)
        dtype = self.dtype(o.get("dtype"), f"{path}.dtype")
        return StateSpec(
            name=self.name(o.get("name"), f"{path}.name"),
            role=self.enum(Role, o.get("role"), f"{path}.role"),
            dtype=dtype,
            shape=self.shape(o.get("shape"), f"{path}.shape"),
            initial=self.initial(o.get("initial", 0.0), dtype, f"{path}.initial"),
            ownership=self.enum(Ownership, o.get("ownership", "caller"), f"{path}.ownership"),
            device=self.device(o.get("device", "cpu"), f"{path}.device"),
            layer=self.optional_int(o.get("layer"), f"{path}.layer"),
            repeat=None if o.get("repeat") is None else self.string(o.get("repeat"), f"{path}.repeat"),
        )
