"""``python3 dev.py test`` runs every test file exactly once across its pytest processes (dev.LANES)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dev() -> object:
    spec = importlib.util.spec_from_file_location("etsdk_dev_script", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_test_file_is_in_exactly_one_lane() -> None:
    lanes = _dev().LANES  # type: ignore[attr-defined]
    runs: dict[Path, list[str]] = {}
    for name, args in lanes:
        ignored = {(ROOT / a.removeprefix("--ignore=")).resolve() for a in args if a.startswith("--ignore=")}
        for arg in (a for a in args if not a.startswith("-")):
            target = (ROOT / arg).resolve()
            files = [target] if target.is_file() else sorted(target.rglob("test_*.py"))
            for file in files:
                if file not in ignored:
                    runs.setdefault(file, []).append(name)
    every = sorted({*ROOT.joinpath("tests").rglob("test_*.py"), *ROOT.joinpath("plugins").glob("*/tests/**/test_*.py")})
    every = [f for f in every if "template" not in f.parts]
    assert len(every) > 50, every  # the globs found the suite
    missing = [str(f.relative_to(ROOT)) for f in every if f.resolve() not in runs]
    twice = {str(f.relative_to(ROOT)): n for f, n in runs.items() if len(n) > 1}
    assert not missing and not twice, f"not run: {missing}; run twice: {twice}"
