"""A small verifying FlatBuffers reader: no generated code, every read bounds-checked.

The executorch wheel ships the ``.fbs`` schemas but neither the FlatBuffers C++
headers nor generated verifiers, and its ``.ptd`` loader reads the flatbuffer
without verifying it (a flipped byte sent the process into SIGSEGV). This
reader applies the FlatBuffers verifier's rules to every object it touches:
offsets inside the buffer and aligned, vtables inside the buffer, fields inside
their table, vectors and strings inside the buffer, strings NUL-terminated and
UTF-8. It reads only what a caller asks for, so callers walk the schema they
check (see :mod:`etsdk._format.program_file`). Failures raise :class:`FlatbufferError`
with a path such as ``named_data[3].key``.
"""

from __future__ import annotations

import struct

__all__ = ["Buffer", "FlatbufferError", "Table"]

_MAX_TABLES = 10_000_000
_SCALARS = {fmt: struct.Struct("<" + fmt) for fmt in "bBhHiIqQfd?"}


class FlatbufferError(ValueError):
    """The bytes are not a well-formed flatbuffer of the expected schema."""


class Buffer:
    """The bytes of one flatbuffer (offset 0 is its root offset)."""

    __slots__ = ("data", "size", "budget")

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data = data
        self.size = len(data)
        self.budget = _MAX_TABLES

    def need(self, pos: int, length: int, align: int, where: str) -> None:
        if pos < 0 or length < 0 or pos + length > self.size:
            raise FlatbufferError(f"{where}: bytes {pos}..{pos + length} lie outside the {self.size}-byte flatbuffer")
        if align > 1 and pos % align:
            raise FlatbufferError(f"{where}: offset {pos} is not aligned to {align}")

    def scalar(self, fmt: str, pos: int, where: str) -> int | float | bool:
        s = _SCALARS[fmt]
        self.need(pos, s.size, s.size, where)
        value: int | float | bool = s.unpack_from(self.data, pos)[0]
        return value

    def root(self, identifier: bytes | None, where: str = "root") -> Table:
        if self.size < 8:
            raise FlatbufferError(f"{where}: {self.size} bytes is too short for a flatbuffer")
        if identifier is not None and bytes(self.data[4:8]) != identifier:
            raise FlatbufferError(f"{where}: file identifier is {bytes(self.data[4:8])!r}, expected {identifier!r}")
        return Table(self, int(self.scalar("I", 0, where)), where)


class Table:
    """One table: fields by index (the order of the schema, union types counting as one field each)."""

    __slots__ = ("buf", "pos", "vtable", "vsize", "tsize", "where")

    def __init__(self, buf: Buffer, pos: int, where: str) -> None:
        buf.budget -= 1
        if buf.budget < 0:
            raise FlatbufferError(f"{where}: more than {_MAX_TABLES} tables")
        self.buf, self.pos, self.where = buf, pos, where
        vtable = pos - int(buf.scalar("i", pos, where))
        buf.need(vtable, 4, 2, f"{where} (vtable)")
        self.vtable = vtable
        self.vsize = int(buf.scalar("H", vtable, where))
        self.tsize = int(buf.scalar("H", vtable + 2, where))
        if self.vsize < 4 or self.vsize % 2:
            raise FlatbufferError(f"{where}: vtable size {self.vsize} is not an even number >= 4")
        if self.tsize < 4:
            raise FlatbufferError(f"{where}: table size {self.tsize} is smaller than its vtable offset")
        buf.need(vtable, self.vsize, 2, f"{where} (vtable)")
        buf.need(pos, self.tsize, 1, f"{where} (table)")

    def _field(self, index: int, size: int, name: str) -> int | None:
        entry = 4 + 2 * index
        if entry + 2 > self.vsize:
            return None
        voffset = int(self.buf.scalar("H", self.vtable + entry, self.where))
        if voffset == 0:
            return None
        where = f"{self.where}.{name}"
        if voffset < 4 or voffset + size > self.tsize:
            raise FlatbufferError(
                f"{where}: field at {voffset}..{voffset + size} lies outside its {self.tsize}-byte table"
            )
        pos = self.pos + voffset
        self.buf.need(pos, size, size, where)
        return pos

    def scalar(self, index: int, fmt: str, name: str, default: int | float | bool = 0) -> int | float | bool:
        pos = self._field(index, _SCALARS[fmt].size, name)
        return default if pos is None else self.buf.scalar(fmt, pos, f"{self.where}.{name}")

    def _target(self, index: int, name: str) -> int | None:
        pos = self._field(index, 4, name)
        if pos is None:
            return None
        offset = int(self.buf.scalar("I", pos, f"{self.where}.{name}"))
        if offset == 0 or offset >= 1 << 31:
            raise FlatbufferError(f"{self.where}.{name}: offset {offset} is not a valid forward offset")
        return pos + offset

    def table(self, index: int, name: str) -> Table | None:
        target = self._target(index, name)
        return None if target is None else Table(self.buf, target, f"{self.where}.{name}")

    def _vector(self, index: int, elem_size: int, name: str) -> tuple[int, int] | None:
        target = self._target(index, name)
        if target is None:
            return None
        where = f"{self.where}.{name}"
        count = int(self.buf.scalar("I", target, where))
        start = target + 4
        self.buf.need(start, count * elem_size, 1, f"{where} ({count} elements)")
        return start, count

    def length(self, index: int, name: str, elem_size: int = 4) -> int:
        found = self._vector(index, elem_size, name)
        return 0 if found is None else found[1]

    def scalars(self, index: int, fmt: str, name: str) -> tuple[int, ...] | None:
        size = _SCALARS[fmt].size
        found = self._vector(index, size, name)
        if found is None:
            return None
        start, count = found
        if size > 1 and start % size:
            raise FlatbufferError(f"{self.where}.{name}: vector data at {start} is not aligned to {size}")
        return struct.unpack_from(f"<{count}{fmt}", self.buf.data, start)

    def raw(self, index: int, name: str) -> tuple[int, int] | None:
        """``(offset, length)`` of a byte vector."""
        return self._vector(index, 1, name)

    def tables(self, index: int, name: str) -> list[Table] | None:
        found = self._vector(index, 4, name)
        if found is None:
            return None
        start, count = found
        out = []
        for i in range(count):
            pos = start + 4 * i
            offset = int(self.buf.scalar("I", pos, f"{self.where}.{name}[{i}]"))
            if offset == 0 or offset >= 1 << 31:
                raise FlatbufferError(f"{self.where}.{name}[{i}]: offset {offset} is not a valid forward offset")
            out.append(Table(self.buf, pos + offset, f"{self.where}.{name}[{i}]"))
        return out

    def string(self, index: int, name: str) -> str | None:
        found = self._vector(index, 1, name)
        if found is None:
            return None
        start, count = found
        where = f"{self.where}.{name}"
        self.buf.need(start, count + 1, 1, where)
        if self.buf.data[start + count] != 0:
            raise FlatbufferError(f"{where}: string is not NUL-terminated")
        try:
            return bytes(self.buf.data[start : start + count]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FlatbufferError(f"{where}: string is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None

    def union(self, index: int, name: str) -> tuple[int, Table | None]:
        """A union occupies two fields: its type (``index``) and its value (``index + 1``)."""
        kind = int(self.scalar(index, "B", f"{name}_type"))
        value = self.table(index + 1, name)
        if kind != 0 and value is None:
            raise FlatbufferError(f"{self.where}.{name}: union of type {kind} has no value")
        return kind, value
