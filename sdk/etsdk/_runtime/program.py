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

Programs whose contract declares state run with a :class:`etsdk._state.session.Session`
(``program.new_session()``; ``program.run(..., session=...)``), one storage per
state identity, shared by every method and delegate of the program.

Methods of one program share planned memory, so calls into one program are
serialised by a per-program lock; separate programs run independently.

Before the runtime sees a file, etsdk checks it (:mod:`etsdk._runtime.verification` says
what, and what ``verify=True`` adds), and pins it: the runtime reads the very
file etsdk opened and checked, and every call first makes sure the pinned
files were not truncated or rewritten since. Every call checks its inputs
against the method (count, dtype, shape; value bounds the contract declares)
before anything executes.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Any

from etsdk._format.program_file import DataLayout, FormatError, ProgramLayout, read_data_file, read_program_file
from etsdk._runtime.bridge import ensure_registered, loading_method, pop_delegate_error, runtime_backend_names
from etsdk._state.contract import Contract, ContractError, IOSpec
from etsdk._state.session import Session, StateError, sessions_active
from etsdk._state.signature import PROGRAM_RECORD_KEY, ProgramRecord, find_program_record_key
from etsdk.errors import BackendNotFoundError, EtsdkError, IntegrityError, ProgramError

__all__ = ["Method", "MethodInfo", "Program", "TensorInfo", "load"]


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Shape and dtype of one method input or output, as the program declares it."""

    #: Its position among the method's inputs (or outputs).
    index: int
    #: The static shape.
    shape: tuple[int, ...]
    #: The ``torch.dtype``.
    dtype: Any
    #: Its size in bytes.
    nbytes: int


@dataclass(frozen=True, slots=True)
class MethodInfo:
    """What :meth:`Program.method_info` reports for one method: its engine I/O and its delegates' backends."""

    #: The method's name.
    name: str
    #: The engine inputs in call order (what ``run`` takes); None for a non-tensor input.
    inputs: tuple[TensorInfo | None, ...]
    #: The engine outputs in the order ``run`` returns them; None for a non-tensor output.
    outputs: tuple[TensorInfo | None, ...]
    #: The backend id of each delegate, in program order (one id per delegate, so an id may repeat).
    backends: tuple[str, ...]


def _tensor_info(meta: Any, index: int, getter: str) -> TensorInfo | None:
    from etsdk._format.dtypes import torch_dtype

    try:
        info = getattr(meta, getter)(index)
    except (RuntimeError, IndexError, ValueError):
        return None
    return TensorInfo(index, tuple(info.sizes()), torch_dtype(info.dtype()), info.nbytes())


def _describe(value: Any) -> str:
    from etsdk._format.dtypes import dtype_name

    if hasattr(value, "dtype") and hasattr(value, "shape"):
        try:
            text = f"{dtype_name(value.dtype)} {list(value.shape)}"
        except (KeyError, ValueError, TypeError):
            text = f"{value.dtype} {list(value.shape)}"
        device = getattr(getattr(value, "device", None), "type", "cpu")
        return text if device == "cpu" else f"{text} on {device}"
    if value is None:
        return "None"
    return f"{type(value).__name__} {value!r}"[:80]


@dataclass(frozen=True, slots=True)
class _InputCheck:
    index: int
    label: str  # "input 1 ('positions', role positions)"
    info: TensorInfo | None
    bound: int | None
    role: str | None


