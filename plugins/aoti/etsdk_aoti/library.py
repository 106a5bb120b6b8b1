"""The AOTInductor model-container C API of a compiled library, through ctypes.

Only what etsdk needs: create / delete a container, read the constants'
metadata, bind user-managed constants by name, run. Every call's error code is
checked and turned into :class:`AotiError` with the library's last error text.
The C API exposes no shapes; shapes are recorded at compile time by the
serializer and checked by the runtime before anything is bound.

Lifetimes (each found by a leak measurement, see tests/hostile/test_leaks.py):

* A user-managed binding does not take the handle it is given: the container
  makes its own handle to the tensor (``aoti_torch_new_tensor_handle``) and
  never deletes it, neither when the constant is re-bound nor when the
  container is deleted (torch 2.13, ``MaybeOwningAtenTensorHandle``). Each such
  handle keeps the tensor's storage alive: the mapped ``.ptd`` for weights, the
  session's storage for state. :class:`Library` therefore frees the handles it
  passes right after binding, and frees the container's own handles of every
  constant it binds once they are replaced or the container is deleted.
* The library itself is never ``dlclose``'d: loads of one compiled library
  (one cached file, see :func:`cached_library`) share one mapping through the
  dynamic loader's reference count, and unloading code that OpenMP worker
  threads may have run is not safe. Memory for code is bounded by the number
  of distinct libraries a process loads.
* The cached file is checked against its SHA-256 before every ``dlopen``; a
  damaged or altered file is rewritten from the (verified) blob first.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etsdk import BackendError, ExportError

logger = logging.getLogger(__name__)

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


#: Inductor's ``ConstantType`` enumerators (``torch::aot_inductor::ConstantType``) in the container's numbering
_SOURCE_KINDS = {
    "Unknown": ConstantKind.UNKNOWN,
    "Parameter": ConstantKind.PARAMETER,
    "Buffer": ConstantKind.BUFFER,
    "TensorConstant": ConstantKind.TENSOR_CONSTANT,
    "FoldedConstant": ConstantKind.FOLDED,
}
_MODEL_BASE = re.compile(r"AOTInductorModelBase\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,")
_CONSTANT_FIELD = re.compile(r"^\s*constants_info_\[(\d+)\]\.(\w+)\s*=\s*(.*?);\s*$", re.MULTILINE)
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_SOURCE_VALUES = {
    "name": _STRING,
    "original_fqn": _STRING,
    "dtype": re.compile(r"cached_torch_dtype_(\w+)"),
    "data_size": re.compile(r"(\d+)"),
    "from_folded": re.compile(r"(true|false)"),
    "type": re.compile(r"static_cast<int32_t>\(torch::aot_inductor::ConstantType::(\w+)\)"),
}


@functools.cache
def torch_dtype_code(name: str) -> int | None:
    """The ScalarType code torch's C shim gives dtype ``name`` (``aoti_torch_dtype_float32()`` -> 6): the code a
    container reports for a constant whose generated source says ``cached_torch_dtype_<name>``; None if torch has
    no such dtype. Calls torch's own library, never generated code."""
    import torch

    try:
        function = getattr(ctypes.CDLL(torch._C.__file__), f"aoti_torch_dtype_{name}")
    except (AttributeError, OSError):
        return None
    function.restype = ctypes.c_int32
    function.argtypes = []
    return int(function())


