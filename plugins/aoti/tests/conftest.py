"""Shared fixtures of etsdk-aoti's tests: the kernels at every instruction-set level this host runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from etsdk import BackendUnavailableError
from etsdk.backend import host_cpu
from etsdk_aoti import kernels
from etsdk_aoti.kernels.levels import LEVELS, KernelLevel, requested_level

#: The levels of this host's architecture, lowest first; those it cannot run are skipped with the reason.
HOST_LEVELS: list[KernelLevel] = [lv for lv in LEVELS if lv.machine == host_cpu().machine]


@pytest.fixture(params=[lv.name for lv in HOST_LEVELS] or ["portable"])
def kernel_level(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test once per kernel level (the entry points call that level's table), restoring the process's own
    level after; a level this host cannot run is skipped with what it lacks."""
    try:
        kernels.use_level(request.param)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))
    try:
        yield request.param
    finally:
        kernels.use_level(requested_level().name)
