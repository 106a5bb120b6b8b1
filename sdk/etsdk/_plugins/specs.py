"""What a plugin hands to etsdk: small frozen records, cheap to build.

A plugin's registration hooks return these records and nothing else. Fields
that need heavy imports (torch, executorch, tensorrt) are *factories*: plain
callables that import what they need only when a backend is actually used, so
listing plugins never imports them.
"""

from __future__ import annotations

import argparse
import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Availability",
    "BackendSpec",
    "Capability",
    "CommandSpec",
    "ContractSpec",
    "Option",
    "RunnerSpec",
]


class Capability(str, enum.Enum):
    """What a backend can do, as far as the core needs to know (``BackendSpec.capabilities``).

    The conformance kit skips a behaviour that needs a capability the backend does not declare, with that reason.
    """

    #: The backend runs on the CPU.
    CPU = "cpu"
    #: The backend runs on a CUDA device.
    CUDA = "cuda"
    #: The backend binds caller-owned state (KV caches, counters) in place.
    CALLER_OWNED_STATE = "caller_owned_state"
    #: The backend reads weights from named data (.pte or an external .ptd).
    NAMED_DATA = "named_data"
    #: The backend claims ``etsdk::attention`` (``etsdk.backend.ATTENTION``) and computes it, reading only the key /
    #: value rows some query sees where it has a kernel for the device (etsdk-aoti: the CPU; on CUDA it reads
    #: every row), in both of its forms (float key / value, and int8 key / value with a scale per row); exporters
    #: then bound attention by its mask (LLM decode cost follows the filled rows).
    FILLED_ATTENTION = "filled_attention"


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether a backend can run on this machine, and if not, why."""

    #: True when the backend's runtime can run here (exporting never needs it).
    available: bool
    #: Why not, for ``etsdk plugins`` and the error of a load that needs the backend; None when available.
    reason: str | None = None

    @classmethod
    def ok(cls) -> Availability:
        """The backend can run here."""
        return cls(True, None)

    @classmethod
    def unavailable(cls, reason: str) -> Availability:
        """The backend cannot run here; ``reason`` (required, non-empty) says what is missing and how to get it."""
        if not reason:
            raise ValueError("an unavailable backend must say why")
        return cls(False, reason)


def _always_available() -> Availability:
    return Availability.ok()


@dataclass(frozen=True, slots=True)
class Option:
    """One partitioner option a backend accepts: ``etsdk.lower`` checks every option against these.

    ``type``: the accepted Python type(s) (``bool`` is never accepted for ``int``);
    ``choices``: the allowed values when the set is closed; ``default``: what
    the partitioner uses when the option is not given (documentation only: the
    core passes only the options the caller gave).
    """

    #: The keyword the partitioner receives (a Python identifier).
    name: str
    type: type | tuple[type, ...]
    default: Any = None
    #: One line saying what the option does.
    help: str = ""
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"option name must be a Python identifier, got {self.name!r}")

    def describe(self) -> str:
        """``name (type[ | type] [one of [...]])``: how errors about this option name what it accepts."""
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        kinds = " | ".join(t.__name__ for t in types)
        choices = f" one of {list(self.choices)}" if self.choices is not None else ""
        return f"{self.name} ({kinds}{choices})"

    def check(self, value: Any) -> str | None:
        """Why ``value`` is not acceptable, or None."""
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        if isinstance(value, bool) and bool not in types:
            return f"expected {self.describe()}, found {value!r}"
        if not isinstance(value, types):
            return f"expected {self.describe()}, found {type(value).__name__} {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"expected one of {list(self.choices)}, found {value!r}"
        return None


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend a plugin provides.

    ``id`` is the ExecuTorch backend id: the name written into the ``.pte`` and
    looked up in the runtime's backend registry. It must be a Python identifier
    because ExecuTorch uses it as the ``BackendDetails`` class name.

    ``partitioner(**options)`` returns an ExecuTorch ``Partitioner`` (usually an
    :class:`etsdk.backend.OperatorPartitioner`); ``options`` declares every
    option it takes, and ``etsdk.lower`` refuses undeclared or mistyped ones
    naming the backend and the method. ``preprocess(partition)`` receives an
    :class:`etsdk.backend.Partition` and returns the payload (``bytes`` or an
    :class:`etsdk.BlobWriter`). ``runtime()`` returns the runtime binding
    (:class:`etsdk.backend.RuntimeBinding`). ``probe()`` says whether the
    backend can *run* here without importing heavy dependencies; exporting does
    not need it to (a CPU machine may export for a GPU one).
    """

    id: str
    #: The backend's own version (informational; the blob's required features, not this, decide compatibility).
    version: str
    partitioner: Callable[..., Any]
    preprocess: Callable[..., Any]
    runtime: Callable[[], Any]
    #: What the backend can do (:class:`Capability`); the conformance kit skips behaviours needing others.
    capabilities: frozenset[Capability] = frozenset()
    probe: Callable[[], Availability] = _always_available
    #: One line describing the backend (informational).
    description: str = ""
    options: tuple[Option, ...] = ()
    #: The quantized weight formats the backend computes (``WeightFormat`` or names such as ``"int4:g32"``;
    #: stored as names). The core lets a partitioner claim a call of ``etsdk::linear_q`` / ``embedding_q``
    #: only in these formats, and refuses to load a program whose delegate reads another.
    weight_formats: tuple[str, ...] = ()
    #: Lines ``etsdk doctor`` prints about the backend on this host (which level of its native code runs, what it
    #: found); called by ``etsdk doctor`` only, so it may build or load native code. ``None``: nothing to say.
    doctor: Callable[[], Sequence[str]] | None = None
    #: Lines ``etsdk inspect`` prints under each delegate of this backend (and ``--json`` lists as its
    #: ``details``): what the payload says about itself, such as the device or CPU its code was compiled for.
    #: Called with the delegate's payload, after its SHA-256 was checked against the program record; it must only
    #: read the payload (never load or run code from it). An exception is shown as the delegate's one detail line.
    #: ``None``: nothing beyond the core's lines.
    describe_payload: Callable[[memoryview], Sequence[str]] | None = None

    def __post_init__(self) -> None:
        from etsdk._format.weight_format import WeightFormat

        try:
            names = tuple(f.name if isinstance(f, WeightFormat) else WeightFormat.parse(f).name for f in self.weight_formats)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"BackendSpec({self.id!r}).weight_formats: {exc}") from None
        object.__setattr__(self, "weight_formats", names)
        if not self.id.isidentifier():
            raise ValueError(f"backend id must be a Python identifier, got {self.id!r}")
        if self.doctor is not None and not callable(self.doctor):
            raise TypeError(f"BackendSpec({self.id!r}).doctor must be callable or None")
        if self.describe_payload is not None and not callable(self.describe_payload):
            raise TypeError(f"BackendSpec({self.id!r}).describe_payload must be callable or None")
        for name in ("partitioner", "preprocess", "runtime", "probe"):
            if not callable(getattr(self, name)):
                raise TypeError(f"BackendSpec({self.id!r}).{name} must be callable")
        if not all(isinstance(o, Option) for o in self.options):
            raise TypeError(f"BackendSpec({self.id!r}).options must be a tuple of etsdk.Option")
        option_names = [o.name for o in self.options]
        if len(set(option_names)) != len(option_names):
            raise ValueError(f"BackendSpec({self.id!r}).options declares an option twice: {option_names}")


