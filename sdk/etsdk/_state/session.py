"""Caller-owned state: storage the core owns per session, above every delegate.

A :class:`Session` holds one tensor per state identity the program's contract
declares (KV caches, counters), created from the declared dtype, shape, device
and initial value. Every method and every delegate that declares a state binds
that same storage and updates it in place: after a call the caller sees the
mutation through :attr:`Session.state`, and the data pointer never changes.
Two sessions never share storage; :meth:`Session.reset` re-initialises it.
The storage cannot be replaced (:attr:`Session.state` is a read-only mapping):
write into it in place, or :meth:`Session.restore` a snapshot.

Because the state lives here and not in a delegate, a session can be copied and
moved without knowing which backend computed it: :meth:`Session.snapshot`
(an immutable copy plus the program identity), :meth:`Session.restore` (in
place), :meth:`Session.fork` (a new session from this one's state),
:meth:`Session.save` / :meth:`Session.load` (a safetensors file). A snapshot
restores into any program of the same model and state specs, whichever
backends run its methods (:mod:`etsdk._format.fingerprint`); anything else is refused
with the difference named.

While a method runs, the session is *current* on the calling thread (a
thread-local the runtime bindings read through :func:`current_session`). A
host calling from another thread passes the session explicitly to
``Program.run(..., session=...)``, which makes it current there. A session is
used by one thread at a time.

A method over several sessions (a contract method's ``slots``: one decode step
for several conversations) runs with ``Program.run(..., sessions=(s0, s1, ...))``:
slot ``j``'s state bindings receive ``sessions[j]``'s storage
(:func:`current_sessions`), so each conversation's caches stay its own and no
state is copied in or out.

All state is caller-owned: a contract that declares runtime-owned state (storage
a backend would keep below the delegate) is refused when it is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from etsdk._channels import SESSION
from etsdk._state.contract import Contract
from etsdk.errors import StateError

if TYPE_CHECKING:
    import torch

    from etsdk._format.fingerprint import ModelFingerprint
    from etsdk._state.snapshot import Snapshot

__all__ = ["Session", "StateError", "StateView", "current_session", "current_sessions", "sessions_active"]


class StateView(Mapping[str, "torch.Tensor"]):
    """A session's caller-owned storage by state identity: read it, write into it in place; never replace it."""

    __slots__ = ("_tensors",)

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self._tensors = tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __setitem__(self, name: str, value: object) -> NoReturn:
        raise StateError(
            f"session state '{name}' cannot be replaced: every method and delegate binds this storage; write into "
            f"it in place (session.state[{name!r}].copy_(...)) or restore a snapshot (session.restore(...))"
        )

    def __delitem__(self, name: str) -> NoReturn:
        raise StateError(f"session state '{name}' cannot be removed; the program declares it")

    def __repr__(self) -> str:
        return f"StateView({', '.join(self._tensors)})"


