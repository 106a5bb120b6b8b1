"""The runtime bridge: plugin runtime bindings running inside the ExecuTorch runtime.

A small native extension (``_bridge.cpp``) registers a backend id into the
runtime's backend registry and forwards ``init`` / ``execute`` / ``destroy`` to
Python. This package is the Python half: the binding protocol plugin authors
implement, the per-backend dispatcher, and the carrying of binding exceptions
back to the caller.

Binding protocol (typed in :mod:`etsdk.backend`; the reference backend is a working one)::

    class MyBinding:
        def init(self, context: InitContext) -> handle: ...   # once per delegate per method load

    class handle:
        def execute(self, args: tuple, state: tuple) -> None: ...   # inputs then outputs; session state
        def destroy(self) -> None: ...                                # optional

``args`` holds the delegate's inputs followed by its outputs, in the order the
program binds them. Tensors are torch tensors *sharing memory* with the runtime
(write outputs in place, e.g. ``out.copy_(y)``); they are valid only during the
call. Scalars arrive as Python ``int`` / ``float`` / ``bool``. ``state`` holds
the calling session's storage for each of ``context.states``, in that order:
the core pushes it (resolved once per session), so bindings never look a
session up themselves; update it in place.

Before ``init`` runs, the delegate's wrapper is matched with its entry in the
program record (uid, position in the method, payload SHA-256): a blob whose
bytes changed is refused before any plugin code parses it.
"""

from __future__ import annotations

import hashlib
import threading
import traceback
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from etsdk._channels import DELEGATE_ERROR, LOADING
from etsdk._format.envelope import unwrap_blob
from etsdk._state.session import current_sessions
from etsdk._state.signature import DelegateSignature, ProgramRecord, StateBinding
from etsdk.errors import BridgeRegistryError, DelegateError, EtsdkError, ProgramError

__all__ = [
    "DelegateHandle",
    "InitContext",
    "NamedData",
    "RuntimeBinding",
    "ensure_registered",
    "pop_delegate_error",
    "readonly_tensor",
]


class NamedData:
    """The program's named data (from the ``.pte`` and any ``.ptd``), zero-copy.

    Valid only while ``init`` runs; buffers returned by :meth:`get` stay valid
    for as long as they are referenced.
    """

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    def keys(self) -> list[str]:
        """Every named-data key of the program and its data file (``"<backend id>/<sha256>"`` for etsdk's writer)."""
        return list(self._native.keys())

    def get(self, key: str) -> memoryview:
        """The bytes of ``key``, zero-copy from the mapped file; raises :class:`etsdk.ProgramError` when it is missing.

        A missing key usually means a program exported with external weights loaded without its ``.ptd``: the
        error says so.
        """
        try:
            return memoryview(self._native.get(key))
        except KeyError:
            raise ProgramError(
                f"named data '{key}' is in neither the program nor the data file given: a program exported with "
                "external weights needs its .ptd (etsdk.load(path, data=...)); with one given, the files are damaged "
                "or do not belong together (etsdk verify checks them)"
            ) from None

    def get_tensor(self, key: str, dtype: Any, shape: tuple[int, ...]) -> Any:
        """A read-only torch tensor over ``key`` without a copy; size is checked."""
        return tensor_over(key, self.get(key), dtype, shape)


def tensor_over(key: str, buf: memoryview, dtype: Any, shape: tuple[int, ...]) -> Any:
    """A read-only tensor of ``dtype`` / ``shape`` over named data ``key``'s buffer, its size checked first."""
    import torch

    expected = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    if buf.nbytes != expected:
        raise ProgramError(f"named data '{key}': expected {expected} bytes for {dtype} {list(shape)}, found {buf.nbytes}")
    if expected == 0:
        return torch.empty(shape, dtype=dtype)
    return readonly_tensor(buf, dtype).view(shape)


_readonly_lock = threading.Lock()
_readonly_warned = False


