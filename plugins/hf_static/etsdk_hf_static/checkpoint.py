"""A transformers model whose parameters are the checkpoint's safetensors bytes, memory-mapped: no copy in memory.

``AutoModelForCausalLM.from_pretrained`` allocates every parameter and reads the checkpoint into it, so an export
starts with the whole model in anonymous memory. :func:`load_mapped` builds the model from its config with its
parameters on the meta device (buffers such as rotary frequencies are computed as usual), then assigns each
parameter a zero-copy view of its tensor in the checkpoint's ``*.safetensors`` files, mapped copy-on-write: the
bytes stay in the page cache, read when the export hashes and stores them, and the kernel can drop and re-read
them under memory pressure. Tied parameters (an output head sharing the embedding) are tied again after.

Each file is checked before any tensor is made (:func:`map_safetensors`): the header's size, its JSON, every
tensor's dtype, shape and byte range inside the file; a problem is an :class:`etsdk.ExportError` naming the file,
the tensor and what was expected. A checkpoint this path cannot bind exactly (a tensor in another dtype than the
model's float32, names that differ from the model's, a missing tensor) returns None with the reason, and the
exporter loads it with ``from_pretrained`` instead (and says so).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etsdk import ExportError

__all__ = ["Mapped", "checkpoint_files", "load_mapped", "map_safetensors"]

#: safetensors dtype names -> torch dtype names
_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}
#: a header larger than this is not a safetensors header (the format's own reader refuses above 100 MB)
_MAX_HEADER = 100 * 2**20


@dataclass(frozen=True)
class Mapped:
    """The model, the files its parameters map, and how many bytes of parameters they map."""

    model: Any
    files: tuple[Path, ...]
    mapped_bytes: int


def checkpoint_files(directory: Path) -> list[Path]:
    """The directory's safetensors files: those ``model.safetensors.index.json`` names, else every ``*.safetensors``."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ExportError(f"{index}: expected a JSON object with a 'weight_map' of tensor -> file, found {exc!r}") from None
        if any(not isinstance(n, str) or "/" in n or "\\" in n for n in names):
            raise ExportError(f"{index}: weight_map names files outside {directory}: {names}")
        return [directory / name for name in names]
    return sorted(directory.glob("*.safetensors"))


def map_safetensors(path: Path) -> dict[str, Any]:
    """Every tensor of the safetensors file ``path`` as a zero-copy view of the file, mapped copy-on-write.

    Checks the header before making any tensor: an ``ExportError`` names the file, the tensor and the problem.
    """
    import torch

    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            if size < 8:
                raise ExportError(f"{path}: expected a safetensors file (an 8-byte header size first), found {size} bytes")
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(_MAX_HEADER, size - 8):
                raise ExportError(f"{path}: the header claims {length} bytes, the file has {size - 8} after the size field")
            try:
                header = json.loads(f.read(length))
            except ValueError as exc:
                raise ExportError(f"{path}: the safetensors header is not JSON ({exc})") from None
            if not isinstance(header, dict):
                raise ExportError(f"{path}: expected a JSON object as the header, found {type(header).__name__}")
            region = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size > 8 + length else None
    except OSError as exc:
        raise ExportError(f"cannot read {path}: {exc.strerror or exc}") from None
    start = 8 + length
    tensors: dict[str, Any] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor '{name}'"
        if not isinstance(entry, dict) or set(entry) - {"dtype", "shape", "data_offsets"}:
            raise ExportError(f"{where}: expected {{dtype, shape, data_offsets}}, found {entry!r}")
        dtype = _DTYPES.get(entry.get("dtype"))  # type: ignore[arg-type]
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if dtype is None:
            raise ExportError(f"{where}: unknown dtype {entry.get('dtype')!r} (known: {', '.join(_DTYPES)})")
        if not isinstance(shape, list) or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
            raise ExportError(f"{where}: expected a shape of non-negative integers, found {shape!r}")
        if (
            not isinstance(offsets, list) or len(offsets) != 2
            or any(isinstance(o, bool) or not isinstance(o, int) for o in offsets) or not 0 <= offsets[0] <= offsets[1]
        ):
            raise ExportError(f"{where}: expected data_offsets [begin, end] with 0 <= begin <= end, found {offsets!r}")
        torch_dtype = getattr(torch, dtype)
        count = 1
        for d in shape:
            count *= d
        want = count * torch.empty((), dtype=torch_dtype).element_size()
        if offsets[1] - offsets[0] != want:
            raise ExportError(f"{where}: {dtype} {shape} takes {want} bytes, its data_offsets span {offsets[1] - offsets[0]}")
        if start + offsets[1] > size:
            raise ExportError(f"{where}: its bytes end at {start + offsets[1]}, past the end of the file ({size} bytes)")
        if count == 0 or region is None:
            tensors[name] = torch.empty(shape, dtype=torch_dtype)
            continue
        with warnings_quiet():  # a copy-on-write map is writable: torch's warning about read-only buffers never applies
            flat = torch.frombuffer(region, dtype=torch_dtype, count=count, offset=start + offsets[0])
        tensors[name] = flat.view(shape)
    return tensors


@contextlib.contextmanager
def warnings_quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Within the block every parameter a module registers moves to the meta device (buffers stay real)."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: Any) -> None:
        register(module, name, param)
        if param is not None:
            kind = type(param)
            module._parameters[name] = kind(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def load_mapped(directory: Path) -> tuple[Mapped | None, str]:
    """The causal LM of ``directory`` with every parameter mapped from its safetensors files, and ``""``; or
    ``(None, why)`` when the checkpoint cannot be bound exactly (the caller loads it another way)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    files = checkpoint_files(directory)
    if not files:
        return None, "no *.safetensors files"
    tensors: dict[str, Any] = {}
    for path in files:
        for name, tensor in map_safetensors(path).items():
            if name in tensors:
                raise ExportError(f"{path}: tensor '{name}' is also in another file of {directory}")
            tensors[name] = tensor
    other = sorted({str(t.dtype).removeprefix("torch.") for t in tensors.values() if t.dtype != torch.float32})
    if other:
        return None, f"tensors in {', '.join(other)} (the program is float32: they are converted in memory)"
    config = AutoConfig.from_pretrained(directory)
    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    unexpected = sorted(set(tensors) - names)
    if unexpected:
        return None, f"checkpoint names the model does not use as they are ({', '.join(unexpected[:3])}...)"
    for name, param in model.named_parameters(remove_duplicate=False):
        if name in tensors and tuple(param.shape) != tuple(tensors[name].shape):
            raise ExportError(
                f"{directory}: tensor '{name}' is {list(tensors[name].shape)} in the checkpoint, the model's config "
                f"makes it {list(param.shape)}"
            )
    model.load_state_dict(tensors, strict=False, assign=True)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    missing = sorted(name for name, param in model.named_parameters() if param.device.type == "meta")
    if missing:
        return None, f"the checkpoint lacks {', '.join(missing[:3])}"
    if (directory / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(directory)
    mapped_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return Mapped(model.eval(), tuple(files), mapped_bytes), ""
