"""The exportable form of a Hugging Face causal LM over a static cache (hf_static v1).

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
"""

from __future__ import annotations

from typing import Any

import torch
from etsdk import ExportError

__all__ = ["StaticCausalLM", "causal_mask", "state_fqns", "unsupported_layer"]


def unsupported_layer(model: Any, index: int, layer: Any) -> str:
    """Why hf_static v1 cannot export ``model``: layer ``index``'s cache is not a full-attention static one."""
    config = model.config.get_text_config()
    kind = type(layer).__name__
    if "SlidingWindow" in kind:
        feature = f"sliding-window attention (a ring cache of {getattr(config, 'sliding_window', '?')} rows)"
    elif "LinearAttention" in kind:
        feature = "linear attention (a recurrent state, not a key / value cache)"
    else:
        feature = f"a cache of kind {kind}"
    types = getattr(config, "layer_types", None)
    mix = f"; its layer types: {', '.join(sorted(set(types)))}" if types else ""
    return (
        f"{getattr(config, 'model_type', type(model).__name__)}: layer {index} uses {feature} ({kind}), and the "
        f"hf_static v1 contract holds full-attention key / value caches only{mix}; export a model whose every layer "
        f"is full attention"
    )


def state_fqns(layers: int) -> dict[str, str]:
    """Module buffer FQN -> hf_static state identity."""
    out = {}
    for i in range(layers):
        out[f"key_cache_{i}"] = f"k{i}"
        out[f"value_cache_{i}"] = f"v{i}"
        out[f"cumulative_length_{i}"] = f"c{i}"
    return out


def causal_mask(start_pos: int, real: int, rows: int, context: int, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The ``[1, 1, rows, context]`` bool mask for ``real`` tokens at ``start_pos`` padded to ``rows``.

    Row ``i`` sees cache rows ``0 .. min(start_pos + i, start_pos + real - 1)``: real
    rows are causal, padded rows see the real ones only (never padding, and never
    nothing, so no row's softmax is over an empty set). ``out``: fill it in place.
    """
    last = torch.clamp(torch.arange(rows) + start_pos, max=start_pos + real - 1).reshape(1, 1, rows, 1)
    columns = torch.arange(context).reshape(1, 1, 1, context)
    if out is None:
        return columns <= last
    return torch.le(columns, last, out=out)


class StaticCausalLM(torch.nn.Module):
    """``model`` (a transformers causal LM) over a static cache of ``context_length`` rows."""

    def __init__(self, model: Any, context_length: int) -> None:
        super().__init__()
        from transformers.cache_utils import StaticCache, StaticLayer

        config = model.config.get_text_config()
        self.model = model
        self.cache = StaticCache(max_cache_len=context_length, config=config)
        layers: list[StaticLayer] = []
        for i, layer in enumerate(self.cache.layers):
            if type(layer) is not StaticLayer:
                raise ExportError(unsupported_layer(model, i, layer))
            layers.append(layer)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache.early_initialization(1, heads, head_dim, model.dtype, torch.device("cpu"))
        for i, layer in enumerate(layers):
            self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
            self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
            self.register_buffer(f"cumulative_length_{i}", layer.cumulative_length, persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions.unsqueeze(0),
            cache_position=positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        return out.logits
