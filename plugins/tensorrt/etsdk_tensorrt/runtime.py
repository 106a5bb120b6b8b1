"""The runtime binding: an engine per delegate, every tensor bound by name, state bound in place.

``init`` (once per delegate per method load) does everything that can fail
before anything runs:

* reads the blob, refusing unknown required features, and checks its binding
  table against the delegate's signature (names, dtypes, shapes, states);
* gets an engine: the blob's serialized engine when it was built for this
  TensorRT version and this GPU's compute capability; otherwise one built from
  the blob's ONNX (and cached); with no ONNX to rebuild from, the program is
  refused naming both versions / capabilities;
* cross-checks the engine against the blob by name: every I/O tensor's mode,
  dtype and shape, that the engine has no other tensor, where each tensor lives,
  and, where TensorRT has ``get_aliased_input_tensor`` (10.15+), that every
  ``kv_cache_update`` alias is the engine's own and no other output aliases an
  input. Caller-owned state must live where the engine says its tensor lives: a
  state the program allocates on the host for an engine tensor on the device is
  refused here, naming the state (it is never staged through scratch memory).

Per call (:meth:`TensorRTHandle.execute`, plain inputs: the delegate's arguments
and the session's state tensors in the signature's state order): for every input
``set_input_shape`` and ``set_tensor_address`` by name; every output's address
by name; each written state's aliased output bound to the state's own address;
``execute_async_v3`` on the caller's current CUDA stream. User inputs and
outputs that ExecuTorch hands over in host memory for a device engine go through
device buffers allocated once per handle; nothing is allocated per call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from etsdk import BlobFormatError, ProgramError, UnsupportedFeatureError
from etsdk.backend import dtype_name

from etsdk_tensorrt import blob_format, device, engine
from etsdk_tensorrt.options import BuildOptions

logger = logging.getLogger(__name__)

#: TensorRT DataType member name -> etsdk dtype name.
DTYPES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "UINT8": "uint8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
}
#: set_tensor_address's documented alignment for device memory.
DEVICE_ALIGNMENT = 256


class EngineMismatchError(ProgramError):
    """A TensorRT engine, or the memory offered to it, disagrees with what the blob binds."""


@dataclass(frozen=True, slots=True)
class _Tensor:
    """One engine I/O tensor as this binding uses it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    on_device: bool


def _enum_name(value: Any) -> str:
    return str(getattr(value, "name", value)).rsplit(".", 1)[-1]


def _shape(dims: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in dims)


