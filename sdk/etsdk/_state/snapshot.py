"""Snapshots of a session's state, and their file format.

A :class:`Snapshot` is what :meth:`etsdk._state.session.Session.snapshot` returns: a copy
of every caller-owned state tensor, the state specs and model fingerprint of
the program it was taken on (:mod:`etsdk._format.fingerprint`), and JSON metadata the
caller keeps with it (a runner's position, say). It is immutable: restoring
copies *from* it, so one snapshot restores any number of times.

On disk (``Snapshot.save`` / ``Snapshot.load``, ``Session.save`` / ``Session.load``)
a snapshot is a safetensors file: one tensor per caller-owned state, named by
its identity, and one metadata entry ``etsdk.session`` holding JSON::

    {"format": "etsdk.session", "format_version": [1, 0],
     "contract": {"name": "hf_static", "version": 1},
     "model": {"weights": "<sha256>", "states": "<sha256>"},
     "states": [{"name", "role", "dtype", "shape", "initial", "ownership"}, ...],
     "sha256": {"<state>": "<sha256 of its bytes>", ...},
     "metadata": {...}}

Reading is strict: a file that is not safetensors, lacks or garbles the etsdk
metadata, holds other tensors than its states declare, or whose bytes do not
match their recorded SHA-256 is a :class:`~etsdk._state.session.StateError` naming the
file and the problem; no safetensors exception escapes. Files are written to a
temporary name beside the target and renamed when complete.

safetensors is imported only when a file is written or read (it is installed
with transformers; ``pip install safetensors`` otherwise).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from etsdk._format.fingerprint import ModelFingerprint, states_fingerprint
from etsdk._format.versioning import check_format
from etsdk._state.contract import Contract, Ownership, Role, StateSpec
from etsdk.errors import EtsdkError, StateError

if TYPE_CHECKING:
    import torch

__all__ = ["SESSION_FORMAT", "Snapshot"]

SESSION_FORMAT = "etsdk.session"
SESSION_FORMAT_MAJOR = 1
SESSION_FORMAT_MINOR = 0
METADATA_KEY = "etsdk.session"
_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True, slots=True, eq=False)
class Snapshot:
    """An immutable copy of a session's caller-owned state and the identity of the program it was taken on."""

    #: The name of the contract the program follows.
    contract: str
    #: Its version.
    contract_version: int
    #: The program's model fingerprint (weights and state layout, not the backends): a snapshot restores into
    #: any program of the same model, whichever backends it was exported for.
    model: ModelFingerprint
    #: The contract's state declarations the tensors follow (name, dtype, shape, ...).
    states: tuple[StateSpec, ...]
    #: State identity -> a private copy of its tensor (read-only mapping).
    tensors: Mapping[str, torch.Tensor]
    #: The caller's JSON values kept with the state (a runner's position, say), copied and read-only.
    metadata: Mapping[str, Any]

    @classmethod
    def create(
        cls,
        *,
        contract: str,
        contract_version: int,
        model: ModelFingerprint,
        states: Sequence[StateSpec],
        tensors: Mapping[str, torch.Tensor],
        metadata: Mapping[str, Any] | None,
    ) -> Snapshot:
        """A snapshot over ``tensors`` as given (not copied: :meth:`Session.snapshot` passes copies); ``metadata``
        is copied through JSON, so it must be JSON values."""
        return cls(
            contract=contract,
            contract_version=contract_version,
            model=model,
            states=tuple(states),
            tensors=MappingProxyType(dict(tensors)),
            metadata=MappingProxyType(_json_copy(metadata or {})),
        )

    @property
    def nbytes(self) -> int:
        """The size of the state tensors in bytes (what the snapshot holds in memory, metadata aside)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def differences(self, contract: Contract, model: ModelFingerprint) -> list[str]:
        """What differs between this snapshot and a program of ``contract`` and ``model`` (empty: compatible)."""
        found: list[str] = []
        if (self.contract, self.contract_version) != (contract.name, contract.version):
            found.append(
                f"contract: the snapshot is of '{self.contract}' v{self.contract_version}, the program follows "
                f"'{contract.name}' v{contract.version}"
            )
        mine = {s.name: s for s in self.states}
        theirs = {s.name: s for s in contract.states}
        missing = [name for name in theirs if name not in mine]
        extra = [name for name in mine if name not in theirs]
        if missing:
            found.append(f"state(s) {', '.join(missing)} of the program are not in the snapshot")
        if extra:
            found.append(f"the snapshot holds state(s) {', '.join(extra)} the program does not declare")
        for name, want in theirs.items():
            got = mine.get(name)
            if got is None:
                continue
            for attribute in ("dtype", "shape", "role", "ownership", "initial"):
                a, b = _attribute(got, attribute), _attribute(want, attribute)
                if a != b:
                    found.append(f"state '{name}' {attribute}: the snapshot has {a}, the program {b}")
        if not found and self.model.states != model.states:
            found.append("state specs differ (state fingerprints differ)")
        if self.model.weights != model.weights:
            found.append(
                f"model: the snapshot was taken on another model (weights fingerprint {self.model.weights[:12]}…, "
                f"the program's {model.weights[:12]}…)"
            )
        return found

    # ----------------------------------------------------------------- files

    def save(self, path: str | Path) -> Path:
        """Write this snapshot to ``path`` (safetensors), atomically; returns the path."""
        from etsdk._format.fingerprint import _tensor_digest

        save_file = _safetensors().save_file
        path = Path(path)
        if path.is_dir():
            raise StateError(f"cannot save a session to {path}: it is a directory")
        if not path.parent.is_dir():
            raise StateError(f"cannot save a session to {path}: no directory {path.parent}")
        tensors = {name: t.detach().cpu().contiguous() for name, t in self.tensors.items()}
        header = {
            "format": SESSION_FORMAT,
            "format_version": [SESSION_FORMAT_MAJOR, SESSION_FORMAT_MINOR],
            "contract": {"name": self.contract, "version": self.contract_version},
            "model": self.model.to_json(),
            "states": [_spec_json(s) for s in self.states],
            "sha256": {name: _tensor_digest(t) for name, t in tensors.items()},
            "metadata": dict(self.metadata),
        }
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            save_file(tensors, str(temporary), metadata={METADATA_KEY: json.dumps(header, separators=(",", ":"))})
            os.replace(temporary, path)
        except OSError as exc:
            raise StateError(f"cannot save a session to {path}: {exc}") from None
        finally:
            temporary.unlink(missing_ok=True)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Snapshot:
        """Read a snapshot written by :meth:`save`; anything else is a :class:`StateError` naming the problem."""
        from etsdk._format.dtypes import dtype_name
        from etsdk._format.fingerprint import _tensor_digest

        path = Path(path)
        where = f"session file {path}"
        if not path.is_file():
            raise StateError(f"{where} not found" if not path.exists() else f"{where} is not a file")
        safe_open = _safetensors().safe_open
        try:
            with safe_open(str(path), framework="pt") as f:
                raw = (f.metadata() or {}).get(METADATA_KEY)
                if raw is None:
                    raise StateError(f"{where} is a safetensors file but not an etsdk session (no '{METADATA_KEY}' metadata)")
                header = _parse_header(raw, where)
                keys = set(f.keys())
                declared = [s.name for s in header["states"] if s.ownership == Ownership.CALLER]
                if keys != set(declared):
                    raise StateError(
                        f"{where}: holds tensor(s) {sorted(keys)}, its states declare {sorted(declared)}"
                    )
                tensors = {name: f.get_tensor(name) for name in declared}
        except EtsdkError:
            raise
        except Exception as exc:  # safetensors raises its own SafetensorError, OSError, ValueError, ...
            raise StateError(f"{where} is not a readable safetensors file ({type(exc).__name__}: {exc})") from None
        specs = {s.name: s for s in header["states"]}
        for name, tensor in tensors.items():
            spec = specs[name]
            found = (dtype_name(tensor.dtype), tuple(tensor.shape))
            if found != (spec.dtype, tuple(spec.shape)):
                raise StateError(
                    f"{where}: tensor '{name}' is {found[0]} {list(found[1])}, its state is declared "
                    f"{spec.dtype} {list(spec.shape)}"
                )
            digest = header["sha256"].get(name)
            if digest != _tensor_digest(tensor):
                raise StateError(f"{where}: the bytes of '{name}' do not match their recorded SHA-256 (the file is damaged)")
        if states_fingerprint(header["states"]) != header["model"].states:
            raise StateError(f"{where}: its states do not match its own state fingerprint (the file is damaged or edited)")
        return cls.create(
            contract=header["contract"][0],
            contract_version=header["contract"][1],
            model=header["model"],
            states=header["states"],
            tensors=tensors,
            metadata=header["metadata"],
        )


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise StateError("session files need the safetensors package: pip install safetensors") from None
    import safetensors

    class _Api:
        save_file = staticmethod(safetensors.torch.save_file)
        safe_open = staticmethod(safetensors.safe_open)

    return _Api


def _attribute(spec: StateSpec, attribute: str) -> str:
    value = getattr(spec, attribute)
    if attribute == "shape":
        return str(list(value))
    if isinstance(value, (Role, Ownership)):
        return value.value
    return str(value)


def _json_copy(metadata: Mapping[str, Any]) -> dict[str, Any]:
    try:
        copied = json.loads(json.dumps(dict(metadata), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise StateError(f"snapshot metadata must be JSON (objects, lists, strings, finite numbers): {exc}") from None
    return dict(copied)


def _spec_json(s: StateSpec) -> dict[str, Any]:
    return {
        "name": s.name,
        "role": s.role.value,
        "dtype": s.dtype,
        "shape": list(s.shape),
        "initial": s.initial,
        "ownership": s.ownership.value,
    }


def _parse_header(raw: str, where: str) -> dict[str, Any]:
    """The etsdk.session JSON, strictly: every field present and of its type; unknown fields refused."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise StateError(f"{where}: its etsdk metadata is not valid JSON ({exc})") from None
    check_format(
        obj, expected=SESSION_FORMAT, major=SESSION_FORMAT_MAJOR, minor=SESSION_FORMAT_MINOR, where=where,
        error=StateError, what="etsdk session",
    )
    fields = {"format", "format_version", "contract", "model", "states", "sha256", "metadata"}
    if set(obj) != fields:
        raise StateError(f"{where}: etsdk session fields are {sorted(obj)}, expected {sorted(fields)}")

    def fail(field: str, expected: str, value: Any) -> StateError:
        return StateError(f"{where}: {field}: expected {expected}, found {value!r}"[:400])

    contract = obj["contract"]
    if (
        not isinstance(contract, dict)
        or set(contract) != {"name", "version"}
        or not isinstance(contract["name"], str)
        or isinstance(contract["version"], bool)
        or not isinstance(contract["version"], int)
    ):
        raise fail("contract", "an object with a string 'name' and an integer 'version'", contract)
    model = ModelFingerprint.from_json(obj["model"], where, error=StateError)
    states_raw = obj["states"]
    if not isinstance(states_raw, list):
        raise fail("states", "a list", states_raw)
    states: list[StateSpec] = []
    for i, s in enumerate(states_raw):
        field = f"states[{i}]"
        if not isinstance(s, dict) or set(s) != {"name", "role", "dtype", "shape", "initial", "ownership"}:
            raise fail(field, "an object with name, role, dtype, shape, initial, ownership", s)
        if not isinstance(s["name"], str) or not s["name"] or any(x.name == s["name"] for x in states):
            raise fail(f"{field}.name", "a unique non-empty string", s["name"])
        if s["dtype"] not in _DTYPES:
            raise fail(f"{field}.dtype", f"one of {', '.join(_DTYPES)}", s["dtype"])
        shape = s["shape"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise fail(f"{field}.shape", "a list of non-negative integers", shape)
        initial = s["initial"]
        if isinstance(initial, bool) or not isinstance(initial, (int, float)) or not math.isfinite(initial):
            raise fail(f"{field}.initial", "a finite number", initial)
        try:
            role, ownership = Role(s["role"]), Ownership(s["ownership"])
        except ValueError:
            raise fail(f"{field}.role/ownership", "a known role and ownership", (s["role"], s["ownership"])) from None
        states.append(StateSpec(s["name"], role, s["dtype"], tuple(shape), float(initial), ownership))
    digests = obj["sha256"]
    caller = {s.name for s in states if s.ownership == Ownership.CALLER}
    if not isinstance(digests, dict) or set(digests) != caller or not all(isinstance(v, str) for v in digests.values()):
        raise fail("sha256", f"one digest per caller-owned state ({', '.join(sorted(caller))})", digests)
    if not isinstance(obj["metadata"], dict):
        raise fail("metadata", "an object", obj["metadata"])
    return {
        "contract": (contract["name"], contract["version"]),
        "model": model,
        "states": tuple(states),
        "sha256": digests,
        "metadata": obj["metadata"],
    }