def readonly_tensor(buffer: memoryview, dtype: Any) -> Any:
    """A flat torch tensor over a read-only buffer (mapped weights), without a copy.

    torch warns once per process that the buffer is not writable; these tensors
    are read-only by contract, so the first call silences that one warning under
    a lock (``warnings`` filters are process-wide) and later calls touch nothing.
    """
    import torch

    global _readonly_warned
    if _readonly_warned:
        return torch.frombuffer(buffer, dtype=dtype)
    import warnings

    with _readonly_lock:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            tensor = torch.frombuffer(buffer, dtype=dtype)
        _readonly_warned = True
    return tensor


@dataclass(frozen=True, slots=True)
class InitContext:
    """What a binding's ``init`` receives for one delegate of one method.

    ``blob``: the plugin's own payload (exactly what its preprocess returned),
    a zero-copy view of the loaded program: keep a reference while you use it.
    ``compile_specs``: what the partitioner's ``DelegationSpec`` carried.
    ``named_data``: the program's named data, usable during ``init`` only.
    ``signature``: the delegate's engine arguments in binding order, its state
    bindings and claimed operators. ``states``: the state bindings, in the order
    ``execute`` receives the session's tensors.
    """

    #: The backend id the delegate was exported for.
    backend_id: str
    #: The method being loaded (name it in error messages).
    method: str
    blob: memoryview
    compile_specs: Mapping[str, bytes]
    named_data: NamedData
    signature: DelegateSignature

    @property
    def states(self) -> tuple[StateBinding, ...]:
        """The delegate's state bindings (``signature.states``): ``execute``'s ``state[i]`` is ``states[i]``.

        Each names the state identity, the buffer it came from, dtype and shape; the order is fixed at export
        and checked again at load, so a binding may rely on it.
        """
        return self.signature.states


class DelegateHandle(Protocol):
    """What ``init`` returns: ``execute(args, state)`` per call, optional ``destroy()``."""

    def execute(self, args: tuple[Any, ...], state: tuple[Any, ...]) -> None:
        """Run the delegate once.

        ``args``: the engine inputs then outputs, in signature order, as tensors sharing the runtime's memory
        (valid during the call only): write the outputs in place. ``state``: the calling session's storage, one
        tensor per ``context.states`` entry: update it in place, never keep it past a session switch (a
        different session passes different tensors). An exception reaches the caller as a
        :class:`etsdk.DelegateError` naming backend and method.
        """


class RuntimeBinding(Protocol):
    """A backend's runtime side: ``init`` once per delegate per method load."""

    def init(self, context: InitContext) -> DelegateHandle:
        """Decode and check ``context.blob``, read weights from ``context.named_data``, return the handle.

        Check everything here, not in ``execute``: a damaged or foreign blob must be refused (an exception,
        never a crash) before any call runs.
        """


@dataclass(frozen=True, slots=True)
class _PendingError:
    backend_id: str
    method: str | None
    phase: str
    error: BaseException

    def to_exception(self) -> EtsdkError:
        if isinstance(self.error, EtsdkError):
            return self.error
        tb = "".join(traceback.format_exception(type(self.error), self.error, self.error.__traceback__))
        where = f" in method '{self.method}'" if self.method else ""
        text = " | ".join(line.strip() for line in str(self.error).splitlines() if line.strip())
        err = DelegateError(
            f"backend '{self.backend_id}' raised {type(self.error).__name__} during {self.phase}{where}: {text}",
            backend_id=self.backend_id,
            method=self.method,
            phase=self.phase,
            original_type=type(self.error).__name__,
            original_message=str(self.error),
            original_traceback=tb,
        )
        err.__cause__ = self.error
        return err




class loading_method:
    """Context for delegate ``init`` calls of one method load: which record to check against."""

    def __init__(self, record: ProgramRecord | None, method: str, program: str) -> None:
        self.record = record
        self.method = method
        self.program = program
        self.index = 0

    def __enter__(self) -> loading_method:
        self._binding = LOADING.bound(self)
        self._binding.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._binding.__exit__(None, None, None)


