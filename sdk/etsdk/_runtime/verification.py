"""File integrity: what every ``etsdk.load`` checks, what ``verify=True`` adds, ``etsdk verify``.

Every load (structural checks proportional to the flatbuffers; the data's hashes to the weights, a BLAKE3 pass
several times faster than SHA-256: see docs/integrity.md for figures):

* the ``.pte``: ExecuTorch's flatbuffer verifier, then etsdk's structural
  checks of what the runtime trusts (:mod:`etsdk._format.program_file`: headers, segments,
  named data, every index of every execution plan);
* the ``.ptd``: its header, its whole flatbuffer (FlatBuffers verifier rules),
  its segments and entries (the runtime verifies none of it);
* the program record and its contract; each delegate's container, signature
  and payload at method load;
* the files are *pinned*: etsdk opens each file once and the runtime reads
  that same open file (``/proc/self/fd``), so what was checked is what runs;
  before every call the pinned files' size and modification time are compared
  with those at load (a file truncated or rewritten in place is refused
  instead of faulting or computing with other weights).

* every named-data entry (every weight) is read once and hashed, in parallel threads while the runtime parses
  the program (which reads no weight), and ``load`` waits for them before it returns: by the BLAKE3 digest the program record keeps for it (written at export beside the SHA-256 key,
  when the ``blake3`` package is installed), else by the SHA-256 its content-addressed key records; a
  mismatch is an :class:`etsdk.IntegrityError` naming the entry and the file. ``load(verify=False)`` skips
  this (an explicit opt-out).

``verify=True`` (and ``etsdk verify``) hashes by SHA-256 instead, whatever the record says: every named-data
entry whose key is content-addressed (``<namespace>/<sha256 hex>`` or a bare sha256 hex, what etsdk's writer
stores, the program record ``etsdk/program/<sha256 hex>`` included) is read once and its SHA-256 compared with
its key. Keys of any other form (a third party's, the record ``etsdk/program`` of a program written before
records were content-addressed) are reported as *unverifiable*, never as failures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from etsdk._format.content_hash import EntryCheck, hash_entries

__all__ = ["VerifyReport", "verify"]

@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify` checked: every entry, and every method loaded (or why not)."""

    #: The ``.pte`` checked.
    program: Path
    #: The ``.ptd`` checked with it, or None.
    data: Path | None
    #: One per named-data entry: file, key, size, ``status`` (``ok``, ``mismatch`` with the digest ``found``,
    #: or ``unverifiable``: the key is not a content hash).
    entries: tuple[EntryCheck, ...]
    #: ``(method, "loaded")`` or ``(method, "skipped: <why>")`` (its backend is not installed or cannot run here).
    methods: tuple[tuple[str, str], ...]

    @property
    def ok(self) -> bool:
        """No entry is damaged (``unverifiable`` entries and skipped methods do not count against it)."""
        return all(e.status != "mismatch" for e in self.entries)

    @property
    def verified_bytes(self) -> int:
        """The bytes whose SHA-256 matched their key."""
        return sum(e.size for e in self.entries if e.status == "ok")

    def to_json(self) -> dict[str, object]:
        """What ``etsdk verify --json`` prints: ``program``, ``data``, ``ok``, ``entries``, ``methods``."""
        return {
            "program": str(self.program),
            "data": str(self.data) if self.data is not None else None,
            "ok": self.ok,
            "entries": [e.to_json() for e in self.entries],
            "methods": [{"method": m, "status": s} for m, s in self.methods],
        }


def verify(path: str | Path, data: str | Path | None = None, *, methods: bool = True) -> VerifyReport:
    """Check a program completely: everything :func:`etsdk.load` checks, every content hash, every method.

    Structural problems raise :class:`ProgramError` (as ``etsdk.load`` does);
    damaged entries are reported (``report.ok`` is False), not raised. With
    ``methods``, the program is loaded and every method too, which checks each
    delegate's payload and signature; methods whose backend is not installed
    (or cannot run here) are reported as skipped. No backend is needed for the
    rest.
    """
    from etsdk._runtime.program import load, open_checked
    from etsdk.errors import BackendNotFoundError, BackendUnavailableError, IntegrityError

    try:
        checked = open_checked(path, data)
    except IntegrityError:  # the program record is damaged: report it with every other entry, load nothing
        checked = open_checked(path, data, read_record=False)
    try:
        entries = hash_entries(checked.files.program.fd, checked.layout.entries, checked.path.name)
        if checked.files.data is not None and checked.data_layout is not None and checked.data_path is not None:
            entries += hash_entries(checked.files.data.fd, checked.data_layout.entries, checked.data_path.name)
    finally:
        checked.files.close()
    loaded: list[tuple[str, str]] = []
    if methods and all(e.status != "mismatch" for e in entries):
        try:
            program = load(path, data)
        except (BackendNotFoundError, BackendUnavailableError) as exc:
            loaded = [(method, f"skipped: {exc}") for method in checked.backends]
        else:
            for method in program.methods:
                try:
                    program.load_method(method)
                except (BackendNotFoundError, BackendUnavailableError) as exc:
                    loaded.append((method, f"skipped: {exc}"))
                else:
                    loaded.append((method, "loaded"))
    return VerifyReport(checked.path, checked.data_path, tuple(entries), tuple(loaded))
