"""Attention that follows the filled rows: transformers' attention layers call ``etsdk::attention`` in export.

hf_static's masks are boolean and bound every query to the rows written so far, so an attention that stops at
the last visible column reads what the conversation holds, not the cache's capacity: decode at S=8192 costs
what it costs at S=256 while the conversation is short. :func:`filled_attention` makes the layers of one model
call ``etsdk::attention`` (SDPA's meaning, :mod:`etsdk.backend`) while it is traced, when every backend of the
program claims that operator (``Capability.FILLED_ATTENTION``); otherwise, or with ``attention="full"``, they
keep SDPA over every row (full-length mode). A layer with an attention feature the operator does not have
(logit soft-capping, attention sinks) keeps SDPA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from etsdk import Capability, ExportError, get_backend

__all__ = ["ATTENTION_MODES", "IMPLEMENTATION", "filled_attention", "wanted"]

ATTENTION_MODES = ("auto", "filled", "full")
#: the name the attention function is registered under with transformers
IMPLEMENTATION = "etsdk_filled"


def _forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    unsupported = kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None or kwargs.get("dropout", 0.0)
    if unsupported or not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    scale = kwargs.get("scaling")
    out = torch.ops.etsdk.attention(query, key, value, attention_mask, float(scale if scale is not None else query.shape[-1] ** -0.5))
    return out.transpose(1, 2).contiguous(), None


def wanted(mode: str, backends: Sequence[str]) -> bool:
    """Whether an export with ``mode`` over ``backends`` (ids) bounds attention by its mask."""
    if mode not in ATTENTION_MODES:
        raise ExportError(f"attention must be one of {', '.join(ATTENTION_MODES)}, found {mode!r}")
    if mode == "full":
        return False
    lacking = sorted({b for b in backends if Capability.FILLED_ATTENTION not in get_backend(b).capabilities})
    if mode == "filled" and lacking:
        raise ExportError(
            f"attention='filled' needs every backend to claim etsdk::attention; {', '.join(lacking)} does not "
            f"declare {Capability.FILLED_ATTENTION.value} (use attention='full' or 'auto')"
        )
    return not lacking


@contextlib.contextmanager
def filled_attention(model: Any, enabled: bool = True) -> Iterator[None]:
    """Within the block, ``model``'s attention layers call ``etsdk::attention`` (restored after it)."""
    if not enabled:
        yield
        return
    from etsdk.backend import ATTENTION  # noqa: F401  (registers etsdk::attention)
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, _forward)
    configs = [c for c in {id(c): c for c in (model.config, model.config.get_text_config())}.values()]
    before = [c._attn_implementation for c in configs]
    try:
        for config in configs:
            config._attn_implementation = IMPLEMENTATION
        yield
    finally:
        for config, value in zip(configs, before):
            config._attn_implementation = value
