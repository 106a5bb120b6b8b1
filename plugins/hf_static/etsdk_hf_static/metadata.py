"""The hf_static metadata record (contract v1, v2 and v3): what a runner needs to know before the first step.

Embedded in the program as ``contract.metadata["hf_static"]`` (the contract
record travels in the program and is checked against the installed
specification at load). :func:`read_metadata` parses it strictly and checks it
against the record's own sizes: every disagreement is a :class:`MetadataError`
naming the field, what was expected and what was found.

Version 1: every layer is full attention (caches of S rows, a counter per layer).
Version 2 adds sliding-window layers: ``layer_kinds`` says per model layer
``"full"`` (a cache of S rows, written at its positions) or ``"window"`` (a ring
cache of R = ``ring_rows`` rows, written at position mod R, attending to the last
``window`` positions); it has no counters.
Version 3 is version 2 with int8 caches (``cache_dtype`` ``"int8"``): every cache
holds int8 rows and a float32 state beside it (``k0_scale``, ``[1, H, rows, 1]``)
one scale per row and head. Its ``layer_kinds`` may be all ``"full"``; then
``window`` and ``ring_rows`` are null, R is 1 and ``window_mask`` is all True (the
program does not read it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from etsdk import Contract, ContractError, ExportError

__all__ = [
    "CONTRACT_NAME",
    "CACHE_DTYPES",
    "FULL",
    "MASK_CONVENTION",
    "SUPPORTED_VERSIONS",
    "WINDOW",
    "check_cache_dtype",
    "HfStaticMetadata",
    "MetadataError",
    "read_metadata",
    "ring_rows",
    "tokenizer_dir",
]

CONTRACT_NAME = "hf_static"
SUPPORTED_VERSIONS = (1, 2, 3)
METADATA_KEY = "hf_static"
METADATA_FORMAT = 1
#: metadata format of a version-2 program (it adds ``window``, ``ring_rows`` and ``layer_kinds``)
METADATA_FORMAT_V2 = 2
#: metadata format of a version-3 program (int8 caches: ``cache_dtype`` "int8"; windows optional)
METADATA_FORMAT_V3 = 3
#: what a cache may hold: the model's float32 values (versions 1 and 2), or int8 rows with a scale each (version 3)
CACHE_DTYPES = ("float32", "int8")


def check_cache_dtype(cache_dtype: str) -> str:
    """``cache_dtype`` when a cache may hold it (:data:`CACHE_DTYPES`), else an :class:`etsdk.ExportError`."""
    if cache_dtype not in CACHE_DTYPES:
        raise ExportError(f"kv_cache must be one of {', '.join(CACHE_DTYPES)}, found {cache_dtype!r}")
    return cache_dtype
FULL, WINDOW = "full", "window"
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
    Version 2 (sliding-window layers): ``window`` W, ``ring_rows`` R, and
    ``layer_kinds`` (one of ``"full"`` / ``"window"`` per layer); empty for version 1.
    Version 3: ``cache_dtype`` ``"int8"`` (caches of int8 rows with a scale per row
    and head), ``layer_kinds`` always given, ``window`` / ``ring_rows`` None when no
    layer has a window.
    ``full_logits`` (any version): False when a prefill call computes the logits of
    its last real row only and leaves the other rows zero (the field is then
    written; a program without it computes every row's).
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
    window: int | None = None
    ring_rows: int | None = None
    layer_kinds: tuple[str, ...] = ()
    full_logits: bool = True

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["eos_ids"] = list(self.eos_ids)
        if self.full_logits:  # what a program without the field means: older runners still read it
            del out["full_logits"]
        if self.version == 1:
            for name in ("window", "ring_rows", "layer_kinds"):
                del out[name]
        else:
            out["layer_kinds"] = list(self.layer_kinds)
        return out

    @property
    def version(self) -> int:
        """The hf_static contract version: 3 for int8 caches, else 2 when a layer has a ring (sliding-window)
        cache, else 1."""
        if self.cache_dtype == "int8":
            return 3
        return 2 if self.layer_kinds else 1

    @property
    def dims(self) -> dict[str, int]:
        """The contract sizes this metadata implies."""
        dims = {dim: getattr(self, name) for dim, name in _DIM_FIELDS.items()}
        if self.version >= 2:
            dims["L"] = self.layer_kinds.count(FULL)
            dims["LW"] = self.layer_kinds.count(WINDOW)
            dims["R"] = self.ring_rows or 1  # version 3 without windows: a one-column window_mask nobody reads
        return dims

    def cache_names(self, layer: int) -> tuple[str, str]:
        """The state identities of model layer ``layer``'s key and value caches (``k3``/``v3``; ``kw0``/``vw0``
        for the first sliding-window layer of a version-2 program)."""
        if self.version == 1:
            return f"k{layer}", f"v{layer}"
        kind = self.layer_kinds[layer]
        index = self.layer_kinds[:layer].count(kind)
        return (f"k{index}", f"v{index}") if kind == FULL else (f"kw{index}", f"vw{index}")

    def cache_rows(self, layer: int) -> int:
        """Rows of layer ``layer``'s caches: S, or R for a ring."""
        if self.version >= 2 and self.layer_kinds[layer] == WINDOW:
            return self.ring_rows or 0
        return self.context_length

    def cache_states(self, layer: int) -> dict[str, tuple[str, tuple[int, int, int, int]]]:
        """Every state of model layer ``layer``'s caches: name -> (dtype, shape). The key and value caches, and for
        int8 caches (version 3) their scales (``k0_scale``: float32 ``[1, H, rows, 1]``)."""
        rows = self.cache_rows(layer)
        cache = (self.cache_dtype, (1, self.kv_heads, rows, self.head_dim))
        out = dict.fromkeys(self.cache_names(layer), cache)
        if self.cache_dtype == "int8":
            out.update({f"{name}_scale": ("float32", (1, self.kv_heads, rows, 1)) for name in self.cache_names(layer)})
        return out

    def rewind_reach(self) -> int | None:
        """How many written positions a conversation can step back and still find every row its next query
        needs in the ring caches (``R - W + 1``), or None when every cache keeps every row (version 1)."""
        if self.version == 1 or self.ring_rows is None or self.ring_rows == self.context_length:
            return None  # a ring of S rows never wraps: every written row stays
        assert self.ring_rows is not None and self.window is not None
        return self.ring_rows - self.window + 1

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
    if record.version == 1:
        known -= {"window", "ring_rows", "layer_kinds"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise MetadataError(f"metadata has unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    wanted_format = {1: METADATA_FORMAT, 2: METADATA_FORMAT_V2}.get(record.version, METADATA_FORMAT_V3)
    if raw.get("format") != wanted_format:
        raise MetadataError(f"metadata.format: expected {wanted_format}, found {raw.get('format')!r}")
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
    cache_dtype = "int8" if record.version == 3 else "float32"
    for name, wanted in (("cache_dtype", cache_dtype), ("logits_dtype", "float32"), ("mask", MASK_CONVENTION), ("logits", "last")):
        found = raw.get(name, wanted)
        if found != wanted:
            raise MetadataError(f"metadata.{name}: {CONTRACT_NAME} v{record.version} supports {wanted!r}, found {found!r}")
    architecture = raw.get("architecture", "")
    if not isinstance(architecture, str):
        raise MetadataError(f"metadata.architecture: expected a string, found {architecture!r}")
    extra: dict[str, Any] = {}
    if record.version >= 2:
        extra = _read_windows(raw, values, record.version)
    full_logits = raw.get("full_logits", True)
    if not isinstance(full_logits, bool):
        raise MetadataError(f"metadata.full_logits: expected true or false, found {full_logits!r}")
    meta = HfStaticMetadata(
        **values, eos_ids=tuple(eos), architecture=architecture, bos_id=bos, cache_dtype=cache_dtype,
        full_logits=full_logits, **extra
    )
    if meta.prefill_length > meta.context_length:
        raise MetadataError(
            f"metadata.prefill_length {meta.prefill_length} exceeds context_length {meta.context_length}"
        )
    for dim, value in meta.dims.items():
        if record.dims.get(dim) != value:
            raise MetadataError(
                f"metadata.{_DIM_FIELDS[dim] if meta.version == 1 or dim not in ('L', 'LW', 'R') else 'layer_kinds / ring_rows'} is {value} but the contract record's dim {dim} is {record.dims.get(dim)!r}"
            )
    return meta


def _read_windows(raw: Mapping[str, Any], values: Mapping[str, int], version: int) -> dict[str, Any]:
    """The version-2 and 3 fields: ``window`` W, ``ring_rows`` R and ``layer_kinds``, checked against each other
    (a version-3 program may have no window layer, and then no W and R)."""
    kinds = raw.get("layer_kinds")
    if not isinstance(kinds, list) or len(kinds) != values["layers"] or any(k not in (FULL, WINDOW) for k in kinds):
        raise MetadataError(
            f"metadata.layer_kinds: expected a list of {values['layers']} entries, each '{FULL}' or '{WINDOW}', found {kinds!r}"
        )
    out: dict[str, Any] = {"layer_kinds": tuple(kinds), "format": METADATA_FORMAT_V2 if version == 2 else METADATA_FORMAT_V3}
    if WINDOW not in kinds:
        if version == 2:
            raise MetadataError(f"metadata.layer_kinds: a {CONTRACT_NAME} v2 program has a '{WINDOW}' layer, found none")
        found = {name: raw.get(name) for name in ("window", "ring_rows") if raw.get(name) is not None}
        if found:
            raise MetadataError(f"metadata: no layer has a window, so window and ring_rows must be null, found {found}")
        return out
    for name in ("window", "ring_rows"):
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise MetadataError(f"metadata.{name}: expected a positive integer, found {value!r}")
        out[name] = value
    S, T = values["context_length"], values["prefill_length"]
    if out["window"] >= S:
        raise MetadataError(f"metadata.window: a ring layer's window must be below S={S}, found {out['window']}")
    want = ring_rows(out["window"], T, S)
    if out["ring_rows"] != want:
        raise MetadataError(
            f"metadata.ring_rows: W={out['window']}, T={T} and S={S} need {want} ring rows, found {out['ring_rows']}"
        )
    return out


def ring_rows(window: int, prefill_length: int, context_length: int) -> int:
    """R, the rows of a ring cache: W + T - 1 (a prefill chunk's first query still finds its W - 1 predecessors
    after the chunk's T rows are written), at most S."""
    return min(context_length, window + prefill_length - 1)


def tokenizer_dir(program_path: str | Path) -> Path:
    """Where export saves the model's tokenizer beside ``model.pte``: ``model.tokenizer/`` (the runtime loads it)."""
    path = Path(program_path)
    return path.with_name(path.stem + ".tokenizer")
