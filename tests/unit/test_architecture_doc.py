"""docs/architecture.md names only modules, files and functions that exist."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()


def test_every_path_it_names_exists() -> None:
    paths = set(re.findall(r"`((?:sdk|plugins|tests|contracts|docs|benchmarks|tools)/[^`<>]+?)`", DOC))
    assert len(paths) > 20, "the architecture document names too few files to be the map"
    missing = sorted(p for p in paths if not (ROOT / p.rstrip("/")).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_file_of_the_layer_table_exists_in_its_package() -> None:
    checked = 0
    for row in DOC.splitlines():
        package = re.match(r"\| [^|]+ \| `(sdk/etsdk/[^`]+/)` \|(.*)\|\s*$", row)
        if package is None:
            continue
        for name in re.findall(r"`([\w/]+\.(?:py|cpp))`", package.group(2)):
            assert (ROOT / package.group(1) / name).is_file(), f"{package.group(1)}{name} is in the layer table but missing"
            checked += 1
    assert checked > 30


def test_every_dotted_name_it_uses_exists() -> None:
    """``etsdk.x.y`` is a module, or a name defined by the module before its last dot."""
    for name in sorted(set(re.findall(r"`(etsdk(?:\.\w+)+)`", DOC))):
        if importlib.util.find_spec(name) is not None:
            continue
        parent, _, attribute = name.rpartition(".")
        assert hasattr(importlib.import_module(parent), attribute), f"docs/architecture.md names {name}, which does not exist"


def test_the_stages_of_lower_are_functions_of_its_module() -> None:
    lower = importlib.import_module("etsdk._export.lower")
    walk = DOC.split("## Walk 1", 1)[1].split("## Walk 2", 1)[0]
    stages = re.findall(r"^\d\. `(\w+)`", walk, flags=re.M)
    assert stages == ["check_request", "resolve_partitioners", "trace", "check_traced", "lower_to_edge", "check_delegation", "emit"]
    for stage in stages:
        assert callable(getattr(lower, stage, None)), f"stage {stage} is not a function of etsdk._export.lower"


def test_every_thread_local_channel_is_declared_in_one_module() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "sdk" / "etsdk").rglob("*.py")
        if "threading.local(" in p.read_text() and p.name != "_channels.py"
    ]
    assert not offenders, f"thread-local state outside etsdk/_channels.py: {offenders}"