class GeneratedSource:
    """The container's metadata as Inductor's generated wrapper source (``*.wrapper.cpp``) declares it, read
    without loading the compiled library: for a library compiled for a CPU this host cannot run.

    The same attributes as :class:`Library` for what the serializer reads (``num_inputs``, ``num_outputs``,
    :meth:`constants`): the model's ``AOTInductorModelBase(num_inputs, num_outputs, num_constants, ...)`` and
    each ``constants_info_[i]``'s ``name``, ``dtype``, ``data_size``, ``from_folded``, ``type`` and
    ``original_fqn``. The runtime compares them with what the container reports when the library loads.
    """

    def __init__(self, path: Path, num_inputs: int, num_outputs: int, constants: list[ContainerConstant]) -> None:
        self.path = path
        self.num_inputs = num_inputs
        self.num_outputs = num_outputs
        self._constants = constants

    @classmethod
    def read(cls, directory: Path) -> GeneratedSource:
        """The metadata of the one ``*.wrapper.cpp`` under ``directory``; :class:`etsdk.ExportError` naming what
        was expected and what was found when there is not exactly one or it does not parse."""
        sources = sorted(directory.rglob("*.wrapper.cpp"))
        if len(sources) != 1:
            found = ", ".join(p.name for p in sources) or "none"
            raise ExportError(f"etsdk-aoti: expected one Inductor wrapper source (*.wrapper.cpp) in {directory}, found {found}")
        return cls.parse(sources[0].read_text(encoding="utf-8", errors="replace"), sources[0])

    @classmethod
    def parse(cls, text: str, path: Path) -> GeneratedSource:
        where = f"etsdk-aoti: Inductor's generated source {path.name}"
        bases = _MODEL_BASE.findall(text)
        if len(bases) != 1:
            raise ExportError(
                f"{where}: expected one AOTInductorModelBase(num_inputs, num_outputs, num_constants, ...), found {len(bases)}"
            )
        num_inputs, num_outputs, count = (int(v) for v in bases[0])
        fields: dict[int, dict[str, str]] = {}
        for index, key, value in _CONSTANT_FIELD.findall(text):
            pattern = _SOURCE_VALUES.get(key)
            if pattern is None:
                continue  # device_type, offset, shape, stride, layout: not part of the container's metadata
            match = pattern.fullmatch(value.strip())
            if match is None:
                raise ExportError(f"{where}: constants_info_[{index}].{key} is {value.strip()!r}, expected {pattern.pattern}")
            fields.setdefault(int(index), {})[key] = match.group(1)
        if sorted(fields) != list(range(count)):
            raise ExportError(
                f"{where}: the model declares {count} constant(s), constants_info_ describes indices {sorted(fields)[:16]}"
            )
        constants = []
        for index in range(count):
            found = fields[index]
            absent = [k for k in _SOURCE_VALUES if k not in found]
            if absent:
                raise ExportError(f"{where}: constants_info_[{index}] sets no {', '.join(absent)}")
            code = torch_dtype_code(found["dtype"])
            if code is None:
                raise ExportError(f"{where}: constants_info_[{index}].dtype names cached_torch_dtype_{found['dtype']}, which torch does not know")
            kind = _SOURCE_KINDS.get(found["type"])
            if kind is None:
                raise ExportError(
                    f"{where}: constants_info_[{index}].type is ConstantType::{found['type']}, expected one of {', '.join(_SOURCE_KINDS)}"
                )
            constants.append(
                ContainerConstant(
                    index=index,
                    name=_unescape(found["name"]),
                    fqn=_unescape(found["original_fqn"]),
                    kind=kind,
                    folded=found["from_folded"] == "true",
                    dtype_code=code,
                    nbytes=int(found["data_size"]),
                )
            )
        return cls(path, num_inputs, num_outputs, constants)

    def constants(self) -> list[ContainerConstant]:
        return list(self._constants)

    def close(self) -> None:
        """Nothing to release (nothing was loaded)."""


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


class _Entry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("handle", _vp)]


def tensor_handles(tensors: Sequence[Any]) -> list[int]:
    """New AtenTensorHandles sharing storage with ``tensors`` (owned by whoever consumes them)."""
    import torch

    return [_get_pointer(c, None) for c in torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(list(tensors))]


def free_handles(handles: Sequence[int]) -> None:
    """Delete AtenTensorHandles nobody else owns (each drops one reference to its tensor)."""
    import torch

    live = [h for h in handles if h]
    if live:
        # Stealing turns each handle into a Python tensor that deletes it when dropped.
        torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs([_new_capsule(h, None, None) for h in live])


