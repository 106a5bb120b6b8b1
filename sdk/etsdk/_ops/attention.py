"""``etsdk::attention``: attention under a boolean mask that reads only the key / value rows some query sees.

A decode step over a static cache of S rows needs only the rows written so far; ``scaled_dot_product_attention``
with a mask still reads all S of them, so its cost grows with the capacity, not with the conversation. This
operator has SDPA's meaning exactly (a masked-out row contributes nothing) and says how to skip the rest: only
rows ``0 .. n-1`` are read, where ``n`` is one past the last column any query row may see. Exporters call it
where a mask bounds the attention (``etsdk_hf_static`` does, for backends that declare
:attr:`etsdk.Capability.FILLED_ATTENTION`); backends claim it and replace it with a kernel that stops at ``n``
(etsdk-aoti) or run its reference below (the reference backend).

Schema::

    etsdk::attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scale) -> Tensor

``query`` ``[B, Hq, L, E]``, ``key`` ``[B, H, S, E]``, ``value`` ``[B, H, S, Ev]`` with ``Hq`` a multiple of ``H``
(grouped-query attention: query head ``h`` reads key / value head ``h // (Hq / H)``), ``mask`` bool ``[B or 1, 1,
L, S]`` (True: visible; every query row sees at least one column). Returns ``[B, Hq, L, Ev]``. Importing this
module registers it with torch (once per process).
"""

from __future__ import annotations

import threading

import torch

__all__ = ["ATTENTION", "attention_rows_read", "calls_attention", "filled_rows"]

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


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> None:
    """The operator's operands, or a ValueError saying which one is not what the schema says (at export too)."""
    problems = []
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
        if mask.shape[0] not in (1, B) or tuple(mask.shape[1:]) != (1, L, S):
            problems.append(f"mask [1 or {B}, 1, {L}, {S}], found {list(mask.shape)}")
    if problems:
        raise ValueError(f"etsdk::attention expects {'; '.join(problems)}")


@torch.library.custom_op("etsdk::attention", mutates_args=())
def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    global _rows_read
    _check(query, key, value, mask)
    n = filled_rows(mask)
    with _counter_lock:
        _rows_read += n
    return torch.nn.functional.scaled_dot_product_attention(
        query, key[:, :, :n], value[:, :, :n], attn_mask=mask[..., :n], scale=scale, enable_gqa=query.shape[1] != key.shape[1]
    )


@_attention.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    _check(query, key, value, mask)
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


#: The operator's overload, for graph rewrites and claims (``node.target is ATTENTION``).
ATTENTION = torch.ops.etsdk.attention.default


def calls_attention(node: object) -> bool:
    """Whether ``node`` (an FX node, ATen or edge dialect) calls ``etsdk::attention``."""
    if getattr(node, "op", None) != "call_function":
        return False
    target = getattr(node, "target", None)
    return (target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", None)) is ATTENTION
