"""Renders the API reference from the docstrings: ``docs/backend-api.md`` (``etsdk.backend``) and ``docs/api.md``
(``etsdk``, ``etsdk.testing``, ``etsdk.conformance``), each module's ``__all__``, and lists what is undocumented.

``python3 dev.py apidoc`` (``python tools/apidoc.py``) writes both files and exits 1 naming every public name
without a docstring; ``--check`` writes nothing and exits 1 when a file is stale or a name undocumented. A test
(``tests/unit/test_api_reference.py``) runs the same checks, so the reference never drifts from the code. A
development tool: it is not part of the installed package.

What must be documented: every name in a public module's ``__all__`` (its own docstring; a constant or instance
by a ``#:`` comment block right above its assignment, Sphinx's convention); every public method and property of
a public class (including those it inherits from a private etsdk base); every field of a public dataclass and
every member of a public enum, by a ``#:`` comment above it or by naming it in the class docstring (```name```).
A dataclass's generated ``Name(field, ...)`` docstring does not count.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: page (relative to the repository) -> the public modules it documents, in order
PAGES = {
    "docs/backend-api.md": ("etsdk.backend",),
    "docs/api.md": ("etsdk", "etsdk.testing", "etsdk.conformance"),
}

BACKEND_HEADER = """# Backend API reference (`etsdk.backend`)

Generated from the docstrings by `python3 dev.py apidoc` (a test checks it is current and that every public name
is documented). The tutorial is [backend-tutorial.md](backend-tutorial.md); the guide is
[backend-authors.md](backend-authors.md); the rest of the public API (`etsdk`, `etsdk.testing`,
`etsdk.conformance`) is in [api.md](api.md).
"""

API_HEADER = """# API reference