def _signature_from_record(backend_id: str, method: str, uid: str, payload: memoryview) -> DelegateSignature:
    """The delegate's record entry (by position in the method), after checking uid and payload hash."""
    context: loading_method | None = LOADING.get()
    if context is None:
        raise ProgramError(
            f"method '{method}', delegate {backend_id}: loaded outside etsdk.load(); etsdk delegates take their "
            "signature from the program record: load the program with etsdk.load"
        )
    where = f"{context.program}: method '{method}', delegate {context.index} ({backend_id})"
    if context.record is None:
        raise ProgramError(f"{where}: the program carries no etsdk program record; re-export it with etsdk.lower")
    delegates = context.record.methods.get(method, ())
    if context.index >= len(delegates):
        raise ProgramError(f"{where}: the program record lists only {len(delegates)} etsdk delegate(s) for this method")
    expected = delegates[context.index]
    context.index += 1
    if expected.signature.computed_uid() != expected.signature.uid:
        raise ProgramError(f"{where}: the program record's entry for this delegate was altered (its uid does not match its content)")
    if expected.backend != backend_id or expected.signature.uid != uid:
        raise ProgramError(
            f"{where}: the delegate does not match its program record entry (binding order or delegates differ): "
            f"record lists {expected.backend} uid {expected.signature.uid}, the program holds {backend_id} uid {uid}"
        )
    contract = context.record.contract
    slots = contract.slots_of(method) if contract is not None else 1
    beyond = [b for b in expected.signature.states if b.slot >= slots]
    if beyond:
        raise ProgramError(
            f"{where}: binds state '{beyond[0].state}' of slot {beyond[0].slot}, but the contract runs method "
            f"'{method}' over {slots} session(s)"
        )
    digest = hashlib.sha256(payload).hexdigest()
    if digest != expected.signature.payload_sha256:
        raise ProgramError(
            f"{where}: the delegate's payload is corrupted (SHA-256 {digest[:16]}..., the program record says "
            f"{expected.signature.payload_sha256[:16]}...); refusing to hand it to the backend"
        )
    return expected.signature


def _argument_check(backend_id: str, method: str, signature: DelegateSignature) -> Any:
    expected = (*signature.inputs, *signature.outputs)

    def check(args: tuple[Any, ...]) -> None:
        from etsdk._format.dtypes import dtype_name

        if len(args) != len(expected):
            raise ProgramError(
                f"method '{method}', delegate {backend_id}: the runtime passed {len(args)} arguments, the delegate's "
                f"signature has {len(expected)}"
            )
        for index, (arg, want) in enumerate(zip(args, expected)):
            found = (dtype_name(arg.dtype), tuple(arg.shape)) if hasattr(arg, "dtype") else (type(arg).__name__, ())
            if found != (want.dtype, want.shape):
                raise ProgramError(
                    f"method '{method}', delegate {backend_id}: argument {index} is {found[0]} {list(found[1])}, "
                    f"the signature binds {want.describe()} there"
                )

    return check


def pop_delegate_error() -> EtsdkError | None:
    """The exception a binding raised on this thread since the last call, if any."""
    pending: _PendingError | None = DELEGATE_ERROR.take()
    return pending.to_exception() if pending is not None else None


class _Dispatcher:
    """Called by the native bridge for one backend id."""

    def __init__(self, backend_id: str) -> None:
        self.backend_id = backend_id
        self._binding: Any = None
        self._generation = -1
        self._methods: dict[int, str] = {}

    def _get_binding(self) -> Any:
        # Re-pointed, not re-registered: after the plugin registry is rebuilt the
        # same runtime slot resolves the backend id again.
        from etsdk._plugins.registry import get_backend, registry_generation

        generation = registry_generation()
        if self._binding is None or generation != self._generation:
            self._binding = get_backend(self.backend_id, require_available=True).runtime()
            self._generation = generation
        return self._binding

    def init(self, backend_id: str, blob: Any, specs: list[tuple[str, bytes]], named: Any, method: str) -> Any:
        named_data = NamedData(named)
        try:
            uid, payload = unwrap_blob(memoryview(blob), f"method '{method}', delegate {backend_id}")
            signature = _signature_from_record(backend_id, method, uid, payload)
            context = InitContext(
                backend_id=backend_id,
                method=method,
                blob=payload,
                compile_specs=dict(specs),
                named_data=named_data,
                signature=signature,
            )
            handle = self._get_binding().init(context)
            if not callable(getattr(handle, "execute", None)):
                raise TypeError(
                    f"the runtime binding of '{backend_id}' returned {type(handle).__name__} from init(), "
                    "which has no execute(args, state) method"
                )
            bound = _StatePush(handle, signature.states) if signature.states else _Stateless(handle)
        except BaseException as exc:  # noqa: BLE001 - carried to the caller by pop_delegate_error
            self.record_error("init", exc, None, method)
            return None
        self._methods[id(bound)] = method
        return bound, _argument_check(backend_id, method, signature)

    def record_error(self, phase: str, error: BaseException, handle: Any, method: str | None = None) -> None:
        if method is None and handle is not None:
            method = self._methods.get(id(handle))
        DELEGATE_ERROR.put(_PendingError(self.backend_id, method, phase, error))

    def destroy(self, handle: Any) -> None:
        self._methods.pop(id(handle), None)
        destroy = getattr(handle, "destroy", None)
        if callable(destroy):
            destroy()


