"""``etsdk::attention`` in an AOTInductor partition: the native kernel on the CPU, SDPA elsewhere.

The core's ``etsdk::attention`` is SDPA under a boolean mask that reads only the key / value rows some query
sees. On the CPU every call is pointed at :data:`etsdk_aoti.kernels.KERNEL_ATTENTION` (``attention.cpp``: stops
at the last visible row, so an LLM's decode step costs what the conversation holds); the compiled library then
calls the kernels library, and the blob requires :data:`~etsdk_aoti.blob_format.ATTENTION_FEATURE`. On CUDA
it becomes SDPA over every row (full-length: no CUDA kernel yet).
"""

from __future__ import annotations

import torch

from etsdk_aoti import kernels

__all__ = ["kernel_attention", "rewrite_attention"]


def kernel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``etsdk::attention`` on the native kernel (what a rewritten call computes): contiguous float32 operands."""
    out = kernels.KERNEL_ATTENTION(
        query.to(torch.float32).contiguous(), key.to(torch.float32).contiguous(), value.to(torch.float32).contiguous(),
        mask.contiguous(), scale,
    )
    return out.to(query.dtype)


def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1]
    )


def rewrite_attention(module: torch.fx.GraphModule, device: str) -> bool:
    """Point every ``etsdk::attention`` call of ``module`` at the native kernel (``device`` cpu) or at SDPA;
    whether a call now needs the kernels library."""
    from etsdk.backend import calls_attention

    calls = [n for n in module.graph.nodes if calls_attention(n)]
    for node in calls:
        node.target = kernel_attention if device == "cpu" else _sdpa
    if calls:
        module.recompile()
    return bool(calls) and device == "cpu"
