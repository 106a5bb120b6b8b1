"""Shared fixtures of etsdk-aoti's tests: the kernels at every instruction-set level this host runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from etsdk_aoti.testing import host_level_names, run_at_level


@pytest.fixture(params=host_level_names())
def kernel_level(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test once per kernel level (the entry points call that level's table); a level this host cannot
    run is skipped with what it lacks."""
    yield from run_at_level(request.param)
