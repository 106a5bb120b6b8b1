"""The core's conformance kit, run for etsdk-tensorrt on the stand-in (host-located engines: ``device="cpu"``)."""

from __future__ import annotations

from typing import Any

import pytest
from etsdk.conformance.suite import *  # noqa: F401,F403 - the kit's tests
from etsdk_tensorrt import BACKEND_ID


@pytest.fixture(scope="session")
def etsdk_backend_id() -> str:
    return BACKEND_ID


@pytest.fixture(scope="session")
def etsdk_backend_options() -> dict[str, Any]:
    return {"device": "cpu"}
