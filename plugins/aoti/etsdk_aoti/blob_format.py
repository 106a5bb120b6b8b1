"""What an etsdk-aoti blob says, written and read in one place.

The payload is an etsdk container (:class:`etsdk.backend.BlobWriter`, producer ``etsdk-aoti``) with three
sections, in this order:

``config`` (JSON object)::

    {"device": "cpu" | "cuda" | "cuda:N",   the device the library was compiled for
     "num_inputs": int,                     the library's inputs: the delegate's inputs, then its state inputs
     "num_outputs": int,                    the library's outputs: the delegate's outputs
     "library_sha256": str,                 hex SHA-256 of section ``library``
     "state_inputs": [int],                 the state bindings (indices into the signature's states) the library
                                            takes after the delegate's inputs: every binding, in order
     "cpu": {...}}                          what CPU the library's code needs, below; for "cuda" its host
                                            code (the C++ wrapper that launches the kernels); absent in blobs
                                            written before it was recorded (aoti.cpu_target.v1)

``config.cpu`` (JSON object, keys in this order)::

    {"target": str,                         the CPU target: "native" (the exporting host) or a baseline such as
                                            "x86-64-v3" (etsdk.backend.cpu_target_names())
     "machine": str,                        "x86_64", "aarch64", ...
     "features": [str],                     the instruction-set features the compiled code requires (Linux
                                            names, sorted, distinct): what a host must have to load it
     "vec_isa": str,                        Inductor's vector ISA for the library ("avx512", "avx2", "asimd",
                                            "none")
     "march": str,                          the -march value Inductor compiled with ("native", "x86-64-v3")
     "built_on": str,                       the exporting host (HostCpu.describe(): one line)
     "kernels": "portable"}                 the level etsdk-aoti's own kernels need: they are built on the
                                            host that runs the program and pick their level there

    A host of another machine, or that lacks one of the features, refuses the blob before the library is written
    to the cache or loaded (etsdk_aoti.cpu.refusal).

``constants`` (JSON list): one record per constant the *container* reports, in container order::

    {"name", "fqn", "kind", "folded", "dtype_code", "nbytes", "source"}
    + for source "entry":   {"dtype", "shape", "stride", "key"}
    + for source "derived": {"dtype", "shape", "stride", "derive": {"format", "weight_shape", "stored", "plane"}}

    kind:   the container's: "unknown" | "parameter" | "buffer" | "tensor_constant" | "folded"
    source: "entry" (its own named-data entry ``key``, content-addressed: a weight another delegate of the
                     program reads too is the same entry), viewed as dtype / shape / stride,
            "derived" (computed at load: ``plane`` ("qdata", "scales" or "mins", float32 scales) of the planes of
                     a quantized weight in ``format`` of logical shape ``weight_shape``, stored as the entries
                     ``stored`` (plane or "blocks" -> key)),
            "absent" (not stored: bound to zeros where the completeness rule allows it),
            "folded" (computed by the library's constant folding at load)

``library``: the compiled ``.so`` (4096-aligned), streamed from Inductor's output file.

Required features (a reader refuses any it does not know): ``aoti.container.v1`` always;
``aoti.state_inputs.v1`` when ``state_inputs`` is not empty; ``aoti.cpu_target.v1`` exactly when ``config.cpu``
is present (a reader that cannot check the host against it must refuse the blob, not run code that may die of an
illegal instruction), and ``aoti.cpu_target.host.v1`` too exactly when the device is not the CPU (the record is
the host code's; readers of the first feature alone took it for CPU libraries only); ``aoti.named_constants.v1`` when a constant has
source "entry" or "derived"; ``aoti.kernels.qmm.v1``, ``aoti.kernels.attention.v1``,
``aoti.kernels.attention_int8.v1`` and ``aoti.kernels.linear.v1`` when the library calls the corresponding
kernel of etsdk-aoti's kernels library (:mod:`etsdk_aoti.kernels`). Blobs of older layouts are refused with the advice to re-export: a constant with
source ``"state"`` (before ``aoti.state_inputs.v1``) or ``"weights"`` (a slot of one weights entry per
delegate, before ``aoti.named_constants.v1``).

Both JSON sections are written with ``json.dumps``' default spacing and in the key order above: the bytes of a
blob are part of the program's recorded hash.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etsdk import BlobFormatError
from etsdk.backend import BlobReader, BlobWriter

from etsdk_aoti.library import ConstantKind

BLOB_FEATURE = "aoti.container.v1"
#: the library takes the delegate's state as inputs after its engine inputs (config ``state_inputs``); a reader
#: without this feature would run it with too few inputs, so it is a required feature of such blobs
STATE_INPUTS_FEATURE = "aoti.state_inputs.v1"
#: the library calls etsdk-aoti's quantized kernels (``aoti_torch_cpu_etsdk_qmm``, etsdk_aoti.kernels)
KERNELS_FEATURE = "aoti.kernels.qmm.v1"
#: the library calls etsdk-aoti's attention kernel (``aoti_torch_cpu_etsdk_attention``, etsdk_aoti.attention)
ATTENTION_FEATURE = "aoti.kernels.attention.v1"
#: the library calls the int8-cache attention kernel (``aoti_torch_cpu_etsdk_attention_int8``)
ATTENTION_INT8_FEATURE = "aoti.kernels.attention_int8.v1"
#: the library calls the attention kernel's form for a batch of sessions, each over its own caches
#: (``aoti_torch_cpu_etsdk_attention_slots``: a batched decode step's per-session calls merged into one)
ATTENTION_SLOTS_FEATURE = "aoti.kernels.attention_slots.v1"
#: the library calls the float32 few-row GEMV (``aoti_torch_cpu_etsdk_linear``, etsdk_aoti.float_linear)
LINEAR_FEATURE = "aoti.kernels.linear.v1"
#: ... with bfloat16 / float16 weights (a reader whose kernel takes float32 weights only would fail the call)
LINEAR16_FEATURE = "aoti.kernels.linear16.v1"
#: the library calls the int8-activation product of the ``:a8`` formats (``aoti_torch_cpu_etsdk_qmm_a8``)
QMM_A8_FEATURE = "aoti.kernels.qmm_a8.v1"
#: ... and its form for several weights that read the same input (``aoti_torch_cpu_etsdk_qmm_a8_fused``)
QMM_A8_FUSED_FEATURE = "aoti.kernels.qmm_a8_fused.v1"
#: ... with int8 weights (``int8[:gGROUP]:a8``; a reader whose kernel multiplies only 4-bit weights would fail the call)
QMM_A8_INT8_FEATURE = "aoti.kernels.qmm_a8_int8.v1"
#: constants read from their own named-data entries or derived at load (sources "entry" / "derived")
NAMED_CONSTANTS_FEATURE = "aoti.named_constants.v1"
#: config ``cpu`` says what CPU the library needs; a reader must check the host against it before loading the
#: library (an older reader cannot, so it refuses the blob)
CPU_TARGET_FEATURE = "aoti.cpu_target.v1"
#: ... for a device other than the CPU: the record describes the library's host code (a reader of
#: aoti.cpu_target.v1 alone took config.cpu for CPU libraries only and would call the blob malformed)
HOST_CPU_TARGET_FEATURE = "aoti.cpu_target.host.v1"
KNOWN_FEATURES = frozenset(
    {BLOB_FEATURE, STATE_INPUTS_FEATURE, NAMED_CONSTANTS_FEATURE, KERNELS_FEATURE, ATTENTION_FEATURE, ATTENTION_INT8_FEATURE,
     ATTENTION_SLOTS_FEATURE, LINEAR_FEATURE,
     LINEAR16_FEATURE, QMM_A8_FEATURE, QMM_A8_FUSED_FEATURE, QMM_A8_INT8_FEATURE, CPU_TARGET_FEATURE, HOST_CPU_TARGET_FEATURE}
)
#: ``config.cpu.kernels``: etsdk-aoti's kernels are built where the program runs and pick their level there
KERNELS_PORTABLE = "portable"

PRODUCER = "etsdk-aoti"
CONFIG_SECTION = "config"
CONSTANTS_SECTION = "constants"
LIBRARY_SECTION = "library"
LIBRARY_ALIGNMENT = 4096

_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FEATURE_NAME = re.compile(r"[a-z0-9_]+")


class Source(str, enum.Enum):
    """Where a constant's data comes from at load."""

    ENTRY = "entry"
    DERIVED = "derived"
    ABSENT = "absent"
    FOLDED = "folded"


