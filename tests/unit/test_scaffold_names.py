"""``etsdk new-backend`` refuses bad names and never overwrites a directory (no install, no export).

A scaffold installed, exported, run and checked by the kit: tests/integration/test_scaffold.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _etsdk(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "etsdk", *args], cwd=cwd, capture_output=True, text=True, env=env)


def test_names_that_are_not_identifiers_are_refused(tmp_path: Path) -> None:
    for bad in ("3bad", "my-backend", "MyBackend", "class", ""):
        result = _etsdk("new-backend", bad, "--dir", str(tmp_path), cwd=tmp_path)
        assert result.returncode == 2, (bad, result.stdout)
        assert "must be a lowercase Python identifier" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_never_overwritten(tmp_path: Path) -> None:
    first = _etsdk("new-backend", "twice", "--dir", str(tmp_path), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    plugin = tmp_path / "etsdk-twice" / "etsdk_twice" / "plugin.py"
    plugin.write_text(plugin.read_text() + "\n# my edits\n")
    again = _etsdk("new-backend", "twice", "--dir", str(tmp_path), cwd=tmp_path)
    assert again.returncode == 2 and "already exists; refusing to overwrite" in again.stderr
    assert plugin.read_text().endswith("# my edits\n")
