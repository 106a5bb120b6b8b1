"""Building TensorRT engines from ONNX (at export or on first load), and the cache of engines built at load.

Written against TensorRT's Python API (10.x and 11.x): ``Builder``,
``OnnxParser.parse_from_file``, ``IBuilderConfig`` (precision flags where the
TensorRT version has them, workspace pool, optimisation level, a progress
monitor) and ``build_serialized_network``. The networks etsdk exports have static
shapes; should the parser report a dynamic input, one optimisation profile pins
it to the shape the blob records.

Engines built at load are cached on disk under ``<etsdk cache>/tensorrt``, keyed
by the ONNX (graph and weights digests), the build options, the TensorRT version
and the GPU's compute capability: a second load of the same program on the same
machine deserializes instead of building.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from etsdk import BackendUnavailableError, EtsdkError

from etsdk_tensorrt import BACKEND_ID
from etsdk_tensorrt.options import BuildOptions

Say = Callable[[str], None]
#: Part of every cache key: bump when the way engines are built here changes (flags, profiles, parsing).
BUILDER_VERSION = 1


def import_tensorrt() -> ModuleType:
    try:
        return importlib.import_module("tensorrt")
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend '{BACKEND_ID}' needs TensorRT's Python package 'tensorrt' to build or run engines: {exc}",
            backend_id=BACKEND_ID,
        ) from None


def tensorrt_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorrt") is not None


def progress_printer(enabled: bool) -> Say:
    def say(text: str) -> None:
        if enabled:
            print(f"etsdk-tensorrt: {text}", file=sys.stderr, flush=True)

    return say


def _progress_monitor(trt: ModuleType, say: Say) -> Any:
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class Monitor(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.depth: dict[str, int] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            depth = self.depth.get(parent_phase, -1) + 1 if parent_phase else 0
            self.depth[phase_name] = depth
            if depth <= 1:
                say(f"{'  ' * depth}{phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True  # never cancel

        def phase_finish(self, phase_name: str) -> None:
            self.depth.pop(phase_name, None)

    return Monitor()


def _set_precision(trt: ModuleType, config: Any, precision: str, error: type[EtsdkError], where: str) -> None:
    flags = trt.BuilderFlag
    if precision == "fp32":
        if hasattr(flags, "TF32"):
            config.clear_flag(flags.TF32)
        return
    if precision == "tf32":
        if hasattr(flags, "TF32"):
            config.set_flag(flags.TF32)
        return
    flag = {"fp16": "FP16", "bf16": "BF16"}[precision]
    if not hasattr(flags, flag):
        raise error(
            f"{where}: TensorRT {trt.__version__} has no BuilderFlag.{flag} (it builds strongly typed networks only): export the "
            f"model in {'float16' if precision == 'fp16' else 'bfloat16'} instead of asking for precision '{precision}'"
        )
    config.set_flag(getattr(flags, flag))


def can_strip(trt: ModuleType) -> bool:
    """Whether this TensorRT builds weight-stripped engines that its ONNX parser refits (10.0+)."""
    flags = trt.BuilderFlag
    return hasattr(flags, "STRIP_PLAN") and hasattr(flags, "REFIT_IDENTICAL") and hasattr(trt, "OnnxParserRefitter")


def build(
    trt: ModuleType,
    model_path: Path,
    options: BuildOptions,
    shapes: Mapping[str, tuple[int, ...]],
    *,
    say: Say,
    error: type[EtsdkError],
    where: str = f"backend '{BACKEND_ID}'",
    strip: bool = False,
) -> Any:
    """Build a serialized engine (``IHostMemory``) from the ONNX at ``model_path`` (weights beside it).

    ``strip``: leave the weights out of the plan (``STRIP_PLAN`` with ``REFIT_IDENTICAL``; :func:`can_strip`), to
    be refitted at load from the same ONNX weights (:func:`refit`). Failures raise ``error`` (ExportError at
    export, ProgramError at load) prefixed with ``where``.
    """
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    say(f"parsing {model_path.name} with TensorRT {trt.__version__}")
    if not parser.parse_from_file(str(model_path)):
        problems = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)) or "no details"
        raise error(f"{where}: TensorRT {trt.__version__}'s ONNX parser refused the partition: {problems}")
    config = builder.create_builder_config()
    _set_precision(trt, config, options.precision, error, where)
    if options.workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level
    dynamic = []
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        if any(int(d) < 0 for d in tensor.shape):
            if tensor.name not in shapes:
                raise error(f"{where}: the network input '{tensor.name}' has a dynamic shape and the blob records none for it")
            dynamic.append(tensor.name)
    if dynamic:
        profile = builder.create_optimization_profile()
        for name in dynamic:
            profile.set_shape(name, shapes[name], shapes[name], shapes[name])
        config.add_optimization_profile(profile)
    if strip:
        config.set_flag(trt.BuilderFlag.STRIP_PLAN)
        config.set_flag(trt.BuilderFlag.REFIT_IDENTICAL)
    monitor = _progress_monitor(trt, say) if options.progress else None
    if monitor is not None:
        config.progress_monitor = monitor
    say(f"building the engine (precision {options.precision})")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise error(f"{where}: TensorRT {trt.__version__} failed to build the engine (see TensorRT's log above)")
    say(f"engine built: {serialized.nbytes} bytes{' (weights stripped: refitted at load from the ONNX weights)' if strip else ''}")
    return serialized


def refit(trt: ModuleType, found: Any, model_path: Path, *, error: type[EtsdkError], where: str) -> None:
    """Give a weight-stripped engine its weights from the ONNX at ``model_path`` (weights beside it)."""
    logger = trt.Logger(trt.Logger.WARNING)
    refitter = trt.Refitter(found, logger)
    parser = trt.OnnxParserRefitter(refitter, logger)
    if not parser.refit_from_file(str(model_path)):
        problems = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)) or "no details"
        raise error(f"{where}: refitting the weight-stripped engine from the blob's ONNX weights failed: {problems}")
    if not refitter.refit_cuda_engine():
        raise error(f"{where}: TensorRT {trt.__version__} could not refit the weight-stripped engine (see its log above)")


# ----------------------------------------------------------------------------- cache


def cache_root() -> Path:
    from etsdk.backend import cache_dir

    return cache_dir() / "tensorrt"


def cache_key(parts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(parts), sort_keys=True).encode()).hexdigest()[:40]


def cached(key: str, produce: Callable[[], Any]) -> tuple[bytes, bool]:
    """The engine cached under ``key``, or ``produce()``'s, written atomically; and whether it was cached."""
    path = cache_root() / f"{key}.engine"
    if path.is_file():
        return path.read_bytes(), True
    data = bytes(produce())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return data, False


def forget(key: str) -> None:
    (cache_root() / f"{key}.engine").unlink(missing_ok=True)