class TensorRTHandle:
    """One delegate's engine and execution context."""

    def __init__(
        self,
        where: str,
        context: Any,
        engine_ref: Any,
        inputs: Sequence[_Tensor],
        outputs: Sequence[_Tensor],
        states: Sequence[tuple[str, _Tensor, str | None]],
    ) -> None:
        self._where = where
        self._context = context
        self._engine = engine_ref  # the context needs its engine alive
        self._inputs = tuple(inputs)
        self._outputs = tuple(outputs)
        self._states = tuple(states)  # (identity, input tensor, aliased output name or None)
        self._staging: dict[str, Any] = {}
        self._bound: tuple[int, ...] | None = None  # data pointers of the state last checked

    # -- state

    def _check_state(self, state: Sequence[Any]) -> None:
        if len(state) != len(self._states):
            raise EngineMismatchError(
                f"{self._where}: the delegate binds {len(self._states)} state tensor(s), the session offers {len(state)}"
            )
        for (identity, tensor, _), storage in zip(self._states, state):
            place = "the device" if tensor.on_device else "the host"
            on_device = device.is_device_tensor(storage)
            if on_device != tensor.on_device:
                raise EngineMismatchError(
                    f"{self._where}: state '{identity}' is in {storage.device.type} memory, but the engine binds "
                    f"'{tensor.name}' on {place}; caller-owned state is updated in place at its own address and "
                    "never staged through scratch memory: export for the engine's device (device option) so sessions "
                    "allocate the state there"
                )
            found = (dtype_name(storage.dtype), tuple(storage.shape))
            if found != (tensor.dtype, tensor.shape) or not storage.is_contiguous():
                raise EngineMismatchError(
                    f"{self._where}: state '{identity}' is {found[0]} {list(found[1])}"
                    f"{'' if storage.is_contiguous() else ' (not contiguous)'}; the engine binds '{tensor.name}' as "
                    f"{tensor.dtype} {list(tensor.shape)}, contiguous"
                )
            if tensor.on_device and storage.data_ptr() % DEVICE_ALIGNMENT:
                raise EngineMismatchError(
                    f"{self._where}: state '{identity}' starts at an address TensorRT cannot bind (not "
                    f"{DEVICE_ALIGNMENT}-byte aligned)"
                )

    # -- per call

    def _address(self, tensor: _Tensor, value: Any, *, is_input: bool) -> int:
        if not tensor.on_device or device.is_device_tensor(value):
            return int(value.data_ptr())
        staged = self._staging.get(tensor.name)
        if staged is None:
            staged = self._staging[tensor.name] = device.empty(tensor.shape, value.dtype)
        if is_input:
            staged.copy_(value, non_blocking=True)
        return int(staged.data_ptr())

    def _bind(self, name: str, address: int) -> None:
        if not self._context.set_tensor_address(name, address):
            raise EngineMismatchError(f"{self._where}: TensorRT refused an address for engine tensor '{name}'")

    def execute(self, args: Sequence[Any], state: Sequence[Any]) -> None:
        """Run once: ``args`` are the delegate's inputs then outputs; ``state`` the session's tensors."""
        pointers = tuple(int(s.data_ptr()) for s in state)
        if pointers != self._bound:
            self._check_state(state)
            self._bound = pointers
        context = self._context
        for tensor, value in zip(self._inputs, args):
            if not context.set_input_shape(tensor.name, tensor.shape):
                raise EngineMismatchError(f"{self._where}: TensorRT refused shape {list(tensor.shape)} for '{tensor.name}'")
            self._bind(tensor.name, self._address(tensor, value, is_input=True))
        for (_, tensor, aliased), storage in zip(self._states, state):
            if not context.set_input_shape(tensor.name, tensor.shape):
                raise EngineMismatchError(f"{self._where}: TensorRT refused shape {list(tensor.shape)} for '{tensor.name}'")
            address = int(storage.data_ptr())
            self._bind(tensor.name, address)
            if aliased is not None:
                self._bind(aliased, address)  # the update lands in the caller's own storage
        outputs = args[len(self._inputs) :]
        for tensor, value in zip(self._outputs, outputs):
            self._bind(tensor.name, self._address(tensor, value, is_input=False))
        if not context.execute_async_v3(device.current_stream()):
            raise ProgramError(f"{self._where}: TensorRT's execute_async_v3 failed (see TensorRT's log)")
        for tensor, value in zip(self._outputs, outputs):
            staged = self._staging.get(tensor.name)
            if staged is not None:
                value.copy_(staged)  # a device -> host copy on the current stream waits for the engine

    def destroy(self) -> None:
        self._staging.clear()
        self._context = None
        self._engine = None


# ----------------------------------------------------------------------------- init


def _check_signature(where: str, description: blob_format.BlobDescription, signature: Any) -> None:
    """The blob's binding table must follow the delegate's signature, argument by argument."""
    for side, bound, declared in (
        ("input", description.inputs, signature.inputs),
        ("output", description.outputs, signature.outputs),
    ):
        if len(bound) != len(declared):
            raise BlobFormatError(
                f"{where}: the blob binds {len(bound)} engine {side}(s), the delegate has {len(declared)}"
            )
        for index, (b, d) in enumerate(zip(bound, declared)):
            if (b.dtype, b.shape) != (d.dtype, tuple(d.shape)):
                raise BlobFormatError(
                    f"{where}: delegate {side} {index} ({d.describe()}) is bound to engine tensor {b.describe()}"
                )
    states = [(s.state, s.dtype, tuple(s.shape)) for s in signature.states]  # == context.states
    bound_states = [(s.state, s.dtype, s.shape) for s in description.states]
    if states != bound_states:
        raise BlobFormatError(f"{where}: the blob binds state {bound_states}, the delegate declares {states}")


