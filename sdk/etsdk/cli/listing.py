"""``etsdk plugins``: what is installed, and whether it can run here."""

from __future__ import annotations

import json

from etsdk._plugins.registry import list_plugins

__all__ = ["print_plugins"]


def print_plugins(as_json: bool = False) -> int:
    """``etsdk plugins``: a table of installed plugins and why any is not ok (or JSON)."""
    plugins = list_plugins()
    if as_json:
        print(json.dumps([p.to_json() for p in plugins], indent=2))
        return 0
    rows = [("NAME", "DISTRIBUTION", "VERSION", "STATUS", "BACKENDS", "CONTRACTS", "RUNNERS", "COMMANDS")]
    for p in plugins:
        rows.append(
            (
                p.name,
                p.distribution,
                p.version,
                p.status.value,
                ",".join(p.backends) or "-",
                ",".join(p.contracts) or "-",
                ",".join(p.runners) or "-",
                ",".join(p.commands) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for p in plugins:
        if p.reason:
            print(f"  {p.name}: {p.status.value}: {p.reason}")
        for refusal in p.refused:
            print(f"  {p.name}: refused: {refusal}")
    if not plugins:
        print("no etsdk plugins installed (entry-point group 'etsdk.plugins')")
    return 0
