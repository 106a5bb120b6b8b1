"""Registration of etsdk-aoti (imports nothing heavy)."""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any

from etsdk import hookimpl
from etsdk.backend import Availability, BackendSpec, Capability, Option, WeightFormat, cpu_target_names

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


def _doctor() -> list[str]:
    from etsdk_aoti.kernels import ISA_VARIABLE, current_level, load, runnable_levels

    path = load()  # builds the kernels at the level this process uses
    chosen = current_level()
    forced = f"forced by {ISA_VARIABLE}" if chosen.name != runnable_levels()[-1].name else f"the host's best; {ISA_VARIABLE} forces a lower one"
    return [
        f"kernels level {chosen.name} ({forced}); this host runs: {' '.join(lv.name for lv in runnable_levels())}",
        f"kernels library: {path}",
    ]


def _describe_payload(payload: memoryview) -> list[str]:
    """``etsdk inspect``'s lines for an etsdk-aoti delegate: its device, and what CPU its code needs."""
    from etsdk.backend import host_cpu

    from etsdk_aoti import blob_format, cpu

    blob = blob_format.decode(payload)
    lines = blob_format.describe(blob)
    if blob.config.cpu is not None:
        why = cpu.refusal(blob.config.cpu, host_cpu())
        runs = "this host runs it" if blob.config.device == "cpu" else "this host's CPU runs its host code"
        lines.append(why.split("; ", 1)[1] if why else runs)  # "this host lacks ...; re-export ..."
    return lines


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
            doctor=_doctor,
            description="AOTInductor-compiled partitions run through the model-container C API (cpu or cuda)",
            # quantized linears run on etsdk-aoti's kernels, embeddings in generated code: every format (CPU only)
            weight_formats=tuple(f.name for f in WeightFormat.every(int8_activations=True)),
            options=(
                Option("device", str, None, "cpu, cuda or cuda:N (default: cuda when available)"),
                Option(
                    "kernel_threads", int, 1,
                    "OpenMP threads of the generated CPU kernels: 1 (on the calling thread) or -1 (the caller's team)",
                ),
                Option(
                    "cpu_target", str, "native",
                    "the CPU the generated code (on CUDA: its host code) is compiled for: native (this host) or a baseline a fleet shares "
                    "(x86-64-v3: AVX2, x86-64-v4: AVX-512); a host that lacks a feature refuses the program at load",
                    choices=tuple(cpu_target_names()),
                ),
            ),
            describe_payload=_describe_payload,
        )
    ]