def cached_library(data: memoryview | bytes, sha256: str | None = None) -> Path:
    """The compiled library ``data`` as a file ``dlopen`` can load, cached by content and checked.

    The cache file (``<cache>/aoti/<sha256>.so``) is hashed before it is
    returned; a missing, truncated, damaged or altered file is (re)written from
    ``data`` by an atomic rename, so a loaded library is always the bytes the
    program carries. ``sha256`` is the hex digest of ``data`` when the caller
    has it already; it is recomputed otherwise. ``data`` itself is trusted:
    the core checks every delegate payload against the hash recorded at export.

    The remaining race: a process that rewrites the cache file in place between
    this check and ``dlopen`` is not detected (the file is private to the
    user; etsdk itself only ever replaces it by rename).
    """
    from etsdk.backend import cache_dir

    digest = sha256 or hashlib.sha256(data).hexdigest()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise AotiError(f"cached_library: sha256 must be 64 lowercase hex digits, found {digest!r}")
    path = cache_dir() / "aoti" / f"{digest}.so"
    if path.is_file():
        found = _file_sha256(path)
        if found == digest:
            return path
        logger.debug("etsdk-aoti: cached library %s is damaged (sha256 %s); rewriting it", path, found)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{digest[:16]}-", suffix=".so")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            written = _file_sha256(Path(tmp))
            if written != digest:
                raise AotiError(
                    f"writing the compiled AOTInductor library to {tmp} gave sha256 {written}, expected {digest}"
                )
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise AotiError(f"cannot write the compiled AOTInductor library to {path.parent}: {exc}") from None
    return path


def _file_sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


class _MapEntry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("handle", _vp)]


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
        self._bound: set[str] = set()  # constant names bound user-managed (their container handles are ours to free)
        self._fqns: dict[str, str] | None = None  # constant name -> original FQN, when FQNs identify constants

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
        """Bind tensors as the constants' storage without copying; the container keeps them alive.

        Re-binding a constant releases the container's reference to the tensor
        it replaces; :meth:`close` releases the rest.
        """
        if not pairs:
            return
        replaced = self._container_handles({name for name, _ in pairs} & self._bound)
        handles = tensor_handles([t for _, t in pairs])
        names = [name.encode() for name, _ in pairs]
        entries = (_Entry * len(pairs))(*[_Entry(n, h) for n, h in zip(names, handles)])
        try:
            self._check(
                self._lib.AOTInductorModelContainerUpdateUserManagedConstantBufferPairs(
                    self._handle, entries, len(pairs), False, False
                ),
                "binding constants",
            )
        finally:
            free_handles(handles)  # the container made its own handle to each tensor
        self._bound.update(name for name, _ in pairs)
        free_handles(replaced)  # only after a successful update: until then the container still uses them

    def _container_handles(self, names: set[str]) -> list[int]:
        """The container's own handles of the constants ``names`` (empty where they cannot be told apart)."""
        if not names or not self._handle:
            return []
        try:
            extract = self._lib.AOTInductorModelContainerExtractConstantsMapEntries
        except AttributeError:
            return []  # a library from an older torch: its handles stay with the container (leaked)
        if self._fqns is None:
            constants = [c for c in self.constants() if not c.folded]
            fqns = [c.fqn for c in constants]
            unique = bool(fqns) and all(fqns) and len(set(fqns)) == len(fqns)
            self._fqns = {c.name: c.fqn for c in constants} if unique else {}
        if not self._fqns:
            return []
        entries = ctypes.POINTER(_MapEntry)()
        count = _size()
        if extract(self._handle, ctypes.byref(entries), ctypes.byref(count), False) != 0:
            return []
        wanted = {self._fqns[name]: name for name in names if name in self._fqns}
        found: list[int] = []
        for i in range(count.value):
            fqn = (entries[i].name or b"").decode(errors="replace")
            if fqn in wanted and entries[i].handle:
                found.append(entries[i].handle)
        return found

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
            owned = self._container_handles(set(self._bound))
            self._lib.AOTInductorModelContainerDelete(self._handle)
            self._handle = _vp()
            self._bound.clear()
            free_handles(owned)  # the deleted container never frees the handles of user-managed constants

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
