"""Content hashes of named data: a content-addressed key (``<namespace>/<sha256 hex>`` or a bare hex digest)
records the SHA-256 of its bytes; these read an entry once from an open file and compare."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from etsdk._format.program_file import Entry
from etsdk.errors import IntegrityError

__all__ = ["EntryCheck", "content_digest", "hash_entries", "raise_on_mismatch"]

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
                f"{check.file}: named data '{check.key}' ({check.size} bytes) is damaged: its bytes hash to "
                f"{check.found}, its key records {content_digest(check.key)}",
                file=check.file,
                key=check.key,
            )