class _Stateless:
    """A handle of a delegate that binds no state: ``execute(args)`` from the bridge -> ``execute(args, ())``."""

    __slots__ = ("handle", "inner")

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.inner = handle.execute

    def execute(self, args: tuple[Any, ...]) -> None:
        self.inner(args, ())

    def destroy(self) -> None:
        destroy = getattr(self.handle, "destroy", None)
        if callable(destroy):
            destroy()


class _StatePush(_Stateless):
    """Pushes the calling sessions' storage for the delegate's state bindings into ``execute``: binding ``i``
    receives state ``states[i].state`` of session ``states[i].slot`` (slot 0: the call's one session).

    The tuple is resolved once per set of sessions and kept with weak references
    to them (never the sessions themselves: a loaded program must not keep its
    sessions alive). No reference cycle either: the native bridge frees this
    object when the method is destroyed. The slots were checked against the
    method's session count at load, and the count against the call's sessions
    before it ran.
    """

    __slots__ = ("keys", "sessions", "state")

    def __init__(self, handle: Any, states: tuple[StateBinding, ...]) -> None:
        super().__init__(handle)
        self.keys = tuple((s.state, s.slot) for s in states)
        self.sessions: tuple[Any, ...] = ()
        self.state: tuple[Any, ...] = ()

    def execute(self, args: tuple[Any, ...]) -> None:
        sessions = current_sessions()
        known = self.sessions
        if len(known) != len(sessions) or any(ref() is not session for ref, session in zip(known, sessions)):
            self.state = tuple(sessions[slot].tensor(name) for name, slot in self.keys)
            self.sessions = tuple(weakref.ref(session) for session in sessions)
        self.inner(args, self.state)


_lock = threading.Lock()
_dispatchers: dict[str, _Dispatcher] = {}


def _wrap_tensor(view: memoryview, dtype_code: int, sizes: tuple[int, ...]) -> Any:
    import torch

    from etsdk._format.dtypes import torch_dtype

    dtype = torch_dtype(dtype_code)
    if view.nbytes == 0:
        return torch.empty(sizes, dtype=dtype)
    return torch.frombuffer(view, dtype=dtype).view(sizes)


def ensure_registered(backend_id: str) -> None:
    """Register ``backend_id`` with the runtime (once per process) through the bridge.

    The runtime's registry has a fixed number of slots and no unregister: a name
    is registered once and its dispatcher kept for the life of the process.
    """
    from etsdk._runtime.bridge.build import load_extension

    with _lock:
        if backend_id in _dispatchers:
            return
        native = load_extension()
        native.set_wrap_tensor(_wrap_tensor)
        dispatcher = _Dispatcher(backend_id)
        try:
            native.register(backend_id, dispatcher)
        except (ValueError, OverflowError) as exc:
            raise BridgeRegistryError(str(exc), backend_id=backend_id) from None
        _dispatchers[backend_id] = dispatcher


def runtime_backend_names() -> list[str]:
    """Every backend id the ExecuTorch runtime currently has registered."""
    from etsdk._runtime.bridge.build import load_extension

    return list(load_extension().runtime_backends())
