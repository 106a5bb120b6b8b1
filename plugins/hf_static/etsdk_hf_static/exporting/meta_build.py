"""A transformers model built from its ``config.json`` with every parameter on the meta device, and the
checkpoint's tensors that give them their values (``etsdk export --meta-trace``).

The model is a description (names, dtypes, shapes) while :func:`etsdk.lower` traces it; then its weights are bound,
as the tensors of the checkpoint's safetensors files, memory-mapped (nothing copied), each read once by the backend
that stores it (a weight converted to another dtype is converted into a file before tracing). Buffers are built for
real (they are computed from the config, not stored: rotary frequencies) and so are the wrapper's caches.

Only parameters go to the meta device, by registering each one there as the model is built: under
``torch.device("meta")`` the rotary frequencies would be meta too, and their values are not in the checkpoint.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from etsdk import ExportError

__all__ = ["checkpoint_tensors", "described_model", "parameters_on_meta", "weight_values"]


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Within the block, every parameter a module registers is moved to the meta device as it is registered (a
    layer's CPU tensor exists only until its constructor registers it, and is never written: no memory is used)."""
    import torch

    original = torch.nn.Module.register_parameter

    def register_on_meta(self: Any, name: str, param: Any) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(self, name, param)

    torch.nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def described_model(directory: Path, dtype: Any) -> Any:
    """The causal LM that ``directory``'s ``config.json`` describes, its parameters on the meta device in ``dtype``
    (the checkpoint's), with its generation config (end-of-sequence ids) as ``from_pretrained`` reads it."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    try:
        config = AutoConfig.from_pretrained(directory)
        with parameters_on_meta():
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - an unknown architecture or a damaged config: one clear error
        raise ExportError(f"transformers could not build a causal LM from {directory / 'config.json'}: {type(exc).__name__}: {exc}") from exc
    if (directory / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(directory)
    return model.eval()


def checkpoint_tensors(directory: Path) -> dict[str, Any]:
    """Every tensor of ``directory``'s safetensors checkpoint (``model.safetensors``, or the shards its
    ``model.safetensors.index.json`` names), memory-mapped from the files by name."""
    from safetensors import safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ExportError(f"{index} is not a safetensors index (a 'weight_map' of tensor -> file): {exc}") from None
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ExportError(f"--meta-trace reads a safetensors checkpoint; {directory} has neither model.safetensors nor model.safetensors.index.json")
    tensors: dict[str, Any] = {}
    for name in files:
        path = directory / name
        try:
            with safe_open(str(path), framework="pt") as handle:  # the tensors keep their mapping alive
                for key in handle.keys():
                    tensors[key] = handle.get_tensor(key)
        except Exception as exc:  # noqa: BLE001 - SafetensorError from a damaged file: one clear error
            raise ExportError(f"cannot read {path} as safetensors: {type(exc).__name__}: {exc}") from None
    return tensors


def weight_values(model: Any, checkpoint: Mapping[str, Any], prefix: str, spill: Any = None) -> dict[str, Any]:
    """``lower(weights=...)`` for ``model``'s meta parameters and buffers, named as the module that wraps it at
    ``prefix`` names them: each one's checkpoint tensor, converted to the dtype the export gave it (16-bit weights
    upcast by ``--weights-dtype float32``, norms computed in float32) in a file of ``spill`` when given, else in
    memory. A weight the checkpoint holds under none of its names (a tied head is stored once, under the
    embedding's) is refused, named."""
    values: dict[str, Any] = {}
    done: set[int] = set()
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    described = {id(t): n for n, t in reversed(named) if t is not None and t.device.type == "meta"}  # first names
    for name, tensor in named:
        if tensor is None or tensor.device.type != "meta" or id(tensor) in done or name not in checkpoint:
            continue
        done.add(id(tensor))
        stored = checkpoint[name]
        if tuple(stored.shape) != tuple(tensor.shape):
            raise ExportError(f"the checkpoint's '{name}' is {list(stored.shape)}; the model's config describes {list(tensor.shape)}")
        if stored.dtype != tensor.dtype:
            stored = spill.convert(stored, tensor.dtype) if spill is not None else stored.to(tensor.dtype)
        values[prefix + name] = stored
    missing = [name for key, name in described.items() if key not in done]
    if missing:
        raise ExportError(
            f"the checkpoint has no tensor {', '.join(repr(m) for m in missing[:3])}{' ...' if len(missing) > 3 else ''} "
            f"({len(missing)} of the model's {len(described)} weights are missing); is it this config's checkpoint?"
        )
    return values
