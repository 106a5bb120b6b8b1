"""The reference runtime binding: runs a partition's aten calls with torch.

``init`` validates the whole blob (format, required features, every op name,
every reference) before returning a handle, so a bad blob fails the method
load, never a call. Constants are zero-copy views of the named data.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from etsdk.backend import BlobReader, InitContext
from etsdk.errors import BlobFormatError
from etsdk.reference_backend.graph_format import GRAPH_FEATURE, GRAPH_SECTION

_ENUMS: dict[str, Callable[[str], Any]] = {
    "dtype": lambda v: getattr(torch, v),
    "device": torch.device,
    "layout": lambda v: getattr(torch, v),
    "memory_format": lambda v: getattr(torch, v),
    "float": float,
}


def _resolve_op(name: str) -> Callable[..., Any]:
    if name == "getitem":
        return operator.getitem
    namespace, _, rest = name.partition("::")
    packet_name, _, overload = rest.partition(".")
    if namespace == "dim_order_ops":
        import executorch.exir.passes.dim_order_ops_registry  # noqa: F401  (registers the ops with torch)
    if namespace == "etsdk":
        from etsdk.backend import ATTENTION, quantized_call  # noqa: F401  (registers etsdk::linear_q, embedding_q, attention)
    try:
        packet = getattr(getattr(torch.ops, namespace), packet_name)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        raise BlobFormatError(f"reference blob calls unknown operator '{name}'") from None


class _Program:
    """A decoded graph: a flat list of calls over numbered slots."""

    def __init__(self, document: Any, context: InitContext) -> None:
        if not isinstance(document, dict) or not {"inputs", "nodes", "outputs"} <= document.keys():
            raise BlobFormatError("reference graph must be an object with inputs, nodes and outputs")
        self.slot_count = 0
        self.user_slots: list[tuple[int, int]] = []  # (slot, delegate arg index)
        self.state_slots: list[tuple[int, int]] = []  # (slot, index into the pushed state)
        self.constants: list[tuple[int, torch.Tensor]] = []
        self.num_states = len(context.states)
        num_user = len(context.signature.inputs)
        for spec in document["inputs"]:
            kind = spec.get("kind") if isinstance(spec, dict) else None
            if kind == "user":
                index = _index(spec["index"], num_user, "user input")
                self.user_slots.append((self.slot_count, index))
            elif kind == "state":
                self.state_slots.append((self.slot_count, _index(spec["index"], self.num_states, "state")))
            elif kind == "constant":
                tensor = context.named_data.get_tensor(
                    str(spec["key"]), getattr(torch, str(spec["dtype"])), tuple(int(d) for d in spec["shape"])
                )
                self.constants.append((self.slot_count, tensor))
            else:
                raise BlobFormatError(f"reference graph input has unknown kind {kind!r}")
            self.slot_count += 1
        self.calls: list[tuple[Callable[..., Any], Any, Any]] = []
        for node in document["nodes"]:
            op = _resolve_op(str(node["op"]))
            self.calls.append((op, self._decode(node["args"]), self._decode(node.get("kwargs", {}))))
            self.slot_count += 1
        self.outputs = self._decode(document["outputs"])
        self.num_inputs = len(self.user_slots)
        self.num_outputs = len(self.outputs)
        self.state_updates: list[tuple[int, Any]] = [
            (_index(u["index"], self.num_states, "state update"), self._decode(u["value"]))
            for u in document.get("state_updates", [])
        ]
        self.in_place = self._plan_in_place_updates()

    def _plan_in_place_updates(self) -> set[int]:
        """Turn functional cache writes back into in-place updates of the session storage.

        ``index_put(state, idx, v)`` (or ``index_copy``) whose result is the
        state's new value runs as ``index_put_`` on the storage itself, if no
        call after it reads the state's old value. Returns the states updated so.
        """
        first_call_slot = self.slot_count - len(self.calls)
        state_slot = {state: slot for slot, state in self.state_slots}
        in_place: set[int] = set()
        for state, value in self.state_updates:
            if not isinstance(value, _Ref) or value.slot < first_call_slot:
                continue
            index = value.slot - first_call_slot
            op, args, kwargs = self.calls[index]
            name = getattr(op, "__name__", "")
            inplace_op = _IN_PLACE.get(name)
            if inplace_op is None or not args or not isinstance(args[0], _Ref) or args[0].slot != state_slot[state]:
                continue
            if name.startswith("index_put") and (len(args) > 3 and args[3] or kwargs.get("accumulate")):
                continue
            later = [c for c in self.calls[index + 1 :] if state_slot[state] in _refs(c[1]) | _refs(c[2])]
            if later:
                continue
            self.calls[index] = (inplace_op, args, kwargs)
            in_place.add(state)
        return in_place

    def _decode(self, value: Any) -> Any:
        # Slot references become _Ref markers; everything else is materialised once.
        if isinstance(value, list):
            return [self._decode(v) for v in value]
        if isinstance(value, dict):
            if "ref" in value:
                slot = value["ref"]
                if not isinstance(slot, int) or not 0 <= slot < self.slot_count:
                    raise BlobFormatError(f"reference graph refers to slot {slot!r} before it exists")
                return _Ref(slot)
            if "list" in value:
                return [self._decode(v) for v in value["list"]]
            if len(value) == 1:
                (kind, raw), = value.items()
                if kind in _ENUMS:
                    return _ENUMS[kind](raw)
            return {k: self._decode(v) for k, v in value.items()}
        if isinstance(value, float) and not math.isfinite(value):
            return value
        return value


def _index(raw: Any, count: int, what: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw < count:
        raise BlobFormatError(f"reference graph names {what} {raw!r}; the delegate binds {count}")
    return raw


class _Ref:
    __slots__ = ("slot",)

    def __init__(self, slot: int) -> None:
        self.slot = slot


def _refs(value: Any) -> set[int]:
    if isinstance(value, _Ref):
        return {value.slot}
    if isinstance(value, (list, tuple)):
        return set().union(*(_refs(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return set().union(*(_refs(v) for v in value.values())) if value else set()
    return set()


_IN_PLACE = {
    "index_put.default": torch.ops.aten.index_put_.default,
    "index_copy.default": torch.ops.aten.index_copy_.default,
}


def _materialise(value: Any, slots: list[Any]) -> Any:
    if isinstance(value, _Ref):
        return slots[value.slot]
    if isinstance(value, list):
        return [_materialise(v, slots) for v in value]
    if isinstance(value, dict):
        return {k: _materialise(v, slots) for k, v in value.items()}
    return value


def _argument_getter(value: Any) -> Callable[[list[Any]], Any]:
    """A function of the slots giving one argument: plain refs and constants cost one lookup."""
    if isinstance(value, _Ref):
        slot = value.slot
        return lambda slots: slots[slot]
    if not _refs(value):
        return lambda slots: value
    return lambda slots: _materialise(value, slots)


class _Call:
    """One aten call with its argument getters resolved at init."""

    __slots__ = ("op", "args", "kwargs", "slot")

    def __init__(self, op: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], slot: int) -> None:
        self.op = op
        self.args = tuple(_argument_getter(a) for a in args)
        self.kwargs = tuple((k, _argument_getter(v)) for k, v in kwargs.items())
        self.slot = slot


class ReferenceHandle:
    def __init__(self, program: _Program, blob: memoryview) -> None:
        self._program = program
        self._blob = blob  # keeps the runtime's buffer alive while constants may view it
        self._slots: list[Any] = [None] * program.slot_count
        for slot, tensor in program.constants:
            self._slots[slot] = tensor
        first = program.slot_count - len(program.calls)
        self._calls = [_Call(op, a, k, first + i) for i, (op, a, k) in enumerate(program.calls)]
        self._outputs = tuple(_argument_getter(v) for v in program.outputs)
        self._num_inputs = program.num_inputs
        self._num_args = program.num_inputs + program.num_outputs
        self._state_slots = tuple(program.state_slots)
        # updates not done in place by the calls themselves: copied after the call
        self._copy_updates = tuple(
            (index, _argument_getter(value)) for index, value in program.state_updates if index not in program.in_place
        )

    def execute(self, args: tuple[Any, ...], state: tuple[torch.Tensor, ...]) -> None:
        if len(args) != self._num_args:
            raise ValueError(
                f"reference delegate expects {self._num_inputs} input(s) and "
                f"{self._num_args - self._num_inputs} output(s) ({self._num_args} arguments), got {len(args)}"
            )
        slots = self._slots
        for slot, index in self._program.user_slots:
            slots[slot] = args[index]
        for slot, index in self._state_slots:
            slots[slot] = state[index]
        # Runtime tensors never require grad, so no autograd state is recorded here.
        for call in self._calls:
            if call.kwargs:
                kwargs = {k: get(slots) for k, get in call.kwargs}
                slots[call.slot] = call.op(*[get(slots) for get in call.args], **kwargs)
            else:
                slots[call.slot] = call.op(*[get(slots) for get in call.args])
        for out, get in zip(args[self._num_inputs :], self._outputs):
            out.copy_(get(slots))
        for index, get in self._copy_updates:
            state[index].copy_(get(slots))
        for slot, _ in self._program.user_slots:
            slots[slot] = None  # never hold runtime memory past the call
        for slot, _ in self._state_slots:
            slots[slot] = None
        for call in self._calls:
            slots[call.slot] = None

    def destroy(self) -> None:
        self._slots.clear()


class ReferenceBinding:
    """Runtime binding of the reference backend."""

    def init(self, context: InitContext) -> ReferenceHandle:
        reader = BlobReader(context.blob, known_features={GRAPH_FEATURE})
        try:
            document = json.loads(bytes(reader.section(GRAPH_SECTION)).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise BlobFormatError(f"reference graph section is not valid JSON: {exc}") from None
        try:
            program = _Program(document, context)
        except (KeyError, TypeError, ValueError) as exc:
            raise BlobFormatError(f"reference graph is malformed: {type(exc).__name__}: {exc}") from None
        return ReferenceHandle(program, context.blob)
