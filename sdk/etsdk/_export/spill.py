"""Converted weights kept in files instead of memory while a program is exported.

An export that converts weights (quantizes them) would otherwise hold the converted copy of the whole model in
anonymous memory until the program is written (so would one that converts their dtype: a bfloat16 checkpoint
exported with float32 weights). A :class:`WeightSpill` makes
each converted tensor in its own file, memory-mapped: the export then reads
it like a checkpoint's weight (its pages dropped from the process once read, its bytes copied from the file into
the program, no second temporary copy), so what stays resident is one tensor at a time, not the model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any

from etsdk.errors import ExportError

__all__ = ["WeightSpill"]


_PREFIX = "etsdk-spill-"


def remove_orphans(parent: Path, prefix: str) -> None:
    """Remove the files and folders ``<prefix><pid>-...`` in ``parent`` whose process is gone: one killed (out of
    memory, ``kill -9``) could not remove its own temporary weights, gigabytes of them. One whose process still
    runs, or whose process this one cannot tell about, is left alone."""
    try:
        found = list(parent.glob(f"{prefix}*-*"))
    except OSError:
        return
    for path in found:
        pid = path.name.removeprefix(prefix).partition("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        if not 0 < int(pid) < 2**31:
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its process runs
        except ProcessLookupError:
            pass  # gone
        except OSError:
            continue  # another user's process, or no way to tell
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass  # not ours to remove: left as it is


class WeightSpill:
    """Tensors made in files under a fresh temporary directory, memory-mapped (:meth:`empty`, :meth:`convert`).

    Use it around both the conversion and the writing of the program (a ``with`` block): the files are read when
    the program is written and removed when the block ends. Tensors under 1 MiB are made in memory (a file each
    would cost more than it saves). ``directory``: where the temporary directory is made (default:
    ``tempfile.gettempdir()``, which ``TMPDIR`` chooses); spill folders left there by a process that was killed
    are removed first. A file that cannot be written (a full disk) raises
    :class:`~etsdk.errors.ExportError` naming the folder.
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        remove_orphans(Path(directory if directory is not None else tempfile.gettempdir()), _PREFIX)
        try:
            self.path = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=directory))
        except OSError as exc:
            where = directory if directory is not None else tempfile.gettempdir()
            raise ExportError(f"cannot make a folder for converted weights under {where}: {exc.strerror or exc} (TMPDIR chooses the folder)") from exc
        self._removal = weakref.finalize(self, shutil.rmtree, str(self.path), True)  # also without close()
        self._count = 0
        #: bytes written to files so far
        self.bytes = 0

    def __enter__(self) -> WeightSpill:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Remove the files (tensors mapped from them stay readable until released: the mappings keep them)."""
        self._removal()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised tensor in a new file, memory-mapped shared (what is written to it goes to the file, so its
        pages can be dropped from the process once written); ``torch.empty`` when under 1 MiB."""
        import math

        import torch

        from etsdk._export.partition import SPOOL_BYTES

        count = math.prod(shape)
        size = count * torch.empty((), dtype=dtype).element_size()
        if size < SPOOL_BYTES:
            return torch.empty(shape, dtype=dtype)
        path = self.path / f"{self._count}.bin"
        self._count += 1
        try:
            with open(path, "wb") as out:  # the blocks reserved now: a full disk is an error here, not a SIGBUS later
                os.posix_fallocate(out.fileno(), 0, size)
            made = torch.from_file(str(path), shared=True, size=count, dtype=dtype)
        except (OSError, RuntimeError) as exc:
            path.unlink(missing_ok=True)
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise ExportError(
                f"making a {size}-byte file for a converted weight under {self.path.parent} failed: {why}; "
                "nothing was written to the output (TMPDIR chooses the folder)"
            ) from exc
        self.bytes += size
        return made.view(shape)

    def convert(self, tensor: Any, dtype: Any) -> Any:
        """``tensor`` converted to ``dtype`` (``tensor.to(dtype)``'s values), made by :meth:`empty` and written a slice
        of rows at a time: the pages of a memory-mapped ``tensor`` (a checkpoint's) and the written pages are
        dropped from the process as each slice is done, so a model's weights convert with one slice resident."""
        from etsdk._format.mapped_pages import CHUNK, release_file_pages, trim_heap

        source = tensor.detach()
        made = self.empty(tuple(source.shape), dtype)
        if source.dim() == 0 or source.numel() == 0:
            return made.copy_(source)
        rows = int(source.shape[0])
        step = max(1, CHUNK // max(1, source[0].numel() * source.element_size()))
        for start in range(0, rows, step):
            part, written = source[start : start + step], made[start : start + step]
            written.copy_(part)
            release_file_pages(written.data_ptr(), written.numel() * written.element_size())
            if part.is_contiguous() and part.device.type == "cpu":
                release_file_pages(part.data_ptr(), part.numel() * part.element_size())
        trim_heap()
        return made
