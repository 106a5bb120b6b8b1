"""``etsdk new-backend NAME``: a complete, pip-installable backend plugin that works at once.

The template (``template/``) is the four rooms every plugin has (``plugin.py``, ``partitioner.py``,
``serializer.py``, ``runtime.py``) plus ``blob_format.py``, the one home of the blob's layout that the
serializer encodes and the runtime decodes; a ``pyproject.toml`` with the entry point, tests that run the
conformance kit, and a README. Its backend computes the operators it claims with torch, so
a fresh scaffold exports, runs and passes the kit before its author changes anything.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from pathlib import Path

from etsdk.errors import EtsdkError

__all__ = ["Scaffold", "new_backend"]

TEMPLATE = Path(__file__).resolve().parent / "template"
_LAYOUT = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "package/__init__.py.tmpl": "etsdk_{name}/__init__.py",
    "package/plugin.py.tmpl": "etsdk_{name}/plugin.py",
    "package/partitioner.py.tmpl": "etsdk_{name}/partitioner.py",
    "package/serializer.py.tmpl": "etsdk_{name}/serializer.py",
    "package/blob_format.py.tmpl": "etsdk_{name}/blob_format.py",
    "package/runtime.py.tmpl": "etsdk_{name}/runtime.py",
    "tests/test_backend.py.tmpl": "tests/test_{name}.py",
    "tests/test_conformance.py.tmpl": "tests/test_conformance.py",
}


@dataclass(frozen=True, slots=True)
class Scaffold:
    """What ``new_backend`` wrote: the project directory, the backend id, every file."""

    directory: Path
    backend_id: str
    files: tuple[Path, ...]


def backend_id_for(name: str) -> str:
    """``my_npu`` -> ``MyNpuBackend``."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) + "Backend"


def new_backend(name: str, directory: str | Path = ".") -> Scaffold:
    """Write ``etsdk-NAME/`` under ``directory``; refuses a name that is not a lowercase identifier, and any existing path."""
    if not name.isidentifier() or keyword.iskeyword(name) or name != name.lower() or name.startswith("_"):
        raise EtsdkError(
            f"backend name must be a lowercase Python identifier (letters, digits, underscores; e.g. my_npu), "
            f"found {name!r}"
        )
    root = Path(directory) / f"etsdk-{name}"
    if root.exists():
        raise EtsdkError(f"{root} already exists; refusing to overwrite it (choose another name or --dir)")
    backend_id = backend_id_for(name)
    written = []
    for source, target in _LAYOUT.items():
        text = (TEMPLATE / source).read_text().replace("{{name}}", name).replace("{{backend_id}}", backend_id)
        path = root / target.format(name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return Scaffold(root, backend_id, tuple(written))