#: sources of older layouts, refused with the advice to re-export: a state bound as a constant (before
#: ``aoti.state_inputs.v1``), a slot of the delegate's one weights entry (before ``aoti.named_constants.v1``)
LEGACY_SOURCES = {
    "state": f"a state bound as a constant, written before state became a library input ({STATE_INPUTS_FEATURE})",
    "weights": f"a slot of one weights entry per delegate, written before {NAMED_CONSTANTS_FEATURE}",
}


@dataclass(frozen=True, slots=True)
class CpuRecord:
    """``config.cpu``: what CPU the library's code needs (see the module docstring)."""

    target: str
    machine: str
    #: sorted, distinct Linux feature names
    features: tuple[str, ...]
    vec_isa: str
    march: str
    built_on: str
    kernels: str = KERNELS_PORTABLE


@dataclass(frozen=True, slots=True)
class Config:
    """Section ``config``."""

    device: str
    num_inputs: int
    num_outputs: int
    library_sha256: str
    state_inputs: tuple[int, ...]
    #: what CPU the library's code needs (for "cuda": its host code); None in blobs written before it was recorded
    cpu: CpuRecord | None = None


@dataclass(frozen=True, slots=True)
class TensorView:
    """The tensor a stored constant's bytes are."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Derivation:
    """How a ``derived`` constant is computed at load (see the module docstring)."""

    format: str
    weight_shape: tuple[int, int]
    #: stored plane ("blocks", "qdata", "scales", "mins") -> named-data key
    stored: tuple[tuple[str, str], ...]
    plane: str


@dataclass(frozen=True, slots=True)
class Constant:
    """One record of section ``constants``: what the container reported, and where the data comes from."""

    name: str
    fqn: str
    kind: ConstantKind
    folded: bool
    dtype_code: int
    nbytes: int
    source: Source
    view: TensorView | None = None  # exactly when source is ENTRY or DERIVED
    key: str | None = None  # exactly when source is ENTRY
    derive: Derivation | None = None  # exactly when source is DERIVED


@dataclass(frozen=True, slots=True)
class AotiBlob:
    """Everything an etsdk-aoti blob holds.

    ``library``: the compiled ``.so``; a file (streamed when encoding) or its bytes, and after :func:`decode`
    a zero-copy view of the payload whose SHA-256 was checked against ``config.library_sha256``.
    """

    config: Config
    constants: tuple[Constant, ...]
    library: Path | bytes | memoryview

    #: the library calls etsdk-aoti's quantized kernels (feature ``aoti.kernels.qmm.v1``)
    calls_kernels: bool = False
    #: the library calls etsdk-aoti's attention kernel (feature ``aoti.kernels.attention.v1``)
    calls_attention: bool = False
    #: the library calls the int8-cache attention kernel (feature ``aoti.kernels.attention_int8.v1``)
    calls_attention_int8: bool = False
    #: the library calls the attention kernel's form for a batch of sessions (feature ``aoti.kernels.attention_slots.v1``)
    calls_attention_slots: bool = False
    #: the library calls the float32 few-row GEMV (feature ``aoti.kernels.linear.v1``)
    calls_linear: bool = False
    #: ... with bfloat16 / float16 weights (feature ``aoti.kernels.linear16.v1``)
    calls_linear16: bool = False
    #: the library calls the ``:a8`` formats' product (feature ``aoti.kernels.qmm_a8.v1``)
    calls_qmm_a8: bool = False
    #: ... in its form for several weights that read the same input (feature ``aoti.kernels.qmm_a8_fused.v1``)
    calls_qmm_a8_fused: bool = False
    #: ... with int8 weights (feature ``aoti.kernels.qmm_a8_int8.v1``)
    calls_qmm_a8_int8: bool = False

    @property
    def calls_native(self) -> bool:
        """Whether the library calls into etsdk-aoti's kernels library (which must be loaded first)."""
        return (
            self.calls_kernels or self.calls_attention or self.calls_attention_int8 or self.calls_linear or self.calls_qmm_a8
            or self.calls_qmm_a8_fused or self.calls_attention_slots
        )

    def required_features(self) -> list[str]:
        features = [BLOB_FEATURE]
        if self.config.state_inputs:
            features.append(STATE_INPUTS_FEATURE)
        if any(c.source in (Source.ENTRY, Source.DERIVED) for c in self.constants):
            features.append(NAMED_CONSTANTS_FEATURE)
        if self.calls_kernels:
            features.append(KERNELS_FEATURE)
        if self.calls_attention:
            features.append(ATTENTION_FEATURE)
        if self.calls_attention_int8:
            features.append(ATTENTION_INT8_FEATURE)
        if self.calls_attention_slots:
            features.append(ATTENTION_SLOTS_FEATURE)
        if self.calls_linear:
            features.append(LINEAR_FEATURE)
        if self.calls_linear16:
            features.append(LINEAR16_FEATURE)
        if self.calls_qmm_a8:
            features.append(QMM_A8_FEATURE)
        if self.calls_qmm_a8_fused:
            features.append(QMM_A8_FUSED_FEATURE)
        if self.calls_qmm_a8_int8:
            features.append(QMM_A8_INT8_FEATURE)
        if self.config.cpu is not None:
            features.append(CPU_TARGET_FEATURE)
            if self.config.device != "cpu":
                features.append(HOST_CPU_TARGET_FEATURE)
        return features

    @property
    def folds_constants(self) -> bool:
        """Whether the library computes some constants itself (its constant folding runs at load)."""
        return any(c.source is Source.FOLDED for c in self.constants)


