"""Reading a program's contract without the runtime: ``etsdk.read_contract(path)``.

What an application checks before it loads anything heavy: the contract record etsdk embeds in every
program (its sizes, its metadata) is named data in the ``.pte``, and reading it needs neither torch nor the
ExecuTorch runtime nor any backend. ``etsdk generate`` refuses a request that cannot fit the program's
context this way, in the time it takes to read the file's flatbuffer, before ``etsdk.load`` imports the
runtime and the runner loads its methods.
"""

from __future__ import annotations

import os
from pathlib import Path

from etsdk._format.program_file import FormatError, read_program_file
from etsdk._runtime.program import _check_contract, _PinnedFile
from etsdk._state.contract import Contract
from etsdk._state.signature import PROGRAM_RECORD_KEY, ProgramRecord
from etsdk.errors import ProgramError

__all__ = ["read_contract"]


def read_contract(path: str | Path) -> Contract | None:
    """The I/O contract embedded in the program at ``path`` (None when it has none), without loading it.

    Reads only the ``.pte``'s flatbuffer and its program record: no torch, no ExecuTorch runtime, no backend
    (a program whose backends are not installed here can be read). The file gets the structural checks
    :func:`etsdk.load` makes before the runtime sees it, and the contract is checked against the installed
    specification as ``load`` checks it; a bad file is a :class:`ProgramError` (the messages ``load`` gives),
    an unknown or non-conforming contract a :class:`ContractError`.
    """
    path = Path(path)
    pinned = _PinnedFile(path, "program")
    try:
        try:
            layout = read_program_file(pinned.fd)
        except FormatError as exc:
            raise ProgramError(f"{path} is not a valid ExecuTorch program ({exc})") from None
        # the record's key: etsdk/program, or etsdk/program/<its content hash> where records are content-addressed
        keys = [e for e in layout.entries if e.key == PROGRAM_RECORD_KEY or e.key.startswith(PROGRAM_RECORD_KEY + "/")]
        if not keys:
            return None
        if len(keys) > 1:
            raise ProgramError(f"{path.name}: holds {len(keys)} etsdk program records; a program has one")
        entry = keys[0]
        data = bytearray()
        while len(data) < entry.size:
            chunk = os.pread(pinned.fd, entry.size - len(data), entry.offset + len(data))
            if not chunk:
                raise ProgramError(f"{path}: the file ends inside its etsdk program record")
            data += chunk
        try:
            record = ProgramRecord.from_bytes(bytes(data), path.name)
        except RecursionError:
            raise ProgramError(f"{path.name}: the etsdk program record is nested too deeply") from None
        if record.contract is not None:
            _check_contract(record.contract, path)
        return record.contract
    finally:
        os.close(pinned.fd)
