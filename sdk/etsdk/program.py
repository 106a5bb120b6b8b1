"""Loading and running programs: ``etsdk.load(path, data=None)``.

A :class:`Program` is a ``.pte`` (and optionally a ``.ptd``) loaded into the
ExecuTorch runtime from the executorch wheel. Before anything executes, the
program is verified by the runtime's own loader and every backend id it uses
is resolved: ids provided by installed etsdk plugins are registered through
the bridge (only those this program uses), ids built into the runtime are used
as they are, and any other id is a clear error saying which plugin is missing.

Methods of one program share planned memory, so calls into one program are
serialised by a per-program lock; separate programs run independently.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etsdk.bridge import ensure_registered, pop_delegate_error, runtime_backend_names
from etsdk.errors import BackendNotFoundError, EtsdkError, ProgramError

__all__ = ["Method", "MethodInfo", "Program", "TensorInfo", "load"]


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Shape and dtype of one method input or output, as the program declares it."""

    index: int
    shape: tuple[int, ...]
    dtype: Any  # torch.dtype
    nbytes: int


@dataclass(frozen=True, slots=True)
class MethodInfo:
    name: str
    inputs: tuple[TensorInfo | None, ...]  # None for non-tensor inputs
    outputs: tuple[TensorInfo | None, ...]
    backends: tuple[str, ...]  # delegate backend ids, in program order


def _tensor_info(meta: Any, index: int, getter: str) -> TensorInfo | None:
    from etsdk.dtypes import torch_dtype

    try:
        info = getattr(meta, getter)(index)
    except (RuntimeError, IndexError, ValueError):
        return None
    return TensorInfo(index, tuple(info.sizes()), torch_dtype(info.dtype()), info.nbytes())


class Method:
    """One loaded method; call it with its inputs to get its outputs."""

    def __init__(self, program: Program, name: str, native: Any) -> None:
        self._program = program
        self.name = name
        self._native = native
        self.info = program.method_info(name)

    def __call__(self, *inputs: Any) -> list[Any]:
        return self.execute(inputs)

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        expected = len(self.info.inputs)
        if len(inputs) != expected:
            raise ProgramError(f"method '{self.name}' takes {expected} input(s), got {len(inputs)}")
        with self._program._lock:
            pop_delegate_error()
            try:
                return list(self._native.execute(list(inputs)))
            except RuntimeError as exc:
                carried = pop_delegate_error()
                if carried is not None:
                    raise carried from carried.__cause__
                raise ProgramError(f"method '{self.name}' failed in the ExecuTorch runtime: {exc}") from exc


class Program:
    """A verified ExecuTorch program with its backends resolved."""

    def __init__(self, path: Path, data: Path | None, native: Any, backends: dict[str, tuple[str, ...]]) -> None:
        self.path = path
        self.data = data
        self._native = native
        self._backends = backends
        self._lock = threading.RLock()
        self._methods: dict[str, Method] = {}

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self._backends)

    @property
    def contract(self) -> Any:
        """The I/O contract embedded in the program, or None (contracts arrive with the contracts issue)."""
        return None

    def delegates(self, method: str) -> tuple[str, ...]:
        self._check_method(method)
        return self._backends[method]

    def _check_method(self, method: str) -> None:
        if method not in self._backends:
            raise ProgramError(
                f"program {self.path.name} has no method '{method}' (methods: {', '.join(self.methods)})"
            )

    def method_info(self, method: str) -> MethodInfo:
        self._check_method(method)
        meta = self._native.metadata(method)
        return MethodInfo(
            name=method,
            inputs=tuple(_tensor_info(meta, i, "input_tensor_meta") for i in range(meta.num_inputs())),
            outputs=tuple(_tensor_info(meta, i, "output_tensor_meta") for i in range(meta.num_outputs())),
            backends=self._backends[method],
        )

    def load_method(self, method: str) -> Method:
        """Load (once) and return ``method``; delegate ``init`` runs here."""
        self._check_method(method)
        with self._lock:
            found = self._methods.get(method)
            if found is not None:
                return found
            pop_delegate_error()
            try:
                native = self._native.load_method(method)
            except RuntimeError as exc:
                carried = pop_delegate_error()
                if carried is not None:
                    raise carried from carried.__cause__
                hint = (
                    "; the program may keep data outside the .pte: pass its .ptd with etsdk.load(path, data=...)"
                    if self.data is None
                    else ""
                )
                raise ProgramError(f"loading method '{method}' of {self.path.name} failed: {exc}{hint}") from exc
            loaded = Method(self, method, native)
            self._methods[method] = loaded
            return loaded

    def __getitem__(self, method: str) -> Method:
        return self.load_method(method)

    def run(self, method: str, *inputs: Any) -> list[Any]:
        return self.load_method(method)(*inputs)

    def __repr__(self) -> str:
        return f"Program({str(self.path)!r}, methods={list(self.methods)})"


def _resolve_backends(backends: dict[str, tuple[str, ...]], path: Path) -> None:
    from etsdk.registry import get_backend

    builtin = set(runtime_backend_names())
    for method, ids in backends.items():
        for backend_id in dict.fromkeys(ids):
            try:
                get_backend(backend_id, require_available=True)
            except BackendNotFoundError as exc:
                if backend_id in builtin:
                    continue  # built into the executorch wheel (e.g. XnnpackBackend)
                raise BackendNotFoundError(
                    f"{path.name}: method '{method}' delegates to backend '{backend_id}', which neither "
                    f"the ExecuTorch runtime nor any installed etsdk plugin provides. {exc}",
                    backend_id=backend_id,
                ) from None
            ensure_registered(backend_id)


def load(path: str | Path, data: str | Path | None = None) -> Program:
    """Load a ``.pte`` (and its ``.ptd`` when the program keeps data outside) for execution.

    Raises :class:`ProgramError` for a missing, unreadable or corrupted file and
    :class:`BackendNotFoundError` for a backend id nothing installed provides.
    """
    from etsdk.bridge.build import load_extension

    path = Path(path)
    if not path.is_file():
        raise ProgramError(f"program file not found: {path}")
    data_path = Path(data) if data is not None else None
    if data_path is not None and not data_path.is_file():
        raise ProgramError(f"data file not found: {data_path}")
    native_bridge = load_extension()
    try:
        listing = native_bridge.program_backends(str(path))
    except (ValueError, OSError) as exc:
        raise ProgramError(f"{path} is not a valid ExecuTorch program: {exc}") from None
    backends = {method: tuple(ids) for method, ids in listing}
    _resolve_backends(backends, path)
    from executorch.runtime import Runtime, Verification

    try:
        native = Runtime.get().load_program(
            path,
            verification=Verification.InternalConsistency,
            data_path=data_path,
        )
    except (RuntimeError, ValueError) as exc:
        raise ProgramError(f"the ExecuTorch runtime refused {path}: {exc}") from exc
    except EtsdkError:
        raise
    return Program(path, data_path, native, backends)
