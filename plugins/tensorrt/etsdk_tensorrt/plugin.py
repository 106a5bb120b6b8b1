"""Registration of etsdk-tensorrt (imports neither torch nor tensorrt).

The factories import the partitioner, serializer and runtime binding only when
the backend is used; the probe says whether engines can *run* here and, if not,
what is missing (export does not need it: without TensorRT the engine is built
on first load on the target).
"""

from __future__ import annotations

from typing import Any

from etsdk import hookimpl
from etsdk.backend import Availability, BackendSpec, Capability, Option, WeightFormat

from etsdk_tensorrt import BACKEND_ID

ETSDK_PLUGIN_API = ">=2,<3"
VERSION = "0.1.0"

OPTIONS = (
    Option("device", str, "cuda", "where the engine runs and caller-owned state lives: cuda, or cpu for host-located engines"),
    Option("precision", str, "fp32", "builder precision (TF32 off for fp32)", choices=("fp32", "tf32", "fp16", "bf16")),
    Option("build", str, "auto", "build the engine at export, or on first load on the target", choices=("auto", "export", "load")),
    Option("keep_onnx", bool, True, "keep the ONNX beside a built engine so another TensorRT / GPU can rebuild it"),
    Option("workspace_mib", int, None, "the builder's workspace pool limit in MiB"),
    Option("optimization_level", int, None, "the builder optimisation level, 0 to 5"),
    Option("progress", bool, True, "show engine-build progress on stderr"),
)


def _partitioner(**options: Any) -> Any:
    from etsdk_tensorrt.partitioner import TensorRTPartitioner

    return TensorRTPartitioner(**options)


def _preprocess(partition: Any) -> Any:
    from etsdk_tensorrt.serializer import preprocess

    return preprocess(partition)


def _runtime() -> Any:
    from etsdk_tensorrt.runtime import TensorRTBinding

    return TensorRTBinding()


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
            options=OPTIONS,
            # DequantizeLinear + MatMul in the ONNX (etsdk_tensorrt.quantized); GGUF blocks as the planes they hold
            weight_formats=tuple(f.name for f in WeightFormat.every()),
        )
    ]
