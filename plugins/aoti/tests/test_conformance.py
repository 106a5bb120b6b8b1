"""The etsdk conformance kit, run against etsdk-aoti on CPU (real AOTInductor compiles, shared per kit)."""

from __future__ import annotations

from typing import Any

import pytest
from etsdk.conformance.suite import *  # noqa: F403 - the kit's tests
from etsdk_aoti import BACKEND_ID


@pytest.fixture(scope="session")
def etsdk_backend_id() -> str:
    return BACKEND_ID


@pytest.fixture(scope="session")
def etsdk_backend_options() -> dict[str, Any]:
    return {"device": "cpu"}
