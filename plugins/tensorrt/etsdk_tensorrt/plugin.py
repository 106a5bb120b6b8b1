"""Registration of etsdk-tensorrt.

Registers the backend id with an availability probe that never imports
tensorrt. This release does not implement the backend yet: its factories
refuse with a clear error, and the probe reports it unavailable everywhere.
"""

from __future__ import annotations

from typing import Any

from etsdk import hookimpl
from etsdk.errors import BackendUnavailableError
from etsdk.registration import BackendSpec, Capability

from etsdk_tensorrt import BACKEND_ID

ETSDK_PLUGIN_API = ">=2,<3"


def _not_implemented(*_: Any, **__: Any) -> Any:
    from etsdk_tensorrt.availability import probe

    raise BackendUnavailableError(f"backend '{BACKEND_ID}' cannot run here: {probe().reason}", backend_id=BACKEND_ID)


def _probe() -> Any:
    from etsdk_tensorrt.availability import probe

    return probe()


@hookimpl
def etsdk_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            id=BACKEND_ID,
            version="0.0.1",
            partitioner=_not_implemented,
            preprocess=_not_implemented,
            runtime=_not_implemented,
            capabilities=frozenset({Capability.CUDA}),
            probe=_probe,
            description="TensorRT engines (not implemented in this release)",
        )
    ]
