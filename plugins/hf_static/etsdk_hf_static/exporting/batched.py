"""A decode step over K conversations in one call: every linear layer reads its weights once for K rows.

:class:`BatchedDecodeLM` is the decode step of :class:`~etsdk_hf_static.exporting.module.WindowedCausalLM` (or of
a v1 :class:`~etsdk_hf_static.exporting.module.StaticCausalLM` program, whose every layer is full) over K slots.
Each slot's caches are a separate session's storage, bound at run time by slot, so the module holds K copies of
every cache buffer (``k0_s0``, ``k0_s1``, ...), never one stacked ``[K, ...]`` tensor: a slot is rebound to
another conversation without copying anyone's rows.

``forward(input_ids [K, 1] int64, positions [K] int64, attention_mask [K, 1, 1, S] bool, window_mask [K, 1, 1, R]
bool)`` (no ``window_mask`` for a v1 program) returns logits ``[K, 1, V]``: row ``s`` is slot ``s``'s next token at ``positions[s]``, written into slot
``s``'s caches only, and computes what the single-slot wrapper's decode step computes over those caches.
Under :func:`~etsdk_hf_static.exporting.attention.filled_attention` each slot attends over its own caches with one
``etsdk::attention`` call (each reads its own filled rows); under the model's own attention the slots' caches are
stacked for it (correct, but a copy of every cache per layer).
"""

from __future__ import annotations

from typing import Any

import torch
from etsdk import ExportError, StateSlot

__all__ = ["BatchedDecodeLM"]


class _SlotTarget:
    """One layer's cache buffers in every slot (slot ``s``: ``keys[s]``, ``values[s]``, and for int8 caches
    ``key_scales[s]``, ``value_scales[s]``), and its ring rows (None: S)."""

    def __init__(
        self, keys: list[torch.Tensor], values: list[torch.Tensor], ring: int | None,
        key_scales: list[torch.Tensor] | None, value_scales: list[torch.Tensor] | None,
    ) -> None:
        self.keys, self.values, self.ring = keys, values, ring
        self.key_scales, self.value_scales = key_scales, value_scales


def _slot_cache(config: Any, context_length: int, targets: list[_SlotTarget]) -> Any:
    """The cache transformers' attention layers call: row ``s`` of a step's keys and values is written at
    ``positions[s]`` (mod R for a ring) into slot ``s``'s buffers (int8: quantized as it is written). It returns,
    when :attr:`filled` (the model attends with ``etsdk::attention``), slot 0's buffer as a stand-in for every slot's
    (:func:`~etsdk_hf_static.exporting.attention.remember_slots`: no op in the graph, no copy), else the slots'
    caches stacked along the batch (dequantized for int8), which the model's own attention reads."""
    from transformers.cache_utils import StaticCache

    from etsdk_hf_static.exporting.attention import remember_slots

    class SlotCache(StaticCache):  # type: ignore[misc]
        targets: list[_SlotTarget]
        positions: torch.Tensor | None
        filled: bool

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_kwargs: Any = None
        ) -> tuple[torch.Tensor, torch.Tensor]:
            from etsdk.backend import dequantize_rows

            from etsdk_hf_static.exporting.module import cache_rows_at, write_rows

            target = self.targets[layer_idx]
            assert self.positions is not None  # set by the wrapper's forward before the model runs
            index = cache_rows_at(self.positions, target.ring)
            out = []
            for states, caches, scales in (
                (key_states, target.keys, target.key_scales), (value_states, target.values, target.value_scales)
            ):
                for s, cache in enumerate(caches):  # slot s's row into slot s's buffers only
                    write_rows(cache, None if scales is None else scales[s], index[s : s + 1], states[s : s + 1])
                if self.filled:
                    out.append(remember_slots(caches[0], caches, scales))
                elif scales is None:
                    out.append(torch.cat(caches, dim=0))
                else:
                    stacked = torch.cat([dequantize_rows(c, scale) for c, scale in zip(caches, scales)], dim=0)
                    out.append(stacked.to(states.dtype))
            return out[0], out[1]

    cache = SlotCache(max_cache_len=context_length, config=config)
    cache.targets = targets
    cache.positions = None
    cache.filled = False
    return cache


