"""The exportable form of a Hugging Face causal LM over a static cache (hf_static v1 and v2).

:class:`StaticCausalLM` wraps a transformers ``*ForCausalLM`` with a
``StaticCache`` whose tensors are registered as buffers (``key_cache_{i}``,
``value_cache_{i}``, ``cumulative_length_{i}``). They become the program's
caller-owned state. Unlike transformers' own ExecuTorch wrapper it takes the
attention mask as an input and does **not** reset the counters from the
positions inside the graph: the runner writes every counter from ``start_pos``
before each step, so a padded prefill chunk (which advances the counters by T,
not by the real row count) never leaves them stale.

``forward(input_ids [1, T] int64, positions [T] int64, attention_mask [1, 1, T, S] bool)``
returns logits ``[1, T, V]`` float32. Mask convention ``bool_true_visible``:
``mask[0, 0, i, j]`` is True when row ``i`` may attend to cache row ``j``.
Built with ``full_logits=False`` (what export does unless told otherwise), a
chunk of T > 1 rows computes the logits of its last real row only (:func:`~etsdk_hf_static.masks.last_real_row`),
the other rows are zero: the vocabulary projection is skipped where nobody reads
it (for SmolLM2-135M it is a fifth of a prefill's multiplies).
Built with ``skip_padding=True`` (what export does), every other linear layer
reads a chunk's padded rows as zeros (:class:`PaddingRows`), so a backend whose
kernel skips trailing zero rows (etsdk-aoti) multiplies the real rows only: a
chunk of 25 tokens costs about 25 rows, not T. The real rows compute the same.

:class:`WindowedCausalLM` (hf_static v2) is the form of a model with
sliding-window layers: full layers keep S rows written at their positions,
sliding-window layers a ring of R rows written at position mod R; it takes a
second mask for the rings (:func:`~etsdk_hf_static.masks.slot_mask`) and has no counters. With
``cache_dtype="int8"`` (hf_static v3) every cache holds int8 rows and a float32
scale per row and head beside it (``k0`` / ``k0_scale``), written by
:func:`etsdk.backend.quantize_rows`.
"""

from __future__ import annotations

from typing import Any

import torch
from etsdk import ExportError

__all__ = [
    "PaddingRows",
    "StaticCausalLM",
    "WRAPPED",
    "WindowedCausalLM",
    "keeps_chosen_logits",
    "layer_kinds",
    "layer_masks",
    "state_fqns",
    "unsupported_layer",
]


def unsupported_layer(model: Any, index: int, layer: Any, layer_type: str | None = None) -> str:
    """Why hf_static cannot export ``model``: layer ``index``'s cache is neither full attention nor a sliding window."""
    config = model.config.get_text_config()
    kind = type(layer).__name__
    if layer_type == "chunked_attention":
        feature = "chunked attention (attention within fixed blocks of positions)"
    elif "LinearAttention" in kind or layer_type == "linear_attention":
        feature = "linear attention (a recurrent state, not a key / value cache)"
    else:
        feature = f"layers of type '{layer_type}'" if layer_type else f"a cache of kind {kind}"
    types = getattr(config, "layer_types", None)
    mix = f"; its layer types: {', '.join(sorted(set(types)))}" if types else ""
    return (
        f"{getattr(config, 'model_type', type(model).__name__)}: layer {index} uses {feature} ({kind}), and the "
        f"hf_static contracts hold full-attention and sliding-window key / value caches only{mix}; export a model "
        f"whose every layer is one of those"
    )


def layer_kinds(model: Any, context_length: int) -> tuple[tuple[str, ...], int | None]:
    """Per layer ``"full"`` or ``"window"`` (a sliding window shorter than the context), and the window W.

    Refuses, as an :class:`etsdk.ExportError` naming the layer and the feature, a layer whose cache is neither
    (linear attention, a chunked or other cache kind)."""
    from transformers.cache_utils import StaticCache, StaticLayer, StaticSlidingWindowLayer

    config = model.config.get_text_config()
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    kinds = []
    for i, layer in enumerate(StaticCache(max_cache_len=context_length, config=config).layers):
        if types is not None and types[i] not in ("full_attention", "sliding_attention"):
            # e.g. Llama 4's chunked attention also gets a sliding-window cache, but attends by blocks, not by window
            raise ExportError(unsupported_layer(model, i, layer, types[i]))
        if type(layer) is StaticSlidingWindowLayer and isinstance(window, int) and window > 0:
            kinds.append("window" if window < context_length else "full")
        elif type(layer) is StaticLayer:
            kinds.append("full")
        else:
            raise ExportError(unsupported_layer(model, i, layer))
    return tuple(kinds), window if "window" in kinds else None


