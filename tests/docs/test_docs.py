"""The runnable examples in the README and the user guide run, and ``etsdk demo`` works.

The LLM main job (``python3 dev.py demo``): tests/cross_plugin/test_llm_main_job.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("doc", ["README.md", "docs/index.md", "plugins/aoti/README.md", "docs/hf_static.md"])
def test_python_examples_run(doc: str, tmp_path: Path) -> None:
    blocks = _python_blocks(ROOT / doc)
    assert blocks, f"{doc} has no python example"
    for block in blocks[:1]:
        result = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("doc", ["docs/mixed-delegates.md"])
def test_every_python_example_of_a_guide_runs(doc: str, tmp_path: Path) -> None:
    """Guides whose examples build on each other: all blocks, in order, in one process."""
    blocks = _python_blocks(ROOT / doc)
    assert len(blocks) >= 2
    result = subprocess.run([sys.executable, "-c", "\n".join(blocks)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_demo_main_job(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETSDK_") or k == "ETSDK_CACHE_DIR"}
    result = subprocess.run(
        [sys.executable, "-m", "etsdk", "demo", "--out-dir", str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "matches eager PyTorch" in result.stdout
    assert (tmp_path / "mlp.pte").is_file() and (tmp_path / "weights.ptd").is_file()


def test_the_migration_guide_covers_every_plugin_api_bump_and_every_moved_module() -> None:
    """docs/migrating.md, named by the skip reason of a plugin for an older plugin API, stays complete."""
    import etsdk
    from etsdk._moved import MOVED
    from etsdk._plugins.discovery import MIGRATION_GUIDE

    guide = ROOT / MIGRATION_GUIDE
    assert guide.is_file(), f"the skip reason names {MIGRATION_GUIDE}, which does not exist"
    text = guide.read_text()
    for old in range(1, etsdk.PLUGIN_API_VERSION):
        assert f"## Plugin API {old} -> {old + 1}" in text, f"{MIGRATION_GUIDE} has no section for plugin API {old}"
    listed = set(re.findall(r"\| `(etsdk(?:\.\w+)+)`", text)) | set(re.findall(r", `(etsdk(?:\.\w+)+)` \|", text))
    missing = sorted(set(MOVED) - listed)
    assert not missing, f"{MIGRATION_GUIDE} does not list the old module path(s) {missing} with their replacement"
    for doc in ("index.md", "backend-authors.md"):
        assert "(migrating.md" in (ROOT / "docs" / doc).read_text(), f"docs/{doc} does not link the migration guide"
