"""16-bit weights computed in float32: a bfloat16 / float16 checkpoint's matrices stay 16-bit in the program.

:func:`keep_16bit_weights` swaps each ``torch.nn.Linear`` / ``torch.nn.Embedding``
whose weight is bfloat16 or float16 for a :class:`WidenedLinear` /
:class:`WidenedEmbedding` that keeps the weight as it is and widens it to float32
where it is used, and converts every other parameter and buffer (norms, biases,
rotary tables) to float32. The model then computes exactly what the same model
upcast to float32 computes (a 16-bit value is exact in float32), while its
program stores half the bytes per weight and a decode step reads half as many.

Why not run the model in bfloat16: the contracts' caches and logits are float32,
and CPUs without bfloat16 arithmetic convert every value anyway; widening only
the weights keeps the activations' precision and the contract, and a backend
that reads 16-bit weights natively (etsdk-aoti's GEMV) does the widening in
registers. Every backend runs the exported graph (``_to_copy`` of the weight
feeding ``linear``) without knowing about this module.

A weight tied between the embedding and the output head stays one tensor.
Loading the checkpoint in its own dtype leaves its tensors memory-mapped from the
file (transformers does this for safetensors), so nothing model-sized is copied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["WIDENED_DTYPES", "WideningReport", "WidenedEmbedding", "WidenedLinear", "keep_16bit_weights"]

#: The weight dtypes :func:`keep_16bit_weights` keeps.
WIDENED_DTYPES = (torch.bfloat16, torch.float16)


def _parameter(weight: torch.Tensor) -> torch.nn.Parameter:
    """``weight`` itself when it is a parameter (a tied weight stays one object), else a parameter over its storage."""
    return weight if isinstance(weight, torch.nn.Parameter) else torch.nn.Parameter(weight, requires_grad=False)


class WidenedLinear(torch.nn.Module):
    """``y = x @ weight.float().T + bias``, the weight kept 16-bit (a constant of the exported program)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        if weight.dtype not in WIDENED_DTYPES or weight.dim() != 2:
            raise ValueError(f"WidenedLinear keeps a 2-D bfloat16 or float16 weight, found {weight.dtype} {list(weight.shape)}")
        self.weight = _parameter(weight)
        self.bias = torch.nn.Parameter(bias.detach().float(), requires_grad=False) if bias is not None else None
        self.out_features, self.in_features = (int(d) for d in weight.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ w.T + bias`` in ``x``'s dtype (float32)."""
        return torch.nn.functional.linear(x, self.weight.to(x.dtype), self.bias)

    def extra_repr(self) -> str:
        """``in_features=..., out_features=..., weight=bfloat16``."""
        return f"in_features={self.in_features}, out_features={self.out_features}, weight={str(self.weight.dtype)[6:]}"


class WidenedEmbedding(torch.nn.Module):
    """Rows of a 16-bit table widened to float32 (times ``scale``, as Gemma scales its embeddings)."""

    def __init__(self, weight: torch.Tensor, padding_idx: int | None = None, scale: Any = None) -> None:
        super().__init__()
        if weight.dtype not in WIDENED_DTYPES or weight.dim() != 2:
            raise ValueError(f"WidenedEmbedding keeps a 2-D bfloat16 or float16 table, found {weight.dtype} {list(weight.shape)}")
        self.weight = _parameter(weight)
        self.padding_idx = padding_idx
        self.scale = scale.float() if isinstance(scale, torch.Tensor) else scale
        self.num_embeddings, self.embedding_dim = (int(d) for d in weight.shape)

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        """The rows ``indices`` picks, in float32."""
        out = torch.nn.functional.embedding(indices, self.weight).float()
        return out * self.scale if self.scale is not None else out

    def extra_repr(self) -> str:
        """``num_embeddings, embedding_dim, weight=bfloat16``."""
        return f"{self.num_embeddings}, {self.embedding_dim}, weight={str(self.weight.dtype)[6:]}"


@dataclass
class WideningReport:
    """What :func:`keep_16bit_weights` did."""

    #: Module name -> the dtype its weight keeps (``bfloat16`` / ``float16``).
    kept: dict[str, str] = field(default_factory=dict)
    #: Bytes of the weights kept 16-bit (a tied weight counted once).
    kept_bytes: int = 0
    #: Bytes of the parameters and buffers converted to float32 (before conversion).
    converted_bytes: int = 0

    def summary(self) -> str:
        """One line: how many layers keep which dtype, and their size."""
        dtypes = sorted(set(self.kept.values()))
        return (
            f"{len(self.kept)} linear / embedding weights kept {' / '.join(dtypes) or 'as they are'} "
            f"({self.kept_bytes / 2**20:.1f} MiB), computed in float32"
        )


def keep_16bit_weights(model: torch.nn.Module) -> WideningReport:
    """Keep ``model``'s 16-bit linear / embedding weights, convert the rest to float32, compute in float32.

    Changes ``model`` in place. A ``torch.nn.Linear`` / ``torch.nn.Embedding`` (or an embedding subclass
    with an ``embed_scale``) whose weight is bfloat16 or float16 becomes a :class:`WidenedLinear` /
    :class:`WidenedEmbedding` holding the same tensor (no copy); quantized layers
    (:func:`etsdk.quantize_model`) compute in float32 too, their stored tensors kept as their format stores them
    (float16 scales stay float16). Other modules' floating-point parameters and buffers become float32. A model
    with no 16-bit weight is only converted.
    """
    from etsdk._quant.modules import QuantizedEmbedding, _set, _Stored

    report = WideningReport()
    seen: set[int] = set()
    swaps: list[tuple[str, torch.nn.Module]] = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, QuantizedEmbedding):
            module.dtype = torch.float32
            if isinstance(module.scale, torch.Tensor):
                module.scale = module.scale.float()
            continue
        if not isinstance(weight, torch.Tensor) or weight.dtype not in WIDENED_DTYPES or weight.dim() != 2:
            continue
        if type(module) is torch.nn.Linear:
            swaps.append((name, WidenedLinear(weight, module.bias)))
        elif type(module) is torch.nn.Embedding or (isinstance(module, torch.nn.Embedding) and hasattr(module, "embed_scale")):
            swaps.append((name, WidenedEmbedding(weight, module.padding_idx, getattr(module, "embed_scale", None))))
        else:
            continue
        report.kept[name] = str(weight.dtype).removeprefix("torch.")
        if id(weight) not in seen:
            seen.add(id(weight))
            report.kept_bytes += weight.numel() * weight.element_size()
    for name, replacement in swaps:
        _set(model, name, replacement)
    kept = {id(module.weight) for module in model.modules() if isinstance(module, (WidenedLinear, WidenedEmbedding))}
    # a quantized layer's stored tensors are its format's bytes (float16 scales stay float16): never converted
    kept |= {id(t) for module in model.modules() if isinstance(module, _Stored) for t in module.parameters(recurse=False)}
    for module in model.modules():
        for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if tensor is None or id(tensor) in kept or not tensor.is_floating_point() or tensor.dtype == torch.float32:
                continue
            report.converted_bytes += tensor.numel() * tensor.element_size()
            converted = tensor.detach().float()
            if isinstance(tensor, torch.nn.Parameter):
                setattr(module, name, torch.nn.Parameter(converted, requires_grad=False))
            else:
                module._buffers[name] = converted
    return report