class Method:
    """One loaded method; call it with its inputs to get its outputs."""

    def __init__(self, program: Program, name: str, native: Any) -> None:
        self._program = program
        self.name = name
        self._native = native
        self.info = program.method_info(name)

        contract = program.contract
        self._stateful = contract is not None and bool(contract.states)
        #: how many sessions one call binds (its contract method's ``slots``; 1 for an ordinary method)
        self.slots = contract.slots_of(name) if contract is not None else 1
        self._checks = tuple(program._input_checks(name, self.info))

    def __call__(self, *inputs: Any, session: Session | None = None, sessions: Sequence[Session] | None = None) -> list[Any]:
        return self.execute(inputs, session=session, sessions=sessions)

    def execute(
        self, inputs: Sequence[Any], *, session: Session | None = None, sessions: Sequence[Session] | None = None
    ) -> list[Any]:
        """Run with ``inputs``; a stateful program binds ``session`` (default: the program's own).

        A method over several sessions (:attr:`slots` > 1) binds ``sessions`` instead: one distinct session of
        this program per slot, in slot order, and no default. Inputs and sessions are checked against the method
        before anything runs: the inputs' count, each one's kind, dtype and shape, and the value bounds the
        contract declares (positions inside the cache, token ids inside the vocabulary); a non-contiguous tensor
        is passed as a contiguous copy.
        """
        inputs = self._checked(inputs)
        if self._stateful:
            bound = self._sessions(session, sessions)
            with self._program._lock, sessions_active(bound) if len(bound) > 1 else bound[0].active():
                self._program._check_files()
                return self._execute(inputs)
        if session is not None or sessions is not None:
            raise StateError(f"method '{self.name}' declares no state; it takes no session")
        with self._program._lock:
            self._program._check_files()
            return self._execute(inputs)

    def _sessions(self, session: Session | None, sessions: Sequence[Session] | None) -> tuple[Session, ...]:
        """The call's sessions by slot, each checked to belong to this program, none given twice."""
        if sessions is None:
            if self.slots > 1:
                raise StateError(
                    f"method '{self.name}' runs over {self.slots} sessions: pass sessions=(...) with one session "
                    "per slot, in slot order"
                )
            bound: tuple[Session, ...] = (self._program.default_session if session is None else session,)
        else:
            if session is not None:
                raise StateError(f"method '{self.name}': pass session= or sessions=, not both")
            if isinstance(sessions, Session) or not isinstance(sessions, Sequence):
                raise StateError(f"method '{self.name}': sessions= takes a sequence of sessions, found {type(sessions).__name__}")
            bound = tuple(sessions)
            if len(bound) != self.slots:
                raise StateError(
                    f"method '{self.name}' runs over {self.slots} session(s), one per slot; {len(bound)} given"
                )
        for index, given in enumerate(bound):
            if not isinstance(given, Session):
                raise StateError(f"method '{self.name}': session {index} is {type(given).__name__}, not an etsdk Session")
            given.check_owner(self._program)
            first = next(i for i, other in enumerate(bound) if other is given)
            if first != index:
                raise StateError(
                    f"method '{self.name}': one session is given for slots {first} and {index}; each slot updates "
                    "its own session's state, so each needs its own (session.fork() makes one)"
                )
        return bound

    def _checked(self, inputs: Sequence[Any]) -> Sequence[Any]:
        import torch

        if len(inputs) != len(self._checks):
            raise ProgramError(f"method '{self.name}' takes {len(self._checks)} input(s), got {len(inputs)}")
        copied: list[Any] | None = None
        for check, value in zip(self._checks, inputs):
            want = check.info
            if want is None:
                if isinstance(value, (bool, int, float)):
                    continue
                raise ProgramError(
                    f"method '{self.name}' {check.label}: expected a scalar (int, float or bool), found {_describe(value)}"
                )
            if not isinstance(value, torch.Tensor):
                raise ProgramError(
                    f"method '{self.name}' {check.label}: expected a tensor {_describe_info(want)}, found {_describe(value)}"
                )
            if value.dtype != want.dtype or tuple(value.shape) != want.shape or value.device.type != "cpu":
                raise ProgramError(
                    f"method '{self.name}' {check.label}: expected {_describe_info(want)}, found {_describe(value)}"
                )
            if check.bound is not None and value.numel():
                low, high = (int(v) for v in torch.aminmax(value))
                if low < 0 or high >= check.bound:
                    why = {"positions": " (the cache holds {} rows)", "tokens": " (the vocabulary holds {} tokens)"}
                    raise ProgramError(
                        f"method '{self.name}' {check.label}: values must lie in [0, {check.bound})"
                        f"{why.get(check.role or '', '').format(check.bound)}, found {low if low < 0 else high}"
                    )
            if not value.is_contiguous():
                if copied is None:
                    copied = list(inputs)
                copied[check.index] = value.contiguous()
        return inputs if copied is None else copied

    def _execute(self, inputs: Sequence[Any]) -> list[Any]:
        pop_delegate_error()
        try:
            return list(self._native.execute(list(inputs)))
        except (RuntimeError, ValueError, MemoryError) as exc:
            carried = pop_delegate_error()
            if carried is not None:
                raise carried from carried.__cause__
            raise ProgramError(f"method '{self.name}' failed in the ExecuTorch runtime: {exc}") from exc


def _describe_info(info: TensorInfo) -> str:
    from etsdk._format.dtypes import dtype_name

    return f"{dtype_name(info.dtype)} {list(info.shape)}"


