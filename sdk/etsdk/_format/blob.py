"""The etsdk delegate-blob container: one format for every plugin's blob.

Layout (all integers little-endian)::

    0   8  magic            b"ETSDKBLB"
    8   2  major version    a reader refuses a newer major version
    10  2  minor version    newer minors are readable by older readers
    12  4  header length    bytes of the JSON header that follows
    16  8  total length     bytes of the whole blob (detects truncation)
    24  .. header           UTF-8 JSON: {"required_features": [str],
                            "optional_features": [str], "producer": str,
                            "sections": [{"name", "offset", "length", "alignment"}]}
    ..  .. sections         each at its absolute offset, a multiple of its alignment

A reader is told which features it understands and refuses a blob that
*requires* any other (fail closed); optional features it does not know are
ignored. Sections are returned as zero-copy ``memoryview`` slices. The writer
streams sections (bytes, buffers or whole files) without holding them together
in memory.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from etsdk.errors import BlobFormatError, UnsupportedFeatureError

__all__ = ["BLOB_MAGIC", "BlobReader", "BlobSection", "BlobWriter"]

BLOB_MAGIC = b"ETSDKBLB"
MAJOR_VERSION = 1
MINOR_VERSION = 0
_FIXED = struct.Struct("<8sHHIQ")
_MAX_HEADER = 16 << 20
_MAX_ALIGNMENT = 1 << 16
_STREAM_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class BlobSection:
    name: str
    offset: int
    length: int
    alignment: int


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def _check_alignment(name: str, alignment: object) -> int:
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment <= 0
        or alignment > _MAX_ALIGNMENT
        or alignment & (alignment - 1)
    ):
        raise BlobFormatError(
            f"section '{name}': alignment must be a power of two in [1, {_MAX_ALIGNMENT}], found {alignment!r}"
        )
    return alignment


class BlobWriter:
    """Build a blob section by section; nothing is read until it is written."""

    def __init__(
        self,
        *,
        required_features: Iterable[str] = (),
        optional_features: Iterable[str] = (),
        producer: str = "etsdk",
    ) -> None:
        self.required_features = sorted(set(required_features))
        self.optional_features = sorted(set(optional_features))
        self.producer = producer
        self._sections: list[tuple[str, int, int, bytes | memoryview | Path]] = []

    def add_section(self, name: str, data: bytes | bytearray | memoryview, *, alignment: int = 16) -> None:
        """Add section ``name`` holding ``data``'s bytes, starting at a multiple of ``alignment`` in the blob.

        ``data`` is referenced, not copied: it must stay unchanged until the blob is written. ``name`` must be
        non-empty and unique in the blob; ``alignment`` a power of two up to 65536, counted from the blob's start
        (so a section is aligned in memory as far as the blob itself is). Raises :class:`etsdk.BlobFormatError`
        naming the section otherwise.
        """
        view = memoryview(data).cast("B")
        self._add(name, view.nbytes, alignment, view)

    def add_file_section(self, name: str, path: str | Path, *, alignment: int = 64) -> None:
        """Add a section whose bytes are streamed from ``path`` at write time."""
        path = Path(path)
        self._add(name, path.stat().st_size, alignment, path)

    def _add(self, name: str, length: int, alignment: int, source: bytes | memoryview | Path) -> None:
        if not isinstance(name, str) or not name:
            raise BlobFormatError(f"section name must be a non-empty string, found {name!r}")
        if any(existing == name for existing, *_ in self._sections):
            raise BlobFormatError(f"duplicate section name '{name}'")
        self._sections.append((name, length, _check_alignment(name, alignment), source))

    def _layout(self) -> tuple[bytes, list[BlobSection], int]:
        # The header's length depends on the offsets it records; iterate until stable.
        header_len = 0
        while True:
            offset = _FIXED.size + header_len
            sections = []
            for name, length, alignment, _ in self._sections:
                offset = _align(offset, alignment)
                sections.append(BlobSection(name, offset, length, alignment))
                offset += length
            header = json.dumps(
                {
                    "producer": self.producer,
                    "required_features": self.required_features,
                    "optional_features": self.optional_features,
                    "sections": [
                        {"name": s.name, "offset": s.offset, "length": s.length, "alignment": s.alignment}
                        for s in sections
                    ],
                },
                separators=(",", ":"),
            ).encode()
            if len(header) == header_len:
                return header, sections, offset
            header_len = len(header)

    def write_to(self, out: BinaryIO) -> int:
        """Stream the blob into ``out``; returns the number of bytes written."""
        header, sections, total = self._layout()
        out.write(_FIXED.pack(BLOB_MAGIC, MAJOR_VERSION, MINOR_VERSION, len(header), total))
        out.write(header)
        position = _FIXED.size + len(header)
        chunk: bytearray | None = None
        for section, (_, _, _, source) in zip(sections, self._sections):
            out.write(b"\0" * (section.offset - position))
            if isinstance(source, Path):
                chunk = chunk if chunk is not None else bytearray(_STREAM_CHUNK)
                _stream(source, out, chunk, section.length)
            else:
                out.write(source)
            position = section.offset + section.length
        return position

    def to_bytes(self) -> bytes:
        """The whole blob in memory (:meth:`write_to` streams it instead; prefer that for model-sized sections)."""
        import io

        buffer = io.BytesIO()
        self.write_to(buffer)
        return buffer.getvalue()


def _stream(source: Path, out: BinaryIO, chunk: bytearray, length: int) -> None:
    """Copy ``source`` through one reused buffer: memory stays at one chunk whatever the size."""
    view = memoryview(chunk)
    copied = 0
    with source.open("rb") as f:
        while True:
            n = f.readinto(chunk)
            if not n:
                break
            out.write(view[:n])
            copied += n
    if copied != length:
        raise BlobFormatError(
            f"section file {source} changed size while writing: expected {length} bytes, read {copied}"
        )


class BlobReader:
    """Validate a blob completely on construction, then hand out zero-copy sections."""

    def __init__(self, data: bytes | bytearray | memoryview, *, known_features: Iterable[str] = ()) -> None:
        view = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
        if view.nbytes < _FIXED.size:
            raise BlobFormatError(
                f"blob is {view.nbytes} bytes, shorter than the {_FIXED.size}-byte etsdk blob preamble"
            )
        magic, major, minor, header_len, total = _FIXED.unpack_from(view, 0)
        if magic != BLOB_MAGIC:
            raise BlobFormatError(f"not an etsdk blob: expected magic {BLOB_MAGIC!r}, found {bytes(magic)!r}")
        if major > MAJOR_VERSION:
            raise UnsupportedFeatureError(
                f"blob format version {major}.{minor} is newer than this reader ({MAJOR_VERSION}.{MINOR_VERSION}); "
                f"upgrade etsdk to read it",
                feature=f"format-{major}",
            )
        if total != view.nbytes:
            raise BlobFormatError(
                f"blob length mismatch: header says {total} bytes, found {view.nbytes} (truncated or padded)"
            )
        if header_len > _MAX_HEADER or _FIXED.size + header_len > total:
            raise BlobFormatError(f"blob header length {header_len} does not fit in a {total}-byte blob")
        try:
            header = json.loads(bytes(view[_FIXED.size : _FIXED.size + header_len]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise BlobFormatError(f"blob header is not valid UTF-8 JSON: {exc}") from None
        if not isinstance(header, dict):
            raise BlobFormatError(f"blob header must be a JSON object, found {type(header).__name__}")
        self.version = (major, minor)
        self.producer = _typed(header, "producer", str, "")
        self.required_features = tuple(_str_list(header, "required_features"))
        self.optional_features = tuple(_str_list(header, "optional_features"))
        known = set(known_features)
        unknown = [f for f in self.required_features if f not in known]
        if unknown:
            raise UnsupportedFeatureError(
                f"blob from '{self.producer}' requires feature(s) {', '.join(unknown)} that this reader "
                f"does not support (it supports: {', '.join(sorted(known)) or 'none'}); upgrade the plugin",
                feature=unknown[0],
            )
        raw_sections = _typed(header, "sections", list, [])
        self._sections: dict[str, BlobSection] = {}
        data_start = _FIXED.size + header_len
        for i, raw in enumerate(raw_sections):
            if not isinstance(raw, dict):
                raise BlobFormatError(f"section {i}: expected an object, found {type(raw).__name__}")
            name = _typed(raw, "name", str, None, where=f"section {i}")
            offset = _typed(raw, "offset", int, None, where=f"section '{name}'")
            length = _typed(raw, "length", int, None, where=f"section '{name}'")
            alignment = _check_alignment(name, raw.get("alignment"))
            if name in self._sections:
                raise BlobFormatError(f"duplicate section name '{name}'")
            if offset < data_start or length < 0 or offset + length > total:
                raise BlobFormatError(
                    f"section '{name}' spans [{offset}, {offset + length}) outside the blob's data "
                    f"[{data_start}, {total})"
                )
            if offset % alignment:
                raise BlobFormatError(
                    f"section '{name}' offset {offset} is not a multiple of its alignment {alignment}"
                )
            self._sections[name] = BlobSection(name, offset, length, alignment)
        self._view = view

    @staticmethod
    def declared_features(data: bytes | bytearray | memoryview) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(required, optional)`` features a blob declares, without refusing any (for tools and tests)."""
        view = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
        if view.nbytes < _FIXED.size:
            raise BlobFormatError(
                f"blob is {view.nbytes} bytes, shorter than the {_FIXED.size}-byte etsdk blob preamble"
            )
        magic, _, _, header_len, _ = _FIXED.unpack_from(view, 0)
        if magic != BLOB_MAGIC or header_len > min(_MAX_HEADER, view.nbytes - _FIXED.size):
            raise BlobFormatError("not an etsdk blob (bad magic or header length)")
        try:
            header = json.loads(bytes(view[_FIXED.size : _FIXED.size + header_len]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise BlobFormatError(f"blob header is not valid UTF-8 JSON: {exc}") from None
        if not isinstance(header, dict):
            raise BlobFormatError("blob header must be a JSON object")
        return tuple(_str_list(header, "required_features")), tuple(_str_list(header, "optional_features"))

    @property
    def sections(self) -> tuple[BlobSection, ...]:
        """Every section's ``name``, ``offset``, ``length`` and ``alignment``, in the blob's order (all checked)."""
        return tuple(self._sections.values())

    def has_section(self, name: str) -> bool:
        """Whether the blob has section ``name`` (for optional sections)."""
        return name in self._sections

    def section(self, name: str) -> memoryview:
        """Section ``name`` as a zero-copy view of the blob (keep the blob alive while you use it).

        Raises :class:`etsdk.BlobFormatError` naming the sections there are when the blob has no such section.
        """
        found = self._sections.get(name)
        if found is None:
            raise BlobFormatError(f"blob has no section '{name}' (sections: {', '.join(self._sections) or 'none'})")
        return self._view[found.offset : found.offset + found.length]


_T = TypeVar("_T")


def _typed(obj: dict[str, Any], key: str, kind: type[_T], default: _T | None, *, where: str = "blob header") -> _T:
    if key not in obj:
        if default is None:
            raise BlobFormatError(f"{where}: missing '{key}'")
        return default
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BlobFormatError(f"{where}: '{key}' must be {kind.__name__}, found {type(value).__name__}")
    return value


def _str_list(obj: dict[str, Any], key: str) -> list[str]:
    value: list[Any] = _typed(obj, key, list, [])
    if not all(isinstance(v, str) for v in value):
        raise BlobFormatError(f"blob header: '{key}' must be a list of strings")
    return value
