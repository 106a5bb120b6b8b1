"""Structural checks of ``.pte`` and ``.ptd`` files, before the ExecuTorch runtime reads them.

The runtime verifies a ``.pte``'s flatbuffer (``Verification.InternalConsistency``)
but trusts the indices inside it (an instruction argument past the end of the
value table aborts the process at the first call) and does not verify a
``.ptd`` at all (a flipped byte in its flatbuffer is a SIGSEGV in
``load_method``). These readers check what the runtime would trust:

``.ptd`` (FlatTensor): the ``FH01`` header (flatbuffer and segment regions
inside the file), the whole flatbuffer (FlatBuffers verifier rules), every
segment inside the segment region, in order, without overlap and at the first
aligned offset after the previous one (how every ExecuTorch serializer lays
them out), every segment used by some entry, every entry's segment index,
unique UTF-8 keys, tensor layouts whose size fits their segment.

``.pte`` (Program; its flatbuffer already verified by the runtime): the ``eh00``
extended header, segments and named data as above, and every execution plan:
value, operator, delegate, instruction and jump indices in range, tensors with
a valid dtype, non-negative sizes, a dim order that is a permutation, planned
memory inside its arena, constants inside their segment, delegate data present,
every delegate called and every planned output written by some instruction.

Every read goes through ``os.pread`` on a descriptor the caller holds: a file
truncated while it is checked reads short and is refused; it never faults.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from etsdk._format.flatbuffers import Buffer, FlatbufferError, Table

__all__ = ["DataLayout", "DelegatePlace", "Entry", "FormatError", "ProgramLayout", "read_data_file", "read_program_file"]

PTE_IDENTIFIER = b"ET12"
PTD_IDENTIFIER = b"FT01"
_PTE_HEADER = struct.Struct("<4sIQQ")  # magic, length, program size, segment base offset (+ segment data size)
_PTD_HEADER = struct.Struct("<4sIQQQQ")  # magic, length, flatbuffer offset, size, segment base offset, data size
_MAX_ARENA_SLACK = 16 << 20
# ExecuTorch ScalarType -> element size in bytes (executorch/schema/scalar_type.fbs)
_ELEMENT_SIZE = {
    0: 1,
    1: 1,
    2: 2,
    3: 4,
    4: 8,
    5: 2,
    6: 4,
    7: 8,
    11: 1,
    12: 1,
    13: 1,
    14: 4,
    15: 2,
    16: 1,
    17: 1,
    22: 2,
    23: 1,
    24: 1,
    25: 1,
    26: 1,
    27: 2,
    28: 4,
    29: 8,
}
_KERNEL_TYPES = range(0, 12)  # Null .. OptionalTensorList
_TENSOR, _TENSOR_LIST, _OPTIONAL_TENSOR_LIST = 5, 10, 11
_KERNEL_CALL, _DELEGATE_CALL, _MOVE_CALL, _JUMP_FALSE_CALL, _FREE_CALL = 1, 2, 3, 4, 5


class FormatError(ValueError):
    """A file is not a well-formed ``.pte`` / ``.ptd``; ``region`` says where (``header``, ``flatbuffer``, ...)."""

    def __init__(self, region: str, message: str) -> None:
        super().__init__(f"{region}: {message}")
        self.region = region


@dataclass(frozen=True, slots=True)
class Entry:
    """One named-data entry: its key and its bytes' place in the file."""

    key: str
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class DataLayout:
    size: int
    entries: tuple[Entry, ...]
    segments: tuple[tuple[int, int], ...] = ()  # (file offset, size)


@dataclass(frozen=True, slots=True)
class DelegatePlace:
    """Where one delegate's payload (its processed data) lies in the file: inline in the flatbuffer or a segment."""

    method: str
    index: int  # the delegate's position in the method's delegate list
    backend: str
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class ProgramLayout:
    size: int
    entries: tuple[Entry, ...]
    #: fully qualified names of tensors the program's own plan expects in external data
    external: tuple[str, ...]
    segments: tuple[tuple[int, int], ...] = ()  # (file offset, size)
    program_size: int = 0  # bytes of the flatbuffer at the start of the file
    delegates: tuple[DelegatePlace, ...] = ()  # every method's delegates, in plan order


