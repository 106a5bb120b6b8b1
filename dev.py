#!/usr/bin/env python3
"""Set up everything and run the main job or the test suite, on a machine with only Python.

    python3 dev.py demo      # set up, then export the embedded tiny LLM through etsdk-aoti and generate with it
    python3 dev.py test      # set up, then run the whole test suite (what CI runs)
    python3 dev.py setup     # set up only

Set-up creates ``.venv`` beside this file, installs the pinned torch and
executorch, the core and every plugin under ``plugins/`` (editable), and builds
the native bridge. It is skipped when nothing it depends on has changed.
Extra arguments after ``test`` go to pytest.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("ETSDK_VENV", ROOT / ".venv"))
PINNED = ["torch==2.13.0", "executorch==1.5.1"]
TOOLS = ["setuptools>=68", "wheel", "pytest>=8", "hypothesis>=6", "pluggy>=1.5", "packaging>=23", "transformers==5.23.0", "onnx==1.23.2", "onnxscript==0.7.2", "onnxruntime==1.32.0", "ruff", "mypy"]


def _bin(name: str) -> Path:
    return VENV / ("Scripts" if os.name == "nt" else "bin") / name


def _run(*cmd: object, **kwargs: object) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kwargs)  # type: ignore[arg-type]


def _plugins() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))


def _fingerprint() -> str:
    h = hashlib.sha256()
    h.update(" ".join(PINNED + TOOLS).encode())
    for path in [ROOT / "pyproject.toml", *(p / "pyproject.toml" for p in _plugins())]:
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def setup() -> None:
    stamp = VENV / ".etsdk-setup"
    fingerprint = _fingerprint()
    if stamp.is_file() and stamp.read_text() == fingerprint and _bin("python").exists():
        print(f"etsdk dev: {VENV} is up to date", flush=True)
    else:
        if not _bin("python").exists():
            print(f"etsdk dev: creating {VENV}", flush=True)
            venv.create(VENV, with_pip=True)
        pip = [_bin("python"), "-m", "pip", "--disable-pip-version-check", "install", "--progress-bar", "off"]
        _run(*pip, *PINNED, *TOOLS)
        editable = [arg for p in [ROOT, *_plugins()] for arg in ("-e", p)]
        _run(*pip, "--no-build-isolation", *editable)
        stamp.write_text(fingerprint)
    _run(_bin("etsdk"), "doctor")


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "demo"
    if command not in {"setup", "demo", "test"}:
        print(__doc__)
        return 2
    setup()
    if command == "demo":
        return subprocess.run([str(_bin("python")), "-m", "etsdk_hf_static.demo", *argv[1:]]).returncode
    if command == "test":
        result = subprocess.run([str(_bin("python")), "-m", "pytest", *argv[1:]], cwd=ROOT)
        return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
