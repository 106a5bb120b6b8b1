"""Registration of etsdk-aoti (imports nothing heavy)."""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any

from etsdk import hookimpl
from etsdk.backend import Availability, BackendSpec, Capability, Option, WeightFormat

from etsdk_aoti import BACKEND_ID

ETSDK_PLUGIN_API = ">=2,<3"


def _partitioner(**options: Any) -> Any:
    from etsdk_aoti.partitioner import AotiPartitioner

    return AotiPartitioner(**options)


def _preprocess(partition: Any) -> Any:
    from etsdk_aoti.serializer import preprocess

    return preprocess(partition)


def _runtime() -> Any:
    from etsdk_aoti.runtime import AotiBinding

    return AotiBinding()


def _probe() -> Availability:
    if importlib.util.find_spec("torch") is None:
        return Availability.unavailable("torch is not installed")
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        return Availability.unavailable("no C++ compiler found: AOTInductor needs one to compile (apt-get install g++)")
    return Availability.ok()


@hookimpl
def etsdk_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            id=BACKEND_ID,
            version="0.1.0",
            partitioner=_partitioner,
            preprocess=_preprocess,
            runtime=_runtime,
            capabilities=frozenset(
                {Capability.CPU, Capability.CUDA, Capability.CALLER_OWNED_STATE, Capability.NAMED_DATA, Capability.FILLED_ATTENTION}
            ),
            probe=_probe,
            description="AOTInductor-compiled partitions run through the model-container C API (cpu or cuda)",
            # quantized linears run on etsdk-aoti's kernels, embeddings in generated code: every format (CPU only)
            weight_formats=tuple(f.name for f in WeightFormat.every(int8_activations=True)),
            options=(
                Option("device", str, None, "cpu, cuda or cuda:N (default: cuda when available)"),
                Option(
                    "kernel_threads", int, 1,
                    "OpenMP threads of the generated CPU kernels: 1 (on the calling thread) or -1 (the caller's team)",
                ),
            ),
        )
    ]