def library_sha256(library: Path | bytes | memoryview) -> str:
    """The hex SHA-256 ``config.library_sha256`` records (a file is read in chunks)."""
    digest = hashlib.sha256()
    if isinstance(library, Path):
        with library.open("rb") as f:
            while chunk := f.read(8 * 1024 * 1024):
                digest.update(chunk)
    else:
        digest.update(library)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------- encode


def _config_json(config: Config) -> dict[str, Any]:
    out: dict[str, Any] = {
        "device": config.device,
        "num_inputs": config.num_inputs,
        "num_outputs": config.num_outputs,
        "library_sha256": config.library_sha256,
        "state_inputs": list(config.state_inputs),
    }
    if config.cpu is not None:
        cpu = config.cpu
        out["cpu"] = {
            "target": cpu.target,
            "machine": cpu.machine,
            "features": list(cpu.features),
            "vec_isa": cpu.vec_isa,
            "march": cpu.march,
            "built_on": cpu.built_on,
            "kernels": cpu.kernels,
        }
    return out


def _constant_json(constant: Constant) -> dict[str, Any]:
    record: dict[str, Any] = {
        "name": constant.name,
        "fqn": constant.fqn,
        "kind": constant.kind.value,
        "folded": constant.folded,
        "dtype_code": constant.dtype_code,
        "nbytes": constant.nbytes,
        "source": constant.source.value,
    }
    if constant.view is not None:
        record.update(dtype=constant.view.dtype, shape=list(constant.view.shape), stride=list(constant.view.stride))
    if constant.key is not None:
        record["key"] = constant.key
    if constant.derive is not None:
        record["derive"] = {
            "format": constant.derive.format,
            "weight_shape": list(constant.derive.weight_shape),
            "stored": dict(constant.derive.stored),
            "plane": constant.derive.plane,
        }
    return record


