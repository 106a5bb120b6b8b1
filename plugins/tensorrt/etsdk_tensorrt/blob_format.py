"""What an etsdk-tensorrt blob says, written and read in one place.

The payload is an etsdk container (:class:`etsdk.BlobWriter`) with two sections:

``tensorrt`` (JSON)::

    {"device": "cuda" | "cpu",                       where the engine's tensors and the caller's state live
     "inputs":  [{"name", "dtype", "shape"}],        engine tensor of each delegate input, IN DELEGATE ORDER
     "outputs": [{"name", "dtype", "shape"}],        engine tensor of each delegate output, IN DELEGATE ORDER
     "states":  [{"state", "input", "output", "dtype", "shape"}],
                                                     per state the delegate binds, in the signature's state
                                                     order: its engine input and, when written, its output
     "aliases": [{"output", "input", "kind", "ownership", "state"}],
                                                     each written state's output aliases its input;
                                                     kind "kv_cache_update" (TensorRT's KV-cache update layer
                                                     enforces it) or "user" (declared here), ownership "caller"
     "engine":  null | {"data": {"key", "nbytes", "sha256"}, "tensorrt_version", "compute_capability",
                         "precision", "stripped"},
                                                     the serialized engine in named data, and what it was built for;
                                                     "stripped": built without its weights (STRIP_PLAN), which
                                                     the runtime refits from the ONNX weights
     "onnx":    null | {"opset", "sha256", "weights": null | {"key", "nbytes", "sha256"}, "weights_location",
                         "tensors": [{"name", "offset", "nbytes", "key"}]},
                                                     the ONNX graph (section ``onnx``) and its external weights:
                                                     one file in named data (older blobs), or per initializer
                                                     the named-data weight entry holding the bytes the file
                                                     has at ``offset`` (``tensors``; the file is rebuilt from
                                                     them at load), entries other backends share
     "build":   {options the engine is (re)built with}}

``onnx``: the ONNX model without its weights (present when ``onnx`` is not null).

Required features (a reader refuses any it does not know): ``tensorrt.blob.v1``
always; ``tensorrt.engine.v1`` with an engine; ``tensorrt.onnx.v1`` with ONNX;
``tensorrt.onnx.tensors.v1`` when its weights are given per initializer;
``tensorrt.engine.stripped.v1`` with a weight-stripped engine;
``tensorrt.alias.kv_cache_update.v1`` / ``tensorrt.alias.user.v1`` when an alias
of that kind is present.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from etsdk import BlobFormatError, BlobReader, BlobWriter
from etsdk.backend import ArgSpec

BLOB_FEATURE = "tensorrt.blob.v1"
ENGINE_FEATURE = "tensorrt.engine.v1"
ONNX_FEATURE = "tensorrt.onnx.v1"
ONNX_TENSORS_FEATURE = "tensorrt.onnx.tensors.v1"
ENGINE_STRIPPED_FEATURE = "tensorrt.engine.stripped.v1"
ALIAS_FEATURES = {"kv_cache_update": "tensorrt.alias.kv_cache_update.v1", "user": "tensorrt.alias.user.v1"}
KNOWN_FEATURES = frozenset(
    {BLOB_FEATURE, ENGINE_FEATURE, ENGINE_STRIPPED_FEATURE, ONNX_FEATURE, ONNX_TENSORS_FEATURE, *ALIAS_FEATURES.values()}
)

JSON_SECTION = "tensorrt"
ONNX_SECTION = "onnx"
ALIAS_KINDS = tuple(ALIAS_FEATURES)
#: Where caller-owned state lives; runtime-owned state is not something this backend keeps.
OWNERSHIP = "caller"


#: An engine I/O tensor: the core's ArgSpec (name, dtype name, shape), one description for both.
TensorSpec = ArgSpec


@dataclass(frozen=True, slots=True)
class StateTensor:
    state: str
    input: str
    output: str | None
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Alias:
    output: str
    input: str
    kind: str
    ownership: str
    state: str


@dataclass(frozen=True, slots=True)
class NamedBytes:
    key: str
    nbytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class EngineRecord:
    data: NamedBytes
    tensorrt_version: str
    compute_capability: str
    precision: str
    #: built without its weights (``BuilderFlag.STRIP_PLAN``): refitted at load from the blob's ONNX weights
    stripped: bool = False


@dataclass(frozen=True, slots=True)
class OnnxTensor:
    """One ONNX initializer's bytes: ``nbytes`` at ``offset`` of the external-data file, held by the named-data
    entry ``key`` (``weights/<sha256>``: the entry every backend storing the same weight shares)."""

    name: str
    offset: int
    nbytes: int
    key: str


@dataclass(frozen=True, slots=True)
class OnnxRecord:
    opset: int
    sha256: str
    weights: NamedBytes | None
    weights_location: str | None
    tensors: tuple[OnnxTensor, ...] = ()

    def weights_identity(self) -> str | None:
        """What identifies the external weights' bytes (for the engine cache): the file's SHA-256, or a digest of
        the per-initializer entries (their keys are their bytes' SHA-256)."""
        if self.tensors:
            listing = json.dumps([[t.offset, t.nbytes, t.key] for t in self.tensors], separators=(",", ":"))
            return "tensors:" + hashlib.sha256(listing.encode()).hexdigest()
        return self.weights.sha256 if self.weights is not None else None


@dataclass(frozen=True, slots=True)
class BlobDescription:
    device: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    states: tuple[StateTensor, ...]
    aliases: tuple[Alias, ...]
    engine: EngineRecord | None
    onnx: OnnxRecord | None
    build: Mapping[str, Any]

    def required_features(self) -> list[str]:
        features = [BLOB_FEATURE]
        if self.engine is not None:
            features.append(ENGINE_FEATURE)
            if self.engine.stripped:
                features.append(ENGINE_STRIPPED_FEATURE)
        if self.onnx is not None:
            features.append(ONNX_FEATURE)
            if self.onnx.tensors:
                features.append(ONNX_TENSORS_FEATURE)
        unknown = sorted({a.kind for a in self.aliases} - set(ALIAS_FEATURES))
        if unknown:
            raise BlobFormatError(f"etsdk-tensorrt blob: alias kind(s) {', '.join(unknown)} are not one of {', '.join(ALIAS_KINDS)}")
        features += sorted({ALIAS_FEATURES[a.kind] for a in self.aliases})
        return features

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["build"] = dict(self.build)
        return out


def write(description: BlobDescription, onnx_graph: bytes | None) -> bytes:
    if (onnx_graph is None) != (description.onnx is None):
        raise BlobFormatError("an etsdk-tensorrt blob carries the ONNX graph exactly when its description names it")
    if description.engine is None and description.onnx is None:
        raise BlobFormatError("an etsdk-tensorrt blob needs an engine, its ONNX, or both")
    writer = BlobWriter(required_features=description.required_features(), producer="etsdk-tensorrt")
    writer.add_section(JSON_SECTION, json.dumps(description.to_json(), separators=(",", ":")).encode())
    if onnx_graph is not None:
        writer.add_section(ONNX_SECTION, onnx_graph, alignment=64)
    return writer.to_bytes()


def read(payload: memoryview | bytes) -> tuple[BlobDescription, memoryview | None]:
    """The description and (zero-copy) ONNX graph of a payload; refuses unknown required features."""
    reader = BlobReader(payload, known_features=KNOWN_FEATURES)
    try:
        raw = json.loads(bytes(reader.section(JSON_SECTION)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BlobFormatError(f"etsdk-tensorrt blob: section '{JSON_SECTION}' is not valid JSON: {exc}") from None
    description = _parse(raw)
    onnx_graph = reader.section(ONNX_SECTION) if description.onnx is not None else None
    if description.engine is None and description.onnx is None:
        raise BlobFormatError("etsdk-tensorrt blob carries neither an engine nor ONNX to build one from")
    return description, onnx_graph


class _Fields:
    """Strict readers naming the field that is wrong."""

    def __init__(self, obj: Any, where: str) -> None:
        if not isinstance(obj, dict):
            raise BlobFormatError(f"etsdk-tensorrt blob: {where} must be an object, found {type(obj).__name__}")
        self.obj, self.where = obj, where

    def _get(self, key: str) -> Any:
        if key not in self.obj:
            raise BlobFormatError(f"etsdk-tensorrt blob: {self.where} has no '{key}'")
        return self.obj[key]

    def text(self, key: str, *, optional: bool = False) -> Any:
        value = self.obj.get(key) if optional else self._get(key)
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise BlobFormatError(f"etsdk-tensorrt blob: {self.where}.{key} must be a non-empty string, found {value!r}")
        return value

    def integer(self, key: str) -> int:
        value = self._get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BlobFormatError(f"etsdk-tensorrt blob: {self.where}.{key} must be a non-negative integer, found {value!r}")
        return value

    def sizes(self, key: str) -> tuple[int, ...]:
        value = self._get(key)
        if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
            raise BlobFormatError(f"etsdk-tensorrt blob: {self.where}.{key} must be a list of sizes, found {value!r}")
        return tuple(value)

    def items(self, key: str) -> list[Any]:
        value = self._get(key)
        if not isinstance(value, list):
            raise BlobFormatError(f"etsdk-tensorrt blob: {self.where}.{key} must be a list")
        return value

    def nested(self, key: str) -> _Fields | None:
        value = self._get(key)
        return None if value is None else _Fields(value, f"{self.where}.{key}")


def _tensor(obj: Any, where: str) -> TensorSpec:
    f = _Fields(obj, where)
    return TensorSpec(f.text("name"), f.text("dtype"), f.sizes("shape"))


def _named(f: _Fields | None) -> NamedBytes | None:
    return None if f is None else NamedBytes(f.text("key"), f.integer("nbytes"), f.text("sha256"))


def _onnx_tensors(o: _Fields) -> tuple[OnnxTensor, ...]:
    """``onnx.tensors`` (absent in older blobs): each a named-data weight entry, in file order, none overlapping,
    and only with a file to rebuild (``weights_location``) and no whole-file entry beside them."""
    if o.obj.get("tensors") is None:
        return ()
    tensors = []
    end = 0
    for i, t in enumerate(o.items("tensors")):
        f = _Fields(t, f"onnx.tensors[{i}]")
        tensor = OnnxTensor(f.text("name"), f.integer("offset"), f.integer("nbytes"), f.text("key"))
        if tensor.offset < end:
            raise BlobFormatError(
                f"etsdk-tensorrt blob: onnx.tensors[{i}] ('{tensor.name}') starts at byte {tensor.offset}, inside the "
                f"previous initializer (which ends at {end}); initializers are listed in file order, apart"
            )
        end = tensor.offset + tensor.nbytes
        tensors.append(tensor)
    if tensors and (o.obj.get("weights") is not None or not o.obj.get("weights_location")):
        raise BlobFormatError(
            "etsdk-tensorrt blob: onnx.tensors rebuilds the external-data file named by onnx.weights_location, "
            "and comes without a whole-file onnx.weights"
        )
    return tuple(tensors)


def _parse(raw: Any) -> BlobDescription:
    top = _Fields(raw, "description")
    states = []
    for i, s in enumerate(top.items("states")):
        f = _Fields(s, f"states[{i}]")
        states.append(StateTensor(f.text("state"), f.text("input"), f.text("output", optional=True), f.text("dtype"), f.sizes("shape")))
    aliases = []
    for i, a in enumerate(top.items("aliases")):
        f = _Fields(a, f"aliases[{i}]")
        alias = Alias(f.text("output"), f.text("input"), f.text("kind"), f.text("ownership"), f.text("state"))
        if alias.kind not in ALIAS_KINDS:
            raise BlobFormatError(f"etsdk-tensorrt blob: aliases[{i}].kind {alias.kind!r} is not one of {', '.join(ALIAS_KINDS)}")
        if alias.ownership != OWNERSHIP:
            raise BlobFormatError(
                f"etsdk-tensorrt blob: aliases[{i}] ('{alias.output}') has ownership {alias.ownership!r}; this backend "
                f"binds only caller-owned state"
            )
        aliases.append(alias)
    engine = None
    e = top.nested("engine")
    if e is not None:
        data = _named(e.nested("data"))
        if data is None:
            raise BlobFormatError("etsdk-tensorrt blob: engine.data must name the serialized engine")
        stripped = e.obj.get("stripped", False)
        if not isinstance(stripped, bool):
            raise BlobFormatError(f"etsdk-tensorrt blob: engine.stripped must be true or false, found {stripped!r}")
        engine = EngineRecord(data, e.text("tensorrt_version"), e.text("compute_capability"), e.text("precision"), stripped)
    onnx = None
    o = top.nested("onnx")
    if o is not None:
        onnx = OnnxRecord(
            o.integer("opset"), o.text("sha256"), _named(o.nested("weights")), o.text("weights_location", optional=True),
            _onnx_tensors(o),
        )
        location = onnx.weights_location
        if location is not None and (location in (".", "..") or "/" in location or "\\" in location):
            raise BlobFormatError(
                f"etsdk-tensorrt blob: onnx.weights_location must be a plain file name beside the graph, found {location!r}"
            )
    build = top._get("build")
    if not isinstance(build, dict):
        raise BlobFormatError("etsdk-tensorrt blob: build must be an object")
    if engine is not None and engine.stripped and (onnx is None or not (onnx.tensors or onnx.weights)):
        raise BlobFormatError("etsdk-tensorrt blob: a weight-stripped engine needs the ONNX weights to refit it from")
    description = BlobDescription(
        device=top.text("device"),
        inputs=tuple(_tensor(t, f"inputs[{i}]") for i, t in enumerate(top.items("inputs"))),
        outputs=tuple(_tensor(t, f"outputs[{i}]") for i, t in enumerate(top.items("outputs"))),
        states=tuple(states),
        aliases=tuple(aliases),
        engine=engine,
        onnx=onnx,
        build=build,
    )
    _check_consistent(description)
    return description


def _check_consistent(d: BlobDescription) -> None:
    names = [t.name for t in (*d.inputs, *d.outputs)] + [s.input for s in d.states] + [s.output for s in d.states if s.output]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise BlobFormatError(f"etsdk-tensorrt blob: engine tensor name(s) {', '.join(duplicates)} are bound twice")
    written = {s.output: s for s in d.states if s.output}
    aliased = {a.output: a for a in d.aliases}
    if set(written) != set(aliased):
        raise BlobFormatError(
            f"etsdk-tensorrt blob: every written state needs exactly one alias; state outputs {sorted(written)}, "
            f"aliases {sorted(aliased)}"
        )
    for output, alias in aliased.items():
        state = written[output]
        if (alias.input, alias.state) != (state.input, state.state):
            raise BlobFormatError(
                f"etsdk-tensorrt blob: alias '{output}' -> '{alias.input}' (state '{alias.state}') disagrees with the "
                f"state table ('{state.input}', state '{state.state}')"
            )
