"""``etsdk new-backend``: the scaffold installs with pip, is listed, exports and runs, and passes the kit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from etsdk.testing import PluginSite


def _etsdk(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "etsdk", *args], cwd=cwd, capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_scaffolded_backend_installs_exports_runs_and_passes_the_kit(tmp_path: Path) -> None:
    made = _etsdk("new-backend", "kit_demo", "--dir", str(tmp_path), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    project = tmp_path / "etsdk-kit_demo"
    site = PluginSite(tmp_path / "site")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(site.root), str(project)],
        capture_output=True, text=True,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    assert (site.root / "etsdk_kit_demo-0.1.0.dist-info" / "entry_points.txt").is_file()
    listed = {p["name"]: p for p in json.loads(site.run_etsdk(["plugins", "--json"]).stdout)}
    assert listed["kit_demo"]["status"] == "ok" and listed["kit_demo"]["backends"] == ["KitDemoBackend"]
    report = tmp_path / "report.json"
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project / "tests"), "--etsdk-report", str(report)],
        cwd=project, capture_output=True, text=True, env=site.env(),
    )
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    results = json.loads(report.read_text())["results"]
    assert {r["outcome"] for r in results} == {"passed"}, [r for r in results if r["outcome"] != "passed"]
    from etsdk.conformance import suite

    behaviours = [name for name in suite.__all__ if name.startswith("test_")]
    assert len(behaviours) == 18 and sorted(r["test"] for r in results) == sorted(behaviours)  # every one ran