class Program:
    """A verified ExecuTorch program with its backends resolved."""

    def __init__(
        self,
        path: Path,
        data: Path | None,
        native: Any,
        backends: dict[str, tuple[str, ...]],
        record: ProgramRecord | None,
        *,
        files: _PinnedFiles | None = None,
        layout: ProgramLayout | None = None,
        data_layout: DataLayout | None = None,
        bounds: dict[str, dict[int, int]] | None = None,
    ) -> None:
        self.path = path
        self.data = data
        self._native = native
        self._backends = backends
        self._record = record
        self._lock = threading.RLock()
        self._methods: dict[str, Method] = {}
        self._default_session: Session | None = None
        self._files = files
        self._layout = layout
        self._data_layout = data_layout
        self._bounds = bounds or {}
        if files is not None:
            weakref.finalize(self, files.close)

    def _check_files(self) -> None:
        if self._files is not None:
            self._files.check_unchanged("since it was loaded")

    def _input_checks(self, method: str, info: MethodInfo) -> list[_InputCheck]:
        specs: tuple[IOSpec, ...] = ()
        contract = self.contract
        if contract is not None and any(m.name == method for m in contract.methods):
            specs = contract.method(method).engine_inputs
        bounds = self._bounds.get(method, {})
        out = []
        for index, tensor in enumerate(info.inputs):
            spec = specs[index] if index < len(specs) else None
            label = f"input {index}" + (f" ('{spec.name}', role {spec.role.value})" if spec is not None else "")
            bound = bounds.get(index)
            if spec is not None and spec.bound is not None and isinstance(spec.bound, int):
                bound = spec.bound if bound is None else min(bound, spec.bound)
            out.append(_InputCheck(index, label, tensor, bound, spec.role.value if spec is not None else None))
        return out

    @property
    def methods(self) -> tuple[str, ...]:
        """The program's method names."""
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
        """The backend id of each delegate of ``method``, in program order (``etsdk inspect`` shows more)."""
        self._check_method(method)
        return self._backends[method]

    def _check_method(self, method: str) -> None:
        if method not in self._backends:
            raise ProgramError(
                f"program {self.path.name} has no method '{method}' (methods: {', '.join(self.methods)})"
            )

    def method_info(self, method: str) -> MethodInfo:
        """Shapes and dtypes of ``method``'s inputs and outputs, and its delegates' backends (nothing is loaded)."""
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
            self._check_files()
            pop_delegate_error()
            try:
                with loading_method(self._record, method, self.path.name):
                    native = self._native.load_method(method)
            except (RuntimeError, ValueError, MemoryError) as exc:
                carried = pop_delegate_error()
                if carried is not None:
                    raise carried from carried.__cause__
                external = self._layout.external if self._layout is not None else ()
                hint = (
                    f"; the program keeps tensors ({', '.join(external[:3])}{', ...' if len(external) > 3 else ''}) "
                    "outside the .pte: pass its .ptd with etsdk.load(path, data=...)"
                    if self.data is None and external
                    else ""
                )
                raise ProgramError(f"loading method '{method}' of {self.path.name} failed: {exc}{hint}") from exc
            loaded = Method(self, method, native)
            self._methods[method] = loaded
            return loaded

    def __getitem__(self, method: str) -> Method:
        return self.load_method(method)

    def run(
        self, method: str, *inputs: Any, session: Session | None = None, sessions: Sequence[Session] | None = None
    ) -> list[Any]:
        """Run ``method`` on ``inputs`` (loading it on first use); returns its outputs as a list of tensors.

        Inputs are checked before anything runs (:meth:`Method.execute`). A stateful method binds ``session``
        (default: :attr:`default_session`); pass it on every call to keep conversations apart. A method over
        several sessions (its contract method's ``slots``) binds ``sessions``, one per slot. Calls into one
        program are serialised by its lock (methods share planned memory): load one program per thread to run
        in parallel.
        """
        return self.load_method(method).execute(inputs, session=session, sessions=sessions)

    def __repr__(self) -> str:
        return f"Program({str(self.path)!r}, methods={list(self.methods)})"