def _pread(fd: int, size: int, offset: int, region: str) -> bytes:
    chunks = []
    done = 0
    while done < size:
        try:
            chunk = os.pread(fd, min(size - done, 1 << 24), offset + done)
        except OSError as exc:
            raise FormatError(region, f"cannot read the file: {exc.strerror or exc}") from None
        if not chunk:
            raise FormatError(region, f"the file ends at byte {offset + done}, {size - done} byte(s) short")
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def _check_segments(segments: list[tuple[int, int]], data_size: int, region: str) -> None:
    """Segments lie in the segment region, in order, each at the first aligned offset after the previous one."""
    end = 0
    for index, (offset, size) in enumerate(segments):
        where = f"segment {index} ({offset}..{offset + size})"
        if offset + size > data_size:
            raise FormatError(region, f"{where} ends past the {data_size}-byte segment data")
        if offset < end:
            raise FormatError(region, f"{where} overlaps the previous segment, which ends at {end}")
        alignment = offset & -offset if offset else 1 << 62
        if offset and (alignment < 16 or offset - end >= alignment):
            raise FormatError(
                region, f"{where} does not start at the first aligned offset after the previous segment (end {end})"
            )
        end = offset + size


def _named(entries: list[Table] | None, segments: list[tuple[int, int]], base: int, region: str) -> tuple[Entry, ...]:
    out: list[Entry] = []
    keys: set[str] = set()
    used: set[int] = set()
    for i, entry in enumerate(entries or ()):
        key = entry.string(0, "key")
        if not key:
            raise FormatError(region, f"named_data[{i}] has no key")
        if key in keys:
            raise FormatError(region, f"named_data[{i}]: key '{key}' appears twice")
        keys.add(key)
        index = int(entry.scalar(1, "I", "segment_index"))
        if index >= len(segments):
            raise FormatError(region, f"named data '{key}' names segment {index}; the file has {len(segments)}")
        used.add(index)
        offset, size = segments[index]
        out.append(Entry(key, base + offset, size))
    return tuple(out)


def _segment_list(table: Table, index: int) -> list[tuple[int, int]]:
    return [
        (int(s.scalar(0, "Q", "offset")), int(s.scalar(1, "Q", "size"))) for s in table.tables(index, "segments") or ()
    ]


# --------------------------------------------------------------------------------------------- .ptd


def read_data_file(fd: int) -> DataLayout:
    """Check a ``.ptd`` (FlatTensor) file; return where its entries lie."""
    size = os.fstat(fd).st_size
    if size < 64:
        raise FormatError("header", f"{size} bytes is too short for a .ptd (at least 64)")
    head = _pread(fd, 64, 0, "header")
    if head[4:8] != PTD_IDENTIFIER:
        raise FormatError("header", f"file identifier {head[4:8]!r} is not {PTD_IDENTIFIER!r} (not a .ptd, or damaged)")
    magic, length, fb_offset, fb_size, base, data_size = _PTD_HEADER.unpack_from(head, 8)
    if magic != b"FH01" or length < _PTD_HEADER.size:
        raise FormatError("header", f"no FlatTensor header (magic {magic!r}, length {length})")
    if fb_offset < 8 + length or fb_offset + fb_size > base or base + data_size > size:
        raise FormatError(
            "header",
            f"regions do not fit the {size}-byte file (flatbuffer {fb_offset}+{fb_size}, segments {base}+{data_size})",
        )
    try:
        root = Buffer(_pread(fd, fb_offset + fb_size, 0, "flatbuffer")).root(PTD_IDENTIFIER, "FlatTensor")
        int(root.scalar(0, "I", "version"))
        tables = root.tables(1, "segments")
        entries = root.tables(2, "named_data")
        if tables is None or entries is None:
            raise FormatError("flatbuffer", "FlatTensor has no segments or no named_data")
        segments = _segment_list(root, 1)
        _check_segments(segments, data_size, "flatbuffer")
        layout = _named(entries, segments, base, "flatbuffer")
        used = {int(e.scalar(1, "I", "segment_index")) for e in entries}
        unused = sorted(set(range(len(segments))) - used)
        if unused:
            raise FormatError("flatbuffer", f"segment(s) {unused} belong to no named data entry")
        for i, entry in enumerate(entries):
            layout_table = entry.table(2, "tensor_layout")
            if layout_table is not None:
                _check_tensor_layout(layout_table, layout[i])
    except FlatbufferError as exc:
        raise FormatError("flatbuffer", str(exc)) from None
    return DataLayout(size, layout, tuple((base + o, n) for o, n in segments))


