"""Lint and type-check from day one: ruff over everything, mypy over the core and the plugins with code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff() -> None:
    pytest.importorskip("ruff")
    result = _run("ruff", "check", "sdk", "tests", "plugins", "benchmarks", "dev.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    pytest.importorskip("mypy")
    result = _run(
        "mypy", "sdk/etsdk", "plugins/aoti/etsdk_aoti", "plugins/hf_static/etsdk_hf_static", "plugins/tensorrt/etsdk_tensorrt",
        "--ignore-missing-imports", "--follow-imports=silent",
    )
    assert result.returncode == 0, result.stdout + result.stderr
