"""``etsdk::attention``: attention under a boolean mask that reads only the key / value rows some query sees.

A decode step over a static cache of S rows needs only the rows written so far; ``scaled_dot_product_attention``
with a mask still reads all S of them, so its cost grows with the capacity, not with the conversation. This
operator has SDPA's meaning exactly (a masked-out row contributes nothing) and says how to skip the rest: only
rows ``0 .. n-1`` are read, where ``n`` is one past the last column any query row may see. Exporters call it
where a mask bounds the attention (``etsdk_hf_static`` does, for backends that declare
:attr:`etsdk.Capability.FILLED_ATTENTION`); backends claim it and replace it with a kernel that stops at ``n``
(etsdk-aoti) or run its reference below (the reference backend).

Schema::

    etsdk::attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scale,
                     Tensor? key_scale=None, Tensor? value_scale=None) -> Tensor

``query`` ``[B, Hq, L, E]``, ``key`` ``[B, H, S, E]``, ``value`` ``[B, H, S, Ev]`` with ``Hq`` a multiple of ``H``
(grouped-query attention: query head ``h`` reads key / value head ``h // (Hq / H)``), ``mask`` bool ``[B or 1, 1,
L, S]`` (True: visible; every query row sees at least one column). Returns ``[B, Hq, L, Ev]`` in the query's dtype.

Int8 caches: with ``key_scale`` and ``value_scale`` (float32 ``[B, H, S, 1]``), ``key`` and ``value`` are int8
rows quantized by :func:`quantize_rows` (one scale per row of each head) and the operator attends over
``key * key_scale`` and ``value * value_scale``; a backend that declares ``FILLED_ATTENTION`` computes both forms.
Importing this module registers the operator with torch (once per process).
"""

from __future__ import annotations

import threading

import torch

__all__ = ["ATTENTION", "attention_rows_read", "calls_attention", "dequantize_rows", "filled_rows", "quantize_rows"]

_counter_lock = threading.Lock()
_rows_read = 0


def filled_rows(mask: torch.Tensor) -> int:
    """``n``: one past the last column of ``mask`` ``[..., L, S]`` that some row sees (at least 1)."""
    seen = mask.reshape(-1, mask.shape[-1]).any(dim=0)
    last = torch.nonzero(seen)
    return int(last[-1, 0]) + 1 if last.numel() else 1


def attention_rows_read() -> int:
    """Key / value rows the reference implementation of ``etsdk::attention`` has read in this process (the sum
    of ``n`` over its calls): what a test checks to see that attention follows the filled rows."""
    return _rows_read


def quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` ``[..., D]`` as int8 rows and float32 scales ``[..., 1]``: symmetric, one scale per row (its largest
    magnitude / 127; a row of zeros gets scale 0). The int8 key / value cache format of :data:`ATTENTION`; what an
    exporter writes into an int8 cache, in the traced graph and in eager PyTorch alike."""
    rows = rows.to(torch.float32)
    scale = rows.abs().amax(dim=-1, keepdim=True) / 127.0
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(rows / divisor).clamp(-127, 127).to(torch.int8), scale


def dequantize_rows(rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Int8 ``rows`` ``[..., D]`` with their ``scale`` ``[..., 1]`` as float32 (the inverse of :func:`quantize_rows`)."""
    return rows.to(torch.float32) * scale


def _check(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
    key_scale: torch.Tensor | None = None, value_scale: torch.Tensor | None = None,
) -> None:
    """The operator's operands, or a ValueError saying which one is not what the schema says (at export too)."""
    problems = []
    if (key_scale is None) != (value_scale is None):
        problems.append("key_scale and value_scale both or neither")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or mask.dim() != 4:
        problems.append(f"4-D operands, found query {list(query.shape)}, key {list(key.shape)}, value {list(value.shape)}, mask {list(mask.shape)}")
    else:
        B, Hq, L, E = query.shape
        _, H, S, _ = key.shape
        if mask.dtype != torch.bool:
            problems.append(f"a bool mask, found {mask.dtype}")
        if tuple(key.shape) != (B, H, S, E) or tuple(value.shape[:3]) != (B, H, S):
            problems.append(f"key [B, H, S, {E}] and value [B, H, S, Ev] for query {list(query.shape)}, found key {list(key.shape)}, value {list(value.shape)}")
        elif H == 0 or Hq % H:
            problems.append(f"query heads a multiple of key heads, found {Hq} and {H}")
        if key_scale is not None and value_scale is not None:
            if key.dtype != torch.int8 or value.dtype != torch.int8:
                problems.append(f"int8 key and value with scales, found {key.dtype} and {value.dtype}")
            for name, given in (("key_scale", key_scale), ("value_scale", value_scale)):
                if given.dtype != torch.float32 or tuple(given.shape) != (B, H, S, 1):
                    problems.append(f"{name} float32 {[B, H, S, 1]}, found {given.dtype} {list(given.shape)}")
        elif key.dtype == torch.int8 or value.dtype == torch.int8:
            problems.append("key_scale and value_scale with int8 key and value")
        if mask.shape[0] not in (1, B) or tuple(mask.shape[1:]) != (1, L, S):
            problems.append(f"mask [1 or {B}, 1, {L}, {S}], found {list(mask.shape)}")
    if problems:
        raise ValueError(f"etsdk::attention expects {'; '.join(problems)}")


@torch.library.custom_op("etsdk::attention", mutates_args=())
def _attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
    key_scale: torch.Tensor | None = None, value_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    global _rows_read
    _check(query, key, value, mask, key_scale, value_scale)
    n = filled_rows(mask)
    with _counter_lock:
        _rows_read += n
    keys, values = key[:, :, :n], value[:, :, :n]
    if key_scale is not None and value_scale is not None:
        keys = dequantize_rows(keys, key_scale[:, :, :n]).to(query.dtype)
        values = dequantize_rows(values, value_scale[:, :, :n]).to(query.dtype)
    return torch.nn.functional.scaled_dot_product_attention(
        query, keys, values, attn_mask=mask[..., :n], scale=scale, enable_gqa=query.shape[1] != key.shape[1]
    )


@_attention.register_fake
def _(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
    key_scale: torch.Tensor | None = None, value_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    _check(query, key, value, mask, key_scale, value_scale)
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


#: The operator's overload, for graph rewrites and claims (``node.target is ATTENTION``).
ATTENTION = torch.ops.etsdk.attention.default


def calls_attention(node: object) -> bool:
    """Whether ``node`` (an FX node, ATen or edge dialect) calls ``etsdk::attention``."""
    if getattr(node, "op", None) != "call_function":
        return False
    target = getattr(node, "target", None)
    return (target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", None)) is ATTENTION
