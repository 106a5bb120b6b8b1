"""docs/sessions.md: its examples run, in order, as one script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs._blocks import runnable

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = ROOT / "docs" / "sessions.md"


def test_sessions_guide_examples_run(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    blocks = [b.body for b in runnable(str(SESSIONS.relative_to(ROOT)), "python")]
    assert len(blocks) >= 4, "the sessions guide lost its examples"
    script = "\n".join(blocks)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "state 'k0' shape: the snapshot has [1, 2, 64, 16], the program [1, 2, 96, 16]" in result.stdout