def _engine_bytes(
    where: str, description: blob_format.BlobDescription, onnx_graph: memoryview | None, named_data: Any, trt: Any
) -> tuple[bytes | memoryview, str | None]:
    """The serialized engine to deserialize, and the cache key it came from (None: the blob's own)."""
    version = str(trt.__version__)
    capability = device.compute_capability()
    built = description.engine
    if built is not None:
        if (built.tensorrt_version, built.compute_capability) == (version, capability):
            data = named_data.get(built.data.key)
            if data.nbytes != built.data.nbytes:
                raise ProgramError(
                    f"{where}: the serialized engine '{built.data.key}' is {data.nbytes} bytes, the blob says "
                    f"{built.data.nbytes} (truncated or from another export)"
                )
            return data, None
        if description.onnx is None:
            raise EngineMismatchError(
                f"{where}: the engine was built for TensorRT {built.tensorrt_version} on compute capability "
                f"{built.compute_capability}, this machine has TensorRT {version} and compute capability {capability}, "
                "and the blob carries no ONNX to rebuild it from; re-export the program here (or export with "
                "keep_onnx=True)"
            )
        logger.info(
            "%s: engine built for TensorRT %s / compute capability %s; rebuilding for %s / %s",
            where, built.tensorrt_version, built.compute_capability, version, capability,
        )
    if description.onnx is None or onnx_graph is None:
        raise BlobFormatError(f"{where}: the blob carries neither a usable engine nor ONNX")
    return _build_from_onnx(where, description, onnx_graph, named_data, trt, version, capability)


def _build_from_onnx(
    where: str,
    description: blob_format.BlobDescription,
    onnx_graph: memoryview,
    named_data: Any,
    trt: Any,
    version: str,
    capability: str,
) -> tuple[bytes, str]:
    import tempfile
    from pathlib import Path

    record = description.onnx
    if record is None:
        raise BlobFormatError(f"{where}: the blob carries no ONNX")
    _check_graph(where, record, onnx_graph)
    options = BuildOptions(
        device=description.device,
        precision=str(description.build.get("precision", "fp32")),
        workspace_mib=description.build.get("workspace_mib"),
        optimization_level=description.build.get("optimization_level"),
        progress=bool(description.build.get("progress", True)),
    )
    key = engine.cache_key(
        {
            "builder": engine.BUILDER_VERSION,
            "graph": record.sha256,
            "weights": record.weights_identity(),
            "precision": options.precision,
            "workspace_mib": options.workspace_mib,
            "optimization_level": options.optimization_level,
            "tensorrt": version,
            "compute_capability": capability,
        }
    )
    say = engine.progress_printer(options.progress)

    def produce() -> Any:
        say(f"{where}: building the TensorRT engine for compute capability {capability} (cached for later loads)")
        with tempfile.TemporaryDirectory(prefix="etsdk-tensorrt-") as tmp:
            model = _onnx_files(where, record, onnx_graph, named_data, Path(tmp))
            shapes = {t.name: t.shape for t in description.inputs} | {s.input: s.shape for s in description.states}
            return engine.build(trt, model, options, shapes, say=say, error=ProgramError, where=where)

    data, _ = engine.cached(key, produce)
    return data, key


def _check_graph(where: str, record: blob_format.OnnxRecord, onnx_graph: memoryview) -> None:
    import hashlib

    if hashlib.sha256(onnx_graph).hexdigest() != record.sha256:
        raise ProgramError(f"{where}: the blob's ONNX graph does not match its recorded SHA-256")


