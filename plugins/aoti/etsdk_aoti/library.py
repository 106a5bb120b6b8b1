"""The AOTInductor model-container C API of a compiled library, through ctypes.

Only what etsdk needs: create / delete a container, read the constants'
metadata, bind user-managed constants by name, run. Every call's error code is
checked and turned into :class:`AotiError` with the library's last error text.
The C API exposes no shapes; shapes are recorded at compile time by the
serializer and checked by the runtime before anything is bound.
"""

from __future__ import annotations

import ctypes
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etsdk import BackendError

_vp = ctypes.c_void_p
_size = ctypes.c_size_t

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = _vp
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [_vp, ctypes.c_char_p, _vp]


class AotiError(BackendError):
    """The AOTInductor container refused a call."""


class ConstantKind(str, enum.Enum):
    UNKNOWN = "unknown"
    PARAMETER = "parameter"
    BUFFER = "buffer"
    TENSOR_CONSTANT = "tensor_constant"
    FOLDED = "folded"


_KINDS = [ConstantKind.UNKNOWN, ConstantKind.PARAMETER, ConstantKind.BUFFER, ConstantKind.TENSOR_CONSTANT, ConstantKind.FOLDED]


@dataclass(frozen=True, slots=True)
class ContainerConstant:
    """What the container itself says about one constant, in container order."""

    index: int
    name: str
    fqn: str
    kind: ConstantKind
    folded: bool
    dtype_code: int
    nbytes: int


class _Entry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("handle", _vp)]


def tensor_handles(tensors: Sequence[Any]) -> list[int]:
    """New AtenTensorHandles sharing storage with ``tensors`` (owned by whoever consumes them)."""
    import torch

    return [_get_pointer(c, None) for c in torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(list(tensors))]


class Library:
    """A loaded AOTInductor library and one model container on ``device``."""

    def __init__(self, path: Path, device: str) -> None:
        try:
            self._lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise AotiError(f"cannot load the compiled AOTInductor library {path}: {exc}") from None
        self.path = path
        self.device = device
        self._handle = _vp()
        self._check(
            self._lib.AOTInductorModelContainerCreateWithDevice(ctypes.byref(self._handle), 1, device.encode(), None),
            f"creating a model container on {device}",
        )
        self.num_inputs = self._size_query("AOTInductorModelContainerGetNumInputs")
        self.num_outputs = self._size_query("AOTInductorModelContainerGetNumOutputs")
        self._run = self._lib.AOTInductorModelContainerRun
        self._run.argtypes = [_vp, ctypes.POINTER(_vp), _size, ctypes.POINTER(_vp), _size, _vp, _vp]
        self._in = (_vp * self.num_inputs)()
        self._out = (_vp * self.num_outputs)()

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            message = ctypes.c_char_p()
            try:
                self._lib.AOTInductorGetLastError(ctypes.byref(message))
                detail = (message.value or b"").decode(errors="replace")
            except AttributeError:
                detail = ""
            raise AotiError(f"AOTInductor failed {what} (code {code}){': ' + detail if detail else ''}")

    def _size_query(self, function: str, *args: Any) -> int:
        value = _size()
        self._check(getattr(self._lib, function)(self._handle, *args, ctypes.byref(value)), function)
        return value.value

    def constants(self) -> list[ContainerConstant]:
        out = []
        for i in range(self._size_query("AOTInductorModelContainerGetNumConstants")):
            index = _size(i)
            name, fqn = ctypes.c_char_p(), ctypes.c_char_p()
            folded, kind, dtype = ctypes.c_bool(), ctypes.c_int32(), ctypes.c_int32()
            self._check(self._lib.AOTInductorModelContainerGetConstantName(self._handle, index, ctypes.byref(name)), "reading constant names")
            self._check(self._lib.AOTInductorModelContainerGetConstantOriginalFQN(self._handle, index, ctypes.byref(fqn)), "reading constant FQNs")
            self._check(self._lib.AOTInductorModelContainerGetConstantFromFolded(self._handle, index, ctypes.byref(folded)), "reading folded flags")
            self._check(self._lib.AOTInductorModelContainerGetConstantType(self._handle, index, ctypes.byref(kind)), "reading constant types")
            self._check(self._lib.AOTInductorModelContainerGetConstantDtype(self._handle, index, ctypes.byref(dtype)), "reading constant dtypes")
            nbytes = self._size_query("AOTInductorModelContainerGetConstantDataSize", index)
            out.append(
                ContainerConstant(
                    index=i,
                    name=(name.value or b"").decode(),
                    fqn=(fqn.value or b"").decode(),
                    kind=_KINDS[kind.value] if 0 <= kind.value < len(_KINDS) else ConstantKind.UNKNOWN,
                    folded=bool(folded.value),
                    dtype_code=dtype.value,
                    nbytes=nbytes,
                )
            )
        return out

    def bind_user_managed(self, pairs: Sequence[tuple[str, Any]]) -> None:
        """Bind tensors as the constants' storage without copying; the container keeps them alive."""
        if not pairs:
            return
        handles = tensor_handles([t for _, t in pairs])
        names = [name.encode() for name, _ in pairs]
        entries = (_Entry * len(pairs))(*[_Entry(n, h) for n, h in zip(names, handles)])
        self._check(
            self._lib.AOTInductorModelContainerUpdateUserManagedConstantBufferPairs(
                self._handle, entries, len(pairs), False, False
            ),
            "binding constants",
        )

    def run_constant_folding(self) -> None:
        self._check(self._lib.AOTInductorModelContainerRunConstantFolding(self._handle, False, None, None), "folding constants")

    def run(self, inputs: Sequence[Any], stream: int | None = None) -> list[Any]:
        """Run with ``inputs`` (their handles are consumed); returns new output tensors."""
        import torch

        for i, handle in enumerate(tensor_handles(inputs)):
            self._in[i] = handle
        self._check(
            self._run(self._handle, self._in, self.num_inputs, self._out, self.num_outputs, stream, None), "running"
        )
        return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs(
            [_new_capsule(self._out[i], None, None) for i in range(self.num_outputs)]
        )

    def close(self) -> None:
        if self._handle:
            self._lib.AOTInductorModelContainerDelete(self._handle)
            self._handle = _vp()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
