"""A stand-in for TensorRT's Python package, for etsdk-tensorrt's tests only (never installed, never shipped).

The tests put this directory first on ``sys.path`` so that ``import tensorrt``
finds it. It follows the names and semantics of the real API (10.x / 11.x) for
the surface etsdk-tensorrt uses, and executes an engine's ONNX with ONNX Runtime
on the CPU:

* ``Builder`` / ``OnnxParser`` / ``IBuilderConfig`` / ``build_serialized_network``
  give an ``IHostMemory`` holding this stand-in's own engine format: a header
  stamped with the TensorRT version and compute capability it was "built" for,
  then the ONNX model with its weights. The parser refuses ONNX that does not
  pass ``onnx.checker``, and ``TensorScatter`` below version 10.15 (as the real
  parser lacked it).
* ``BuilderFlag.STRIP_PLAN`` (with ``REFIT`` or ``REFIT_IDENTICAL``; refused
  alone) builds a weight-stripped engine: every initializer's values are left
  out of the plan (names, dtypes and shapes kept). ``Refitter`` and
  ``OnnxParserRefitter.refit_from_file`` give them back from an ONNX file, each
  by name and checked against its dtype and shape (errors reported like the
  parser's); ``Refitter.refit_cuda_engine`` returns False while one is missing.
  A stripped engine that was not refitted refuses to execute.
* ``Runtime.deserialize_cuda_engine`` returns ``None`` (after logging an error)
  for bytes that are not such an engine, or are stamped for another version or
  compute capability, as TensorRT does.
* ``ICudaEngine`` reports I/O names, modes, dtypes, shapes and locations from
  the ONNX graph; ``get_aliased_input_tensor`` (present from 10.15) reports the
  input a ``TensorScatter`` output updates, as TensorRT reports its KV-cache
  update layer's alias.
* ``IExecutionContext``: addresses are set by name (unknown names refused); an
  input shape other than the engine's is refused; ``execute_async_v3`` refuses
  (returns False after logging) while any I/O tensor has no address, when a
  KV-cache-update output is not bound to its cache input's address, or when a
  device-located tensor is not 256-byte aligned; it then reads every input from,
  and writes every output to, the bound addresses (through ONNX Runtime's
  IOBinding over those raw pointers; the aliased cache is updated in place).

Limits (what is *not* like TensorRT):

* Everything runs on the host, synchronously; the stream handle is ignored.
  Tensor locations are ``HOST`` unless ``STANDIN.location`` says otherwise, and
  then memory is still host memory: a "device" engine here only tests that the
  binding refuses host state before running.
* No kernels, tactics, precision or optimisation profiles: builder flags and
  profiles are recorded, not applied; everything computes as the ONNX says.
  bfloat16 tensors are not supported. A quantized weight (``DequantizeLinear``
  into ``MatMul``) is dequantized and multiplied in float, as TensorRT's
  weight-only GEMMs compute it, not fused: ONNX Runtime runs with its basic
  optimizations only (its extended ones would quantize the activations too).
* An output bound over an input's memory that the engine does not declare as an
  alias (a ``user`` alias) is computed into scratch memory and written after the
  run, i.e. as if the engine read every input before writing that output.
  TensorRT gives no such guarantee for layers other than its KV-cache update.
* No ``IOutputAllocator``, no dynamic output shapes, no DLA, no plugins, no
  timing or engine caches, no ``execute_v2``. Refit is only from an ONNX file
  (no ``set_named_weights``), and every initializer counts as refittable.
* ``STANDIN`` (below) configures what a real installation would decide: the
  version, the GPU's compute capability, tensor locations, and deliberate
  corruption of the I/O an engine reports (to test that bindings refuse it).
"""

from __future__ import annotations

import ctypes
import enum
import json
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

__version__ = "10.16.1"

_MAGIC = b"ETSDK-STANDIN-TRT-ENGINE\0"
_HEADER = struct.Struct("<I")


