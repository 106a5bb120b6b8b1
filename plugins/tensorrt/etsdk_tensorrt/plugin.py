"""Registration of etsdk-tensorrt (imports neither torch nor tensorrt).

The factories import the partitioner, serializer and runtime binding only when
the backend is used; the probe says whether engines can run here, and why not.
"""

from __future__ import annotations

from typing import Any

from etsdk import Availability, BackendSpec, Capability, hookimpl

from etsdk_tensorrt import BACKEND_ID

ETSDK_PLUGIN_API = ">=1,<2"
VERSION = "0.1.0"


def _partitioner(**options: Any) -> Any:
    from etsdk_tensorrt.partitioner import TensorRTPartitioner

    return TensorRTPartitioner(**options)


def _preprocess(edge_program: Any, compile_specs: Any) -> Any:
    from etsdk_tensorrt.serializer import preprocess

    return preprocess(edge_program, compile_specs)


def _runtime() -> Any:
    from etsdk_tensorrt.runtime import TensorRTBindingV1

    return TensorRTBindingV1()


def _probe() -> Availability:
    from etsdk_tensorrt.availability import probe

    return probe()


@hookimpl
def etsdk_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            id=BACKEND_ID,
            version=VERSION,
            partitioner=_partitioner,
            preprocess=_preprocess,
            runtime=_runtime,
            capabilities=frozenset({Capability.CUDA, Capability.CALLER_OWNED_STATE, Capability.NAMED_DATA}),
            probe=_probe,
            description="TensorRT engines built from the partition's ONNX, caller-owned state bound in place",
        )
    ]
