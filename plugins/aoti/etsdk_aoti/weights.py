"""The weights layout of an etsdk-aoti delegate, and how it is written and read.

A delegate's weights are one named-data entry (in the ``.pte``, or a ``.ptd``)
laid out like AOTInductor's own constants blob:

* constants in the container's order; folded constants, state and constants
  left absent take no slot;
* each slot holds the constant's storage bytes (``nbytes``, as the container
  reports them);
* on CPU every slot starts at a multiple of 64 bytes (padding is zeros); when
  every constant lives on CUDA the slots are packed back to back.

The writer streams tensor by tensor into a file (one tensor's bytes in memory
at a time, never the whole blob); the reader hands out one zero-copy, exact-size
tensor per constant (binding views into one big mapped tensor is not safe).
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

CPU_ALIGNMENT = 64


@dataclass(frozen=True, slots=True)
class Slot:
    name: str
    offset: int
    nbytes: int


def layout(entries: Iterable[tuple[str, int]], device: str) -> tuple[list[Slot], int]:
    """Slots for ``(name, nbytes)`` in order, and the total size, for ``device``."""
    alignment = 1 if device.startswith("cuda") else CPU_ALIGNMENT
    slots, offset = [], 0
    for name, nbytes in entries:
        offset = (offset + alignment - 1) // alignment * alignment
        slots.append(Slot(name, offset, nbytes))
        offset += nbytes
    return slots, offset


def tensor_bytes(tensor: Any) -> memoryview:
    """The storage bytes of one contiguous CPU tensor, without a copy."""
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def write(out: BinaryIO, slots: Sequence[Slot], tensors: Sequence[Any]) -> str:
    """Stream ``tensors`` into ``out`` at their slots; returns the SHA-256 of what was written."""
    digest = hashlib.sha256()
    position = 0
    for slot, tensor in zip(slots, tensors):
        padding = b"\0" * (slot.offset - position)
        data = tensor_bytes(tensor)
        if data.nbytes != slot.nbytes:
            raise ValueError(f"constant '{slot.name}' has {data.nbytes} bytes, its slot {slot.nbytes}")
        for chunk in (padding, data):
            out.write(chunk)
            digest.update(chunk)
        position = slot.offset + slot.nbytes
    return digest.hexdigest()


def write_file(path: Path, slots: Sequence[Slot], tensors: Sequence[Any]) -> str:
    with path.open("wb") as f:
        return write(f, slots, tensors)


def read(buffer: memoryview, slot: Slot, dtype: Any, shape: Sequence[int], stride: Sequence[int]) -> Any:
    """One constant as a zero-copy tensor with its own exact-size storage."""
    import torch
    from etsdk.backend import readonly_tensor

    if slot.offset + slot.nbytes > buffer.nbytes:
        raise ValueError(
            f"weights end at byte {buffer.nbytes} but constant '{slot.name}' needs bytes "
            f"[{slot.offset}, {slot.offset + slot.nbytes})"
        )
    if slot.nbytes == 0:
        return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype)
    flat = readonly_tensor(buffer[slot.offset : slot.offset + slot.nbytes], dtype)
    return flat.as_strided(tuple(shape), tuple(stride))


_MADV_WILLNEED = 3
_MADV_POPULATE_READ = 22  # Linux 5.14+: fault the pages in (read), without touching them from Python


def prefetch(weights: Any) -> threading.Thread | None:
    """Start bringing a mapped weights tensor into memory while the caller goes on (Linux; elsewhere nothing).

    ``madvise(MADV_WILLNEED)`` starts the kernel's read-ahead of the file pages at once (a cold page cache: a
    135M model's 538 MB would otherwise be read page by page during the first prefill); a daemon thread then
    maps every page into this process (``MADV_POPULATE_READ``, outside the GIL) so that the first call does not
    take a page fault per 64 KiB of weights. Both are hints: any failure (an older kernel, memory that is not
    a mapping) is ignored. ``weights`` (a tensor over the whole mapped entry) is kept alive by the thread.
    """
    if not sys.platform.startswith("linux") or weights.numel() == 0:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    page = mmap.PAGESIZE
    start = weights.data_ptr() // page * page
    length = weights.data_ptr() + weights.numel() * weights.element_size() - start
    madvise(start, length, _MADV_WILLNEED)

    def populate() -> None:
        # in 64 MiB steps: the thread holds no lock, and an interpreter shutting down finds it between steps
        step = 64 << 20
        for offset in range(0, length, step):
            if madvise(start + offset, min(step, length - offset), _MADV_POPULATE_READ) != 0:
                return
        del keep[:]

    keep = [weights]
    thread = threading.Thread(target=populate, name="etsdk-aoti-prefetch", daemon=True)
    thread.start()
    return thread
