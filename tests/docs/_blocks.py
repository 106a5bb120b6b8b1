"""The fenced code blocks of the documentation, and the convention that says which ones a test executes.

Every fenced block in ``README.md``, ``docs/**/*.md`` and ``plugins/*/README.md`` has a language and is one of:

* executed by a test (``tests/docs``): ``python`` blocks run in a fresh interpreter with a temporary working
  directory, ``bash`` / ``console`` commands (``etsdk ...``, ``python ...``) run there too;
* ``text``: output, a command synopsis or an illustration: never executed;
* any language, marked by the HTML comment ``<!-- not executed: REASON -->`` on the line right before the fence
  (a GPU or TensorRT, a download, an install, a skeleton with ``...`` for your code). A marked ``python`` block
  must still compile.

``tests/docs/test_docs.py`` checks every block against this and names each one that is neither executed nor marked.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<language>[^\s`]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"^\s*<!-- not executed: (?P<reason>\S.*?) -->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text (dedented), and the marker's reason if marked."""

    doc: str
    line: int
    language: str
    body: str
    not_executed: str | None

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line} ({self.language or 'no language'})"


def markdown_files() -> list[str]:
    """Every markdown file the convention covers, relative to the repository: the README, the guides, the READMEs
    of the top-level folders and of every plugin."""
    paths = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted(ROOT.glob("*/README.md")),
        *sorted(ROOT.glob("plugins/*/README.md")),
    ]
    return [str(p.relative_to(ROOT)) for p in paths]


def blocks(doc: str) -> list[Block]:
    """The fenced blocks of ``doc`` (a path relative to the repository), in order."""
    text = (ROOT / doc).read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.match(before)
        body = textwrap.dedent(match.group("body")) if match.group("indent") else match.group("body")
        found.append(Block(doc, line, match.group("language"), body, marker.group("reason") if marker else None))
    return found


def runnable(doc: str, *languages: str) -> list[Block]:
    """The blocks of ``doc`` in ``languages`` that are not marked: what a test must execute."""
    return [b for b in blocks(doc) if b.language in languages and b.not_executed is None]


def commands(block: Block) -> list[str]:
    """The command lines of a ``bash`` block (every non-empty line) or a ``console`` block (the ``$ `` lines)."""
    lines = block.body.splitlines()
    if block.language == "console":
        return [line[2:].strip() for line in lines if line.startswith("$ ")]
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
