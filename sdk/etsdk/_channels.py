"""Every thread-local channel etsdk uses, in one place.

ExecuTorch calls back into etsdk through interfaces that carry no etsdk context
(``Partitioner.partition``, ``BackendDetails.preprocess``, the runtime's
``init`` / ``execute`` through the native bridge). What such a callback needs is
passed down a *channel*: the caller binds a value for the duration of a block on
its thread, the callback reads it. Each channel below says who binds it and who
reads it; nothing else is thread-local. Context that can be passed explicitly is
passed explicitly (a runtime handle receives its state as an argument of
``execute``; a partition receives its writer and reporter as fields).

========================  =======================================  ==========================================
channel                   bound by                                 read by
========================  =======================================  ==========================================
``LOWERING``              :func:`etsdk._export.lower.lower_to_edge`  the core's partitioner wrapper and
                          (the ``LoweringContext`` of one            ``preprocess`` (:mod:`etsdk._export.core_partitioner`)
                          ``etsdk.lower`` call)
``EXPORT_HOOKS``          ``export_hooks(...)`` (conformance kit,  every ``LoweringContext`` created inside
                          tests)
``TRACING``               ``weights_shared_while_tracing()``       the scoped Dynamo clone hook (:mod:`etsdk._export.tracing`)
``LOADING``               :meth:`Program.load_method` (which       the bridge's ``init`` dispatch: the record each
                          record and method are loading)           delegate's signature is checked against
``SESSION``               :meth:`Session.active` (around every     the bridge's state push, :func:`etsdk._state.session.current_session`
                          ``Program.run``); a tuple of sessions    (:func:`~etsdk._state.session.current_sessions` by slot)
                          from ``sessions_active`` for a method
                          over several sessions
``DELEGATE_ERROR``        the bridge dispatcher, when a binding    ``Program`` after the runtime returns an
                          raises inside ``init`` / ``execute``     error code (the Python exception is re-raised)
========================  =======================================  ==========================================

A channel is invisible on another thread: a host that calls from its own threads
passes a session explicitly (``Program.run(..., session=...)``), which binds it there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

__all__ = ["DELEGATE_ERROR", "EXPORT_HOOKS", "LOADING", "LOWERING", "SESSION", "TRACING", "Channel"]

T = TypeVar("T")


class Channel(Generic[T]):
    """One thread-local value: bound for a block by its writer, read by callbacks below it."""

    __slots__ = ("_local", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._local = threading.local()

    def get(self) -> T | None:
        """The value bound on this thread, or None."""
        return getattr(self._local, "value", None)

    @contextmanager
    def bound(self, value: T) -> Iterator[T]:
        """Bind ``value`` on this thread for the block; the previous value comes back after it."""
        previous = self.get()
        self._local.value = value
        try:
            yield value
        finally:
            self._local.value = previous

    def put(self, value: T | None) -> None:
        """Set the value without a block (for a value handed from a callback back up, like an error)."""
        self._local.value = value

    def take(self) -> T | None:
        """The value, cleared."""
        value = self.get()
        self._local.value = None
        return value

    def __repr__(self) -> str:
        return f"Channel({self.name!r})"


#: the ``LoweringContext`` of the ``etsdk.lower`` call running on this thread
LOWERING: Channel[Any] = Channel("lowering")
#: a tuple of ``(transform, observe)`` pairs that every lowering on this thread applies
EXPORT_HOOKS: Channel[tuple[Any, ...]] = Channel("export hooks")
#: how deep this thread is inside ``weights_shared_while_tracing`` (an int)
TRACING: Channel[int] = Channel("tracing")
#: the ``loading_method`` context of the method load running on this thread
LOADING: Channel[Any] = Channel("loading")
#: the ``Session`` whose method is executing on this thread
SESSION: Channel[Any] = Channel("session")
#: the exception a runtime binding raised on this thread, until the caller collects it
DELEGATE_ERROR: Channel[Any] = Channel("delegate error")
