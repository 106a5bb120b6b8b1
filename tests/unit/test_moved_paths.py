"""Module paths of the flat 0.x core still import, once each, with a DeprecationWarning naming the public import."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
from etsdk._moved import MOVED


def test_every_old_path_is_the_new_module_with_a_warning() -> None:
    """In one fresh interpreter: each old path warns on its first import and is the very module at its new place
    (a submodule of an old package path included: nothing is loaded twice)."""
    code = """
import importlib, json, sys, warnings
from etsdk._moved import MOVED
problems = []
for old, (new, public) in sorted(MOVED.items()):
    if old == "etsdk.chat":
        continue  # forwards to a plugin: tests/unit/test_commands.py covers it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    mine = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and " moved" in str(w.message)]
    if not any(old in m and public in m for m in mine):
        problems.append(f"{old}: no warning naming {public}: {mine}")
    if old != "etsdk.backends":
        target = importlib.import_module(new)
        if module is not target or target.__spec__.name != new:
            problems.append(f"{old}: not the module {new} (spec {target.__spec__.name})")
import etsdk.backends.reference.runtime as old_runtime  # a submodule of an old package path: loaded once
import etsdk.reference_backend.runtime as new_runtime
if old_runtime is not new_runtime:
    problems.append("etsdk.backends.reference.runtime was loaded a second time")
print(json.dumps(problems))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
    assert len(MOVED) > 30


def test_names_not_in_the_table_are_not_served() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("etsdk.no_such_module")
