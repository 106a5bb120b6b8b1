"""Caller-owned state: storage the core owns per session, above every delegate.

A :class:`Session` holds one tensor per state identity the program's contract
declares (KV caches, counters), created from the declared dtype, shape, device
and initial value. Every method and every delegate that declares a state binds
that same storage and updates it in place: after a call the caller sees the
mutation through :attr:`Session.state`, and the data pointer never changes.
Two sessions never share storage; :meth:`Session.reset` re-initialises it.

While a method runs, the session is *current* on the calling thread (a
thread-local the runtime bindings read through :func:`current_session`). A
host calling from another thread passes the session explicitly to
``Program.run(..., session=...)``, which makes it current there.

Runtime-owned state (storage a backend keeps below the delegate) uses the same
identity, per-session selection and reset through :meth:`Session.runtime_owned`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from etsdk.contract import Contract, Ownership
from etsdk.errors import EtsdkError

if TYPE_CHECKING:
    import torch

__all__ = ["Session", "StateError", "current_session"]


class StateError(EtsdkError):
    """State is missing, belongs to another program, or is bound where it cannot be used."""


class Session:
    """The state of one conversation / stream over one loaded program."""

    def __init__(self, contract: Contract, *, owner: object | None = None) -> None:
        import torch

        self._contract = contract
        self._owner = owner
        self._tensors: dict[str, torch.Tensor] = {}
        self._runtime: dict[str, Any] = {}
        for spec in contract.states:
            if spec.device.startswith("cuda") and not torch.cuda.is_available():
                raise StateError(f"state '{spec.name}' must live on {spec.device}, but no CUDA device is available")
            if spec.ownership == Ownership.CALLER:
                self._tensors[spec.name] = torch.full(
                    spec.shape, spec.initial, dtype=getattr(torch, spec.dtype), device=spec.device  # type: ignore[arg-type]
                )

    @property
    def contract(self) -> Contract:
        return self._contract

    @property
    def state(self) -> Mapping[str, torch.Tensor]:
        """Caller-owned storage by state identity (read it; the methods update it in place)."""
        return self._tensors

    def tensor(self, name: str) -> torch.Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            pass
        owned = {s.name: s.ownership for s in self._contract.states}
        if owned.get(name) == Ownership.RUNTIME:
            raise StateError(f"state '{name}' is runtime-owned: the backend keeps it (Session.runtime_owned)")
        raise StateError(
            f"session has no caller-owned state '{name}' (declared: {', '.join(self._tensors) or 'none'})"
        )

    def runtime_owned(self, name: str, create: Callable[[], Any]) -> Any:
        """Runtime-owned storage for ``name`` in this session, created on first use."""
        spec = self._contract.state(name)
        if spec.ownership != Ownership.RUNTIME:
            raise StateError(f"state '{name}' is {spec.ownership.value}-owned, not runtime-owned")
        if name not in self._runtime:
            self._runtime[name] = create()
        return self._runtime[name]

    def reset(self) -> None:
        """Back to the declared initial state, in place (data pointers are kept)."""
        for spec in self._contract.states:
            if spec.name in self._tensors:
                self._tensors[spec.name].fill_(spec.initial)
        self._runtime.clear()

    def check_owner(self, owner: object) -> None:
        if self._owner is not None and self._owner is not owner:
            raise StateError("this session belongs to another program; create one with program.new_session()")

    @contextmanager
    def active(self) -> Iterator[Session]:
        """Make this session current on this thread for the duration of the block."""
        previous = getattr(_current, "session", None)
        _current.session = self
        try:
            yield self
        finally:
            _current.session = previous


_current = threading.local()


def current_session() -> Session:
    """The session the calling thread is executing a method for (runtime bindings call this)."""
    session = getattr(_current, "session", None)
    if session is None:
        raise StateError(
            "a delegate needs state but no session is active on this thread; run the method through "
            "Program.run(..., session=...) (a session is thread-local: pass it explicitly from other threads)"
        )
    return session