@dataclass
class _StandIn:
    """What a real installation and GPU would decide (tests change it; ``reset()`` restores it)."""

    compute_capability: str = "8.9"
    location: str = "HOST"  # "HOST" or "DEVICE", for every I/O tensor
    #: ONNX tensor name -> what the engine reports instead: {"name", "dtype", "shape", "aliased" (an input or None)}
    io_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    builds: int = 0  # engines built (tests count cache hits with it)
    executions: int = 0

    def reset(self) -> None:
        global __version__
        __version__ = "10.16.1"
        self.compute_capability, self.location = "8.9", "HOST"
        self.io_overrides = {}
        self.builds = self.executions = 0


STANDIN = _StandIn()


def _version_tuple() -> tuple[int, ...]:
    return tuple(int(p) for p in __version__.split(".")[:2])


# ----------------------------------------------------------------------------- enums


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    BF16 = 7
    INT64 = 8


class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class TensorLocation(enum.Enum):
    DEVICE = 0
    HOST = 1


class BuilderFlag(enum.Enum):
    FP16 = 0
    INT8 = 1
    DEBUG = 2
    GPU_FALLBACK = 3
    REFIT = 5
    DISABLE_TIMING_CACHE = 6
    TF32 = 7
    BF16 = 17
    REFIT_IDENTICAL = 18
    STRIP_PLAN = 19


class MemoryPoolType(enum.Enum):
    WORKSPACE = 0


class NetworkDefinitionCreationFlag(enum.Enum):
    STRONGLY_TYPED = 1


_ONNX_TO_TRT = {1: DataType.FLOAT, 10: DataType.HALF, 16: DataType.BF16, 3: DataType.INT8, 2: DataType.UINT8,
                6: DataType.INT32, 7: DataType.INT64, 9: DataType.BOOL}
_NUMPY = {DataType.FLOAT: "float32", DataType.HALF: "float16", DataType.INT8: "int8", DataType.UINT8: "uint8",
          DataType.INT32: "int32", DataType.INT64: "int64", DataType.BOOL: "bool"}


def nptype(dtype: DataType) -> Any:
    import numpy as np

    if dtype not in _NUMPY:
        raise TypeError(f"the TensorRT stand-in has no numpy type for {dtype}")
    return np.dtype(_NUMPY[dtype]).type


# ----------------------------------------------------------------------------- logging


class ILogger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    INTERNAL_ERROR = Severity.INTERNAL_ERROR
    ERROR = Severity.ERROR
    WARNING = Severity.WARNING
    INFO = Severity.INFO
    VERBOSE = Severity.VERBOSE

    def log(self, severity: Any, msg: str) -> None:
        raise NotImplementedError


class Logger(ILogger):
    def __init__(self, min_severity: Any = ILogger.Severity.WARNING) -> None:
        self.min_severity = min_severity

    def log(self, severity: Any, msg: str) -> None:
        if int(severity) <= int(self.min_severity):
            print(f"[TRT stand-in] [{ILogger.Severity(severity).name}] {msg}", file=sys.stderr)


class Dims(tuple):  # type: ignore[type-arg]
    """TensorRT's ``Dims``: indexable, iterable, ``len()``."""


class IHostMemory(bytes):
    """A serialized engine: bytes with TensorRT's ``nbytes`` / ``dtype``."""

    @property
    def nbytes(self) -> int:
        return len(self)

    @property
    def dtype(self) -> DataType:
        return DataType.UINT8


# ----------------------------------------------------------------------------- building


class ITensor:
    def __init__(self, name: str, dtype: DataType, shape: tuple[int, ...]) -> None:
        self.name, self.dtype, self.shape = name, dtype, Dims(shape)


class INetworkDefinition:
    def __init__(self, flags: int) -> None:
        self.flags = flags
        self._model: Any = None
        self._inputs: list[ITensor] = []
        self._outputs: list[ITensor] = []

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_input(self, index: int) -> ITensor:
        return self._inputs[index]

    def get_output(self, index: int) -> ITensor:
        return self._outputs[index]


def _value_info(value: Any) -> ITensor:
    tensor_type = value.type.tensor_type
    shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
    return ITensor(value.name, _ONNX_TO_TRT[tensor_type.elem_type], shape)


