"""The etsdk-aoti runtime binding: load the library, bind weights and state, run.

``init`` checks everything before anything can run: the blob itself
(:func:`etsdk_aoti.blob_format.decode`: features, every field, ``state_inputs``
against the delegate's state bindings, the library's SHA-256), the host's CPU
against the features the library's code needs (``config.cpu``, checked before the
library is written to the cache or loaded: :func:`etsdk_aoti.cpu.refusal`), the container's
constants against the recorded descriptions (name, FQN, kind, folded, dtype,
size), the weights entry's size, each bound tensor's dtype and shape,
and the completeness rule: folded constants, buffers, tensor constants and
empty parameters may be absent from the weights (absent ones are bound to
zero-filled storage, since a constant left unbound crashes ``Run``); any other
missing constant fails the load, named. Weights are bound user-managed: on CPU
each constant is a zero-copy view of the mapped ``.pte`` / ``.ptd`` with its
own exact-size storage; on CUDA each is copied to the device once.

State is passed to the library as inputs after the engine inputs: the
session's tensors the core pushes into ``execute``, every call, zero-copy; the
compiled code updates them in place. Their dtype, shape, device and layout are
checked when the pushed storage changes (another session). A blob that binds
state as a constant (written before ``aoti.state_inputs.v1``, inside program
formats this etsdk refuses anyway) is refused. Each call runs with the OpenMP
team size :mod:`etsdk_aoti.threads` picks (all threads, or one under contention).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from etsdk import BackendUnavailableError, BlobFormatError, ProgramError
from etsdk.backend import InitContext, dtype_name, host_cpu, torch_dtype

from etsdk_aoti import BACKEND_ID, blob_format, cpu, weights
from etsdk_aoti.blob_format import AotiBlob, Source
from etsdk_aoti.library import ConstantKind, Library, cached_library
from etsdk_aoti.threads import TeamSize

_MAY_BE_ABSENT = {ConstantKind.BUFFER, ConstantKind.TENSOR_CONSTANT, ConstantKind.FOLDED}


class AotiHandle:
    def __init__(
        self,
        library: Library,
        num_inputs: int,
        device: str,
        state_inputs: list[tuple[int, tuple[int, ...], str]],
    ) -> None:
        self._library = library
        self._num_inputs = num_inputs  # engine inputs; the library takes the state inputs after them
        self._state_inputs = state_inputs  # (index into the pushed state, shape, dtype), in library order
        self._checked: tuple[Any, ...] | None = None  # the pushed state checked last (one tuple per session)
        self._device = device
        self._cuda = device.startswith("cuda")
        self.team = TeamSize("fixed" if self._cuda else None)

    def _check_state_inputs(self, state: tuple[Any, ...]) -> None:
        if state is self._checked:
            return
        wanted_device = "cuda" if self._cuda else "cpu"
        for index, shape, dtype in self._state_inputs:
            tensor = state[index]
            found = (dtype_name(tensor.dtype), tuple(tensor.shape), tensor.device.type)
            if found != (dtype, shape, wanted_device) or not tensor.is_contiguous():
                raise ProgramError(
                    f"state {index} is {found[0]} {list(found[1])} on {found[2]}; the compiled library takes it as "
                    f"{dtype} {list(shape)} on {wanted_device} (contiguous)"
                )
        self._checked = state

    def execute(self, args: tuple[Any, ...], state: tuple[Any, ...]) -> None:
        inputs: Sequence[Any] = args[: self._num_inputs]
        if self._cuda:
            inputs = [t.to(self._device, non_blocking=True) for t in inputs]
        if self._state_inputs:
            self._check_state_inputs(state)
            inputs = [*inputs, *(state[index] for index, _, _ in self._state_inputs)]
        outputs = args[self._num_inputs :]
        if self._cuda:
            for out, result in zip(outputs, self._library.run(inputs, torch.cuda.current_stream().cuda_stream)):
                out.copy_(result)
        else:
            # the copy into the runtime's outputs is a parallel region too (logits): same team as the kernels
            self.team.run(lambda: self._run_into(inputs, outputs))

    def _run_into(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        for out, result in zip(outputs, self._library.run(inputs)):
            out.copy_(result)

    def destroy(self) -> None:
        self._checked = None
        self._library.close()


class AotiBinding:
    """Runtime binding of etsdk-aoti."""

    def init(self, context: InitContext) -> AotiHandle:
        # features, both JSON sections, state_inputs against the delegate's bindings, the library's SHA-256
        blob = blob_format.decode(context.blob, state_bindings=len(context.states))
        device = blob.config.device
        # never load code compiled for a CPU this host is not (a CUDA library's host code too): it would die of SIGILL
        if blob.config.cpu is not None:
            why = cpu.refusal(blob.config.cpu, host_cpu())
            if why is not None:
                raise BackendUnavailableError(why, backend_id=BACKEND_ID)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendUnavailableError(
                f"this program was compiled by etsdk-aoti for {device}, but no CUDA device is available",
                backend_id=BACKEND_ID,
            )
        assert isinstance(blob.library, memoryview)  # decode's zero-copy view, its hash checked
        if blob.calls_native:
            from etsdk_aoti import kernels

            kernels.load()  # the library calls into it: in the process's global scope before the library loads
        library = Library(cached_library(blob.library, blob.config.library_sha256), device)
        try:
            handle = self._bind(library, blob, context)
        except BaseException:
            library.close()
            raise
        return handle

    def _bind(self, library: Library, blob: AotiBlob, context: InitContext) -> AotiHandle:
        device = blob.config.device
        actual = library.constants()
        if len(actual) != len(blob.constants):
            raise BlobFormatError(
                f"the compiled library has {len(actual)} constants, the blob describes {len(blob.constants)}"
            )
        for have, want in zip(actual, blob.constants):
            found = (have.name, have.fqn, have.kind.value, have.folded, have.dtype_code, have.nbytes)
            expected = (want.name, want.fqn, want.kind.value, want.folded, want.dtype_code, want.nbytes)
            if found != expected:
                raise BlobFormatError(f"constant {have.index}: the library reports {found}, the blob describes {expected}")
        pairs: list[tuple[str, Any]] = []
        missing: list[str] = []
        entries: list[Any] = []  # every stored tensor, read ahead at once
        derived: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
        for constant in blob.constants:
            name = constant.name
            if constant.source is Source.FOLDED:
                continue
            if constant.source is Source.ENTRY:
                assert constant.key is not None and constant.view is not None  # decode checked the record
                tensor = self._stored(constant, context.named_data.get(constant.key))
                entries.append(tensor)
                pairs.append((name, tensor.to(device) if device != "cpu" else tensor))
            elif constant.source is Source.DERIVED:
                assert constant.derive is not None and constant.view is not None
                tensor = self._derived(constant, context, derived, entries)
                pairs.append((name, tensor.to(device) if device != "cpu" else tensor))
            else:  # Source.ABSENT
                empty_parameter = constant.kind is ConstantKind.PARAMETER and constant.nbytes == 0
                if constant.kind not in _MAY_BE_ABSENT and not empty_parameter:
                    missing.append(f"{name} ({constant.fqn}, {constant.kind.value})")
                    continue
                dtype = torch_dtype(constant.dtype_code)
                count = constant.nbytes // max(torch.empty((), dtype=dtype).element_size(), 1)
                pairs.append((name, torch.zeros(count, dtype=dtype, device=device)))
        if device == "cpu" and entries:  # read the mapped file in while the caller goes on (tokenizer, first prompt)
            weights.prefetch(entries)
        if missing:
            raise ProgramError(
                f"etsdk-aoti: {len(missing)} constant(s) missing from the weights: {', '.join(missing)} "
                "(only folded constants, buffers, tensor constants and empty parameters may be absent)"
            )
        library.bind_user_managed(pairs)
        if blob.folds_constants:
            library.run_constant_folding()
        # decode checked that state_inputs names every state binding, in binding order
        state_inputs = [(index, tuple(binding.shape), str(binding.dtype)) for index, binding in enumerate(context.states)]
        # the library's real arity, never the blob's word for it: a short input list would hand it stale handles
        signature = context.signature
        wanted = (len(signature.inputs) + len(state_inputs), len(signature.outputs))
        arity = (library.num_inputs, library.num_outputs)
        if arity != wanted or (blob.config.num_inputs, blob.config.num_outputs) != arity:
            raise BlobFormatError(
                f"the compiled library takes {library.num_inputs} inputs and returns {library.num_outputs} outputs "
                f"(config says {blob.config.num_inputs} inputs and {blob.config.num_outputs} outputs); the delegate "
                f"binds {len(signature.inputs)} inputs + {len(state_inputs)} state inputs and {len(signature.outputs)} outputs"
            )
        return AotiHandle(library, len(signature.inputs), device, state_inputs)

    @staticmethod
    def _stored(constant: Any, buffer: memoryview) -> Any:
        """One constant's tensor over its own named-data entry (zero-copy), its dtype and size checked against the
        container and the entry."""
        view = constant.view
        dtype = getattr(torch, view.dtype, None)
        if not isinstance(dtype, torch.dtype) or torch_dtype(constant.dtype_code) != dtype:
            raise BlobFormatError(
                f"constant '{constant.name}': the container's dtype is {torch_dtype(constant.dtype_code)}, the "
                f"description says {view.dtype}"
            )
        count = 1
        for d in view.shape:
            count *= d
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if not weights.size_matches(nbytes, constant.nbytes):
            raise BlobFormatError(
                f"constant '{constant.name}': {view.dtype} {list(view.shape)} is {nbytes} bytes, the container expects "
                f"{constant.nbytes}"
            )
        if buffer.nbytes != nbytes:
            raise ProgramError(
                f"etsdk-aoti: constant '{constant.name}' needs {nbytes} bytes, its named-data entry '{constant.key}' has "
                f"{buffer.nbytes} (truncated or from another export)"
            )
        return weights.read(buffer, dtype, view.shape, view.stride)

    @staticmethod
    def _derived(constant: Any, context: InitContext, cache: dict[Any, dict[str, Any]], entries: list[Any]) -> Any:
        """A constant computed at load from a quantized weight's stored entries (once per weight)."""
        from etsdk.backend import WeightFormat

        from etsdk_aoti.quantized import derive_planes

        derive = constant.derive
        key = (derive.format, derive.stored)
        planes = cache.get(key)
        if planes is None:
            fmt = WeightFormat.parse(derive.format)
            expected = fmt.planes(*derive.weight_shape)
            stored = {}
            for plane, entry in derive.stored:
                dtype_text, shape = expected[plane]
                stored[plane] = context.named_data.get_tensor(entry, getattr(torch, dtype_text), shape)
                entries.append(stored[plane])
            try:
                planes = derive_planes(fmt, stored, derive.weight_shape)
            except ValueError as exc:
                raise ProgramError(f"etsdk-aoti: constant '{constant.name}': {exc}") from None
            cache[key] = planes
        tensor = planes.get(derive.plane)
        view = constant.view
        if tensor is None or (dtype_name(tensor.dtype), tuple(tensor.shape)) != (view.dtype, tuple(view.shape)):
            found = "nothing" if tensor is None else f"{dtype_name(tensor.dtype)} {list(tensor.shape)}"
            raise BlobFormatError(
                f"constant '{constant.name}': the {derive.plane} of {derive.format} weight {list(derive.weight_shape)} "
                f"is {found}, the blob describes {view.dtype} {list(view.shape)}"
            )
        if not weights.size_matches(tensor.numel() * tensor.element_size(), constant.nbytes):
            raise BlobFormatError(
                f"constant '{constant.name}': derived {tensor.numel() * tensor.element_size()} bytes, the container "
                f"expects {constant.nbytes}"
            )
        return tensor
