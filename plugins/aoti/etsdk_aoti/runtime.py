"""The etsdk-aoti runtime binding: load the library, bind weights and state, run.

``init`` checks everything before anything can run: the blob's features, the
container's constants against the recorded descriptions (name, FQN, folded,
dtype, size), the weights entry's size, each bound tensor's dtype and shape,
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

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from etsdk import BackendUnavailableError, BlobFormatError, ProgramError
from etsdk.backend import BlobReader, InitContext, dtype_name, torch_dtype

from etsdk_aoti import BACKEND_ID, BLOB_FEATURE, STATE_INPUTS_FEATURE, weights
from etsdk_aoti.library import ConstantKind, Library, cached_library
from etsdk_aoti.threads import TeamSize

_MAY_BE_ABSENT = {ConstantKind.BUFFER.value, ConstantKind.TENSOR_CONSTANT.value, ConstantKind.FOLDED.value}


def _library_file(data: memoryview, expected: str) -> Path:
    """The compiled library on disk (dlopen needs a file): its bytes checked against the blob's record first."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        raise BlobFormatError(
            f"etsdk-aoti: the compiled library's SHA-256 is {digest[:16]}..., the blob records {expected[:16]}...; "
            "refusing to load a damaged library"
        )
    return cached_library(data, digest)


def _json(reader: BlobReader, name: str) -> Any:
    try:
        return json.loads(bytes(reader.section(name)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BlobFormatError(f"etsdk-aoti blob section '{name}' is not valid JSON: {exc}") from None


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
        reader = BlobReader(context.blob, known_features={BLOB_FEATURE, STATE_INPUTS_FEATURE})
        config = _json(reader, "config")
        records = _json(reader, "constants")
        if not isinstance(config, dict) or not isinstance(records, list):
            raise BlobFormatError("etsdk-aoti blob: 'config' must be an object and 'constants' a list")
        device = str(config.get("device", "cpu"))
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendUnavailableError(
                f"this program was compiled by etsdk-aoti for {device}, but no CUDA device is available",
                backend_id=BACKEND_ID,
            )
        expected = config.get("library_sha256")
        if not isinstance(expected, str):
            raise BlobFormatError("etsdk-aoti blob: config records no library_sha256")
        library = Library(_library_file(reader.section("library"), expected), device)
        try:
            handle = self._bind(library, config, records, context, device)
        except BaseException:
            library.close()
            raise
        return handle

    def _bind(self, library: Library, config: dict[str, Any], records: list[Any], context: InitContext, device: str) -> AotiHandle:
        actual = library.constants()
        if len(actual) != len(records):
            raise BlobFormatError(
                f"the compiled library has {len(actual)} constants, the blob describes {len(records)}"
            )
        for have, want in zip(actual, records):
            found = (have.name, have.fqn, have.folded, have.dtype_code, have.nbytes)
            expected = (want.get("name"), want.get("fqn"), want.get("folded"), want.get("dtype_code"), want.get("nbytes"))
            if found != expected:
                raise BlobFormatError(f"constant {have.index}: the library reports {found}, the blob describes {expected}")
        buffer = None
        if config.get("weights_key"):
            buffer = context.named_data.get(str(config["weights_key"]))
            if buffer.nbytes != config.get("weights_bytes"):
                raise ProgramError(
                    f"etsdk-aoti weights '{config['weights_key']}' are {buffer.nbytes} bytes, expected "
                    f"{config.get('weights_bytes')} (truncated or from another export)"
                )
        pairs: list[tuple[str, Any]] = []
        missing: list[str] = []
        for record in records:
            source = record.get("source")
            name = str(record["name"])
            if source == "folded":
                continue
            if source == "state":
                raise BlobFormatError(
                    f"constant '{name}' is bound to a state: a blob written before state became a library input "
                    f"({STATE_INPUTS_FEATURE}); re-export the program"
                )
            if source == "weights":
                if buffer is None:
                    raise BlobFormatError(f"constant '{name}' lives in the weights, but the blob names no weights entry")
                slot = weights.Slot(name, int(record["offset"]), int(record["nbytes"]))
                dtype = getattr(torch, str(record["dtype"]))
                if torch_dtype(int(record["dtype_code"])) != dtype:
                    raise BlobFormatError(
                        f"constant '{name}': the container's dtype is {torch_dtype(int(record['dtype_code']))}, the "
                        f"description says {dtype}"
                    )
                try:
                    tensor = weights.read(buffer, slot, dtype, record["shape"], record["stride"])
                except ValueError as exc:
                    raise ProgramError(f"etsdk-aoti weights: {exc}") from None
                if tensor.numel() * tensor.element_size() != record["nbytes"]:
                    raise BlobFormatError(
                        f"constant '{name}': {dtype} {record['shape']} is {tensor.numel() * tensor.element_size()} "
                        f"bytes, the container expects {record['nbytes']}"
                    )
                pairs.append((name, tensor.to(device) if device != "cpu" else tensor))
            elif source == "absent":
                empty_parameter = record.get("kind") == ConstantKind.PARAMETER.value and record["nbytes"] == 0
                if record.get("kind") not in _MAY_BE_ABSENT and not empty_parameter:
                    missing.append(f"{name} ({record.get('fqn')}, {record.get('kind')})")
                    continue
                dtype = torch_dtype(int(record["dtype_code"]))
                count = int(record["nbytes"]) // max(torch.empty((), dtype=dtype).element_size(), 1)
                pairs.append((name, torch.zeros(count, dtype=dtype, device=device)))
            else:
                raise BlobFormatError(f"constant '{name}' has unknown source {source!r}")
        if missing:
            raise ProgramError(
                f"etsdk-aoti: {len(missing)} constant(s) missing from the weights: {', '.join(missing)} "
                "(only folded constants, buffers, tensor constants and empty parameters may be absent)"
            )
        library.bind_user_managed(pairs)
        if any(r.get("source") == "folded" for r in records):
            library.run_constant_folding()
        # the serializer passes every state binding, in binding order: anything else (a permutation of same-shaped
        # caches would swap them silently) is a damaged or foreign blob
        indices = config.get("state_inputs") or []
        if indices != list(range(len(context.states))) or any(isinstance(i, bool) for i in indices):
            raise BlobFormatError(
                f"etsdk-aoti blob: state_inputs must be {list(range(len(context.states)))} (every state binding in "
                f"order), found {indices!r}"
            )
        state_inputs = [(index, tuple(binding.shape), str(binding.dtype)) for index, binding in enumerate(context.states)]
        # the library's real arity, never the blob's word for it: a short input list would hand it stale handles
        signature = context.signature
        wanted = (len(signature.inputs) + len(state_inputs), len(signature.outputs))
        if (library.num_inputs, library.num_outputs) != wanted or config.get("num_inputs") != library.num_inputs:
            raise BlobFormatError(
                f"the compiled library takes {library.num_inputs} inputs and returns {library.num_outputs} outputs "
                f"(config says {config.get('num_inputs')!r} inputs); the delegate binds {len(signature.inputs)} inputs + "
                f"{len(state_inputs)} state inputs and {len(signature.outputs)} outputs"
            )
        return AotiHandle(library, len(signature.inputs), device, state_inputs)