def encode(blob: AotiBlob) -> bytes:
    """The payload of ``blob``, checked as :func:`decode` checks it (except the library's hash: the caller
    computed it with :func:`library_sha256`; the library file is read once, when written)."""
    config_json = _config_json(blob.config)
    constants_json = [_constant_json(c) for c in blob.constants]
    # what is written is what a reader accepts: the same checks, on the same JSON
    _parse_config(config_json, None)
    _check_constants(tuple(_parse_constant(r, i) for i, r in enumerate(constants_json)), blob.config)
    writer = BlobWriter(required_features=blob.required_features(), producer=PRODUCER)
    writer.add_section(CONFIG_SECTION, json.dumps(config_json).encode())
    writer.add_section(CONSTANTS_SECTION, json.dumps(constants_json).encode())
    if isinstance(blob.library, Path):
        writer.add_file_section(LIBRARY_SECTION, blob.library, alignment=LIBRARY_ALIGNMENT)
    else:
        writer.add_section(LIBRARY_SECTION, blob.library, alignment=LIBRARY_ALIGNMENT)
    return writer.to_bytes()


# ----------------------------------------------------------------------------------------------- decode


def decode(payload: memoryview | bytes, *, state_bindings: int | None = None) -> AotiBlob:
    """The blob in ``payload``, checked completely; ``library`` is a zero-copy view of it.

    ``state_bindings``: how many state bindings the delegate has (``len(context.states)``); ``state_inputs``
    must name every one, in order. Without it, ``state_inputs`` must be ``0..n-1`` for its own length.
    Raises :class:`etsdk.UnsupportedFeatureError` for a required feature this reader does not know and
    :class:`etsdk.BlobFormatError` naming the field, what was expected and what was found, for anything else.
    """
    reader = BlobReader(payload, known_features=KNOWN_FEATURES)
    config = _parse_config(_json(reader, CONFIG_SECTION), state_bindings)
    if config.state_inputs and STATE_INPUTS_FEATURE not in reader.required_features:
        raise BlobFormatError(
            f"etsdk-aoti blob: config.state_inputs names {len(config.state_inputs)} state binding(s), but the blob "
            f"does not require {STATE_INPUTS_FEATURE} (it requires {', '.join(reader.required_features)})"
        )
    if (config.cpu is not None) != (CPU_TARGET_FEATURE in reader.required_features):
        has = "has config.cpu" if config.cpu is not None else "has no config.cpu"
        raise BlobFormatError(
            f"etsdk-aoti blob: it {has}, which goes with requiring {CPU_TARGET_FEATURE} "
            f"(it requires {', '.join(reader.required_features)})"
        )
    host_code = config.cpu is not None and config.device != "cpu"
    if host_code != (HOST_CPU_TARGET_FEATURE in reader.required_features):
        has = f"a config.cpu for device {config.device!r}" if host_code else "no config.cpu for a device other than the CPU"
        raise BlobFormatError(
            f"etsdk-aoti blob: it has {has}, which goes with requiring {HOST_CPU_TARGET_FEATURE} "
            f"(it requires {', '.join(reader.required_features)})"
        )
    raw = _json(reader, CONSTANTS_SECTION)
    if not isinstance(raw, list):
        raise BlobFormatError(f"etsdk-aoti blob: section '{CONSTANTS_SECTION}' must be a list, found {type(raw).__name__}")
    constants = tuple(_parse_constant(record, i) for i, record in enumerate(raw))
    _check_constants(constants, config)
    named = any(c.source in (Source.ENTRY, Source.DERIVED) for c in constants)
    if named and NAMED_CONSTANTS_FEATURE not in reader.required_features:
        raise BlobFormatError(
            f"etsdk-aoti blob: constants read from named-data entries, but the blob does not require "
            f"{NAMED_CONSTANTS_FEATURE} (it requires {', '.join(reader.required_features)})"
        )
    library = reader.section(LIBRARY_SECTION)
    digest = library_sha256(library)
    if digest != config.library_sha256:
        raise BlobFormatError(
            f"etsdk-aoti: the compiled library's SHA-256 is {digest[:16]}..., the blob records "
            f"{config.library_sha256[:16]}...; refusing to load a damaged library"
        )
    features = reader.required_features
    return AotiBlob(
        config, constants, library, calls_kernels=KERNELS_FEATURE in features, calls_attention=ATTENTION_FEATURE in features,
        calls_attention_int8=ATTENTION_INT8_FEATURE in features, calls_attention_slots=ATTENTION_SLOTS_FEATURE in features,
        calls_linear=LINEAR_FEATURE in features,
        calls_linear16=LINEAR16_FEATURE in features, calls_qmm_a8=QMM_A8_FEATURE in features,
        calls_qmm_a8_fused=QMM_A8_FUSED_FEATURE in features, calls_qmm_a8_int8=QMM_A8_INT8_FEATURE in features,
    )


