from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from etsdk.testing import PluginSite


@pytest.fixture
def site(tmp_path: Path) -> PluginSite:
    return PluginSite(tmp_path / "site")


def plugins_json(site: PluginSite, env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    result = site.run_etsdk(["plugins", "--json"], env)
    assert result.returncode == 0, result.stderr
    return {p["name"]: p for p in json.loads(result.stdout)}