class _ParserError:
    def __init__(self, desc: str) -> None:
        self._desc = desc

    def desc(self) -> str:
        return self._desc

    def __str__(self) -> str:
        return f"In node -1 with name:  and operator:  (parse): {self._desc}"


class _Errors:
    """The parsers' error list (``num_errors``, ``get_error``, ``clear_errors``) and reading an ONNX file into it."""

    def __init__(self) -> None:
        self._errors: list[_ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> _ParserError:
        return self._errors[index]

    def clear_errors(self) -> None:
        self._errors.clear()

    def _load(self, model: str) -> Any:
        """The ONNX at ``model`` with its external weights, or None with the failure reported as an error."""
        import onnx

        try:
            return onnx.load(model, load_external_data=True)
        except Exception as exc:  # noqa: BLE001 - reported like the real parser: as an error, not a raise
            self._errors.append(_ParserError(f"cannot read {model}: {exc}"))
            return None


class OnnxParser(_Errors):
    def __init__(self, network: INetworkDefinition, logger: ILogger) -> None:
        super().__init__()
        self.network, self.logger = network, logger

    def parse_from_file(self, model: str) -> bool:
        proto = self._load(model)
        return proto is not None and self._parse(proto)

    def parse(self, model: bytes, path: str | None = None) -> bool:
        import onnx

        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as exc:  # noqa: BLE001
            self._errors.append(_ParserError(f"cannot read the model: {exc}"))
            return False
        return self._parse(proto)

    def _parse(self, proto: Any) -> bool:
        import onnx

        try:
            onnx.checker.check_model(proto, full_check=True)
        except Exception as exc:  # noqa: BLE001
            self._errors.append(_ParserError(f"invalid model: {exc}"))
            return False
        if _version_tuple() < (10, 15) and any(n.op_type == "TensorScatter" for n in proto.graph.node):
            self._errors.append(_ParserError("No importer registered for op: TensorScatter"))
            return False
        self.network._model = proto
        self.network._inputs = [_value_info(v) for v in proto.graph.input]
        self.network._outputs = [_value_info(v) for v in proto.graph.output]
        return True


class IOptimizationProfile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[Any, Any, Any]] = {}

    def set_shape(self, input: str, min: Any, opt: Any, max: Any) -> None:  # noqa: A002 - TensorRT's names
        self.shapes[input] = (tuple(min), tuple(opt), tuple(max))


class IProgressMonitor:
    """Subclass and override, as with TensorRT's (call ``IProgressMonitor.__init__(self)``)."""

    def __init__(self) -> None:
        pass

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        pass

    def step_complete(self, phase_name: str, step: int) -> bool:
        return True

    def phase_finish(self, phase_name: str) -> None:
        pass


class IBuilderConfig:
    def __init__(self) -> None:
        self._flags = {BuilderFlag.TF32}
        self.pools: dict[MemoryPoolType, int] = {}
        self.profiles: list[IOptimizationProfile] = []
        self.builder_optimization_level = 3
        self.progress_monitor: IProgressMonitor | None = None

    def set_flag(self, flag: BuilderFlag) -> None:
        self._flags.add(flag)

    def clear_flag(self, flag: BuilderFlag) -> None:
        self._flags.discard(flag)

    def get_flag(self, flag: BuilderFlag) -> bool:
        return flag in self._flags

    def set_memory_pool_limit(self, pool: MemoryPoolType, pool_size: int) -> None:
        self.pools[pool] = pool_size

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1