@dataclass(frozen=True, slots=True)
class ContractSpec:
    """A versioned I/O contract, specified as a data file (what ``etsdk_register_contracts`` returns).

    A program embeds the contract record it was exported against; :func:`etsdk.load` checks that record against
    the specification registered for its ``(name, version)``, and refuses a name or version nobody registered.
    """

    #: The contract's name, as in the file and in program records (``kv_decoder``, ``hf_static``).
    name: str
    #: Its version (an integer); a new version is a new specification, registered beside the old one.
    version: int
    #: The JSON specification (the ``contracts/`` format), parsed strictly each time a program embedding it loads.
    path: Path
    #: One line describing the contract (informational).
    description: str = ""


@dataclass(frozen=True, slots=True)
class RunnerSpec:
    """A runner / IO manager for one contract: ``factory(program, **options)``.

    ``versions``: the contract versions the runner drives. ``factory(program)``
    returns the runner; for a contract whose programs generate text it returns an
    :class:`etsdk.TextRunner` (``encode``, ``decode_text``, ``generate``), which
    is what ``etsdk generate`` drives. ``exporter(request)`` (optional) builds
    programs that follow the contract from a source model, for ``etsdk export``;
    it takes an :class:`etsdk.ExportRequest` and returns the paths written.
    """

    #: The name of the contract whose programs the runner drives.
    contract: str
    factory: Callable[..., Any]
    versions: tuple[int, ...] = field(default=(1,))
    exporter: Callable[..., Any] | None = None
    #: One line describing the runner (informational).
    description: str = ""


_COMMAND_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One ``etsdk NAME`` command a plugin adds to the command line.

    ``name``: lowercase words joined by ``-`` (``export``, ``new-thing``);
    ``help``: the line ``etsdk --help`` shows for it. ``configure(parser)`` adds
    the command's arguments to its ``argparse`` subparser; it runs whenever the
    command line is built with plugin commands (``etsdk --help`` too), so it must
    be cheap and import nothing heavy. ``run(args)`` runs the command with the
    parsed arguments and returns the exit status; an :class:`etsdk.EtsdkError` or
    ``OSError`` it raises becomes one ``etsdk: error: ...`` line and status 2.
    ``quiet``: the command line calls :func:`etsdk.quiet_command_line` before
    ``run`` (other libraries' warnings and logs silenced in this process; the
    command's own ``--verbose`` flag, when it defines one, shows them again).
    """

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    quiet: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _COMMAND_NAME.fullmatch(self.name):
            raise ValueError(f"command name must be lowercase words joined by '-' (e.g. 'export'), got {self.name!r}")
        for name in ("configure", "run"):
            if not callable(getattr(self, name)):
                raise TypeError(f"CommandSpec({self.name!r}).{name} must be callable")
