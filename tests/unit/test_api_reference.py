"""The API reference (docs/backend-api.md, docs/api.md) is what the docstrings render to; every public name has one."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _apidoc() -> ModuleType:
    return _load("apidoc", ROOT / "tools" / "apidoc.py")


def test_the_api_reference_matches_the_docstrings() -> None:
    """Each page is what tools/apidoc.py renders (python3 dev.py apidoc regenerates them)."""
    apidoc = _apidoc()
    pages = apidoc.render()
    assert set(pages) == {"docs/backend-api.md", "docs/api.md"}
    stale = [page for page, text in pages.items() if (ROOT / page).read_text() != text]
    assert not stale, f"{', '.join(stale)} differ from the docstrings: regenerate with python3 dev.py apidoc"


def test_every_public_name_is_documented() -> None:
    """Every name in the __all__ of etsdk, etsdk.backend, etsdk.testing and etsdk.conformance, every public
    method and property of a public class, every dataclass field and enum member."""
    missing = _apidoc().undocumented()
    assert not missing, "undocumented public API (write a docstring or a #: comment):\n  " + "\n  ".join(missing)


def test_the_check_names_what_lacks_documentation(tmp_path: Path) -> None:
    """The check itself: an undocumented function, class, method, property, field, enum member and constant
    are each named; documented ones (docstring, #: comment, or named in the class docstring) are not."""
    source = '''
        """A public module for the check."""

        import enum
        from dataclasses import dataclass

        __all__ = ["Documented", "Kind", "Record", "bare", "CONSTANT", "NOTED", "documented"]

        CONSTANT = 3

        #: Explained.
        NOTED = 4


        def bare():
            pass


        def documented():
            """Has one."""


        class Kind(enum.Enum):
            """Kinds; ``A`` is named here."""

            A = 1
            #: Explained.
            B = 2
            C = 3


        @dataclass
        class Record:
            #: Explained.
            explained: int
            silent: int


        class Documented:
            """Has one."""

            def method(self):
                pass

            @property
            def value(self):
                """Has one."""
                return 1

            @property
            def hidden(self):
                return 2

            def _private(self):
                pass
    '''
    path = tmp_path / "apidoc_sample.py"
    path.write_text(textwrap.dedent(source))
    sample = _load("apidoc_sample", path)
    try:
        missing = _apidoc().undocumented([sample])
    finally:
        del sys.modules["apidoc_sample"]
    named = {entry.split(" ")[0] for entry in missing}
    assert named == {
        "apidoc_sample.bare",
        "apidoc_sample.CONSTANT",
        "apidoc_sample.Kind.C",
        "apidoc_sample.Record",
        "apidoc_sample.Record.silent",
        "apidoc_sample.Documented.method",
        "apidoc_sample.Documented.hidden",
    }, missing
