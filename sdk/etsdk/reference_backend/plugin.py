"""Registration of the reference backend (the core's own plugin entry point).

Imports nothing heavy: the factories below import torch and executorch only
when the backend is used.
"""

from __future__ import annotations

from typing import Any

from etsdk._format.weight_format import WeightFormat
from etsdk._plugins.hookspec import hookimpl
from etsdk._plugins.specs import BackendSpec, Capability, Option
from etsdk.reference_backend import BACKEND_ID

ETSDK_PLUGIN_API = ">=2,<3"


def _partitioner(**options: Any) -> Any:
    from etsdk.reference_backend.partitioner import ReferencePartitioner

    return ReferencePartitioner(**options)


def _preprocess(partition: Any) -> Any:
    from etsdk.reference_backend.serializer import preprocess

    return preprocess(partition)


def _runtime() -> Any:
    from etsdk.reference_backend.runtime import ReferenceBinding

    return ReferenceBinding()


@hookimpl
def etsdk_register_backends() -> list[BackendSpec]:
    from etsdk import __version__

    return [
        BackendSpec(
            id=BACKEND_ID,
            version=__version__,
            partitioner=_partitioner,
            preprocess=_preprocess,
            runtime=_runtime,
            capabilities=frozenset({Capability.CPU, Capability.NAMED_DATA, Capability.CALLER_OWNED_STATE, Capability.FILLED_ATTENTION}),
            description="computes its partitions with plain torch ops (reference and example)",
            # the quantized operators' own reference math (dequantize, then compute): every format
            weight_formats=tuple(f.name for f in WeightFormat.every(int8_activations=True)),
            options=(
                Option("ops", (list, tuple, frozenset, set), None, "aten operator names to claim (default: every one)"),
            ),
        )
    ]
