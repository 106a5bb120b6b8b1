"""The export's output: a lowered program, written atomically as a ``.pte`` and its ``.ptd`` files.

:func:`check_output_path` runs before any work (``etsdk export`` calls it before loading a model), and
:meth:`Lowered.save` writes every file to a temporary name beside its target and renames them into place only
when all are complete, so a failure never leaves a partial or destroyed output.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from etsdk.errors import ExportError

__all__ = ["Lowered", "check_free_space", "check_output_path", "format_bytes"]


def _progress(stage: str, quiet: bool, started: float) -> None:
    if not quiet:
        print(f"etsdk: {stage} ({time.perf_counter() - started:.1f}s)", file=sys.stderr, flush=True)


#: Seconds between two progress lines while a program is written.
WRITE_PROGRESS_S = 5.0


class _WriteProgress:
    """A file being written that says how much it holds, and how fast it grows, every :data:`WRITE_PROGRESS_S`
    seconds (a multi-gigabyte program takes a while: its weights are copied, and hashed, as they are written)."""

    def __init__(self, file: Any, name: str, started: float) -> None:
        self._file, self._name, self._started = file, name, started
        self._written = 0
        self._since = time.perf_counter()

    def write(self, data: Any) -> int:
        count = int(self._file.write(data))
        self._written += count
        now = time.perf_counter()
        if now - self._since >= WRITE_PROGRESS_S:
            rate = self._written / max(now - self._started, 1e-9)
            _progress(f"writing {self._name}: {format_bytes(self._written)} written, {format_bytes(int(rate))}/s", False, self._started)
            self._since = now
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


@dataclass
class Lowered:
    """An ExecuTorch program ready to be written.

    ``record``: etsdk's program record (the contract, and each method's etsdk
    delegates in engine order with their signatures and claimed operators),
    the same thing ``etsdk inspect`` shows for a written file. ``manager``:
    ExecuTorch's ``ExecutorchProgramManager``.
    """

    manager: Any
    record: Any = None  # etsdk._state.signature.ProgramRecord
    #: False: :meth:`save` reports its progress on stderr, as ``etsdk.lower(quiet=False)`` did.
    quiet: bool = True

    @property
    def methods(self) -> tuple[str, ...]:
        """The program's method names, sorted."""
        return tuple(sorted(self.manager.methods))

    def delegates(self, method: str) -> tuple[Any, ...]:
        """The etsdk delegates of ``method`` in engine order (backend, signature with claimed operators)."""
        if self.record is None or method not in self.record.methods:
            raise ExportError(f"this program has no method '{method}' (methods: {', '.join(self.methods)})")
        return tuple(self.record.methods[method])

    @property
    def data_files(self) -> tuple[str, ...]:
        """Names (without ``.ptd``) of the external data files this program needs."""
        # ExecutorchProgramManager keeps them as cords; reading its private map
        # avoids the bytes copy its public accessors would make.
        return tuple(sorted(getattr(self.manager, "_tensor_data", None) or {}))

    def save(self, path: str | Path) -> list[Path]:
        """Write the ``.pte`` and every ``.ptd`` beside it, atomically; returns the paths written.

        The paths are checked first (:func:`check_output_path`). Every file is
        written to a temporary file in the target directory and flushed to
        disk; only when all are complete are they renamed into place (each
        ``.ptd``, then the ``.pte``). A failure (a full disk, a kill) leaves the
        previous files byte-identical and no partial file under the final
        names. A program already loaded from the old files keeps running on
        them: a rename never changes an open file.
        """
        path = check_output_path(path, self.data_files)
        started = time.perf_counter()
        _progress(f"writing {path}", self.quiet, started)
        written = [path] + [path.parent / f"{name}.ptd" for name in self.data_files]
        staging = _Staging(path.parent)
        try:
            with staging.file(path) as f:
                self.manager.write_to_file(f if self.quiet else _WriteProgress(f, path.name, started))
            if self.data_files:
                _progress(f"writing {', '.join(n + '.ptd' for n in self.data_files)}", self.quiet, started)
                self.manager.write_tensor_data_to_file(str(staging.directory()))
                for name in self.data_files:
                    staging.adopt(staging.directory() / f"{name}.ptd", path.parent / f"{name}.ptd")
            staging.commit()
        except OSError as exc:
            staging.abort()
            raise ExportError(
                f"writing {path} failed: {exc.strerror or exc}; "
                f"{'the previous files are unchanged' if any(p.exists() for p in written) else 'nothing was written'}"
            ) from None
        except BaseException:
            staging.abort()
            raise
        if not self.quiet:
            size, seconds = sum(p.stat().st_size for p in written), time.perf_counter() - started
            rate = f", {format_bytes(int(size / seconds))}/s" if seconds > 0.05 else ""
            _progress(f"written: {format_bytes(size)}{rate}", self.quiet, started)
        return written


