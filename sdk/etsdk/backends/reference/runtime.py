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


def _materialise(value: Any, slots: list[Any]) -> Any:
    if isinstance(value, _Ref):
        return slots[value.slot]
    if isinstance(value, list):
        return [_materialise(v, slots) for v in value]
    if isinstance(value, dict):
        return {k: _materialise(v, slots) for k, v in value.items()}
    return value


class ReferenceHandle:
    def __init__(self, program: _Program, blob: memoryview) -> None:
        self._program = program
        self._blob = blob  # keeps the runtime's buffer alive while constants may view it
        self._slots: list[Any] = [None] * program.slot_count
        for slot, tensor in program.constants:
            self._slots[slot] = tensor

    def execute(self, args: tuple[Any, ...]) -> None:
        program = self._program
        expected = program.num_inputs + program.num_outputs
        if len(args) != expected:
            raise ValueError(
                f"reference delegate expects {program.num_inputs} input(s) and {program.num_outputs} "
                f"output(s) ({expected} arguments), got {len(args)}"
            )
        slots = self._slots
        for slot, index in program.user_slots:
            slots[slot] = args[index]
        position = program.slot_count - len(program.calls)
        with torch.no_grad():
            for op, call_args, call_kwargs in program.calls:
                slots[position] = op(*_materialise(call_args, slots), **_materialise(call_kwargs, slots))
                position += 1
            for out, value in zip(args[program.num_inputs :], program.outputs):
                out.copy_(_materialise(value, slots))
        for slot, _ in program.user_slots:
            slots[slot] = None  # never hold runtime memory past the call

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