def state_fqns(layers: int) -> dict[str, str]:
    """Module buffer FQN -> hf_static state identity."""
    out = {}
    for i in range(layers):
        out[f"key_cache_{i}"] = f"k{i}"
        out[f"value_cache_{i}"] = f"v{i}"
        out[f"cumulative_length_{i}"] = f"c{i}"
    return out


def _full_attention_config(config: Any, context_length: int) -> Any:
    """``config``, or a copy whose sliding windows are off when none is shorter than the context (S <= W: every
    position a query may see is inside its window, so a full-attention cache of S rows computes the same)."""
    import copy

    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or window < context_length:
        return config
    full = copy.copy(config)
    full.sliding_window = None
    types = getattr(config, "layer_types", None)
    if types is not None:
        full.layer_types = ["full_attention" if t == "sliding_attention" else t for t in types]
    return full


def keeps_chosen_logits(model: Any) -> bool:
    """Whether ``model`` can compute the logits of chosen rows only (transformers' ``logits_to_keep`` argument)."""
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _full_logits(model: Any, full_logits: bool) -> bool:
    if not full_logits and not keeps_chosen_logits(model):
        raise ExportError(f"{type(model).__name__} cannot compute chosen rows' logits (no logits_to_keep); build it with full_logits=True")
    return full_logits


def _last_row(causal: torch.Tensor) -> torch.Tensor | None:
    """A chunk's last real row (``[1]``, read once from its ``attention_mask`` by the wrappers' forward, for the
    logits and the padded rows); None for a one-row call."""
    from etsdk_hf_static.masks import last_real_row

    return None if causal.shape[2] == 1 else last_real_row(causal)


def _logits(model: Any, full_logits: bool, keep: torch.Tensor | None, **inputs: Any) -> torch.Tensor:
    """``model``'s logits ``[1, T, V]``: every row's, or (``full_logits`` False and T > 1) the last real row's
    (``keep``: :func:`_last_row`) and zeros."""
    rows = int(inputs["input_ids"].shape[1])
    if full_logits or keep is None:
        return model(**inputs).logits
    logits = model(logits_to_keep=keep, **inputs).logits
    return logits.new_zeros((1, rows, logits.shape[-1])).index_copy(1, keep, logits)


