"""Converted weights kept in files instead of memory while a program is exported.

An export that converts weights (quantizes them) would otherwise hold the converted copy of the whole model in
anonymous memory until the program is written. A :class:`WeightSpill` writes
each converted tensor to its own file and hands back a tensor memory-mapped from that file: the export then reads
it like a checkpoint's weight (its pages dropped from the process once read, its bytes copied from the file into
the program, no second temporary copy), so what stays resident is one tensor at a time, not the model.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any

from etsdk.errors import ExportError

__all__ = ["WeightSpill"]


class WeightSpill:
    """Tensors moved into files under a fresh temporary directory and mapped back.

    Use it around both the conversion and the writing of the program (a ``with`` block): the files are read when
    the program is written and removed when the block ends. Tensors under 1 MiB are returned as they are (a file
    each would cost more than it saves). ``directory``: where the temporary directory is made (default:
    ``tempfile.gettempdir()``, which ``TMPDIR`` chooses). A file that cannot be written (a full disk) raises
    :class:`~etsdk.errors.ExportError` naming the folder.
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        try:
            self.path = Path(tempfile.mkdtemp(prefix="etsdk-spill-", dir=directory))
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

    def __call__(self, tensor: Any) -> Any:
        """``tensor``'s values, as a tensor memory-mapped from a new file (``tensor`` itself when small or not on
        the CPU). The file is written a chunk at a time (the pages of a ``tensor`` mapped from another file, a
        checkpoint's, are dropped from the process as they are read)."""
        import torch

        from etsdk._export.partition import SPOOL_BYTES
        from etsdk._format.mapped_pages import read_through

        source = tensor.detach()
        size = source.numel() * source.element_size()
        if size < SPOOL_BYTES or source.device.type != "cpu":
            return source
        source = source.contiguous()
        path = self.path / f"{self._count}.bin"
        self._count += 1
        try:
            with open(path, "wb") as out:
                read_through(memoryview(source.reshape(-1).view(torch.uint8).numpy()), source.data_ptr(), out.write)
        except OSError as exc:
            path.unlink(missing_ok=True)
            raise ExportError(
                f"writing a {size}-byte converted weight under {self.path.parent} failed: {exc.strerror or exc}; "
                "nothing was written to the output (TMPDIR chooses the folder)"
            ) from exc
        try:
            mapped = torch.from_file(str(path), shared=False, size=source.numel(), dtype=source.dtype)
        except RuntimeError as exc:
            raise ExportError(f"mapping the converted weight {path} back failed: {exc}") from exc
        self.bytes += size
        return mapped.view(source.shape)