def describe(blob: AotiBlob) -> list[str]:
    """What ``etsdk inspect`` shows of a decoded blob: the device, and what CPU its code (a CUDA library's host
    code) was compiled for."""
    config = blob.config
    size = f"library {len(blob.library) if not isinstance(blob.library, Path) else blob.library.stat().st_size} bytes"
    lines = [f"device {config.device}, {size}, {len(blob.constants)} constant(s)"]
    cpu = config.cpu
    code = "" if config.device == "cpu" else " of the host code"
    if cpu is None:
        lines.append(f"cpu target{code}: not recorded (an older blob): built for its exporting host")
        return lines
    needs = " ".join(cpu.features) or "nothing beyond the baseline"
    lines += [
        f"cpu target{code}: {cpu.target} ({cpu.machine}): needs {needs}",
        f"cpu code: vector ISA {cpu.vec_isa}, -march={cpu.march}; etsdk-aoti kernels {cpu.kernels} (built where it runs)",
        f"built on: {cpu.built_on}",
    ]
    return lines


def _json(reader: BlobReader, name: str) -> Any:
    try:
        return json.loads(bytes(reader.section(name)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BlobFormatError(f"etsdk-aoti blob section '{name}' is not valid JSON: {exc}") from None


class _Fields:
    """Strict readers of one JSON object, naming the field that is wrong, what it must be and what it is."""

    def __init__(self, obj: Any, where: str) -> None:
        if not isinstance(obj, dict):
            raise BlobFormatError(f"etsdk-aoti blob: {where} must be an object, found {type(obj).__name__}")
        self.obj, self.where = obj, where

    def get(self, key: str) -> Any:
        if key not in self.obj:
            raise BlobFormatError(f"etsdk-aoti blob: {self.where} has no '{key}'")
        return self.obj[key]

    def fail(self, key: str, expected: str) -> BlobFormatError:
        return BlobFormatError(f"etsdk-aoti blob: {self.where}.{key} must be {expected}, found {self.obj.get(key)!r}")

    def text(self, key: str, *, empty: bool = False) -> str:
        value = self.get(key)
        if not isinstance(value, str) or (not value and not empty):
            raise self.fail(key, "a string" if empty else "a non-empty string")
        return value

    def integer(self, key: str) -> int:
        value = self.get(key)
        if not _is_int(value):
            raise self.fail(key, "an integer")
        return int(value)

    def size(self, key: str) -> int:
        value = self.get(key)
        if not _is_int(value) or value < 0:
            raise self.fail(key, "a non-negative integer")
        return int(value)

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false")
        return value

    def sizes(self, key: str) -> tuple[int, ...]:
        value = self.get(key)
        if not isinstance(value, list) or not all(_is_int(d) and d >= 0 for d in value):
            raise self.fail(key, "a list of non-negative integers")
        return tuple(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_config(raw: Any, state_bindings: int | None) -> Config:
    f = _Fields(raw, CONFIG_SECTION)
    device = f.text("device")
    if not _DEVICE.fullmatch(device):
        raise f.fail("device", "'cpu', 'cuda' or 'cuda:N'")
    sha = f.text("library_sha256")
    if not _SHA256.fullmatch(sha):
        raise f.fail("library_sha256", "64 lowercase hex digits")
    indices = f.get("state_inputs")
    count = state_bindings if state_bindings is not None else len(indices) if isinstance(indices, list) else 0
    expected = list(range(count))
    # the serializer passes every state binding, in binding order: anything else (a permutation of same-shaped
    # caches would swap them silently) is a damaged or foreign blob
    if not isinstance(indices, list) or indices != expected or not all(_is_int(i) for i in indices):
        raise BlobFormatError(
            f"etsdk-aoti blob: config.state_inputs must be {expected} (every state binding in order), found {indices!r}"
        )
    cpu = None
    if "cpu" in f.obj:  # every device: a CUDA library's host code is compiled for a CPU too
        cpu = _parse_cpu(f.obj["cpu"])
    return Config(
        device=device,
        num_inputs=f.size("num_inputs"),
        num_outputs=f.size("num_outputs"),
        library_sha256=sha,
        state_inputs=tuple(indices),
        cpu=cpu,
    )


def _parse_cpu(raw: Any) -> CpuRecord:
    f = _Fields(raw, f"{CONFIG_SECTION}.cpu")
    machine = f.text("machine")
    if not _FEATURE_NAME.fullmatch(machine):
        raise f.fail("machine", "a machine name such as 'x86_64' or 'aarch64'")
    features = f.get("features")
    if (
        not isinstance(features, list)
        or not all(isinstance(x, str) and _FEATURE_NAME.fullmatch(x) for x in features)
        or features != sorted(set(features))
    ):
        raise f.fail("features", "a sorted list of distinct feature names (lowercase letters, digits, '_')")
    kernels = f.text("kernels")
    if kernels != KERNELS_PORTABLE:
        raise f.fail("kernels", repr(KERNELS_PORTABLE))
    return CpuRecord(
        target=f.text("target"),
        machine=machine,
        features=tuple(features),
        vec_isa=f.text("vec_isa"),
        march=f.text("march"),
        built_on=f.text("built_on"),
        kernels=kernels,
    )


_KINDS = {kind.value: kind for kind in ConstantKind}
_SOURCES = {source.value: source for source in Source}


def _parse_constant(raw: Any, index: int) -> Constant:
    f = _Fields(raw, f"constants[{index}]")
    name = f.text("name")
    f.where = f"constants[{index}] ('{name}')"
    kind_name = f.get("kind")
    kind = _KINDS.get(kind_name) if isinstance(kind_name, str) else None
    if kind is None:
        raise f.fail("kind", f"one of {', '.join(_KINDS)}")
    source_name = f.get("source")
    if isinstance(source_name, str) and source_name in LEGACY_SOURCES:
        raise BlobFormatError(
            f"constant '{name}' has source {source_name!r}: {LEGACY_SOURCES[source_name]}; re-export the program"
        )
    source = _SOURCES.get(source_name) if isinstance(source_name, str) else None
    if source is None:
        raise BlobFormatError(
            f"constant '{name}' has unknown source {source_name!r} (expected one of {', '.join(_SOURCES)})"
        )
    view = derive = None
    key: str | None = None
    if source in (Source.ENTRY, Source.DERIVED):
        shape, stride = f.sizes("shape"), f.sizes("stride")
        if len(shape) != len(stride):
            raise BlobFormatError(
                f"etsdk-aoti blob: {f.where}: shape {list(shape)} and stride {list(stride)} differ in length"
            )
        view = TensorView(f.text("dtype"), shape, stride)
    if source is Source.ENTRY:
        key = f.text("key")
    if source is Source.DERIVED:
        derive = _parse_derivation(f.get("derive"), f.where)
    return Constant(
        name=name,
        fqn=f.text("fqn", empty=True),
        kind=kind,
        folded=f.flag("folded"),
        dtype_code=f.integer("dtype_code"),
        nbytes=f.size("nbytes"),
        source=source,
        view=view,
        key=key,
        derive=derive,
    )


_PLANES = ("qdata", "scales", "mins")
_STORED = ("blocks", *_PLANES)


def _parse_derivation(raw: Any, where: str) -> Derivation:
    from etsdk.backend import WeightFormat

    f = _Fields(raw, f"{where}.derive")
    name = f.text("format")
    try:
        fmt = WeightFormat.parse(name)
    except ValueError as exc:
        raise BlobFormatError(f"etsdk-aoti blob: {f.where}.format: {exc}") from None
    shape = f.sizes("weight_shape")
    if len(shape) != 2:
        raise f.fail("weight_shape", "[rows, columns]")
    try:
        expected = set(fmt.planes(shape[0], shape[1]))
    except ValueError as exc:
        raise BlobFormatError(f"etsdk-aoti blob: {f.where}: {exc}") from None
    stored = f.get("stored")
    if not isinstance(stored, dict) or set(stored) != expected or not all(isinstance(k, str) and k for k in stored.values()):
        raise f.fail("stored", f"an object with the keys {sorted(expected)} (named-data keys)")
    plane = f.text("plane")
    if plane not in _PLANES:
        raise f.fail("plane", f"one of {', '.join(_PLANES)}")
    return Derivation(name, (shape[0], shape[1]), tuple(sorted(stored.items())), plane)


def _check_constants(constants: tuple[Constant, ...], config: Config) -> None:
    names = [c.name for c in constants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise BlobFormatError(f"etsdk-aoti blob: constant name(s) {', '.join(duplicates)} are described twice")
    for constant in constants:
        stored = constant.source in (Source.ENTRY, Source.DERIVED)
        if (
            (constant.view is None) == stored
            or (constant.key is None) == (constant.source is Source.ENTRY)
            or (constant.derive is None) == (constant.source is Source.DERIVED)
        ):
            raise BlobFormatError(
                f"etsdk-aoti blob: constant '{constant.name}' with source {constant.source.value!r} must describe "
                "its tensor, key or derivation exactly as its source requires"
            )