class PaddingRows:
    """Zeroes a prefill chunk's padded rows in the input of every linear layer of a model but its output head.

    Forward pre-hooks on the model's ``torch.nn.Linear`` and :class:`etsdk.QuantizedLinear` modules, active only
    while a wrapper's forward has set :attr:`rows` (a chunk of more than one row): the real rows' inputs are
    unchanged, so are their outputs; a padded row's product becomes the layer's bias. A padded row's results carry
    no meaning (no real row attends to it), and a kernel that skips trailing zero rows multiplies only the real
    ones. Only inputs laid out as the sequence, ``[1, T, K]``, are touched. :meth:`close` removes the hooks (the exporter does once it has traced).
    """

    def __init__(self, model: Any) -> None:
        from etsdk import QuantizedLinear

        #: ``[T, 1]`` bool, True for the chunk's real rows; None outside a chunk's forward (the hooks do nothing)
        self.rows: torch.Tensor | None = None
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        self._handles = [
            module.register_forward_pre_hook(self._zero)
            for module in model.modules()
            if isinstance(module, (torch.nn.Linear, QuantizedLinear)) and module is not head
        ]

    def set(self, rows: int, last: torch.Tensor | None) -> None:
        """Mark the real rows of a chunk of ``rows`` whose last real row is ``last`` (None: a one-row call, none
        padded)."""
        self.rows = None if last is None else (torch.arange(rows) <= last).reshape(rows, 1)

    def _zero(self, module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        # only the sequence's own layout, [1, T, K]: a layer fed tokens in another order (a mixture of experts'
        # gathered rows) or another axis is left alone
        if self.rows is None or not args or tuple(args[0].shape[:2]) != (1, self.rows.shape[0]) or args[0].dim() != 3:
            return None
        return (torch.where(self.rows, args[0], 0.0), *args[1:])

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.rows = None


#: Where both wrappers hold the transformers model: their tensors' names are ``WRAPPED + the model's own``.
WRAPPED = "model."


class StaticCausalLM(torch.nn.Module):
    """``model`` (a transformers causal LM) over a static cache of ``context_length`` rows."""

    def __init__(self, model: Any, context_length: int, *, full_logits: bool = True, skip_padding: bool = False) -> None:
        super().__init__()
        from transformers.cache_utils import StaticCache, StaticLayer

        config = model.config.get_text_config()
        self.model = model
        self.full_logits = _full_logits(model, full_logits)
        self.padding = PaddingRows(model) if skip_padding else None
        self.cache = StaticCache(max_cache_len=context_length, config=_full_attention_config(config, context_length))
        layers: list[StaticLayer] = []
        for i, layer in enumerate(self.cache.layers):
            if type(layer) is not StaticLayer:
                raise ExportError(unsupported_layer(model, i, layer))
            layers.append(layer)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # float32 caches whatever the weights' dtype: the contract declares them so (16-bit weights compute in float32)
        self.cache.early_initialization(1, heads, head_dim, torch.float32, torch.device("cpu"))
        for i, layer in enumerate(layers):
            self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
            self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
            self.register_buffer(f"cumulative_length_{i}", layer.cumulative_length, persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        last = _last_row(attention_mask) if self.padding is not None or not self.full_logits else None
        if self.padding is not None:
            self.padding.set(attention_mask.shape[2], last)
        logits = _logits(
            self.model,
            self.full_logits,
            last,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions.unsqueeze(0),
            cache_position=positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        if self.padding is not None:
            self.padding.rows = None
        return logits


class _Target:
    """One layer's cache buffers: keys and values (and their scales, for int8 caches), and its ring rows (None: S)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, ring: int | None, scales: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        self.keys, self.values, self.ring, self.scales = keys, values, ring, scales


def cache_rows_at(positions: torch.Tensor, ring: int | None) -> torch.Tensor:
    """The cache rows ``positions`` are written to: themselves, or modulo a ring's ``ring`` rows."""
    return positions if ring is None else torch.remainder(positions, ring)


def write_rows(cache: torch.Tensor, scale: torch.Tensor | None, at: torch.Tensor, rows: torch.Tensor) -> None:
    """Write ``rows`` into ``cache``'s rows ``at`` (dim 2): as they are, or (``scale`` given: an int8 cache)
    quantized by :func:`etsdk.backend.quantize_rows`, their scales into ``scale``'s same rows."""
    if scale is None:
        cache.index_copy_(2, at, rows)
        return
    from etsdk.backend import quantize_rows

    quantized, row_scale = quantize_rows(rows)
    cache.index_copy_(2, at, quantized)
    scale.index_copy_(2, at, row_scale)


def _position_cache(config: Any, context_length: int, targets: list[_Target]) -> Any:
    """The cache transformers' attention layers call: it writes each layer's keys and values at the step's positions
    (mod R for a ring) into the wrapper's buffers and returns the whole buffer, which the mask selects from.
    (transformers' own sliding-window layer decides by a Python counter, which a traced program cannot.)
    Int8 caches: the rows are quantized as they are written, and the whole cache is returned dequantized (what the
    model's own attention reads); filled attention reads the int8 rows instead (:func:`~etsdk_hf_static.exporting.attention.
    int8_operands`)."""
    from transformers.cache_utils import StaticCache

    from etsdk_hf_static.exporting.attention import remember_int8

    class PositionCache(StaticCache):  # type: ignore[misc]
        targets: list[_Target]
        positions: torch.Tensor | None

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_kwargs: Any = None
        ) -> tuple[torch.Tensor, torch.Tensor]:
            from etsdk.backend import dequantize_rows

            target = self.targets[layer_idx]
            assert self.positions is not None  # set by the wrapper's forward before the model runs
            index = cache_rows_at(self.positions, target.ring)
            if target.scales is None:
                write_rows(target.keys, None, index, key_states)
                write_rows(target.values, None, index, value_states)
                return target.keys, target.values
            out = []
            for rows, cache, scale in ((key_states, target.keys, target.scales[0]), (value_states, target.values, target.scales[1])):
                write_rows(cache, scale, index, rows)
                out.append(remember_int8(dequantize_rows(cache, scale).to(rows.dtype), cache, scale))
            return out[0], out[1]

    cache = PositionCache(max_cache_len=context_length, config=config)
    cache.targets = targets
    cache.positions = None
    return cache


def layer_masks(wrapper: Any, attention_mask: torch.Tensor, window_mask: torch.Tensor | None) -> Any:
    """The ``attention_mask`` argument a wrapper with sliding-window layers hands the model: one mask per layer type
    for a model with per-layer types, else the one its every layer reads. ``wrapper``: its ``by_type``,
    ``all_window`` and ``has_window``."""
    if wrapper.by_type:  # models with per-layer types take one mask per type
        # (a window no shorter than S is full attention: hf_static v3 without ring caches)
        return {"full_attention": attention_mask, "sliding_attention": window_mask if wrapper.has_window else attention_mask}
    return window_mask if wrapper.all_window else attention_mask  # every layer the same kind (Mistral's window)


class WindowedCausalLM(torch.nn.Module):
    """``model`` with sliding-window layers over full caches of S rows and ring caches of R rows (hf_static v2).

    Buffers ``k{j}`` / ``v{j}`` (the j-th full layer) and ``kw{j}`` / ``vw{j}`` (the j-th sliding-window layer),
    named as their state identities. ``forward(input_ids, positions, attention_mask [1, 1, T, S], window_mask
    [1, 1, T, R])`` returns logits ``[1, T, V]``; the model gets each layer type its mask.
    """

    def __init__(
        self,
        model: Any,
        context_length: int,
        ring_rows: int | None,
        kinds: tuple[str, ...],
        cache_dtype: str = "float32",
        *,
        full_logits: bool = True,
        skip_padding: bool = False,
    ) -> None:
        super().__init__()
        from etsdk_hf_static.metadata import check_cache_dtype

        check_cache_dtype(cache_dtype)
        config = model.config.get_text_config()
        self.model = model
        self.full_logits = _full_logits(model, full_logits)
        self.padding = PaddingRows(model) if skip_padding else None
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        int8 = cache_dtype == "int8"
        targets: list[_Target] = []
        for layer, kind in enumerate(kinds):
            ring = ring_rows if kind == "window" else None
            index = kinds[:layer].count(kind)
            names = (f"k{index}", f"v{index}") if ring is None else (f"kw{index}", f"vw{index}")
            rows = ring or context_length
            pair = [torch.zeros(1, heads, rows, head_dim, dtype=torch.int8 if int8 else torch.float32) for _ in names]
            for name, tensor in zip(names, pair):
                self.register_buffer(name, tensor, persistent=False)
            scales = None
            if int8:
                scales = (torch.zeros(1, heads, rows, 1), torch.zeros(1, heads, rows, 1))
                for name, tensor in zip(names, scales):
                    self.register_buffer(f"{name}_scale", tensor, persistent=False)
            targets.append(_Target(pair[0], pair[1], ring, scales))
        self.cache = _position_cache(config, context_length, targets)
        self.by_type = getattr(config, "layer_types", None) is not None
        self.all_window = "full" not in kinds
        self.has_window = "window" in kinds

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor, window_mask: torch.Tensor
    ) -> torch.Tensor:
        from etsdk_hf_static.exporting.attention import forget_int8

        forget_int8()
        self.cache.positions = positions
        last = _last_row(attention_mask) if self.padding is not None or not self.full_logits else None
        if self.padding is not None:
            self.padding.set(attention_mask.shape[2], last)
        logits = _logits(
            self.model, self.full_logits, last, input_ids=input_ids, attention_mask=layer_masks(self, attention_mask, window_mask), position_ids=positions.unsqueeze(0),
            past_key_values=self.cache, use_cache=True,
        )
        forget_int8()  # the dequantized caches of this step are not kept alive until the next one
        if self.padding is not None:
            self.padding.rows = None
        return logits