def _resolve_backends(backends: dict[str, tuple[str, ...]], path: Path, record: ProgramRecord | None) -> None:
    from etsdk._plugins.registry import get_backend

    builtin = set(runtime_backend_names())
    for method, ids in backends.items():
        for backend_id in dict.fromkeys(ids):
            try:
                spec = get_backend(backend_id, require_available=True)
            except BackendNotFoundError as exc:
                if backend_id in builtin:
                    continue  # built into the executorch wheel (e.g. XnnpackBackend)
                raise BackendNotFoundError(
                    f"{path.name}: method '{method}' delegates to backend '{backend_id}', which neither "
                    f"the ExecuTorch runtime nor any installed etsdk plugin provides. {exc}",
                    backend_id=backend_id,
                ) from None
            _check_weight_formats(record, method, backend_id, spec.weight_formats, path)
            ensure_registered(backend_id)


def _check_weight_formats(record: ProgramRecord | None, method: str, backend_id: str, declared: tuple[str, ...], path: Path) -> None:
    """Refuse a delegate reading a quantized weight in a format its (installed) backend does not declare."""
    if record is None:
        return
    for index, delegate in enumerate(record.methods.get(method, ())):
        if delegate.backend != backend_id:
            continue
        for weight in delegate.signature.weights:
            if weight.format not in declared:
                raise ProgramError(
                    f"{path.name}: method '{method}', delegate {index} ({backend_id}) reads weight '{weight.name}' "
                    f"in format {weight.format}, which the installed {backend_id} does not declare (it declares: "
                    f"{', '.join(declared) or 'none'}); upgrade the plugin or re-export for a backend that runs it"
                )


def data_beside(path: str | Path) -> Path | None:
    """``model.ptd`` next to ``model.pte`` when it exists (what ``etsdk export --external-data`` writes)."""
    path = Path(path)
    if not path.name or path.name in (".", "..") or path.is_dir():
        return None  # not a file name; load() says what is wrong with it
    candidate = path.with_suffix(".ptd")
    return candidate if candidate.is_file() else None


def load(path: str | Path, data: str | Path | None = None, *, verify: bool | None = None) -> Program:
    """Load a ``.pte`` (and its ``.ptd`` when the program keeps data outside) for execution.

    Both files are checked before the runtime reads them and stay pinned while the program lives (see
    :mod:`etsdk._runtime.verification`), and every named-data entry (every weight) is hashed before anything
    runs, refusing a damaged one with :class:`etsdk.IntegrityError` naming the entry and the file:

    * ``verify=None`` (the default): by the BLAKE3 digest the program record keeps for each entry, else by the
      SHA-256 its key records; hashed in threads while the runtime parses the program, and waited for before
      ``load`` returns (538 MB of weights: the load 1.04x the unverified one here, ``benchmarks/load_verify.py``);
    * ``verify=True``: by the SHA-256 of every content-addressed entry, whatever the record says (what
      ``etsdk verify`` checks);
    * ``verify=False``: no hashing at all (an explicit opt-out: a damaged weight then computes silently wrong
      results).

    Raises :class:`ProgramError` for a missing, unreadable or corrupted file and
    :class:`BackendNotFoundError` for a backend id nothing installed provides.
    """
    checked = open_checked(path, data)
    checks = _start_checks(checked, verify)
    try:
        _resolve_backends(checked.backends, checked.path, checked.record)
        from executorch.runtime import Runtime, Verification

        try:
            native = Runtime.get().load_program(
                checked.files.program.runtime_path,
                verification=Verification.InternalConsistency,
                data_path=checked.files.data.runtime_path if checked.files.data is not None else None,
            )
        except (RuntimeError, ValueError, MemoryError) as exc:
            raise ProgramError(f"the ExecuTorch runtime refused {checked.path}: {exc}") from exc
        _settle(checks)
        checked.files.check_unchanged("while it was loaded")
        program = Program(
            checked.path,
            checked.data_path,
            native,
            checked.backends,
            checked.record,
            files=checked.files,
            layout=checked.layout,
            data_layout=checked.data_layout,
            bounds=checked.bounds,
        )
        if checked.record is not None and checked.record.contract is not None:
            _check_engine_io(program, checked.record.contract)
    except BaseException as exc:
        damaged = None
        if checks is not None:
            concurrent.futures.wait([checks])  # the hashing threads read the files: never close them under it
            damaged = checks.exception()
        checked.files.close()
        if isinstance(damaged, IntegrityError) and damaged is not exc:
            raise damaged from exc  # a damaged entry is the better answer than what was made of it
        raise
    return program


