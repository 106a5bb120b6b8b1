"""docs/backend-api.md is what etsdk.backend's docstrings render to; every public backend name has one."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_backend_api_reference_matches_the_docstrings() -> None:
    """docs/backend-api.md is what the docstrings of etsdk.backend render to (python3 dev.py apidoc)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("apidoc", ROOT / "tools" / "apidoc.py")
    assert spec is not None and spec.loader is not None
    apidoc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(apidoc)
    render = apidoc.render

    assert (ROOT / "docs" / "backend-api.md").read_text() == render(), "regenerate: python3 dev.py apidoc"


def test_every_public_backend_name_is_documented() -> None:
    import inspect

    import etsdk.backend

    undocumented = [name for name in etsdk.backend.__all__ if not inspect.getdoc(getattr(etsdk.backend, name))]
    assert not undocumented
