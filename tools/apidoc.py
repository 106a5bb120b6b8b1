"""Renders the backend-author API reference (``docs/backend-api.md``) from the docstrings of ``etsdk.backend``.

``python3 dev.py apidoc`` regenerates it (``python tools/apidoc.py > docs/backend-api.md``); a test keeps the
file equal to what this renders, so the reference never drifts from the code. A development tool: it is not
part of the installed package.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

HEADER = """# Backend API reference (`etsdk.backend`)

Generated from the docstrings by `python3 dev.py apidoc` (a test checks it is current). The tutorial is
[backend-tutorial.md](backend-tutorial.md); the guide is [backend-authors.md](backend-authors.md).
"""


def _signature(obj: Any) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", text)  # stable across runs


def _section(name: str, obj: Any) -> str:
    kind = "class" if inspect.isclass(obj) else "function"
    doc = inspect.getdoc(obj) or "(undocumented)"
    lines = [f"## `{name}`", "", f"```text\n{kind} {name}{_signature(obj)}\n```", "", doc, ""]
    if inspect.isclass(obj):
        members = [
            (member, value)
            for member, value in vars(obj).items()
            if not member.startswith("_") and (callable(value) or isinstance(value, property)) and inspect.getdoc(value)
        ]
        for member, value in members:
            target = value.fget if isinstance(value, property) else value
            first = (inspect.getdoc(value) or "").splitlines()[0]
            lines.append(f"- `{member}{_signature(target) if callable(target) else ''}`: {first}")
        if members:
            lines.append("")
    return "\n".join(lines)


def render() -> str:
    import etsdk.backend as backend

    module_doc = inspect.getdoc(backend) or ""
    parts = [HEADER, module_doc, ""]
    for name in sorted(backend.__all__, key=str.lower):
        parts.append(_section(name, getattr(backend, name)))
    return "\n".join(parts).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
