"""Content hashes of named data: a content-addressed key (``<namespace>/<sha256 hex>`` or a bare hex digest)
records the SHA-256 of its bytes; these read an entry once from an open file and compare.

Every load checks every entry (:func:`check_entries`): by the BLAKE3 digest the program record keeps for it
(:data:`FAST`, written at export beside the SHA-256 key: several times faster, and cryptographic too), else
by its SHA-256 key; entries in parallel threads (both hashes run outside the GIL). ``etsdk verify`` and
``load(verify=True)`` hash every entry by its SHA-256 key (:func:`hash_entries`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from etsdk._format.program_file import Entry
from etsdk.errors import IntegrityError

__all__ = ["FAST", "EntryCheck", "check_entries", "content_digest", "fast_hasher", "hash_entries", "raise_on_mismatch"]

#: The name of the fast digest a program record keeps per entry (``ProgramRecord.checks``).
FAST = "blake3"
#: An entry this big is hashed with BLAKE3's own threads (smaller ones run one per worker thread).
_THREADED = 32 << 20

_DIGEST = re.compile(r"(?:^|/)([0-9a-f]{64})$")
_CHUNK = 8 << 20


def content_digest(key: str) -> str | None:
    """The SHA-256 hex digest a content-addressed key records, or None for any other key."""
    found = _DIGEST.search(key)
    return found.group(1) if found else None


@dataclass(frozen=True, slots=True)
class EntryCheck:
    """One named-data entry: ``ok``, ``mismatch`` (with the digest found) or ``unverifiable``."""

    file: str
    key: str
    size: int
    status: str
    found: str | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"file": self.file, "key": self.key, "size": self.size, "status": self.status}
        if self.found is not None:
            out["found"] = self.found
        return out


def fast_hasher(size: int = 0) -> Any:
    """A new BLAKE3 hasher (``update`` / ``hexdigest``), or None where the ``blake3`` package is not installed."""
    try:
        import blake3
    except ImportError:
        return None
    return blake3.blake3(max_threads=blake3.blake3.AUTO) if size >= _THREADED else blake3.blake3()


def _digest(fd: int, entry: Entry, hasher: Any) -> str:
    buffer = bytearray(min(_CHUNK, max(entry.size, 1)))
    view = memoryview(buffer)
    done = 0
    while done < entry.size:
        want = min(entry.size - done, len(buffer))
        got = os.preadv(fd, [view[:want]], entry.offset + done)
        if got <= 0:
            break
        hasher.update(view[:got])
        done += got
    return str(hasher.hexdigest()) if done == entry.size else f"<file ends {entry.size - done} bytes short>"


def check_entries(fd: int, entries: Sequence[Entry], file: str, fast: Mapping[str, str]) -> list[EntryCheck]:
    """Check every entry of the open file ``fd``: by ``fast[key]`` (BLAKE3 hex) where the record has one and
    ``blake3`` is installed, else by the SHA-256 its key records; ``unverifiable`` otherwise. In parallel."""

    def one(entry: Entry) -> EntryCheck:
        expected = fast.get(entry.key)
        hasher = fast_hasher(entry.size) if expected is not None else None
        if hasher is None:
            expected = content_digest(entry.key)
            if expected is None:
                return EntryCheck(file, entry.key, entry.size, "unverifiable")
            hasher = hashlib.sha256()
        found = _digest(fd, entry, hasher)
        return EntryCheck(file, entry.key, entry.size, "ok" if found == expected else "mismatch", found)

    if not entries:
        return []
    workers = max(1, min(len(entries), os.cpu_count() or 1, 8))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="etsdk-verify") as pool:
        return list(pool.map(one, sorted(entries, key=lambda e: -e.size)))


def hash_entries(fd: int, entries: Iterable[Entry], file: str) -> list[EntryCheck]:
    """Hash every content-addressed entry of the open file ``fd`` (read with ``pread``, 8 MiB at a time)."""
    out: list[EntryCheck] = []
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    for entry in entries:
        expected = content_digest(entry.key)
        if expected is None:
            out.append(EntryCheck(file, entry.key, entry.size, "unverifiable"))
            continue
        digest = hashlib.sha256()
        done = 0
        while done < entry.size:
            want = min(entry.size - done, _CHUNK)
            got = os.preadv(fd, [view[:want]], entry.offset + done)
            if got <= 0:
                break
            digest.update(view[:got])
            done += got
        found = digest.hexdigest() if done == entry.size else f"<file ends {entry.size - done} bytes short>"
        out.append(EntryCheck(file, entry.key, entry.size, "ok" if found == expected else "mismatch", found))
    return out


def raise_on_mismatch(checks: Sequence[EntryCheck]) -> None:
    for check in checks:
        if check.status == "mismatch":
            raise IntegrityError(
                f"{check.file}: named data '{check.key}' ({check.size} bytes) is damaged: its bytes do not hash to "
                f"what the program records ({check.found}); the file was changed after export",
                file=check.file,
                key=check.key,
            )
