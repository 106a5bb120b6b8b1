"""etsdk's public names come from ``__all__``, and importing etsdk stays cheap."""

from __future__ import annotations

import subprocess
import sys

import etsdk


def test_all_names_resolve() -> None:
    for name in etsdk.__all__:
        assert getattr(etsdk, name) is not None, name


def test_all_is_complete() -> None:
    public = {name for name in vars(etsdk) if not name.startswith("_") and name != "annotations"}
    modules = {name for name in public if type(getattr(etsdk, name)).__name__ == "module"}
    assert public - modules - {"TYPE_CHECKING", "Any"} <= set(etsdk.__all__)
    assert set(etsdk._LAZY) <= set(etsdk.__all__)


def test_import_does_not_import_torch() -> None:
    code = "import sys, etsdk; print(sorted(m for m in ('torch','executorch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_errors_share_one_root() -> None:
    for name in etsdk.__all__:
        obj = getattr(etsdk, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, etsdk.EtsdkError), name


PUBLIC_MODULES = ("etsdk", "etsdk.backend", "etsdk.testing", "etsdk.conformance", "etsdk.conformance.suite")


def _plugin_imports() -> list[tuple[str, str, str]]:
    """(file, module, name) for every ``from etsdk... import name`` / ``import etsdk...`` under plugins/."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "plugins"
    found = []
    for path in sorted(root.rglob("*.py")):
        if "/standin/" in str(path):
            continue  # test stand-ins imitate other libraries, not etsdk
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "etsdk":
                found += [(str(path.relative_to(root)), node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(str(path.relative_to(root)), alias.name, "") for alias in node.names if alias.name.split(".")[0] == "etsdk"]
    return found


def test_plugins_import_only_public_names() -> None:
    """Our plugins are written as a third party would write theirs: every etsdk name they use is public."""
    import importlib

    imports = _plugin_imports()
    assert imports, "no plugin imports found"
    private = []
    for file, module, name in imports:
        if module not in PUBLIC_MODULES:
            private.append(f"{file}: {module}" + (f".{name}" if name else ""))
            continue
        if name and name != "*" and name not in getattr(importlib.import_module(module), "__all__", ()):
            private.append(f"{file}: {module}.{name} is not in {module}.__all__")
    assert not private, "plugins use non-public etsdk names:\n" + "\n".join(private)


def test_every_public_name_of_the_backend_api_resolves() -> None:
    import etsdk.backend
    import etsdk.testing

    for module in (etsdk.backend, etsdk.testing):
        for name in module.__all__:
            assert getattr(module, name) is not None, (module.__name__, name)
