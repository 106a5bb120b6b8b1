"""The hf_static v1 metadata record: what a runner needs to know before the first step.

Embedded in the program as ``contract.metadata["hf_static"]`` (the contract
record travels in the program and is checked against the installed
specification at load). :func:`read_metadata` parses it strictly and checks it
against the record's own sizes: every disagreement is a :class:`MetadataError`
naming the field, what was expected and what was found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from etsdk import Contract, ContractError

__all__ = ["CONTRACT_NAME", "MASK_CONVENTION", "SUPPORTED_VERSIONS", "HfStaticMetadata", "MetadataError", "read_metadata"]

CONTRACT_NAME = "hf_static"
SUPPORTED_VERSIONS = (1,)
METADATA_KEY = "hf_static"
METADATA_FORMAT = 1
#: ``mask[0, 0, i, j]`` is True where row ``i`` may attend to cache row ``j``.
MASK_CONVENTION = "bool_true_visible"


class MetadataError(ContractError):
    """A program's hf_static metadata is missing, malformed or disagrees with its contract."""


@dataclass(frozen=True, slots=True)
class HfStaticMetadata:
    """Sizes and conventions of one exported hf_static program.

    ``context_length`` S (cache rows), ``prefill_length`` T (tokens per prefill
    call), ``vocab_size`` V, ``layers`` L, ``kv_heads`` H, ``head_dim`` D;
    logits are the last (and only engine) output of each method, ``[1, rows, V]``.
    """

    context_length: int
    prefill_length: int
    vocab_size: int
    layers: int
    kv_heads: int
    head_dim: int
    eos_ids: tuple[int, ...]
    cache_dtype: str = "float32"
    logits_dtype: str = "float32"
    mask: str = MASK_CONVENTION
    logits: str = "last"
    architecture: str = ""
    bos_id: int | None = None
    format: int = METADATA_FORMAT

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["eos_ids"] = list(self.eos_ids)
        return out

    @property
    def dims(self) -> dict[str, int]:
        """The contract sizes this metadata implies."""
        return {dim: getattr(self, name) for dim, name in _DIM_FIELDS.items()}

    def attach(self, record: Contract) -> Contract:
        """``record`` with this metadata embedded."""
        from dataclasses import replace

        return replace(record, metadata={**record.metadata, METADATA_KEY: self.to_json()})


_DIM_FIELDS = {"T": "prefill_length", "S": "context_length", "H": "kv_heads", "D": "head_dim", "V": "vocab_size", "L": "layers"}
_INT_FIELDS = tuple(_DIM_FIELDS.values())


def read_metadata(record: Contract | None) -> HfStaticMetadata:
    """Parse and check the metadata of an hf_static program's contract record."""
    if record is None:
        raise MetadataError("the program embeds no contract record: it was not exported as an hf_static program")
    if record.name != CONTRACT_NAME:
        raise MetadataError(f"expected a program of contract '{CONTRACT_NAME}', found contract '{record.name}'")
    if record.version not in SUPPORTED_VERSIONS:
        raise MetadataError(
            f"{CONTRACT_NAME} version {record.version} is not supported by this runner "
            f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))}); upgrade etsdk-hf-static"
        )
    raw = record.metadata.get(METADATA_KEY)
    if not isinstance(raw, Mapping):
        raise MetadataError(
            f"contract record lacks its '{METADATA_KEY}' metadata object (found {type(raw).__name__ if raw is not None else 'nothing'})"
        )
    known = set(HfStaticMetadata.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise MetadataError(f"metadata has unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    if raw.get("format") != METADATA_FORMAT:
        raise MetadataError(f"metadata.format: expected {METADATA_FORMAT}, found {raw.get('format')!r}")
    values: dict[str, Any] = {}
    for name in _INT_FIELDS:
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise MetadataError(f"metadata.{name}: expected a positive integer, found {value!r}")
        values[name] = value
    eos = raw.get("eos_ids")
    if not isinstance(eos, list) or any(isinstance(e, bool) or not isinstance(e, int) for e in eos):
        raise MetadataError(f"metadata.eos_ids: expected a list of integers, found {eos!r}")
    bad = [e for e in eos if not 0 <= e < values["vocab_size"]]
    if bad:
        raise MetadataError(f"metadata.eos_ids: {bad} outside the vocabulary 0..{values['vocab_size'] - 1}")
    bos = raw.get("bos_id")
    if bos is not None and (isinstance(bos, bool) or not isinstance(bos, int) or not 0 <= bos < values["vocab_size"]):
        raise MetadataError(f"metadata.bos_id: expected null or a token id below {values['vocab_size']}, found {bos!r}")
    for name, wanted in (("cache_dtype", "float32"), ("logits_dtype", "float32"), ("mask", MASK_CONVENTION), ("logits", "last")):
        found = raw.get(name, wanted)
        if found != wanted:
            raise MetadataError(f"metadata.{name}: {CONTRACT_NAME} v1 supports {wanted!r}, found {found!r}")
    architecture = raw.get("architecture", "")
    if not isinstance(architecture, str):
        raise MetadataError(f"metadata.architecture: expected a string, found {architecture!r}")
    meta = HfStaticMetadata(**values, eos_ids=tuple(eos), architecture=architecture, bos_id=bos)
    if meta.prefill_length > meta.context_length:
        raise MetadataError(
            f"metadata.prefill_length {meta.prefill_length} exceeds context_length {meta.context_length}"
        )
    for dim, value in meta.dims.items():
        if record.dims.get(dim) != value:
            raise MetadataError(
                f"metadata.{_DIM_FIELDS[dim]} is {value} but the contract record's dim {dim} is {record.dims.get(dim)!r}"
            )
    return meta
