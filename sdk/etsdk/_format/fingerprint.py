"""Model identity: a fingerprint of a program's weights and of its state specs, independent of its backends.

A snapshot of a session (:mod:`etsdk._state.session`) may be restored into another
program only when both compute the same function over the same state: the same
weights and the same state specs. Which backend runs which method does not
matter (a snapshot taken on a reference-prefill / AOTI-decode program restores
into an all-AOTI export of the same model), so neither does anything a backend
chooses: named-data keys, blob layouts, where state storage lives.

* **Weights**: computed at export from the exported (pre-partition) programs:
  every parameter, buffer and lifted constant that is not declared state, by
  its name (FQN), with its dtype, shape and the SHA-256 of its bytes. Methods
  tracing one module share their weights; each tensor is hashed once, and an
  entry found in several methods counts once. Hashing streams each tensor's own
  memory: no model-sized copy.
* **States**: the contract record's states (name, role, dtype, shape, initial
  value, ownership; not the device).

Both are SHA-256 hex digests, stored in the program record
(:class:`ModelFingerprint`, ``ProgramRecord.model``) and read strictly.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from etsdk._format.mapped_pages import CHUNK, read_through
from etsdk.errors import ProgramError

__all__ = ["ModelFingerprint", "model_fingerprint", "states_fingerprint", "weights_fingerprint"]

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """What a program computes, for snapshots: ``weights`` and ``states`` are SHA-256 hex digests."""

    weights: str
    states: str

    @property
    def combined(self) -> str:
        """One string naming both (``Program.fingerprint``)."""
        return hashlib.sha256(f"etsdk.model:{self.weights}:{self.states}".encode()).hexdigest()

    def to_json(self) -> dict[str, str]:
        return {"weights": self.weights, "states": self.states}

    @classmethod
    def from_json(cls, obj: Any, where: str, error: type[Exception] = ProgramError) -> ModelFingerprint:
        """Strict: an object with exactly ``weights`` and ``states``, each 64 lower-case hex digits."""
        if not isinstance(obj, dict) or set(obj) != {"weights", "states"}:
            found = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise error(f"{where}: model fingerprint must be an object with 'weights' and 'states', found {found}")
        for key in ("weights", "states"):
            value = obj[key]
            if not isinstance(value, str) or not _HEX64.fullmatch(value):
                raise error(f"{where}: model fingerprint '{key}' must be 64 hex digits, found {value!r}")
        return cls(obj["weights"], obj["states"])


def _tensor_digest(tensor: Any) -> str:
    """SHA-256 of a tensor's bytes in row-major order, read in place (one tensor's copy at most, if strided); the
    pages of a memory-mapped tensor are dropped from the process once read (:mod:`etsdk._format.mapped_pages`)."""
    import torch

    flat = tensor.detach()
    if flat.device.type != "cpu":
        h = hashlib.sha256()
        flat = flat.reshape(-1)
        step = max(1, CHUNK // max(1, flat.element_size()))
        for start in range(0, flat.numel(), step):
            h.update(memoryview(flat[start : start + step].cpu().view(torch.uint8).numpy()))
        return h.hexdigest()
    if not flat.is_contiguous():
        flat = flat.contiguous()
    flat = flat.reshape(-1)
    if flat.numel() == 0:
        return hashlib.sha256(b"").hexdigest()

    h = hashlib.sha256()
    read_through(memoryview(flat.view(torch.uint8).numpy()), flat.data_ptr(), h.update)  # a checkpoint's pages: not kept
    return h.hexdigest()


def weights_fingerprint(
    programs: Iterable[Any], exclude: Collection[str] = (), digest: Callable[[Any], str] | None = None
) -> str:
    """Fingerprint of the parameters, buffers and constants of ``programs`` (``torch.export`` ExportedPrograms).

    ``exclude``: names (FQNs) of buffers that are declared state, not weights. ``digest``: the SHA-256 hex of one
    tensor's row-major bytes (default :func:`_tensor_digest`; a lowering passes one that remembers what it read,
    so that storing the weight later does not read it again).
    """
    import torch

    from etsdk._format.dtypes import dtype_name

    entries: set[str] = set()
    digests: dict[tuple[Any, ...], str] = {}  # one hash per distinct tensor memory, across methods
    for program in programs:
        named = [*program.state_dict.items(), *program.constants.items()]
        for name, value in named:
            if name in exclude:
                continue
            if not isinstance(value, torch.Tensor):
                entries.add(f"{name}\topaque\t{type(value).__qualname__}")
                continue
            key = (
                value.device.type,
                value.untyped_storage().data_ptr(),
                value.storage_offset(),
                tuple(value.shape),
                tuple(value.stride()),
                value.dtype,
            )
            if key not in digests:
                digests[key] = (digest or _tensor_digest)(value)
            entries.add(f"{name}\t{dtype_name(value.dtype)}\t{list(value.shape)}\t{digests[key]}")
    h = hashlib.sha256(b"etsdk.weights.v1\n")
    for entry in sorted(entries):
        h.update(entry.encode())
        h.update(b"\n")
    return h.hexdigest()


def states_fingerprint(states: Iterable[Any]) -> str:
    """Fingerprint of state specs (a contract record's states): identity, role, dtype, shape, initial, ownership."""
    canonical = sorted(
        (
            {
                "name": s.name,
                "role": s.role.value,
                "dtype": s.dtype,
                "shape": list(s.shape),
                "initial": float(s.initial),
                "ownership": s.ownership.value,
            }
            for s in states
        ),
        key=lambda item: str(item["name"]),
    )
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(b"etsdk.states.v1\n" + text.encode()).hexdigest()


def model_fingerprint(
    programs: Iterable[Any], state_fqns: Collection[str], contract: Any, digest: Callable[[Any], str] | None = None
) -> ModelFingerprint:
    """The fingerprint ``lower()`` records: weights of ``programs`` (state excluded) and ``contract``'s states
    (``digest`` as in :func:`weights_fingerprint`)."""
    return ModelFingerprint(
        weights_fingerprint(programs, state_fqns, digest), states_fingerprint(contract.states if contract is not None else ())
    )