class Builder:
    def __init__(self, logger: ILogger) -> None:
        self.logger = logger

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        return INetworkDefinition(flags)

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig()

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
        if network._model is None:
            self.logger.log(ILogger.ERROR, "build_serialized_network: the network is empty")
            return None
        dynamic = [t.name for t in network._inputs if any(d < 0 for d in t.shape)]
        unprofiled = [n for n in dynamic if not any(n in p.shapes for p in config.profiles)]
        if unprofiled:
            self.logger.log(ILogger.ERROR, f"dynamic inputs without an optimization profile: {unprofiled}")
            return None
        monitor = config.progress_monitor
        phases = ("Building engine", "Serializing engine")
        for phase in phases:
            if monitor is not None:
                monitor.phase_start(phase, None, 1)
                if not monitor.step_complete(phase, 0):
                    self.logger.log(ILogger.ERROR, "build cancelled by the progress monitor")
                    return None
                monitor.phase_finish(phase)
        stripped = BuilderFlag.STRIP_PLAN in config._flags
        if stripped and not {BuilderFlag.REFIT, BuilderFlag.REFIT_IDENTICAL} & config._flags:
            self.logger.log(ILogger.ERROR, "kSTRIP_PLAN needs kREFIT or kREFIT_IDENTICAL: a stripped plan must be refittable")
            return None
        STANDIN.builds += 1
        header = json.dumps(
            {
                "version": __version__,
                "compute_capability": STANDIN.compute_capability,
                "flags": sorted(f.name for f in config._flags),
                "stripped": stripped,
            }
        ).encode()
        model = _without_weights(network._model) if stripped else network._model
        return IHostMemory(_MAGIC + _HEADER.pack(len(header)) + header + model.SerializeToString())


def _without_weights(model: Any) -> Any:
    """A copy of ``model`` whose initializers keep their name, dtype and shape but no values."""
    import onnx

    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    for tensor in stripped.graph.initializer:
        bare = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=list(tensor.dims))
        tensor.CopyFrom(bare)
    return stripped


# ----------------------------------------------------------------------------- running


class Runtime:
    def __init__(self, logger: ILogger) -> None:
        self.logger = logger

    def deserialize_cuda_engine(self, serialized_engine: Any) -> ICudaEngine | None:
        import onnx

        data = bytes(serialized_engine)
        if not data.startswith(_MAGIC):
            self.logger.log(ILogger.ERROR, "deserializeCudaEngine: not a serialized engine (magic tag mismatch)")
            return None
        (length,) = _HEADER.unpack_from(data, len(_MAGIC))
        start = len(_MAGIC) + _HEADER.size
        header = json.loads(data[start : start + length])
        if header["version"] != __version__:
            self.logger.log(
                ILogger.ERROR,
                f"The engine plan file is not compatible with this version of TensorRT, expecting library version "
                f"{__version__} got {header['version']}, please rebuild.",
            )
            return None
        if header["compute_capability"] != STANDIN.compute_capability:
            self.logger.log(
                ILogger.ERROR,
                f"The engine plan file is generated on an incompatible device, expecting compute "
                f"{STANDIN.compute_capability} got compute {header['compute_capability']}, please rebuild.",
            )
            return None
        return ICudaEngine(onnx.load_from_string(data[start + length :]), weightless=bool(header.get("stripped")))


@dataclass
class _IO:
    name: str  # as the engine reports it
    onnx_name: str
    mode: TensorIOMode
    dtype: DataType
    shape: tuple[int, ...]
    location: TensorLocation
    aliased_input: str | None


