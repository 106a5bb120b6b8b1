"""``etsdk::attention`` in an AOTInductor partition: the native kernel on the CPU, SDPA elsewhere.

The core's ``etsdk::attention`` is SDPA under a boolean mask that reads only the key / value rows some query
sees. On the CPU every call is pointed at :data:`etsdk_aoti.kernels.KERNEL_ATTENTION` (``attention.cpp``: stops
at the last visible row, so an LLM's decode step costs what the conversation holds), or, for int8 caches, at
:data:`~etsdk_aoti.kernels.KERNEL_ATTENTION_INT8`; the compiled library then calls the kernels library, and the
blob requires :data:`~etsdk_aoti.blob_format.ATTENTION_FEATURE` (and
:data:`~etsdk_aoti.blob_format.ATTENTION_INT8_FEATURE`). On CUDA it becomes SDPA over every row (full-length:
no CUDA kernel yet), int8 rows dequantized first.
"""

from __future__ import annotations

import torch

from etsdk_aoti import kernels

__all__ = ["kernel_attention", "kernel_attention_int8", "rewrite_attention"]


def kernel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``etsdk::attention`` on the native kernel (what a rewritten call computes): contiguous float32 operands."""
    out = kernels.KERNEL_ATTENTION(
        query.to(torch.float32).contiguous(), key.to(torch.float32).contiguous(), value.to(torch.float32).contiguous(),
        mask.contiguous(), scale,
    )
    return out.to(query.dtype)


def kernel_attention_int8(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
    key_scale: torch.Tensor, value_scale: torch.Tensor,
) -> torch.Tensor:
    """``etsdk::attention`` over int8 caches on the native kernel: float32 query, int8 rows, float32 scales."""
    out = kernels.KERNEL_ATTENTION_INT8(
        query.to(torch.float32).contiguous(), key.contiguous(), key_scale.contiguous(), value.contiguous(),
        value_scale.contiguous(), mask.contiguous(), scale,
    )
    return out.to(query.dtype)


def _sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
    key_scale: torch.Tensor | None = None, value_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    from etsdk.backend import dequantize_rows

    if key_scale is not None and value_scale is not None:
        key, value = dequantize_rows(key, key_scale).to(query.dtype), dequantize_rows(value, value_scale).to(query.dtype)
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1]
    )


def _int8(node: torch.fx.Node) -> bool:
    """Whether an ``etsdk::attention`` call has its int8 operands (the scales)."""
    return len(node.args) > 5 and node.args[5] is not None or node.kwargs.get("key_scale") is not None


def rewrite_attention(module: torch.fx.GraphModule, device: str) -> bool:
    """Point every ``etsdk::attention`` call of ``module`` at the native kernel (``device`` cpu) or at SDPA;
    whether a call now needs the kernels library."""
    from etsdk.backend import calls_attention

    calls = [n for n in module.graph.nodes if calls_attention(n)]
    for node in calls:
        if device != "cpu":
            node.target = _sdpa
        else:
            node.target = kernel_attention_int8 if _int8(node) else kernel_attention
    if calls:
        module.recompile()
    return bool(calls) and device == "cpu"
