"""A named-data buffer that is a byte range of the file a weight was memory-mapped from (a checkpoint's).

A weight read from a memory-mapped checkpoint need not be copied into a temporary file until the program is
written: the program writer copies its bytes straight from the checkpoint. The file is opened when the weight is
stored and kept open until the program is written (so deleting or renaming the checkpoint in between does not
matter), the bytes were hashed from memory when the weight was stored, and the copy is hashed again as it is
written: a checkpoint rewritten in place in between, or a mapped weight changed in memory, fails the write naming
the file (the export's output is written atomically, so nothing is left behind) instead of writing bytes that
differ from the key.
"""

from __future__ import annotations

import hashlib
import io
import os
import weakref
from collections.abc import Iterator
from typing import Any

from executorch.exir._serialize._cord import FileBackedData

from etsdk._format.mapped_pages import CHUNK, FileRange
from etsdk.errors import ExportError


class _OpenFile:
    """One read-only descriptor of a mapped file, shared by every range of it; closed when the last is dropped."""

    def __init__(self, where: FileRange) -> None:
        try:
            self.fd = os.open(where.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            status = os.fstat(self.fd)
        except OSError as exc:
            raise ExportError(f"cannot open {where.path}, which a weight is mapped from: {exc.strerror or exc}") from exc
        if (status.st_dev, status.st_ino) != (where.device, where.inode):
            os.close(self.fd)
            raise ExportError(f"{where.path} was replaced since its weights were mapped: export again")
        self.path = where.path

    def __del__(self) -> None:
        os.close(self.fd)


_open_files: weakref.WeakValueDictionary[tuple[int, int], _OpenFile] = weakref.WeakValueDictionary()


class FileRangeData(FileBackedData):  # type: ignore[misc]  # ExecuTorch's writer accepts bytes or FileBackedData
    """``where``'s bytes, whose SHA-256 is ``sha256``; the file is only read (through a descriptor opened now), never
    removed."""

    def __init__(self, where: FileRange, sha256: bytes) -> None:
        # not FileBackedData.__init__: that one sizes (and may own) the whole file
        self._path = where.path
        self._size = where.size
        self._sha256 = sha256
        self._finalizer = None
        self._where = where
        key = (where.device, where.inode)
        opened = _open_files.get(key)
        if opened is None:
            opened = _open_files[key] = _OpenFile(where)
        self._file = opened

    def _chunks(self, limit: int | None = None) -> Iterator[bytes]:
        where = self._where
        end = where.size if limit is None else min(limit, where.size)
        done = 0
        while done < end:
            try:
                chunk = os.pread(self._file.fd, min(CHUNK, end - done), where.offset + done)
            except OSError as exc:
                raise ExportError(f"reading {where.path} for the program failed: {exc.strerror or exc}") from exc
            if not chunk:
                raise ExportError(
                    f"{where.path} is shorter than when the export read it ({where.offset + where.size} bytes expected)"
                )
            done += len(chunk)
            yield chunk

    def _checked(self, digest: Any) -> None:
        if digest.digest() != self._sha256:
            raise ExportError(
                f"{self._where.size} bytes at offset {self._where.offset} of {self._where.path} changed since the export "
                "read them (the file was rewritten, or the weight mapped from it was changed in memory); nothing was "
                "written to the output"
            )

    def prefix(self, size: int) -> bytes:
        return b"".join(self._chunks(size))

    def to_bytes(self) -> bytes:
        digest = hashlib.sha256()
        parts = []
        for chunk in self._chunks():
            digest.update(chunk)
            parts.append(chunk)
        self._checked(digest)
        return b"".join(parts)

    def write_to_file(self, outfile: io.BufferedIOBase) -> None:
        digest = hashlib.sha256()
        for chunk in self._chunks():
            digest.update(chunk)
            outfile.write(chunk)
        self._checked(digest)
