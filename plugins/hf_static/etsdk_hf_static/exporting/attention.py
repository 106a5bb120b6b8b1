"""Attention that follows the filled rows: transformers' attention layers call ``etsdk::attention`` in export.

hf_static's masks are boolean and bound every query to the rows written so far, so an attention that stops at
the last visible column reads what the conversation holds, not the cache's capacity: decode at S=8192 costs
what it costs at S=256 while the conversation is short. :func:`filled_attention` makes the layers of one model
call ``etsdk::attention`` (SDPA's meaning, :mod:`etsdk.backend`) while it is traced, when every backend of the
program claims that operator (``Capability.FILLED_ATTENTION``) and the model's attention has no feature the
operator lacks (logit soft-capping, attention sinks: :func:`unsupported_attention`); otherwise, or with
``attention="full"``, the model keeps its own attention implementation over every row (full-length mode).

Int8 caches (hf_static v3): the cache returns each layer's rows dequantized (what the model's own attention
reads) and :func:`remember_int8` notes which int8 rows and scales they came from; the filled attention then
calls ``etsdk::attention`` on those int8 operands, so it reads a quarter of the bytes and the dequantized copy
is never computed.

A batch of conversations (:class:`~etsdk_hf_static.exporting.batched.BatchedDecodeLM`): each row of the batch has
its own cache (one session's storage per slot), and :func:`remember_slots` notes them behind a stand-in the cache
returns; the filled attention then calls ``etsdk::attention`` once per slot, so each reads its own filled rows and
no stacked copy of the caches is made.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from etsdk import Capability, ExportError, get_backend

__all__ = [
    "ATTENTION_MODES",
    "IMPLEMENTATION",
    "filled_attention",
    "forget_int8",
    "int8_operands",
    "lacking_filled_attention",
    "remember_int8",
    "remember_slots",
    "slot_operands",
    "unsupported_attention",
    "wanted",
]

ATTENTION_MODES = ("auto", "filled", "full")
#: the name the attention function is registered under with transformers
IMPLEMENTATION = "etsdk_filled"


_int8 = threading.local()


def remember_int8(dequantized: torch.Tensor, rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Note that ``dequantized`` stands for the int8 ``rows`` and their ``scale`` (until :func:`forget_int8`);
    returns ``dequantized``."""
    if not hasattr(_int8, "found"):
        _int8.found = {}
    _int8.found[id(dequantized)] = (dequantized, rows, scale)
    return dequantized


def forget_int8() -> None:
    """Drop what :func:`remember_int8` and :func:`remember_slots` noted (a wrapper's forward starts with it)."""
    _int8.found = {}
    _int8.slots = {}


def int8_operands(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The int8 rows and scales ``tensor`` was dequantized from in this forward, or None."""
    entry = getattr(_int8, "found", {}).get(id(tensor))
    return (entry[1], entry[2]) if entry is not None and entry[0] is tensor else None


def remember_slots(
    stand_in: torch.Tensor, caches: Sequence[torch.Tensor], scales: Sequence[torch.Tensor] | None = None
) -> torch.Tensor:
    """Note that ``stand_in`` stands for one cache per slot: row ``s`` of the batch attends over ``caches[s]`` (int8
    rows with ``scales[s]``, or float rows for None) until :func:`forget_int8`; returns ``stand_in``."""
    if not hasattr(_int8, "slots"):
        _int8.slots = {}
    _int8.slots[id(stand_in)] = (stand_in, tuple(caches), None if scales is None else tuple(scales))
    return stand_in


def slot_operands(tensor: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None] | None:
    """The per-slot caches (and their scales, or None) ``tensor`` stands for in this forward, or None."""
    entry = getattr(_int8, "slots", {}).get(id(tensor))
    return (entry[1], entry[2]) if entry is not None and entry[0] is tensor else None


def _per_slot(
    query: torch.Tensor, keys: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None],
    values: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None], mask: torch.Tensor, scale: float,
) -> torch.Tensor:
    """One ``etsdk::attention`` per slot (row ``s`` of ``query`` and ``mask`` over slot ``s``'s caches), concatenated."""
    out = []
    for s, (key, value) in enumerate(zip(keys[0], values[0])):
        scales = () if keys[1] is None or values[1] is None else (keys[1][s], values[1][s])
        rows = mask if mask.shape[0] == 1 else mask[s : s + 1]
        out.append(torch.ops.etsdk.attention(query[s : s + 1], key, value, rows, scale, *scales))
    return torch.cat(out, dim=0)


def unsupported_attention(model: Any) -> str | None:
    """Why ``model``'s attention cannot be ``etsdk::attention`` (a feature it lacks), or None when it can."""
    config = model.config.get_text_config()
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return f"its attention soft-caps logits (attn_logit_softcapping={config.attn_logit_softcapping})"
    if any(hasattr(module, "sinks") for module in model.modules()):
        return "its attention has sinks"
    return None


def _forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    unsupported = [k for k in ("softcap", "s_aux", "sinks") if kwargs.get(k) is not None] + (["dropout"] if kwargs.get("dropout") else [])
    if unsupported or not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
        # unsupported_attention() should have kept this model on its own attention: never compute something else
        found = ", ".join(unsupported) or f"a mask of {type(attention_mask).__name__} {getattr(attention_mask, 'dtype', '')}"
        raise ExportError(
            f"{type(module).__name__}: etsdk::attention takes a boolean mask and no {found}; export with attention='full'"
        )
    given = kwargs.get("scaling")
    scale = float(given) if given is not None else float(query.shape[-1] ** -0.5)
    keys, values = int8_operands(key), int8_operands(value)
    key_slots, value_slots = slot_operands(key), slot_operands(value)
    if (key_slots is None) != (value_slots is None) or (key_slots is None and query.shape[0] != key.shape[0]):
        # per-slot caches noted but not both found (the model changed a cache between its update and attention), or
        # a batch of queries over one cache: never attend every row over one slot's rows
        raise ExportError(
            f"{type(module).__name__}: the batched decode step's attention did not receive each slot's caches "
            f"(queries {list(query.shape)}, keys {list(key.shape)}); this model cannot export decode_batch"
        )
    if key_slots is not None and value_slots is not None:  # a batch of conversations: each row over its own cache
        out = _per_slot(query, key_slots, value_slots, attention_mask, scale)
    elif keys is not None and values is not None:  # an int8 cache: attend over its rows, not the dequantized copy
        out = torch.ops.etsdk.attention(query, keys[0], values[0], attention_mask, scale, keys[1], values[1])
    else:
        out = torch.ops.etsdk.attention(query, key, value, attention_mask, scale)
    return out.transpose(1, 2).contiguous(), None


def lacking_filled_attention(backends: Sequence[str]) -> list[str]:
    """The backends (ids) among ``backends`` that do not declare ``Capability.FILLED_ATTENTION``, sorted."""
    return sorted({b for b in backends if Capability.FILLED_ATTENTION not in get_backend(b).capabilities})


def wanted(mode: str, backends: Sequence[str], model: Any = None) -> bool:
    """Whether an export with ``mode`` over ``backends`` (ids) of ``model`` bounds attention by its mask."""
    if mode not in ATTENTION_MODES:
        raise ExportError(f"attention must be one of {', '.join(ATTENTION_MODES)}, found {mode!r}")
    if mode == "full":
        return False
    why = unsupported_attention(model) if model is not None else None
    if why is not None:
        if mode == "filled":
            raise ExportError(f"attention='filled': {type(model).__name__} cannot use etsdk::attention: {why} (use 'full' or 'auto')")
        return False
    lacking = lacking_filled_attention(backends)
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