def _onnx_files(where: str, record: blob_format.OnnxRecord, onnx_graph: memoryview, named_data: Any, directory: Any) -> Any:
    """The blob's ONNX graph and its weights file written into ``directory``; the graph's path."""
    model = directory / "model.onnx"
    model.write_bytes(onnx_graph)
    if record.weights is not None:
        weights = named_data.get(record.weights.key)
        if weights.nbytes != record.weights.nbytes:
            raise ProgramError(
                f"{where}: the ONNX weights '{record.weights.key}' are {weights.nbytes} bytes, the blob says "
                f"{record.weights.nbytes}"
            )
        (directory / str(record.weights_location)).write_bytes(weights)
    elif record.tensors:
        _rebuild_weights(where, record.tensors, named_data, directory / str(record.weights_location))
    return model


def _refit_stripped(where: str, trt: Any, found: Any, description: blob_format.BlobDescription, onnx_graph: Any, named_data: Any) -> None:
    """A weight-stripped engine from the blob gets its weights from the blob's ONNX weights (the program's one copy)."""
    import tempfile
    from pathlib import Path

    if description.onnx is None or onnx_graph is None:  # the blob reader refuses such a blob; kept for the types
        raise BlobFormatError(f"{where}: a weight-stripped engine and no ONNX weights to refit it from")
    _check_graph(where, description.onnx, onnx_graph)
    with tempfile.TemporaryDirectory(prefix="etsdk-tensorrt-") as tmp:
        model = _onnx_files(where, description.onnx, onnx_graph, named_data, Path(tmp))
        engine.refit(trt, found, model, error=ProgramError, where=where)


def _rebuild_weights(where: str, tensors: Sequence[blob_format.OnnxTensor], named_data: Any, path: Any) -> None:
    """The ONNX external-data file, each initializer's bytes (a named-data weight entry) written at its offset."""
    with open(path, "wb") as out:
        for tensor in tensors:
            data = named_data.get(tensor.key)
            if data.nbytes != tensor.nbytes:
                raise ProgramError(
                    f"{where}: ONNX initializer '{tensor.name}' ('{tensor.key}') is {data.nbytes} bytes, the blob says "
                    f"{tensor.nbytes}"
                )
            out.seek(tensor.offset)
            out.write(data)


def _deserialize(where: str, trt: Any, data: bytes | memoryview) -> Any:
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    found = runtime.deserialize_cuda_engine(data)
    if found is None:
        raise EngineMismatchError(f"{where}: TensorRT {trt.__version__} could not deserialize the engine (see TensorRT's log)")
    return runtime, found


def cross_check(where: str, found: Any, description: blob_format.BlobDescription) -> dict[str, bool]:
    """Compare the engine's I/O tensors with the blob, by name; returns name -> lives on the device."""
    expected: dict[str, tuple[str, str, tuple[int, ...]]] = {}
    for t in description.inputs:
        expected[t.name] = ("INPUT", t.dtype, t.shape)
    for s in description.states:
        expected[s.input] = ("INPUT", s.dtype, s.shape)
        if s.output is not None:
            expected[s.output] = ("OUTPUT", s.dtype, s.shape)
    for t in description.outputs:
        expected[t.name] = ("OUTPUT", t.dtype, t.shape)
    names = [str(found.get_tensor_name(i)) for i in range(found.num_io_tensors)]
    extra = sorted(set(names) - set(expected))
    missing = [n for n in expected if n not in names]
    if extra or missing:
        raise EngineMismatchError(
            f"{where}: the engine's I/O tensors {names} are not the blob's {list(expected)}"
            f"{f' (missing: {missing})' if missing else ''}{f' (unknown: {extra})' if extra else ''}"
        )
    located: dict[str, bool] = {}
    for name, (mode, dtype, shape) in expected.items():
        found_mode = _enum_name(found.get_tensor_mode(name))
        found_dtype = DTYPES.get(_enum_name(found.get_tensor_dtype(name)), _enum_name(found.get_tensor_dtype(name)))
        found_shape = _shape(found.get_tensor_shape(name))
        dynamic_ok = mode == "INPUT" and len(found_shape) == len(shape) and all(
            f in (-1, s) for f, s in zip(found_shape, shape)
        )
        if (found_mode, found_dtype) != (mode, dtype) or not (found_shape == shape or dynamic_ok):
            raise EngineMismatchError(
                f"{where}: engine tensor '{name}' is {found_mode.lower()} {found_dtype} {list(found_shape)}, the blob "
                f"binds {mode.lower()} {dtype} {list(shape)}"
            )
        located[name] = _enum_name(found.get_tensor_location(name)) == "DEVICE"
    aliased_input = getattr(found, "get_aliased_input_tensor", None)
    if aliased_input is not None:  # TensorRT 10.15+: the engine says which outputs write through an input
        declared = {a.output: a for a in description.aliases}
        for name, (mode, _, _) in expected.items():
            if mode != "OUTPUT":
                continue
            reported = aliased_input(name) or None
            alias = declared.get(name)
            if alias is not None and alias.kind == "kv_cache_update" and reported != alias.input:
                raise EngineMismatchError(
                    f"{where}: the blob declares '{name}' a kv_cache_update alias of '{alias.input}' (state "
                    f"'{alias.state}'), the engine reports it aliases {reported!r}"
                )
            if reported is not None and (alias is None or reported != alias.input):
                raise EngineMismatchError(
                    f"{where}: the engine writes output '{name}' through input '{reported}', which the blob does not "
                    "declare as an alias"
                )
    return located