class BatchedDecodeLM(torch.nn.Module):
    """``model``'s decode step over ``slots`` conversations, each with its own caches of S (full) or R (ring) rows.

    Buffers ``{identity}_s{s}``: slot ``s``'s copy of the single-slot wrapper's buffer of that state identity, same
    shape and dtype (``k0_s1``, ``kw0_s2``, ``k0_scale_s1``); :meth:`state_slots` maps them back. ``kinds``: per
    layer ``"full"`` or ``"window"`` (:func:`~etsdk_hf_static.exporting.module.layer_kinds`); None: every layer full,
    whose identities ``k{i}`` / ``v{i}`` are then also a v1 program's (:func:`~etsdk_hf_static.exporting.module.
    state_fqns`; its counters ``c{i}`` have no buffer here: this module writes at the given positions).
    """

    def __init__(
        self,
        model: Any,
        context_length: int,
        slots: int,
        *,
        ring_rows: int | None = None,
        kinds: tuple[str, ...] | None = None,
        cache_dtype: str = "float32",
    ) -> None:
        super().__init__()
        from etsdk_hf_static.metadata import check_cache_dtype

        check_cache_dtype(cache_dtype)
        config = model.config.get_text_config()
        kinds = tuple(kinds) if kinds is not None else ("full",) * config.num_hidden_layers
        if slots < 1:
            raise ExportError(f"a batched decode step needs at least one slot, found {slots}")
        if len(kinds) != config.num_hidden_layers or not set(kinds) <= {"full", "window"}:
            count = config.num_hidden_layers
            raise ExportError(f"kinds: 'full' or 'window' for each of the {count} layers, found {kinds}")
        if "window" in kinds and ring_rows is None:
            raise ExportError("sliding-window layers need ring_rows (R, the rows of a ring cache)")
        self.model = model
        self.config = config
        self.slots = slots
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        int8 = cache_dtype == "int8"
        # per layer, per buffer (keys, values[, key scales, value scales]): its identity and one tensor per slot
        layers: list[tuple[int | None, list[tuple[str, list[torch.Tensor]]]]] = []
        for layer, kind in enumerate(kinds):
            ring = ring_rows if kind == "window" else None
            index = kinds[:layer].count(kind)
            names = [f"k{index}", f"v{index}"] if ring is None else [f"kw{index}", f"vw{index}"]
            rows = ring or context_length
            shapes = [((1, heads, rows, head_dim), torch.int8 if int8 else torch.float32)] * 2
            if int8:
                names += [f"{names[0]}_scale", f"{names[1]}_scale"]
                shapes += [((1, heads, rows, 1), torch.float32)] * 2
            copies = [[torch.zeros(shape, dtype=dtype) for _ in range(slots)] for shape, dtype in shapes]
            layers.append((ring, list(zip(names, copies))))
        self._state_slots: dict[str, StateSlot] = {}
        for s in range(slots):  # slot by slot, each in the single-slot wrapper's order
            for _, buffers in layers:
                for name, tensors in buffers:
                    self.register_buffer(f"{name}_s{s}", tensors[s], persistent=False)
                    self._state_slots[f"{name}_s{s}"] = StateSlot(name, s)
        targets = []
        for ring, buffers in layers:
            each = [per_slot for _, per_slot in buffers]
            targets.append(_SlotTarget(each[0], each[1], ring, *(each[2:] if int8 else (None, None))))
        self.cache = _slot_cache(config, context_length, targets)
        self.by_type = getattr(config, "layer_types", None) is not None
        self.all_window = "full" not in kinds
        self.has_window = "window" in kinds

    def state_slots(self) -> dict[str, StateSlot]:
        """Module buffer FQN -> hf_static state identity and slot (``MethodSource(state=...)``)."""
        return dict(self._state_slots)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor,
        window_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from etsdk_hf_static.exporting.attention import IMPLEMENTATION, forget_int8
        from etsdk_hf_static.exporting.module import layer_masks

        forget_int8()
        self.cache.positions = positions
        # read when called, not built: filled_attention() switches the implementation around an export
        self.cache.filled = self.config._attn_implementation == IMPLEMENTATION
        logits = self.model(
            input_ids=input_ids, attention_mask=layer_masks(self, attention_mask, window_mask), position_ids=positions.unsqueeze(1), past_key_values=self.cache,
            use_cache=True,
        ).logits
        forget_int8()  # the per-slot notes of this step are not kept alive until the next one
        return logits