def _start_checks(checked: _Checked, verify: bool | None) -> concurrent.futures.Future[None] | None:
    """Hash every named-data entry in a background thread (``load``'s ``verify``); None when told not to.

    The hashes run outside the GIL on the other cores while the runtime parses the program (which reads no
    named data until a method loads); :func:`_settle` waits and raises before ``load`` returns, so nothing
    runs on a damaged weight.
    """
    if verify is False:
        return None
    from etsdk._format.content_hash import check_entries, hash_entries, raise_on_mismatch

    fast = checked.record.checks if checked.record is not None and verify is None else {}
    files = [(checked.files.program.fd, checked.layout.entries, checked.path.name)]
    if checked.files.data is not None and checked.data_layout is not None and checked.data_path is not None:
        files.append((checked.files.data.fd, checked.data_layout.entries, checked.data_path.name))

    def run() -> None:
        for fd, entries, name in files:
            raise_on_mismatch(hash_entries(fd, entries, name) if verify else check_entries(fd, entries, name, fast))

    future: concurrent.futures.Future[None] = concurrent.futures.Future()

    def thread() -> None:
        try:
            run()
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(None)

    threading.Thread(target=thread, name="etsdk-verify", daemon=True).start()
    return future


def _settle(checks: concurrent.futures.Future[None] | None) -> None:
    """Wait for :func:`_start_checks`' hashes; raise the IntegrityError naming a damaged entry."""
    if checks is not None:
        checks.result()


@dataclass(frozen=True, slots=True)
class _Checked:
    path: Path
    data_path: Path | None
    files: _PinnedFiles
    layout: ProgramLayout
    data_layout: DataLayout | None
    backends: dict[str, tuple[str, ...]]
    record: ProgramRecord | None
    bounds: dict[str, dict[int, int]]


def open_checked(
    path: str | Path, data: str | Path | None, *, check_contract: bool = True, read_record: bool = True
) -> _Checked:
    """Open, pin and check the files (everything before backends are resolved; ``etsdk inspect`` stops here).

    ``check_contract``: also check the embedded contract against the installed specification.
    ``read_record``: parse the program record (``etsdk verify`` reads the files without it when the record is
    damaged, to report it with every other entry). The caller closes ``result.files``.
    """
    from etsdk._runtime.bridge.build import load_extension

    path = Path(path)
    data_path = Path(data) if data is not None else None
    files = _PinnedFiles()
    try:
        files.program = files.open(path, "program")
        if data_path is not None:
            files.data = files.open(data_path, "data")
        try:
            layout = read_program_file(files.program.fd)
        except FormatError as exc:
            raise ProgramError(f"{path} is not a valid ExecuTorch program ({exc})") from None
        native_bridge = load_extension()
        record_key = find_program_record_key((e.key for e in layout.entries), path.name)
        try:
            listing, record_bytes = native_bridge.inspect_program(files.program.runtime_path, record_key or PROGRAM_RECORD_KEY)
        except (ValueError, OSError) as exc:
            raise ProgramError(f"{path} is not a valid ExecuTorch program: {exc}") from None
        data_layout = None
        if files.data is not None and data_path is not None:
            try:
                data_layout = read_data_file(files.data.fd)
            except FormatError as exc:
                raise ProgramError(f"{data_path} is not a valid ExecuTorch data file (.ptd) ({exc})") from None
        backends = {method: tuple(ids) for method, ids in listing}
        bounds: dict[str, dict[int, int]] = {}
        try:
            try:
                record = ProgramRecord.from_bytes(record_bytes, path.name) if record_bytes is not None and read_record else None
            except RecursionError:
                raise ProgramError(f"{path.name}: the etsdk program record is nested too deeply") from None
            if check_contract and record is not None and record.contract is not None:
                bounds = _check_contract(record.contract, path)
        except EtsdkError:
            _raise_if_damaged(record_key, record_bytes, path.name)  # a refused record: say so when it is damaged
            raise
        files.check_unchanged("while it was checked")
    except BaseException:
        files.close()
        raise
    return _Checked(path, data_path, files, layout, data_layout, backends, record, bounds)


def _raise_if_damaged(key: str | None, data: Any, where: str) -> None:
    """A program record that did not parse: when its key is its content hash, say that its bytes are damaged.

    Only on this failure path: a record that parses is not hashed at load (``verify`` hashes it).
    """
    from etsdk._format.content_hash import content_digest

    expected = content_digest(key) if key is not None else None
    if key is None or expected is None or data is None:
        return
    found = hashlib.sha256(bytes(data)).hexdigest()
    if found != expected:
        raise IntegrityError(
            f"{where}: named data '{key}' ({len(data)} bytes, the etsdk program record) is damaged: its bytes hash to "
            f"{found}, its key records {expected}",
            file=where,
            key=key,
        )