class TensorRTBinding:
    """Runtime binding of etsdk-tensorrt."""

    def init(self, context: Any) -> TensorRTHandle:
        """Once per delegate per method load: everything that can fail, fails here."""
        where = f"method '{context.method}', delegate {context.backend_id}"
        try:
            description, onnx_graph = blob_format.read(context.blob)
        except UnsupportedFeatureError as exc:
            raise UnsupportedFeatureError(f"{where}: {exc}", feature=exc.feature) from None
        except BlobFormatError as exc:
            raise BlobFormatError(f"{where}: {exc}") from None
        _check_signature(where, description, context.signature)
        trt = engine.import_tensorrt()
        data, key = _engine_bytes(where, description, onnx_graph, context.named_data, trt)
        try:
            runtime, found = _deserialize(where, trt, data)
        except EngineMismatchError:
            if key is None:
                raise
            engine.forget(key)  # a damaged cache entry: build once more
            data, key = _engine_bytes(where, description, onnx_graph, context.named_data, trt)
            runtime, found = _deserialize(where, trt, data)
        if key is None and description.engine is not None and description.engine.stripped:  # the blob's own engine
            _refit_stripped(where, trt, found, description, onnx_graph, context.named_data)
        located = cross_check(where, found, description)
        state_device = description.device != "cpu"
        for s in description.states:
            for name in (s.input, s.output):
                if name is not None and located[name] != state_device:
                    place = "the device" if located[name] else "the host"
                    raise EngineMismatchError(
                        f"{where}: state '{s.state}' is allocated in {description.device} memory (exported with "
                        f"device='{description.device}'), but the engine binds '{name}' on {place}; caller-owned "
                        "state is updated in place and never staged through scratch memory: export with the device "
                        "the engine runs on"
                    )
        execution = found.create_execution_context()
        if execution is None:
            raise ProgramError(f"{where}: TensorRT could not create an execution context")

        def tensor(spec: Any, name: str | None = None) -> _Tensor:
            key_name = name or spec.name
            return _Tensor(key_name, spec.dtype, tuple(spec.shape), located[key_name])

        inputs = [tensor(t) for t in description.inputs]
        outputs = [tensor(t) for t in description.outputs]
        states = [(s.state, tensor(s, s.input), s.output) for s in description.states]
        return TensorRTHandle(where, execution, (runtime, found), inputs, outputs, states)


__all__ = ["EngineMismatchError", "TensorRTBinding", "TensorRTHandle", "cross_check"]
