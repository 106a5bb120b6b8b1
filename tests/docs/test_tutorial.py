"""docs/backend-tutorial.md, executed block by block: it ends with a working backend in its own distribution.

``# file:`` blocks are written to disk, ``bash`` blocks run (``pip install`` goes to a target directory put
on ``PYTHONPATH`` instead of the test environment: a real install with real entry points, nothing left
behind), other ``python`` blocks run in a subprocess. Blocks marked ``<!-- not executed: ... -->`` are skipped
(``tests/docs/_blocks.py``).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from etsdk.testing import PluginSite

from tests.docs._blocks import runnable

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "backend-tutorial.md"
#: The languages of the blocks this test executes (every one of the tutorial's that is not marked).
LANGUAGES = ("toml", "python", "bash")


def blocks() -> list[tuple[str, str]]:
    return [(b.language, b.body) for b in runnable(str(TUTORIAL.relative_to(ROOT)), *LANGUAGES)]


@pytest.mark.slow
def test_the_tutorial_runs_from_zero(tmp_path: Path) -> None:
    site = PluginSite(tmp_path / "site")
    outputs: list[str] = []
    for language, body in blocks():
        first = body.splitlines()[0]
        if first.startswith("# file: "):
            path = tmp_path / first.removeprefix("# file: ").strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
            continue
        if language == "bash":
            for line in body.strip().splitlines():
                words = shlex.split(line)
                if words[:2] == ["pip", "install"]:
                    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site.root), *words[2:]]
                else:
                    assert words[0] == "etsdk", line
                    command = [sys.executable, "-m", "etsdk", *words[1:]]
                result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=site.env())
                assert result.returncode == 0, f"{line}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
                outputs.append(result.stdout)
        elif language == "python":
            result = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, capture_output=True, text=True, env=site.env())
            assert result.returncode == 0, result.stderr[-3000:]
            outputs.append(result.stdout)
    listing = next(o for o in outputs if o.startswith("NAME"))
    assert re.search(r"^mini\s+etsdk-mini\s+0\.1\.0\s+ok\s+MiniBackend", listing, flags=re.M), listing
    assert any("MiniBackend matches eager PyTorch" in o for o in outputs)
    assert any("MiniBackend {'aten::addmm'" in o for o in outputs)
    report = json.loads((tmp_path / "mini-report.json").read_text())["results"]
    outcomes = {r["behaviour"].split(":")[0]: r["outcome"] for r in report}
    assert outcomes["export and run vs eager"] == "passed"
    assert outcomes["refusal of an unknown required feature"] == "passed"
    assert outcomes["mutated blobs never crash"] == "passed"
    assert outcomes["in-place caller-owned state"] == "skipped"
    assert {r["outcome"] for r in report} <= {"passed", "skipped"}, [r for r in report if r["outcome"] == "failed"]
