"""A named-data buffer that is a byte range of the file a weight was memory-mapped from (a checkpoint's).

A weight read from a memory-mapped checkpoint need not be copied into a temporary file until the program is
written: the program writer copies its bytes straight from the checkpoint. The bytes were hashed from memory when
the weight was stored, and the copy is hashed again as it is written: a checkpoint changed on disk in between, or a
mapped weight changed in memory, fails the write naming the file (the export's output is written atomically, so
nothing is left behind) instead of writing bytes that differ from the key.
"""

from __future__ import annotations

import hashlib
import io
import os

from executorch.exir._serialize._cord import FileBackedData

from etsdk._format.mapped_pages import FileRange
from etsdk.errors import ExportError

_CHUNK = 8 * 1024 * 1024


class FileRangeData(FileBackedData):  # type: ignore[misc]  # ExecuTorch's writer accepts bytes or FileBackedData
    """``where``'s bytes, whose SHA-256 is ``sha256``; the file is only read, never removed."""

    def __init__(self, where: FileRange, sha256: bytes) -> None:
        # not FileBackedData.__init__: that one sizes (and may own) the whole file
        self._path = where.path
        self._size = where.size
        self._sha256 = sha256
        self._finalizer = None
        self._where = where

    def _chunks(self) -> object:
        where = self._where
        with open(where.path, "rb") as f:
            status = os.fstat(f.fileno())
            if (status.st_dev, status.st_ino) != (where.device, where.inode):
                raise ExportError(f"{where.path} was replaced during the export: its weights cannot be copied into the program")
            f.seek(where.offset)
            left = where.size
            while left:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    raise ExportError(
                        f"{where.path} is shorter than when the export read it ({where.offset + where.size} bytes expected)"
                    )
                left -= len(chunk)
                yield chunk

    def _checked(self, digest: hashlib._Hash) -> None:
        if digest.digest() != self._sha256:
            raise ExportError(
                f"{self._where.size} bytes at offset {self._where.offset} of {self._where.path} changed since the export "
                "read them (the file was rewritten, or the weight mapped from it was changed in memory); nothing was "
                "written to the output"
            )

    def prefix(self, size: int) -> bytes:
        with open(self._where.path, "rb") as f:
            f.seek(self._where.offset)
            return f.read(min(size, self._size))

    def to_bytes(self) -> bytes:
        digest = hashlib.sha256()
        parts = []
        for chunk in self._chunks():  # type: ignore[attr-defined]
            digest.update(chunk)
            parts.append(chunk)
        self._checked(digest)
        return b"".join(parts)

    def write_to_file(self, outfile: io.BufferedIOBase) -> None:
        digest = hashlib.sha256()
        for chunk in self._chunks():  # type: ignore[attr-defined]
            digest.update(chunk)
            outfile.write(chunk)
        self._checked(digest)
