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

from etsdk.backends.reference.graph_format import GRAPH_FEATURE, GRAPH_SECTION
from etsdk.blob import BlobReader
from etsdk.bridge import InitContext
from etsdk.errors import BlobFormatError

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
        self.constants: list[tuple[int, torch.Tensor]] = []
        for spec in document["inputs"]:
            kind = spec.get("kind") if isinstance(spec, dict) else None
            if kind == "user":
                self.user_slots.append((self.slot_count, int(spec["index"])))
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


class _Ref:
    __slots__ = ("slot",)

    def __init__(self, slot: int) -> None:
        self.slot = slot


def _has_ref(value: Any) -> bool:
    if isinstance(value, _Ref):
        return True
    if isinstance(value, list):
        return any(_has_ref(v) for v in value)
    if isinstance(value, dict):
        return any(_has_ref(v) for v in value.values())
    return False


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
    if not _has_ref(value):
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

    def execute(self, args: tuple[Any, ...]) -> None:
        if len(args) != self._num_args:
            raise ValueError(
                f"reference delegate expects {self._num_inputs} input(s) and "
                f"{self._num_args - self._num_inputs} output(s) ({self._num_args} arguments), got {len(args)}"
            )
        slots = self._slots
        for slot, index in self._program.user_slots:
            slots[slot] = args[index]
        # Runtime tensors never require grad, so no autograd state is recorded here.
        for call in self._calls:
            if call.kwargs:
                kwargs = {k: get(slots) for k, get in call.kwargs}
                slots[call.slot] = call.op(*[get(slots) for get in call.args], **kwargs)
            else:
                slots[call.slot] = call.op(*[get(slots) for get in call.args])
        for out, get in zip(args[self._num_inputs :], self._outputs):
            out.copy_(get(slots))
        for slot, _ in self._program.user_slots:
            slots[slot] = None  # never hold runtime memory past the call
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
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BlobFormatError(f"reference graph section is not valid JSON: {exc}") from None
        try:
            program = _Program(document, context)
        except (KeyError, TypeError, ValueError) as exc:
            raise BlobFormatError(f"reference graph is malformed: {type(exc).__name__}: {exc}") from None
        return ReferenceHandle(program, context.blob)