class ICudaEngine:
    def __init__(self, model: Any, weightless: bool = False) -> None:
        self._model = model
        #: a weight-stripped plan not refitted yet: these initializers have no values
        self._weightless = {t.name for t in model.graph.initializer} if weightless else set()
        producers = {out: node for node in model.graph.node for out in node.output}
        graph_inputs = {v.name for v in model.graph.input}
        self._io: list[_IO] = []
        location = TensorLocation[STANDIN.location]
        for mode, values in ((TensorIOMode.INPUT, model.graph.input), (TensorIOMode.OUTPUT, model.graph.output)):
            for value in values:
                info = _value_info(value)
                aliased = None
                if mode is TensorIOMode.OUTPUT:
                    node = producers.get(value.name)
                    while node is not None and node.op_type == "Identity":
                        node = producers.get(node.input[0])
                    if node is not None and node.op_type == "TensorScatter" and node.input[0] in graph_inputs:
                        aliased = node.input[0]
                override = STANDIN.io_overrides.get(value.name, {})
                self._io.append(
                    _IO(
                        name=override.get("name", value.name),
                        onnx_name=value.name,
                        mode=mode,
                        dtype=override.get("dtype", info.dtype),
                        shape=tuple(override.get("shape", tuple(info.shape))),
                        location=location,
                        aliased_input=override.get("aliased", aliased),
                    )
                )
        self._by_name = {io.name: io for io in self._io}
        self._session: Any = None

    # -- I/O description

    @property
    def num_io_tensors(self) -> int:
        return len(self._io)

    def get_tensor_name(self, index: int) -> str:
        return self._io[index].name

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        io = self._by_name.get(name)
        return io.mode if io is not None else TensorIOMode.NONE

    def get_tensor_dtype(self, name: str) -> DataType:
        io = self._by_name.get(name)
        return io.dtype if io is not None else DataType.FLOAT

    def get_tensor_shape(self, name: str) -> Dims:
        io = self._by_name.get(name)
        return Dims(io.shape) if io is not None else Dims((-1,))

    def get_tensor_location(self, name: str) -> TensorLocation:
        io = self._by_name.get(name)
        return io.location if io is not None else TensorLocation.DEVICE

    def __getattr__(self, name: str) -> Any:
        if name == "get_aliased_input_tensor" and _version_tuple() >= (10, 15):
            return self._aliased_input_tensor
        raise AttributeError(f"'ICudaEngine' object has no attribute '{name}' (TensorRT stand-in {__version__})")

    def _aliased_input_tensor(self, name: str) -> str | None:
        io = self._by_name.get(name)
        if io is None or io.mode is not TensorIOMode.OUTPUT or io.aliased_input is None:
            return None
        return next(i.name for i in self._io if i.onnx_name == io.aliased_input)

    def create_execution_context(self) -> IExecutionContext:
        return IExecutionContext(self)

    def serialize(self) -> IHostMemory:
        header = json.dumps({"version": __version__, "compute_capability": STANDIN.compute_capability, "flags": []}).encode()
        return IHostMemory(_MAGIC + _HEADER.pack(len(header)) + header + self._model.SerializeToString())

    def _ort(self) -> Any:
        if self._session is None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.log_severity_level = 3
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            # ORT's extended optimizations turn DequantizeLinear -> MatMul into an int8 MatMul that quantizes the
            # activations too (1 % off on a quantized weight); TensorRT's weight-only GEMM keeps them in float
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            self._session = ort.InferenceSession(
                self._model.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
        return self._session


class IExecutionContext:
    def __init__(self, engine: ICudaEngine) -> None:
        self.engine = engine
        self._addresses: dict[str, int] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self.logger = Logger()

    def set_input_shape(self, name: str, shape: Any) -> bool:
        io = self.engine._by_name.get(name)
        shape = tuple(int(d) for d in shape)
        if io is None or io.mode is not TensorIOMode.INPUT:
            self.logger.log(ILogger.ERROR, f"setInputShape: '{name}' is not an input tensor")
            return False
        if len(shape) != len(io.shape) or any(e not in (-1, s) for e, s in zip(io.shape, shape)):
            self.logger.log(ILogger.ERROR, f"setInputShape: {list(shape)} is outside the profile of '{name}' {list(io.shape)}")
            return False
        self._shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> Dims:
        return Dims(self._shapes.get(name, self.engine.get_tensor_shape(name)))

    def set_tensor_address(self, name: str, memory: int) -> bool:
        if name not in self.engine._by_name:
            self.logger.log(ILogger.ERROR, f"setTensorAddress: '{name}' is not an input or output tensor")
            return False
        self._addresses[name] = int(memory)
        return True

    def get_tensor_address(self, name: str) -> int:
        return self._addresses.get(name, 0)

    def execute_async_v3(self, stream_handle: int) -> bool:
        import numpy as np

        engine = self.engine
        if engine._weightless:
            self.logger.log(ILogger.ERROR, "enqueueV3: the engine's weights were stripped from its plan and it was not refitted")
            return False
        unset = [io.name for io in engine._io if not self._addresses.get(io.name)]
        if unset:
            self.logger.log(ILogger.ERROR, f"enqueueV3: tensor(s) {unset} have no address set")
            return False
        unshaped = [io.name for io in engine._io if io.mode is TensorIOMode.INPUT and io.name not in self._shapes and -1 in io.shape]
        if unshaped:
            self.logger.log(ILogger.ERROR, f"enqueueV3: input shape(s) of {unshaped} not specified")
            return False
        misaligned = [io.name for io in engine._io if io.location is TensorLocation.DEVICE and self._addresses[io.name] % 256]
        if misaligned:
            self.logger.log(ILogger.ERROR, f"enqueueV3: device tensor(s) {misaligned} are not 256-byte aligned")
            return False
        by_onnx = {io.onnx_name: io for io in engine._io}
        for io in engine._io:
            if io.aliased_input is not None:
                cache = by_onnx[io.aliased_input]
                if self._addresses[io.name] != self._addresses[cache.name]:
                    self.logger.log(
                        ILogger.ERROR,
                        f"enqueueV3: KVCacheUpdate output '{io.name}' must share the device memory of its cache input "
                        f"'{cache.name}'",
                    )
                    return False
        session = engine._ort()
        binding = session.io_binding()
        spans = []
        for io in engine._io:
            if io.mode is TensorIOMode.INPUT:
                shape = self._shapes.get(io.name, io.shape)
                address = self._addresses[io.name]
                binding.bind_input(io.onnx_name, "cpu", 0, nptype(io.dtype), list(shape), address)
                spans.append((address, address + _nbytes(io.dtype, shape)))
        scratch: list[tuple[Any, int, int]] = []
        for io in engine._io:
            if io.mode is not TensorIOMode.OUTPUT:
                continue
            address = self._addresses[io.name]
            size = _nbytes(io.dtype, io.shape)
            overlaps = any(address < end and start < address + size for start, end in spans)
            if overlaps and io.aliased_input is None:
                array = np.empty(io.shape, dtype=nptype(io.dtype))
                binding.bind_output(io.onnx_name, "cpu", 0, nptype(io.dtype), list(io.shape), array.ctypes.data)
                scratch.append((array, address, size))
            else:
                binding.bind_output(io.onnx_name, "cpu", 0, nptype(io.dtype), list(io.shape), address)
        session.run_with_iobinding(binding)
        for array, address, size in scratch:
            ctypes.memmove(address, array.ctypes.data, size)
        STANDIN.executions += 1
        return True


def _nbytes(dtype: DataType, shape: Any) -> int:
    import numpy as np

    count = 1
    for d in shape:
        count *= int(d)
    return count * np.dtype(_NUMPY[dtype]).itemsize


# ----------------------------------------------------------------------------- refit


class Refitter:
    """Weights for an engine, given by name, applied by :meth:`refit_cuda_engine`."""

    def __init__(self, engine: ICudaEngine, logger: ILogger) -> None:
        self.engine, self.logger = engine, logger
        self._pending: dict[str, Any] = {}

    def refit_cuda_engine(self) -> bool:
        missing = sorted(self.engine._weightless - set(self._pending))
        if missing:
            self.logger.log(ILogger.ERROR, f"refitCudaEngine: missing weights for {missing}")
            return False
        for tensor in self.engine._model.graph.initializer:
            if tensor.name in self._pending:
                tensor.CopyFrom(self._pending[tensor.name])
        self.engine._weightless = set()
        self.engine._session = None
        self._pending.clear()
        return True


class OnnxParserRefitter(_Errors):
    """Refits an engine's weights from the ONNX model it was built from (``refit_from_file``)."""

    def __init__(self, refitter: Refitter, logger: ILogger) -> None:
        super().__init__()
        self.refitter, self.logger = refitter, logger

    def refit_from_file(self, onnx_model_file: str) -> bool:
        proto = self._load(onnx_model_file)
        if proto is None:
            return False
        wanted = {t.name: t for t in self.refitter.engine._model.graph.initializer}
        for tensor in proto.graph.initializer:
            known = wanted.get(tensor.name)
            if known is None:
                continue
            if (known.data_type, list(known.dims)) != (tensor.data_type, list(tensor.dims)):
                self._errors.append(_ParserError(f"weights '{tensor.name}': count or type differs from the engine's"))
                return False
            self.refitter._pending[tensor.name] = tensor
        return True
