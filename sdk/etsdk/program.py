"""Loading and running programs: ``etsdk.load(path, data=None)``.

A :class:`Program` is a ``.pte`` (and optionally a ``.ptd``) loaded into the
ExecuTorch runtime from the executorch wheel. Before anything executes, the
program is verified by the runtime's own loader and every backend id it uses
is resolved: ids provided by installed etsdk plugins are registered through
the bridge (only those this program uses), ids built into the runtime are used
as they are, and any other id is a clear error saying which plugin is missing.

The program record etsdk embeds at export (contract, every delegate's
signature) is read and validated before any method loads: an unknown contract
or version is refused with the versions this installation supports, and every
engine-bound input and output of every method is checked against the contract
(method, index, role, expected, found).

Programs whose contract declares state run with a :class:`etsdk.state.Session`
(``program.new_session()``; ``program.run(..., session=...)``), one storage per
state identity, shared by every method and delegate of the program.

Methods of one program share planned memory, so calls into one program are
serialised by a per-program lock; separate programs run independently.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etsdk.bridge import ensure_registered, loading_method, pop_delegate_error, runtime_backend_names
from etsdk.contract import Contract, ContractError
from etsdk.errors import BackendNotFoundError, ProgramError
from etsdk.signature import PROGRAM_RECORD_KEY, ProgramRecord
from etsdk.state import Session, StateError

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

        self._stateful = program.contract is not None and bool(program.contract.states)

    def __call__(self, *inputs: Any, session: Session | None = None) -> list[Any]:
        return self.execute(inputs, session=session)

    def execute(self, inputs: Sequence[Any], *, session: Session | None = None) -> list[Any]:
        """Run with ``inputs``; a stateful program binds ``session`` (default: the program's own)."""
        expected = len(self.info.inputs)
        if len(inputs) != expected:
            raise ProgramError(f"method '{self.name}' takes {expected} input(s), got {len(inputs)}")
        if self._stateful:
            if session is None:
                session = self._program.default_session
            session.check_owner(self._program)
            with self._program._lock, session.active():
                return self._execute(inputs)
        if session is not None:
            raise StateError(f"method '{self.name}' declares no state; it takes no session")
        with self._program._lock:
            return self._execute(inputs)

    def _execute(self, inputs: Sequence[Any]) -> list[Any]:
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

    def __init__(
        self,
        path: Path,
        data: Path | None,
        native: Any,
        backends: dict[str, tuple[str, ...]],
        record: ProgramRecord | None,
    ) -> None:
        self.path = path
        self.data = data
        self._native = native
        self._backends = backends
        self._record = record
        self._lock = threading.RLock()
        self._methods: dict[str, Method] = {}
        self._default_session: Session | None = None

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self._backends)

    @property
    def contract(self) -> Contract | None:
        """The I/O contract record embedded in the program (validated at load), or None."""
        return self._record.contract if self._record is not None else None

    @property
    def record(self) -> ProgramRecord | None:
        """etsdk's program record: contract and every delegate's signature in engine order."""
        return self._record

    @property
    def fingerprint(self) -> str | None:
        """Model identity (weights + state specs, any backend); None for programs exported before etsdk recorded it."""
        model = self._record.model if self._record is not None else None
        return model.combined if model is not None else None

    def new_session(self) -> Session:
        """Fresh state for this program: every declared state at its initial value."""
        contract = self.contract
        if contract is None or not contract.states:
            raise StateError(f"program {self.path.name} declares no state")
        assert self._record is not None  # a contract comes from the record
        return Session(contract, owner=self, model=self._record.model, where=self.path.name)

    @property
    def default_session(self) -> Session:
        """The session used when a stateful method is called without one (created on first use)."""
        with self._lock:
            if self._default_session is None:
                self._default_session = self.new_session()
            return self._default_session

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
                with loading_method(self._record, method, self.path.name):
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

    def run(self, method: str, *inputs: Any, session: Session | None = None) -> list[Any]:
        return self.load_method(method).execute(inputs, session=session)

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


def data_beside(path: str | Path) -> Path | None:
    """``model.ptd`` next to ``model.pte`` when it exists (what ``etsdk export --external-data`` writes)."""
    candidate = Path(path).with_suffix(".ptd")
    return candidate if candidate.is_file() else None


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
        listing, record_bytes = native_bridge.inspect_program(str(path), PROGRAM_RECORD_KEY)
    except (ValueError, OSError) as exc:
        raise ProgramError(f"{path} is not a valid ExecuTorch program: {exc}") from None
    backends = {method: tuple(ids) for method, ids in listing}
    record = ProgramRecord.from_bytes(record_bytes, path.name) if record_bytes is not None else None
    if record is not None and record.contract is not None:
        _check_contract(record.contract, path)
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
    program = Program(path, data_path, native, backends, record)
    if record is not None and record.contract is not None:
        _check_engine_io(program, record.contract)
    return program


def _check_contract(record: Contract, path: Path) -> None:
    """The embedded record must be a contract this installation knows, and follow its specification."""
    from etsdk.registry import get_contract

    spec_file = get_contract(record.name, record.version)
    spec = Contract.from_bytes(spec_file.path.read_bytes(), where=str(spec_file.path))
    try:
        record.check_conforms_to(spec)
    except ContractError as exc:
        raise ContractError(f"{path.name}: {exc}") from None


def _check_engine_io(program: Program, contract: Contract) -> None:
    """Every method the contract names exists, and its engine inputs / outputs match, index by index."""
    from etsdk.dtypes import dtype_name

    for spec in contract.methods:
        if spec.name not in program.methods:
            raise ContractError(
                f"{program.path.name}: contract '{contract.name}' v{contract.version} requires method '{spec.name}', "
                f"the program has {', '.join(program.methods)}"
            )
        info = program.method_info(spec.name)
        for side, wanted, found in (
            ("input", spec.engine_inputs, info.inputs),
            ("output", spec.engine_outputs, info.outputs),
        ):
            if len(wanted) != len(found):
                raise ContractError(
                    f"{program.path.name}: method '{spec.name}' has {len(found)} {side}(s), contract "
                    f"'{contract.name}' binds {len(wanted)} through the engine ({', '.join(w.name for w in wanted)})"
                )
            for index, (want, got) in enumerate(zip(wanted, found)):
                got_desc = f"{dtype_name(got.dtype)} {list(got.shape)}" if got is not None else "a non-tensor value"
                if got is None or (dtype_name(got.dtype), got.shape) != (want.dtype, tuple(want.shape)):
                    raise ContractError(
                        f"{program.path.name}: method '{spec.name}' {side} {index} ('{want.name}', role "
                        f"{want.role.value}): expected {want.dtype} {list(want.shape)}, found {got_desc}"
                    )
