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