Generated from the docstrings by `python3 dev.py apidoc` (a test checks it is current and that every public name
is documented). Every public name of etsdk is in one of four modules; anything else (`etsdk._format`,
`etsdk._state`, ...) is private and may change between releases
([architecture](architecture.md#the-public-faces)).

| module | for | reference |
| --- | --- | --- |
| `etsdk` | users: `lower`, `load`, `Program`, `Session`, `verify`, the error tree, plugin records | [below](#etsdk) |
| `etsdk.backend` | backend authors: what a backend receives and returns | [backend-api.md](backend-api.md) |
| `etsdk.testing` | tests of etsdk and of plugins | [below](#etsdktesting) |
| `etsdk.conformance` | the conformance kit | [below](#etsdkconformance) |

Names `etsdk` shares with `etsdk.backend` (the same objects) are described once, in
[backend-api.md](backend-api.md).
"""

HEADERS = {"docs/backend-api.md": BACKEND_HEADER, "docs/api.md": API_HEADER}


# --- what a name's documentation is ----------------------------------------------------------------------------


def _own_doc(obj: Any) -> str | None:
    """The object's own docstring: not one inherited from a base class, not a dataclass's generated one."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        if doc and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
            return None
    elif isinstance(obj, (staticmethod, classmethod)):
        doc = obj.__func__.__doc__
    elif isinstance(obj, property):
        doc = obj.fget.__doc__ if obj.fget is not None else None
    elif inspect.isroutine(obj):
        doc = obj.__doc__
    else:
        return None
    return inspect.cleandoc(doc) if doc and doc.strip() else None


def _comment_docs(source: str) -> dict[str, str]:
    """``#:`` comment blocks right above an assignment or annotation at the block's own indentation: name -> text."""
    lines = source.splitlines()
    first = next((line for line in lines if line.strip() and not line.lstrip().startswith("@")), "")
    indent = len(first) - len(first.lstrip())
    if first.lstrip().startswith("class "):
        body = next((line for line in lines[lines.index(first) + 1 :] if line.strip()), "")
        indent = len(body) - len(body.lstrip())
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        at_indent = len(line) - len(line.lstrip()) == indent
        if at_indent and stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+)\s*(?::|=)", stripped) if at_indent else None
        if match and pending:
            docs[match.group(1)] = " ".join(pending)
        if stripped or not pending:
            pending = []
    return docs


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _data_doc(module: Any, name: str, seen: frozenset[str] = frozenset()) -> str | None:
    """The ``#:`` comment above ``name``'s assignment: in ``module``, or in the module it imports ``name`` from."""
    source = _source(module)
    doc = _comment_docs(source).get(name)
    if doc or module.__name__ in seen:
        return doc
    match = re.search(rf"^\s*from ([\w.]+) import (?:\([^)]*\b{re.escape(name)}\b[^)]*\)|[^\n]*\b{re.escape(name)}\b)", source, flags=re.M)
    if match is None:
        return None
    return _data_doc(importlib.import_module(match.group(1)), name, seen | {module.__name__})


def _same_package(klass: type, cls: type) -> bool:
    """Whether ``klass`` (a base of ``cls``) comes from ``cls``'s top-level package (not ``builtins``, ``enum``...)."""
    return klass.__module__.split(".")[0] == cls.__module__.split(".")[0]


def _is_member(value: Any) -> bool:
    return isinstance(value, (property, staticmethod, classmethod)) or inspect.isfunction(value)


def _members(cls: type, public: set[int]) -> list[tuple[str, Any]]:
    """Public methods and properties of ``cls`` and of its private etsdk bases (a public base documents its own)."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        if klass is not cls and (id(klass) in public or not _same_package(klass, cls)):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in found or not _is_member(value):
                continue
            if isinstance(cls, enum.EnumMeta) and name in cls.__members__:
                continue
            found[name] = value
    return list(found.items())


def _fields(cls: type) -> list[str]:
    """A dataclass's fields, a named tuple's fields, an enum's members: what the class docstring or ``#:`` names."""
    if isinstance(cls, enum.EnumMeta):
        return list(cls.__members__)
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]
    return [name for name in getattr(cls, "_fields", ()) if not name.startswith("_")]


def _field_docs(cls: type) -> tuple[dict[str, str], list[str]]:
    """``(field -> its #: comment, fields documented by neither a #: comment nor the class docstring)``."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if _same_package(klass, cls):
            comments.update(_comment_docs(_source(klass)))
    doc = _own_doc(cls) or ""
    documented = {name: comments[name] for name in _fields(cls) if name in comments}
    missing = [name for name in _fields(cls) if name not in documented and not re.search(rf"``?{name}\b", doc)]
    return documented, missing


def _public_modules() -> list[Any]:
    return [importlib.import_module(name) for modules in PAGES.values() for name in modules]


def undocumented(modules: list[Any] | None = None) -> list[str]:
    """Every public name, member, field or enum member without documentation, as ``module.Name[.member] (what)``.

    ``modules``: the public modules to check (default: every module of :data:`PAGES`).
    """
    modules = _public_modules() if modules is None else modules
    public = {id(getattr(m, n)) for m in modules for n in m.__all__ if inspect.isclass(getattr(m, n))}
    missing: list[str] = []
    seen: set[int] = set()
    for module in modules:
        for name in module.__all__:
            obj = getattr(module, name)
            qualified = f"{module.__name__}.{name}"
            if inspect.isclass(obj) or inspect.isroutine(obj):
                if id(obj) in seen:  # re-exported: reported once, under the first module
                    continue
                seen.add(id(obj))
            if inspect.isclass(obj) or inspect.isroutine(obj):
                if not _own_doc(obj):
                    missing.append(f"{qualified} (docstring)")
            elif not _data_doc(module, name):
                missing.append(f"{qualified} (a #: comment above its assignment)")
            if not inspect.isclass(obj):
                continue
            for member, value in _members(obj, public):
                if not _own_doc(value):
                    missing.append(f"{qualified}.{member} (docstring)")
            what = "member" if isinstance(obj, enum.EnumMeta) else "field"
            missing += [f"{qualified}.{field} ({what}: a #: comment or the class docstring)" for field in _field_docs(obj)[1]]
    return sorted(set(missing), key=str.lower)


# --- rendering -------------------------------------------------------------------------------------------------


class _Raw:
    """An annotation string shown as written (``str``, not ``'str'``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _signature(obj: Any) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""

    def raw(annotation: Any) -> Any:
        return _Raw(annotation) if isinstance(annotation, str) else annotation

    sig = sig.replace(
        parameters=[p.replace(annotation=raw(p.annotation)) for p in sig.parameters.values()],
        return_annotation=raw(sig.return_annotation),
    )
    text = re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", str(sig))  # stable across runs
    return re.sub(r"<(\w+)\.(\w+): '?([^'>]*)'?>", r"\1.\2", text)  # enum defaults: Kind.MEMBER


def markdown(doc: str) -> str:
    """A reST docstring as Markdown: ````x```` and ``:role:`x``` become ```x```."""
    doc = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", doc)
    return re.sub(r"``(.+?)``", r"`\1`", doc, flags=re.S)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _summary(doc: str | None) -> str:
    """The first sentence of the first paragraph, for the index table."""
    paragraph = (doc or "").split("\n\n")[0].replace("\n", " ")
    sentence = re.match(r"(.+?\.)\s+(?=[A-Z`])", paragraph)
    return markdown(sentence.group(1) if sentence else paragraph).replace("|", "\\|")


def _item(label: str, doc: str) -> list[str]:
    """A bullet whose continuation lines are indented under it."""
    body = markdown(doc).splitlines()
    return [f"- {label}: {body[0]}", *(f"  {line}" if line else "" for line in body[1:])]


def _entry(module: Any, name: str, heading: str, public: set[int]) -> list[str]:
    obj = getattr(module, name)
    lines = [f"{heading} `{name if module.__name__ == 'etsdk.backend' else module.__name__ + '.' + name}`", ""]
    if inspect.isclass(obj) or inspect.isroutine(obj):
        if isinstance(obj, enum.EnumMeta):
            bases = ", ".join(b.__name__ for b in obj.__bases__)
            header = f"class {name}({bases})"
        else:
            header = f"{'class' if inspect.isclass(obj) else 'function'} {name}{_signature(obj)}"
        lines += ["```text", header, "```", "", markdown(_own_doc(obj) or "(undocumented)"), ""]
    else:
        value = f" = {obj!r}" if isinstance(obj, (bool, int, float, str)) else ""
        lines += ["```text", f"{name}: {type(obj).__name__}{value}", "```", "", markdown(_data_doc(module, name) or "(undocumented)"), ""]
    if not inspect.isclass(obj):
        return lines
    documented, _ = _field_docs(obj)
    if documented:
        if isinstance(obj, enum.EnumMeta):
            lines.append("Members:")
            lines.append("")
            for member, doc in documented.items():
                lines += _item(f"`{member}` (`{obj[member].value!r}`)", doc)
        else:
            lines.append("Fields:")
            lines.append("")
            for field, doc in documented.items():
                lines += _item(f"`{field}`", doc)
        lines.append("")
    members = _members(obj, public)
    if members:
        lines.append("Methods and properties:")
        lines.append("")
        for member, value in members:
            target = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            signature = "" if isinstance(value, property) else re.sub(r"^\((?:self|cls)(?:, )?", "(", _signature(target))
            kind = " (property)" if isinstance(value, property) else " (class method)" if isinstance(value, classmethod) else ""
            lines += _item(f"`{member}{signature}`{kind}", _own_doc(value) or "(undocumented)")
        lines.append("")
    return lines


def _render_page(page: str, public: set[int]) -> str:
    modules = [importlib.import_module(name) for name in PAGES[page]]
    home: dict[int, tuple[str, Any]] = {}  # a class or function re-exported is described where first exported
    for other, names in PAGES.items():
        for m in map(importlib.import_module, names):
            for n in m.__all__:
                home.setdefault(id(getattr(m, n)), (other, m))
    parts = [HEADERS[page]]
    single = len(modules) == 1
    for module in modules:
        heading = "##" if single else "###"
        if not single:
            parts += [f"## `{module.__name__}`", ""]
        parts += [markdown(inspect.getdoc(module) or ""), ""]
        names = sorted(module.__all__, key=lambda n: n.strip("_").lower())
        rows = ["| name | what |", "| --- | --- |"]
        entries: list[str] = []
        for name in names:
            obj = getattr(module, name)
            other = home[id(obj)] if (inspect.isclass(obj) or inspect.isroutine(obj)) else (page, module)
            if other[1] is not module:
                label = name if len(PAGES[other[0]]) == 1 else f"{other[1].__name__}.{name}"
                target = ("" if other[0] == page else other[0].removeprefix("docs/")) + f"#{_anchor(label)}"
                rows.append(f"| [`{name}`]({target}) | the same as `{other[1].__name__}.{name}` |")
                continue
            label = name if single else f"{module.__name__}.{name}"
            doc = _own_doc(obj) if (inspect.isclass(obj) or inspect.isroutine(obj)) else _data_doc(module, name)
            rows.append(f"| [`{name}`](#{_anchor(label)}) | {_summary(doc)} |")
            entries += _entry(module, name, heading, public)
        parts += [*rows, "", *entries]
    return "\n".join(parts).rstrip() + "\n"


def render() -> dict[str, str]:
    """Each page (path relative to the repository) -> its text."""
    modules = _public_modules()
    public = {id(getattr(m, n)) for m in modules for n in m.__all__ if inspect.isclass(getattr(m, n))}
    return {page: _render_page(page, public) for page in PAGES}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    status = 0
    for page, text in render().items():
        path = ROOT / page
        if path.is_file() and path.read_text() == text:
            continue
        if check:
            print(f"apidoc: {page} is stale: run python3 dev.py apidoc", file=sys.stderr)
            status = 1
        else:
            path.write_text(text)
            print(f"apidoc: wrote {page}")
    missing = undocumented()
    for name in missing:
        print(f"apidoc: undocumented: {name}", file=sys.stderr)
    return 1 if missing else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
