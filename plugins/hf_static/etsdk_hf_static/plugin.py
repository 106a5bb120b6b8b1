"""Registration of etsdk-hf-static.

This release is a registration shell: it installs, is discovered through the
``etsdk.plugins`` entry point and registers nothing yet. The hf_static contract
and its runner land with the hf_static issue.
"""

from __future__ import annotations

from etsdk import hookimpl
from etsdk.registration import ContractSpec

ETSDK_PLUGIN_API = ">=1,<2"


@hookimpl
def etsdk_register_contracts() -> list[ContractSpec]:
    return []
