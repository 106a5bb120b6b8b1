"""docs/sessions.md: its examples run, in order, as one script."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_sessions_guide_examples_run(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "sessions.md").read_text(), flags=re.S)
    assert len(blocks) >= 4, "the sessions guide lost its examples"
    script = "\n".join(blocks)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "state 'k0' shape: the snapshot has [1, 2, 64, 16], the program [1, 2, 96, 16]" in result.stdout
