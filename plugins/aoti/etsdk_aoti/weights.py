"""How an etsdk-aoti delegate's constants are read from named data, and read ahead.

Each constant of a compiled library is its own named-data entry (in the ``.pte``,
or a ``.ptd``), written by the serializer through ``NamedDataWriter.add_weight``
(content-addressed, 64-byte aligned): a weight another delegate of the program
stores too is one entry. The reader hands out one zero-copy, exact-size tensor
per constant (binding views into one big mapped tensor is not safe), and
:func:`prefetch` brings the mapped pages in while the caller goes on.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
from collections.abc import Sequence
from typing import Any

CPU_ALIGNMENT = 64


def size_matches(nbytes: int, container_nbytes: int) -> bool:
    """Whether a tensor of ``nbytes`` is what a constant the container sizes as ``container_nbytes`` holds: the
    same, or rounded up to :data:`CPU_ALIGNMENT` (the container reports CPU constants' sizes rounded up)."""
    return nbytes == container_nbytes or (nbytes + CPU_ALIGNMENT - 1) // CPU_ALIGNMENT * CPU_ALIGNMENT == container_nbytes


def read(buffer: memoryview, dtype: Any, shape: Sequence[int], stride: Sequence[int]) -> Any:
    """One constant as a zero-copy tensor over its whole entry ``buffer`` (its own exact-size storage)."""
    import torch
    from etsdk.backend import readonly_tensor

    if buffer.nbytes == 0:
        return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype)
    return readonly_tensor(buffer, dtype).as_strided(tuple(shape), tuple(stride))


_MADV_WILLNEED = 3
_MADV_POPULATE_READ = 22  # Linux 5.14+: fault the pages in (read), without touching them from Python


def prefetch(tensors: Sequence[Any]) -> threading.Thread | None:
    """Start bringing mapped weight tensors into memory while the caller goes on (Linux; elsewhere nothing).

    ``madvise(MADV_WILLNEED)`` starts the kernel's read-ahead of the file pages at once (a cold page cache: a
    135M model's 538 MB would otherwise be read page by page during the first prefill); a daemon thread then
    maps every page into this process (``MADV_POPULATE_READ``, outside the GIL) so that the first call does not
    take a page fault per 64 KiB of weights. Both are hints: any failure (an older kernel, memory that is not
    a mapping) is ignored. Adjacent tensors (entries of one file) are merged into one range; the tensors are kept
    alive by the thread until it is done.
    """
    live = [t for t in tensors if t.numel()]
    if not sys.platform.startswith("linux") or not live:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    page = mmap.PAGESIZE
    ranges: list[list[int]] = []
    for start, end in sorted((t.data_ptr() // page * page, t.data_ptr() + t.numel() * t.element_size()) for t in live):
        if ranges and start <= ranges[-1][1] + page:
            ranges[-1][1] = max(ranges[-1][1], end)
        else:
            ranges.append([start, end])
    for start, end in ranges:
        madvise(start, end - start, _MADV_WILLNEED)

    def populate() -> None:
        # in 64 MiB steps: the thread holds no lock, and an interpreter shutting down finds it between steps
        step = 64 << 20
        for start, end in ranges:
            for offset in range(start, end, step):
                if madvise(offset, min(step, end - offset), _MADV_POPULATE_READ) != 0:
                    return
        del keep[:]

    keep = list(live)
    thread = threading.Thread(target=populate, name="etsdk-aoti-prefetch", daemon=True)
    thread.start()
    return thread