def check_output_path(path: str | Path, data_files: Sequence[str] = ()) -> Path:
    """Check that ``path`` (a ``.pte``) and ``<name>.ptd`` beside it can be written; return ``path``.

    Raises a one-line :class:`ExportError` for a directory in the way, a file
    where a directory should be, or a place this process may not write, before
    any work is done (``etsdk export`` calls it before loading the model).
    """
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise ExportError(f"cannot write the program to {str(path)!r}: it names a directory, not a file")
    targets = [path] + [path.parent / f"{name}.ptd" for name in data_files]
    for target in targets:
        if target.is_dir():
            raise ExportError(f"cannot write {target}: it is a directory")
        if target.exists() and not target.is_file():
            raise ExportError(f"cannot write {target}: it exists and is not a regular file")
    ancestor = path.parent if str(path.parent) else Path(".")
    while not ancestor.exists():
        if ancestor.is_symlink():
            raise ExportError(f"cannot write {path}: {ancestor} is a broken symbolic link")
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ExportError(f"cannot write {path}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write {path}: no permission to write in {ancestor}")
    return path


def format_bytes(count: int) -> str:
    """``count`` bytes for people: ``"812 B"``, ``"5.3 MiB"``, ``"12.8 GiB"`` (powers of 1024, as etsdk's other lines)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def spool_size(tensors: Iterable[Any]) -> int:
    """What ``NamedDataWriter.add_weight`` would keep in temporary files for ``tensors`` (each memory counted once):
    the large ones that are not memory-mapped from a file. A memory-mapped weight (a checkpoint loaded in its own
    dtype) is copied from its file when the program is written, so it needs no temporary copy."""
    from etsdk._export.partition import memory_of, spooled

    seen: set[tuple[Any, ...] | None] = set()
    total = 0
    for tensor in tensors:
        memory = memory_of(tensor) if tensor.device.type != "meta" else None
        if memory is None or memory in seen:
            continue
        seen.add(memory)
        if spooled(tensor):
            total += tensor.numel() * tensor.element_size()
    return total


def check_free_space(path: str | Path, program_bytes: int, *, spooled_bytes: int = 0) -> None:
    """Refuse, before any work, an export whose files cannot fit where they go.

    ``program_bytes``: about what the ``.pte`` and its ``.ptd`` files will hold, written beside ``path`` (the
    previous files stay until the new ones are complete, so their space is not counted as free).
    ``spooled_bytes``: what the export keeps in temporary files under ``tempfile.gettempdir()`` until the
    program is written (weights stored with ``NamedDataWriter.add_weight``). Both are needed at once when the
    two folders share a file system. 5 % is added for the program's own tables. Raises a one-line
    :class:`ExportError` naming the folder, what it needs and what it has.
    """
    ancestor = Path(path).parent if str(Path(path).parent) else Path(".")
    while not ancestor.exists():
        ancestor = ancestor.parent
    needs: dict[int, list[tuple[Path, int, str]]] = {}
    places = [(ancestor, program_bytes, "the program")]
    if spooled_bytes:
        places.append((Path(tempfile.gettempdir()), spooled_bytes, "temporary copies of the weights"))
    for folder, count, what in places:
        with contextlib.suppress(OSError):
            needs.setdefault(os.stat(folder).st_dev, []).append((folder, int(count * 1.05), what))
    for entries in needs.values():
        need = sum(count for _, count, _ in entries)
        folder = entries[0][0]
        free = shutil.disk_usage(folder).free
        if need > free:
            parts = " and ".join(f"{format_bytes(count)} for {what} in {where}" for where, count, what in entries)
            raise ExportError(
                f"not enough free space: the export needs about {parts}, and that file system has "
                f"{format_bytes(free)} free; free some space, or write elsewhere (TMPDIR chooses the temporary folder)"
            )


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


class _Staging:
    """Temporary files beside their targets, renamed into place together by :meth:`commit`."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.parent = directory
        self._dir: Path | None = None
        self._files: list[tuple[Path, Path]] = []  # (temporary, target)

    def directory(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=".etsdk-", suffix=".tmp", dir=self.parent))
        return self._dir

    @contextlib.contextmanager
    def file(self, target: Path) -> Iterator[BinaryIO]:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=self.parent)
        self._files.append((Path(name), target))
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())

    def adopt(self, written: Path, target: Path) -> None:
        """A file something else wrote into :meth:`directory`: flushed here, renamed at commit."""
        fd = os.open(written, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._files.append((written, target))

    def commit(self) -> None:
        mode = 0o666 & ~_umask()
        for temporary, _ in self._files:
            os.chmod(temporary, mode)
        # data files first: a reader never sees a new .pte next to old data it does not name
        for temporary, target in sorted(self._files, key=lambda item: item[1].suffix == ".pte"):
            os.replace(temporary, target)
        self._files.clear()
        self._sync_directory()
        self.abort()

    def _sync_directory(self) -> None:
        try:
            fd = os.open(self.parent, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def abort(self) -> None:
        for temporary, _ in self._files:
            temporary.unlink(missing_ok=True)
        self._files.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
