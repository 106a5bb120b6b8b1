"""A memory cgroup to run one command under a memory limit (tests and benchmarks of export memory).

Creating one needs root and a writable cgroup hierarchy (v1 ``memory.limit_in_bytes`` or v2 ``memory.max``);
:func:`memory_cgroup` returns None elsewhere, so a caller can skip. Swap is capped with memory where the
kernel offers it, so nothing escapes the limit into swap.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_V1 = Path("/sys/fs/cgroup/memory")
_V2 = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class MemoryCgroup:
    """A memory cgroup made by :func:`memory_cgroup`: ``path`` is its directory, ``limit`` its limit in bytes."""

    path: Path
    limit: int

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` as a command that moves itself into this cgroup before it runs (a Python process that writes its
        pid into ``cgroup.procs``, then execs ``argv``): every byte the command allocates counts against the limit."""
        import sys

        enter = (
            f"import os; open({str(self.path / 'cgroup.procs')!r}, 'w').write(str(os.getpid())); "
            f"os.execvp({argv[0]!r}, {argv!r})"
        )
        return [sys.executable, "-c", enter]

    def peak(self) -> int | None:
        """The most memory the cgroup has charged so far (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``;
        page cache included), or None where the kernel does not say."""
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            try:
                return int((self.path / name).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return None

    def remove(self) -> None:
        """Remove the cgroup (once nothing runs in it); a cgroup that cannot be removed is left."""
        try:
            self.path.rmdir()
        except OSError:
            pass


def memory_cgroup(name: str, limit: int) -> MemoryCgroup | None:
    """A fresh memory cgroup called ``name`` limited to ``limit`` bytes, or None where none can be made."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    try:
        if (_V1 / "memory.limit_in_bytes").is_file():
            group = _V1 / name
            group.mkdir(exist_ok=True)
            (group / "memory.limit_in_bytes").write_text(str(limit))
            if (group / "memory.memsw.limit_in_bytes").is_file():
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
            return MemoryCgroup(group, limit)
        if "memory" in (_V2 / "cgroup.controllers").read_text().split():
            (_V2 / "cgroup.subtree_control").write_text("+memory")
            group = _V2 / name
            group.mkdir(exist_ok=True)
            (group / "memory.max").write_text(str(limit))
            if (group / "memory.swap.max").is_file():
                (group / "memory.swap.max").write_text("0")
            return MemoryCgroup(group, limit)
    except OSError:
        return None
    return None