def _check_tensor_layout(table: Table, entry: Entry) -> None:
    scalar_type = int(table.scalar(0, "b", "scalar_type"))
    sizes = table.scalars(1, "i", "sizes")
    dim_order = table.scalars(2, "B", "dim_order")
    if scalar_type not in _ELEMENT_SIZE or sizes is None or dim_order is None:
        raise FormatError("flatbuffer", f"named data '{entry.key}': incomplete tensor layout")
    _check_shape(sizes, dim_order, f"named data '{entry.key}'")
    nbytes = _ELEMENT_SIZE[scalar_type] * _product(sizes)
    if nbytes > entry.size:
        raise FormatError(
            "flatbuffer", f"named data '{entry.key}': layout needs {nbytes} bytes, its segment has {entry.size}"
        )


def _check_shape(sizes: tuple[int, ...], dim_order: tuple[int, ...], where: str) -> None:
    if any(s < 0 for s in sizes):
        raise FormatError("flatbuffer", f"{where}: negative size in {list(sizes)}")
    if sorted(dim_order) != list(range(len(sizes))):
        raise FormatError(
            "flatbuffer", f"{where}: dim order {list(dim_order)} is not a permutation of {len(sizes)} dims"
        )


def _product(values: tuple[int, ...]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


# --------------------------------------------------------------------------------------------- .pte


def read_program_file(fd: int) -> ProgramLayout:
    """Check a ``.pte`` (Program) file whose flatbuffer the runtime verified; return its named data."""
    size = os.fstat(fd).st_size
    if size < 8:
        raise FormatError("header", f"{size} bytes is too short for a .pte")
    head = _pread(fd, min(size, 64), 0, "header")
    if head[4:8] != PTE_IDENTIFIER:
        raise FormatError("header", f"file identifier {head[4:8]!r} is not {PTE_IDENTIFIER!r} (not a .pte, or damaged)")
    program_size, base, data_size = size, size, 0
    if len(head) >= 8 + _PTE_HEADER.size and head[8:12] == b"eh00":
        _, length, program_size, base = _PTE_HEADER.unpack_from(head, 8)
        if length < 24 or len(head) < 8 + length:
            raise FormatError("header", f"extended header length {length} is invalid")
        data_size = struct.unpack_from("<Q", head, 8 + 24)[0] if length >= 32 else size - base
        if program_size > base or base + data_size > size:
            raise FormatError(
                "header",
                f"regions do not fit the {size}-byte file (program {program_size}, segments {base}+{data_size})",
            )
    try:
        root = Buffer(_pread(fd, program_size, 0, "flatbuffer")).root(PTE_IDENTIFIER, "Program")
        segments = _segment_list(root, 4)
        _check_segments(segments, data_size, "flatbuffer")
        entries = _named(root.tables(7, "named_data"), segments, base, "flatbuffer")
        constants = _constant_places(root, segments)
        # each inline delegate data's bytes (offset in the flatbuffer, which starts the file), then each segment's
        inline = [_inline_place(t) for t in root.tables(3, "backend_delegate_data") or ()]
        places: dict[int, list[tuple[int, int]]] = {0: inline, 1: [(base + o, n) for o, n in segments]}
        external: list[str] = []
        delegates: list[DelegatePlace] = []
        for p, plan in enumerate(root.tables(1, "execution_plan") or ()):
            external += _check_plan(plan, p, constants, places, delegates)
    except FlatbufferError as exc:
        raise FormatError("flatbuffer", str(exc)) from None
    return ProgramLayout(
        size, entries, tuple(external), tuple((base + o, n) for o, n in segments), program_size, tuple(delegates)
    )


def _inline_place(table: Table) -> tuple[int, int]:
    found = table.raw(0, "data")
    return found if found is not None else (0, 0)


def _constant_places(root: Table, segments: list[tuple[int, int]]) -> list[int]:
    """Bytes available to each constant buffer index (inline storage or a slice of the constant segment)."""
    inline = root.tables(2, "constant_buffer") or []
    sizes = [buffer.length(0, "storage", 1) for buffer in inline]
    sub = root.table(5, "constant_segment")
    offsets = sub.scalars(1, "Q", "offsets") if sub is not None else None
    if sub is not None and offsets:
        index = int(sub.scalar(0, "I", "segment_index"))
        if index >= len(segments):
            raise FormatError("flatbuffer", f"constant_segment names segment {index}; the file has {len(segments)}")
        total = segments[index][1]
        bounds = [*offsets, total]
        if any(o > total for o in offsets) or any(b < a for a, b in zip(bounds, bounds[1:])):
            raise FormatError(
                "flatbuffer", f"constant_segment offsets {list(offsets)[:8]} do not fit its {total}-byte segment"
            )
        return [b - a for a, b in zip(bounds, bounds[1:])]
    return sizes


def _check_plan(
    plan: Table, p: int, constants: list[int], places: dict[int, list[tuple[int, int]]], found: list[DelegatePlace]
) -> list[str]:
    """Check one execution plan; returns the external tensors it names and appends its delegates to ``found``."""
    name = plan.string(0, "name") or f"plan {p}"
    where = f"method '{name}'"
    values = plan.tables(2, "values") or []
    count = len(values)
    arenas = plan.scalars(8, "q", "non_const_buffer_sizes") or ()
    if any(a < 0 for a in arenas):
        raise FormatError("flatbuffer", f"{where}: negative planned memory size in {list(arenas)}")
    used_end = [0] * len(arenas)
    external: list[str] = []

    def index(value: int, what: str, optional: bool = False) -> None:
        if not (0 <= value < count or (optional and value == -1)):
            raise FormatError("flatbuffer", f"{where}: {what} refers to value {value}; the method has {count}")

    planned: set[int] = set()  # tensors in planned memory: computed at run time unless they are inputs
    items: dict[int, tuple[int, ...]] = {}  # tensor list value -> its tensors
    for i, value in enumerate(values):
        kind, body = value.union(0, "val")
        if kind not in _KERNEL_TYPES:
            raise FormatError("flatbuffer", f"{where}: value {i} has unknown type {kind}")
        if kind == _TENSOR and body is not None:
            external += _check_tensor(body, f"{where}: value {i}", arenas, used_end, constants)
            if body.table(6, "allocation_info") is not None:
                planned.add(i)
        elif kind in (_TENSOR_LIST, _OPTIONAL_TENSOR_LIST) and body is not None:
            items[i] = tuple(body.scalars(0, "i", "items") or ())
            for item in items[i]:
                index(item, f"tensor list value {i}", optional=kind == _OPTIONAL_TENSOR_LIST)
    for i, needed in enumerate(used_end):
        if needed > arenas[i] or arenas[i] > 2 * needed + _MAX_ARENA_SLACK:
            raise FormatError(
                "flatbuffer", f"{where}: planned memory {i} is {arenas[i]} bytes, its tensors need {needed}"
            )
    inputs = tuple(plan.scalars(3, "i", "inputs") or ())
    outputs = tuple(plan.scalars(4, "i", "outputs") or ())
    for side, positions in (("input", inputs), ("output", outputs)):
        for position, item in enumerate(positions):
            index(item, f"{side} {position}")
    operators = plan.length(6, "operators")
    delegates = plan.tables(7, "delegates") or []
    for d, delegate in enumerate(delegates):
        backend = delegate.string(0, "id")
        if not backend:
            raise FormatError("flatbuffer", f"{where}: delegate {d} has no backend id")
        processed = delegate.table(1, "processed")
        if processed is None:
            raise FormatError("flatbuffer", f"{where}: delegate {d} has no data")
        location, at = int(processed.scalar(0, "b", "location")), int(processed.scalar(1, "I", "index"))
        listed = places.get(location)
        if listed is None or at >= len(listed):
            raise FormatError(
                "flatbuffer",
                f"{where}: delegate {d}'s data ({'inline' if location == 0 else 'segment'} {at}) does not exist",
            )
        found.append(DelegatePlace(name, d, backend, *listed[at]))
        for spec in delegate.tables(2, "compile_specs") or ():
            spec.string(0, "key")
            spec.raw(1, "value")
    called: set[int] = set()  # delegates some instruction calls
    touched: set[int] = set()  # values some instruction reads or writes
    for c, chain in enumerate(plan.tables(5, "chains") or []):
        for side, field in (("input", 0), ("output", 1)):
            for item in chain.scalars(field, "i", f"{side}s") or ():
                index(item, f"chain {c} {side}")
        instructions = chain.tables(2, "instructions") or []
        for n, instruction in enumerate(instructions):
            kind, body = instruction.union(0, "instr_args")
            what = f"chain {c} instruction {n}"
            if body is None or kind not in range(1, 6):
                raise FormatError("flatbuffer", f"{where}: {what} has unknown kind {kind}")
            if kind in (_KERNEL_CALL, _DELEGATE_CALL):
                target = int(body.scalar(0, "i", "index"))
                limit = operators if kind == _KERNEL_CALL else len(delegates)
                if not 0 <= target < limit:
                    thing = "operator" if kind == _KERNEL_CALL else "delegate"
                    raise FormatError("flatbuffer", f"{where}: {what} calls {thing} {target}; the method has {limit}")
                if kind == _DELEGATE_CALL:
                    called.add(target)
                for a in body.scalars(1, "i", "args") or ():
                    index(a, f"{what} argument")
                    touched.add(a)
                    touched.update(items.get(a, ()))
            elif kind == _MOVE_CALL:
                index(int(body.scalar(0, "i", "move_from")), what)
                index(int(body.scalar(1, "i", "move_to")), what)
                touched.add(int(body.scalar(1, "i", "move_to")))
            elif kind == _JUMP_FALSE_CALL:
                index(int(body.scalar(0, "i", "cond_value_index")), what)
                destination = int(body.scalar(1, "i", "destination_instruction"))
                if not 0 <= destination < len(instructions):
                    raise FormatError("flatbuffer", f"{where}: {what} jumps to instruction {destination}")
            else:
                index(int(body.scalar(0, "i", "value_index")), what)
    # A damaged instruction list can drop a call and still parse: the method would return whatever its planned
    # memory held (found by a one-bit flip of a list length).
    for d in range(len(delegates)):
        if d not in called:
            raise FormatError("flatbuffer", f"{where}: delegate {d} is never called by an instruction")
    for position, item in enumerate(outputs):
        if item in planned and item not in touched and item not in inputs:
            raise FormatError("flatbuffer", f"{where}: output {position} (value {item}) is written by no instruction")
    return external


def _check_tensor(
    tensor: Table, where: str, arenas: tuple[int, ...], used_end: list[int], constants: list[int]
) -> list[str]:
    scalar_type = int(tensor.scalar(0, "b", "scalar_type"))
    if scalar_type not in _ELEMENT_SIZE:
        raise FormatError("flatbuffer", f"{where}: unknown scalar type {scalar_type}")
    sizes = tensor.scalars(2, "i", "sizes") or ()
    _check_shape(sizes, tensor.scalars(3, "B", "dim_order") or (), where)
    if int(tensor.scalar(8, "b", "shape_dynamism")) not in (0, 1, 2):
        raise FormatError("flatbuffer", f"{where}: unknown shape dynamism")
    nbytes = _ELEMENT_SIZE[scalar_type] * _product(sizes)
    allocation = tensor.table(6, "allocation_info")
    if allocation is not None:
        arena = int(allocation.scalar(0, "I", "memory_id"))
        offset = (
            int(allocation.scalar(1, "I", "memory_offset_low"))
            | int(allocation.scalar(2, "I", "memory_offset_high")) << 32
        )
        if not 0 < arena < len(arenas):
            raise FormatError("flatbuffer", f"{where}: planned in memory {arena}; the method plans {len(arenas)}")
        if offset % 16 and nbytes:
            raise FormatError("flatbuffer", f"{where}: planned at offset {offset}, which is not 16-byte aligned")
        used_end[arena] = max(used_end[arena], offset + nbytes)
    external: list[str] = []
    extra = tensor.table(9, "extra_tensor_info")
    if extra is not None:
        if int(extra.scalar(2, "b", "location")) == 1:
            fqn = extra.string(1, "fully_qualified_name")
            if not fqn:
                raise FormatError("flatbuffer", f"{where}: external tensor without a name")
            external.append(fqn)
        extra.string(1, "fully_qualified_name")
    buffer = int(tensor.scalar(5, "I", "data_buffer_idx"))
    if buffer and not external and allocation is None:
        if buffer >= len(constants) or constants[buffer] < nbytes:
            raise FormatError(
                "flatbuffer", f"{where}: constant data {buffer} is missing or shorter than {nbytes} bytes"
            )
    return external
