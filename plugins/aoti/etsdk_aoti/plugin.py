"""Registration of etsdk-aoti.

This release is a registration shell: it installs, is discovered through the
``etsdk.plugins`` entry point and registers nothing yet. Its backend (partitioner,
serializer, runtime binding) lands with the AOTInductor issue.
"""

from __future__ import annotations

from etsdk import hookimpl
from etsdk.registration import BackendSpec

ETSDK_PLUGIN_API = ">=1,<2"


@hookimpl
def etsdk_register_backends() -> list[BackendSpec]:
    return []
