"""How much of a mapping this process holds in memory (Linux): for tests that check pages are handed back."""

from __future__ import annotations

from pathlib import Path

__all__ = ["resident_bytes"]


def resident_bytes(address: int) -> int:
    """Resident bytes of the mapping of this process that holds ``address`` (``Rss`` in ``/proc/self/smaps``).

    Raises ``LookupError`` when no mapping holds it, ``OSError`` where ``/proc/self/smaps`` cannot be read."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and head == "Rss:":
            return int(line.split()[1]) * 1024
    raise LookupError(f"no mapping of this process holds address {address:#x}")
