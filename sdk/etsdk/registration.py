"""What a plugin hands to etsdk: small frozen records, cheap to build.

A plugin's registration hooks return these records and nothing else. Fields
that need heavy imports (torch, executorch, tensorrt) are *factories*: plain
callables that import what they need only when a backend is actually used, so
listing plugins never imports them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Availability",
    "BackendSpec",
    "Capability",
    "ContractSpec",
    "RunnerSpec",
]


class Capability(str, enum.Enum):
    """What a backend can do, as far as the core needs to know."""

    CPU = "cpu"
    CUDA = "cuda"
    #: The backend binds caller-owned state (KV caches, counters) in place.
    CALLER_OWNED_STATE = "caller_owned_state"
    #: The backend reads weights from named data (.pte or an external .ptd).
    NAMED_DATA = "named_data"
    DYNAMIC_SHAPES = "dynamic_shapes"


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether a backend can run on this machine, and if not, why."""

    available: bool
    reason: str | None = None

    @classmethod
    def ok(cls) -> Availability:
        return cls(True, None)

    @classmethod
    def unavailable(cls, reason: str) -> Availability:
        if not reason:
            raise ValueError("an unavailable backend must say why")
        return cls(False, reason)


def _always_available() -> Availability:
    return Availability.ok()


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend a plugin provides.

    ``id`` is the ExecuTorch backend id: the name written into the ``.pte`` and
    looked up in the runtime's backend registry. It must be a Python identifier
    because ExecuTorch uses it as the ``BackendDetails`` class name.

    ``partitioner(**options)`` returns an ExecuTorch ``Partitioner``;
    ``preprocess(edge_program, compile_specs)`` returns a ``PreprocessResult``;
    ``runtime()`` returns the runtime binding (see :mod:`etsdk.bridge`);
    ``probe()`` says whether the backend can run here without importing heavy
    dependencies.
    """

    id: str
    version: str
    partitioner: Callable[..., Any]
    preprocess: Callable[..., Any]
    runtime: Callable[[], Any]
    capabilities: frozenset[Capability] = frozenset()
    probe: Callable[[], Availability] = _always_available
    description: str = ""

    def __post_init__(self) -> None:
        if not self.id.isidentifier():
            raise ValueError(f"backend id must be a Python identifier, got {self.id!r}")
        for name in ("partitioner", "preprocess", "runtime", "probe"):
            if not callable(getattr(self, name)):
                raise TypeError(f"BackendSpec({self.id!r}).{name} must be callable")


@dataclass(frozen=True, slots=True)
class ContractSpec:
    """A versioned I/O contract, specified as a data file."""

    name: str
    version: int
    path: Path
    description: str = ""


@dataclass(frozen=True, slots=True)
class RunnerSpec:
    """A runner / IO manager for one contract: ``factory(program, **options)``.

    ``versions``: the contract versions the runner drives. ``exporter(request)``
    (optional) builds programs that follow the contract from a source model, for
    ``etsdk export``; it takes an :class:`etsdk.generation.ExportRequest` and
    returns the paths written.
    """

    contract: str
    factory: Callable[..., Any]
    versions: tuple[int, ...] = field(default=(1,))
    exporter: Callable[..., Any] | None = None
    description: str = ""