class _PinnedFile:
    """One file opened read-only; the runtime is handed this very open file."""

    __slots__ = ("path", "fd", "size", "mtime", "runtime_path")

    def __init__(self, path: Path, what: str) -> None:
        if path.is_dir():
            raise ProgramError(f"{what} file {path} is a directory")
        try:
            # non-blocking: opening a FIFO must not wait for a writer (it is refused below)
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise ProgramError(f"{what} file not found: {path}") from None
        except OSError as exc:
            raise ProgramError(f"cannot open {what} file {path}: {exc.strerror or exc}") from None
        self.path = path
        stat = os.fstat(self.fd)
        if not S_ISREG(stat.st_mode):
            os.close(self.fd)
            raise ProgramError(f"{what} file {path} is not a regular file")
        self.size, self.mtime = stat.st_size, stat.st_mtime_ns
        proc = f"/proc/self/fd/{self.fd}"
        # Linux: reopening /proc/self/fd/N opens the same file even if the path was replaced since.
        self.runtime_path = proc if os.path.exists(proc) else str(path)

    def changed(self) -> str | None:
        stat = os.fstat(self.fd)
        if (stat.st_size, stat.st_mtime_ns) == (self.size, self.mtime):
            return None
        if stat.st_size != self.size:
            return f"its size changed from {self.size} to {stat.st_size} bytes"
        return "it was modified in place"


class _PinnedFiles:
    """The program's files, open for as long as the program lives."""

    program: _PinnedFile
    data: _PinnedFile | None

    def __init__(self) -> None:
        self.data = None
        self._open: list[int] = []

    def open(self, path: Path, what: str) -> _PinnedFile:
        pinned = _PinnedFile(path, what)
        self._open.append(pinned.fd)
        return pinned

    def check_unchanged(self, when: str) -> None:
        for pinned in (getattr(self, "program", None), self.data):
            if pinned is None:
                continue
            change = pinned.changed()
            if change is not None:
                raise ProgramError(
                    f"{pinned.path} changed on disk {when}: {change}. A loaded program reads its files in place "
                    "and cannot run on a changed file; load it again (etsdk export replaces files by rename, "
                    "which never changes a loaded program's file)"
                )

    def close(self) -> None:
        while self._open:
            try:
                os.close(self._open.pop())
            except OSError:
                pass


def _check_contract(record: Contract, path: Path) -> dict[str, dict[int, int]]:
    """The embedded record must be a contract this installation knows, and follow its specification.

    Returns the value bounds of each method's engine inputs, from the specification.
    """
    from etsdk._plugins.registry import get_contract

    spec_file = get_contract(record.name, record.version)
    spec = Contract.from_bytes(spec_file.path.read_bytes(), where=str(spec_file.path))
    try:
        record.check_conforms_to(spec)
        sizes = {k: v for k, v in record.dims.items() if k in spec.dims and spec.dims[k] is None and v is not None}
        bound_spec = spec.bind(**sizes)
    except ContractError as exc:
        raise ContractError(f"{path.name}: {exc}") from None
    bounds: dict[str, dict[int, int]] = {}
    for method in bound_spec.methods:
        for index, io in enumerate(method.engine_inputs):
            if isinstance(io.bound, int):
                bounds.setdefault(method.name, {})[index] = io.bound
    return bounds


def _check_engine_io(program: Program, contract: Contract) -> None:
    """Every method the contract names exists, and its engine inputs / outputs match (the one engine-I/O check)."""
    from etsdk._format.dtypes import dtype_name

    for spec in contract.methods:
        if spec.name not in program.methods:
            raise ContractError(
                f"{program.path.name}: contract '{contract.name}' v{contract.version} requires method '{spec.name}', "
                f"the program has {', '.join(program.methods)}"
            )
        info = program.method_info(spec.name)
        contract.check_engine_io(
            spec.name,
            [None if t is None else (dtype_name(t.dtype), t.shape) for t in info.inputs],
            [None if t is None else (dtype_name(t.dtype), t.shape) for t in info.outputs],
            where=program.path.name,
        )
