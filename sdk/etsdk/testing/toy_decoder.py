"""A toy attention decoder following the ``kv_decoder`` v1 contract.

Each layer writes its keys and values for ``positions`` into its caches in
place (``index_copy_``), then attends over every cache row at or before each
query's position. Small, deterministic, and enough to show whether state is
bound, updated in place, shared across methods and isolated across sessions.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from etsdk._export.lower import MethodSource
from etsdk._state.contract import Contract


class ToyDecoder(torch.nn.Module):
    """A small seeded attention decoder with per-layer KV-cache buffers, following ``kv_decoder`` v1.

    Buffers ``k_cache_{i}`` / ``v_cache_{i}`` (``[1, heads, capacity, head_dim]``) are written with
    ``index_copy_`` at ``positions``, as a real static-cache decoder does; :meth:`state_fqns` maps them to the
    contract's state identities ``k{i}`` / ``v{i}``. Weights come from ``seed`` (two instances with one seed
    are equal).
    """

    def __init__(self, *, vocab: int = 32, layers: int = 2, heads: int = 2, head_dim: int = 8, capacity: int = 16, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.heads, self.head_dim, self.capacity, self.layers = heads, head_dim, capacity, layers
        width = heads * head_dim
        self.embed = torch.nn.Embedding(vocab, width)
        self.proj = torch.nn.ModuleList(torch.nn.Linear(width, 4 * width) for _ in range(layers))
        self.head = torch.nn.Linear(width, vocab)
        for p in self.parameters():
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
        for i in range(layers):
            self.register_buffer(f"k_cache_{i}", torch.zeros(1, heads, capacity, head_dim))
            self.register_buffer(f"v_cache_{i}", torch.zeros(1, heads, capacity, head_dim))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits ``[1, T, vocab]`` for ``tokens`` ``[1, T]`` at ``positions`` ``[T]``, writing the caches there."""
        steps = tokens.shape[1]
        x = self.embed(tokens)
        visible = torch.arange(self.capacity).unsqueeze(0) <= positions.unsqueeze(1)  # [T, S]
        bias = torch.where(visible, 0.0, -1e9)
        for i in range(self.layers):
            k_cache = getattr(self, f"k_cache_{i}")
            v_cache = getattr(self, f"v_cache_{i}")
            q, k, v, o = self.proj[i](x).chunk(4, dim=-1)
            shape = (1, steps, self.heads, self.head_dim)
            q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
            k_cache.index_copy_(2, positions, k)
            v_cache.index_copy_(2, positions, v)
            scores = q @ k_cache.transpose(-1, -2) / math.sqrt(self.head_dim) + bias
            attended = (scores.softmax(-1) @ v_cache).transpose(1, 2).reshape(1, steps, -1)
            x = x + attended * torch.sigmoid(o)
        return self.head(x)

    def state_fqns(self) -> dict[str, str]:
        """Buffer FQN -> state identity of the kv_decoder contract."""
        out = {}
        for i in range(self.layers):
            out[f"k_cache_{i}"] = f"k{i}"
            out[f"v_cache_{i}"] = f"v{i}"
        return out

    def reset_caches(self) -> None:
        """Zero every buffer (the contract's initial state), for a fresh eager run to compare against."""
        for buffer in self.buffers():
            buffer.zero_()


def kv_decoder_contract(model: ToyDecoder, prefill_length: int, vocab: int | None = None) -> Contract:
    """The core's ``kv_decoder`` v1 specification bound to ``model``'s sizes, prefill of ``prefill_length`` tokens.

    ``vocab`` overrides the vocabulary size V (the bound on token ids) when a test needs a different one.
    """
    from etsdk._plugins.core_plugin import CONTRACTS_DIR

    spec = Contract.from_bytes((CONTRACTS_DIR / "kv_decoder" / "1.json").read_bytes())
    return spec.bind(
        T=prefill_length,
        S=model.capacity,
        H=model.heads,
        D=model.head_dim,
        V=vocab if vocab is not None else model.head.out_features,
        L=model.layers,
    )


def kv_decoder_methods(
    model: ToyDecoder, prefill_length: int, *, prefill_backends: tuple[str, ...], decode_backends: tuple[str, ...], **options: Any
) -> dict[str, MethodSource]:
    """``{"prefill": ..., "decode": ...}`` for :func:`etsdk.lower`: the same ``model`` with its caches declared
    as state, prefill over ``prefill_length`` tokens and decode over one, each on its own backends.

    ``options`` go to both :class:`etsdk.MethodSource` s (``partitioner_options=``, ``strict=``, ...).
    """
    state = model.state_fqns()
    return {
        "prefill": MethodSource(
            model,
            (torch.zeros(1, prefill_length, dtype=torch.long), torch.arange(prefill_length)),
            prefill_backends,
            state=state,
            **options,
        ),
        "decode": MethodSource(
            model, (torch.zeros(1, 1, dtype=torch.long), torch.tensor([0])), decode_backends, state=state, **options
        ),
    }
