"""Where a memory-mapped weight lives in its file, and giving back its pages once it has been read.

A checkpoint loaded in its own dtype is memory-mapped (``safetensors``): hashing or storing a weight reads its pages
into the export process, where they would stay resident until the process ends. They are clean page cache, which
the kernel could take back, but they count in the process's resident memory, so a 6 GB checkpoint would make a
6 GB process. Once a weight has been read, its whole pages are dropped from this process's mapping
(``madvise(MADV_DONTNEED)``): the file's pages stay in the page cache (a later read finds them there, or reads the
file again once the kernel has reclaimed them) and the mapping stays valid. That is safe only while every page of
the range is still the file's: a page of a private mapping written in memory is an anonymous copy, which the advice
would discard, so such a range is left alone (``/proc/self/pagemap`` says which pages are the file's). Anonymous
memory (a model object's own weights) is never advised. Linux only; elsewhere a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

_MADV_DONTNEED = 4

#: Bytes hashed, copied or converted at a time when a weight is read through.
CHUNK = 8 << 20

#: Bytes read between two hand-backs when a mapped tensor is read through (:func:`read_through`): the most of one
#: tensor that is ever resident (a 128k-token embedding is 0.5-1 GB on its own).
WINDOW = 64 << 20


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


@cache
def _madvise() -> object | None:
    libc = _libc()
    if libc is None:
        return None
    advise = libc.madvise
    advise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    advise.restype = ctypes.c_int
    return advise


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere a no-op).

    A conversion that runs weight after weight (quantization) frees its temporaries, but the small tensors it keeps
    between them pin the heap, which glibc then never shrinks: quantizing a 1.2B-parameter model's 114 layers left
    1.3 GB of free heap resident. ``malloc_trim`` returns every free page, also those in the heap's middle.
    """
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)


@dataclass(frozen=True, slots=True)
class FileRange:
    """``size`` bytes at ``offset`` of the file ``path`` (inode ``inode`` on device ``device`` when mapped)."""

    path: str
    offset: int
    size: int
    device: int
    inode: int


def file_range(address: int, nbytes: int) -> FileRange | None:
    """The file bytes that ``[address, address + nbytes)`` maps, when the range lies inside one mapping of a file
    that is still there (``/proc/self/maps``: a path with an inode, the same inode on disk); None otherwise."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                low, _, high = fields[0].partition("-")
                if not int(low, 16) <= address or not address + nbytes <= int(high, 16):
                    continue
                if len(fields) < 6 or fields[4] == "0" or not fields[5].startswith("/"):
                    return None
                path, inode = fields[5].rstrip("\n"), int(fields[4])
                status = os.stat(path)
                if status.st_ino != inode:  # replaced since it was mapped (or "(deleted)")
                    return None
                return FileRange(path, int(fields[2], 16) + address - int(low, 16), nbytes, status.st_dev, inode)
    except (OSError, ValueError, IndexError):
        return None
    return None


def unchanged_file_pages(address: int, nbytes: int, *, just_read: bool = False) -> bool:
    """Whether every page of ``[address, address + nbytes)`` still holds the file's bytes (``/proc/self/pagemap``):
    a page of a private mapping written in memory became anonymous (copy-on-write: present without bit 61, or
    swapped out), a page not present is read from the file when touched. ``just_read``: the range was just read,
    so a pagemap showing none of it present is not telling the truth (an emulated ``/proc``), and the answer is
    False. False where the kernel does not say."""
    page = mmap.PAGESIZE
    first, last = address // page, (address + nbytes - 1) // page
    present, swapped, file_page = 1 << 63, 1 << 62, 1 << 61
    seen_present = False
    try:
        with open("/proc/self/pagemap", "rb") as pagemap:
            pagemap.seek(first * 8)
            left = last - first + 1
            while left:
                count = min(left, 1 << 16)
                entries = memoryview(pagemap.read(count * 8)).cast("Q")
                if len(entries) != count:
                    return False
                for entry in entries:
                    if entry & swapped or (entry & present and not entry & file_page):
                        return False
                    seen_present = seen_present or bool(entry & present)
                left -= count
    except (OSError, ValueError):
        return False
    return seen_present or not just_read


def release_file_pages(address: int, nbytes: int) -> bool:
    """Drop the whole pages of ``[address, address + nbytes)``, just read, from this process when every one of them
    is a mapped file's unchanged page (they stay in the page cache); True if dropped."""
    advise = _madvise()
    page = mmap.PAGESIZE
    start = -(-address // page) * page
    end = (address + nbytes) // page * page
    if advise is None or end <= start or file_range(start, end - start) is None:
        return False
    if not unchanged_file_pages(start, end - start, just_read=True):
        return False  # a thread writing the weight between this check and the advice could lose that write: none does during an export
    return advise(start, end - start, _MADV_DONTNEED) == 0  # type: ignore[operator]


def read_through(view: memoryview, address: int, consume: Callable[[memoryview], object], chunk: int = CHUNK) -> None:
    """Give ``view`` (the bytes at ``address``) to ``consume`` in chunks, dropping each :data:`WINDOW` of a mapped
    file's pages from the process once consumed (anonymous memory is left as it is)."""
    released = 0
    for start in range(0, view.nbytes, chunk):
        consume(view[start : start + chunk])
        done = min(start + chunk, view.nbytes)
        if done - released >= WINDOW or done == view.nbytes:
            release_file_pages(address + released, done - released + (mmap.PAGESIZE if done < view.nbytes else 0))
            released = done