class Session:
    """The state of one conversation / stream over one loaded program.

    ``model``: the program's model fingerprint (``program.record.model``), which
    snapshots carry; ``where``: the program's name, for messages.
    """

    def __init__(
        self,
        contract: Contract,
        *,
        owner: object | None = None,
        model: ModelFingerprint | None = None,
        where: str = "",
    ) -> None:
        import torch

        self._contract = contract
        self._owner = owner
        self._model = model
        self._where = where or f"contract '{contract.name}'"
        self._tensors: dict[str, torch.Tensor] = {}
        self._view = StateView(self._tensors)
        for spec in contract.states:
            if spec.device.startswith("cuda") and not torch.cuda.is_available():
                raise StateError(f"state '{spec.name}' must live on {spec.device}, but no CUDA device is available")
            self._tensors[spec.name] = torch.full(
                spec.shape, spec.initial, dtype=getattr(torch, spec.dtype), device=spec.device  # type: ignore[arg-type]
            )

    @property
    def contract(self) -> Contract:
        """The contract record whose states this session holds (the program's)."""
        return self._contract

    @property
    def model(self) -> ModelFingerprint | None:
        """The model fingerprint of the program this session belongs to (None: not recorded)."""
        return self._model

    @property
    def state(self) -> StateView:
        """Caller-owned storage by state identity (read it; the methods update it in place; it cannot be replaced)."""
        return self._view

    def tensor(self, name: str) -> torch.Tensor:
        """The storage of state ``name`` (the same tensor as ``state[name]``); raises :class:`etsdk.StateError`
        naming the declared states when there is none."""
        try:
            return self._tensors[name]
        except KeyError:
            pass
        raise StateError(
            f"session has no caller-owned state '{name}' (declared: {', '.join(self._tensors) or 'none'})"
        )

    def reset(self) -> None:
        """Back to the declared initial state, in place (data pointers are kept)."""
        for spec in self._contract.states:
            if spec.name in self._tensors:
                self._tensors[spec.name].fill_(spec.initial)

    def check_owner(self, owner: object) -> None:
        """Refuse (:class:`etsdk.StateError`) a session made by another program: its storage has other shapes."""
        if self._owner is not None and self._owner is not owner:
            raise StateError("this session belongs to another program; create one with program.new_session()")

    # ----------------------------------------------------------------- snapshots

    def snapshot(self, metadata: Mapping[str, Any] | None = None) -> Snapshot:
        """An immutable copy of every caller-owned state tensor, with the program identity it belongs to.

        ``metadata``: JSON values the caller keeps with the state (a runner's position, say); saved with it.
        """
        from etsdk._state.snapshot import Snapshot

        model = self._require_model("take a snapshot")
        copies = {name: tensor.detach().clone() for name, tensor in self._tensors.items()}
        return Snapshot.create(
            contract=self._contract.name,
            contract_version=self._contract.version,
            model=model,
            states=self._contract.states,
            tensors=copies,
            metadata=metadata,
        )

    def restore(self, snapshot: Snapshot) -> None:
        """Make this session's state the snapshot's, in place (data pointers are kept).

        Refused, naming every difference, when the snapshot belongs to another contract, state specs
        (identities, shapes, dtypes, ...) or model. Runtime-owned storage is dropped, as :meth:`reset` does.
        """
        from etsdk._state.snapshot import Snapshot

        if not isinstance(snapshot, Snapshot):
            raise StateError(f"restore() takes an etsdk Snapshot, found {type(snapshot).__name__}")
        model = self._require_model("restore a snapshot")
        differences = snapshot.differences(self._contract, model)
        if differences:
            shown = differences[:6] + ([f"and {len(differences) - 6} more"] if len(differences) > 6 else [])
            raise StateError(f"cannot restore this snapshot into a session of {self._where}: {'; '.join(shown)}")
        import torch

        with torch.no_grad():
            for name, tensor in self._tensors.items():
                tensor.copy_(snapshot.tensors[name])

    def fork(self) -> Session:
        """A new session of the same program starting from this one's state (its own storage)."""
        twin = Session.__new__(Session)
        twin._contract = self._contract
        twin._owner = self._owner
        twin._model = self._model
        twin._where = self._where
        twin._tensors = {name: tensor.detach().clone() for name, tensor in self._tensors.items()}
        twin._view = StateView(twin._tensors)
        return twin

    def save(self, path: str | Path, metadata: Mapping[str, Any] | None = None) -> Path:
        """Write a snapshot of this session to ``path`` (safetensors with etsdk metadata); returns the path."""
        return self.snapshot(metadata).save(path)

    @classmethod
    def load(cls, path: str | Path, program: Any) -> Session:
        """A new session of ``program`` holding the state saved in ``path`` (refused for another model / specs)."""
        from etsdk._state.snapshot import Snapshot

        new_session = getattr(program, "new_session", None)
        session = new_session() if callable(new_session) else None
        if not isinstance(session, Session):
            raise StateError(f"Session.load needs an etsdk Program, found {type(program).__name__}")
        session.restore(Snapshot.load(path))
        return session

    def _require_model(self, action: str) -> ModelFingerprint:
        if self._model is None:
            raise StateError(
                f"cannot {action}: {self._where} carries no model fingerprint (it was exported by an older etsdk, "
                "or the session was made without one); re-export the program with this etsdk"
            )
        return self._model

    @contextmanager
    def active(self) -> Iterator[Session]:
        """Make this session current on this thread for the duration of the block."""
        with SESSION.bound(self):
            yield self


@contextmanager
def sessions_active(sessions: tuple[Session, ...]) -> Iterator[None]:
    """Make ``sessions`` (slot order) current on this thread for a method over several sessions."""
    with SESSION.bound(sessions):
        yield


def current_sessions() -> tuple[Session, ...]:
    """The sessions the calling thread is executing a method for, by slot (one for an ordinary method)."""
    found: Session | tuple[Session, ...] | None = SESSION.get()
    if found is None:
        raise StateError(
            "a delegate needs state but no session is active on this thread; run the method through "
            "Program.run(..., session=...) (a session is thread-local: pass it explicitly from other threads)"
        )
    return found if isinstance(found, tuple) else (found,)


def current_session() -> Session:
    """The session the calling thread is executing a method for (runtime bindings call this); refused in a
    method over several sessions, whose bindings read theirs by slot (:func:`current_sessions`)."""
    sessions = current_sessions()
    if len(sessions) != 1:
        raise StateError(
            f"the method runs over {len(sessions)} sessions; a state binding reads its own by slot (current_sessions())"
        )
    return sessions[0]
