"""A toy attention decoder following the ``kv_decoder`` contract (v1; v2 adds a decode step over several sessions).

Each layer writes its keys and values for ``positions`` into its caches in
place (``index_copy_``), then attends over every cache row at or before each
query's position. Small, deterministic, and enough to show whether state is
bound, updated in place, shared across methods and isolated across sessions.
:class:`BatchedToyDecoder` is the same model's decode step for B sessions at
once (``kv_decoder`` v2's ``decode_batch``): one set of caches per slot.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from etsdk._export.lower import MethodSource
from etsdk._state.contract import Contract
from etsdk._state.signature import StateSlot


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


class BatchedToyDecoder(torch.nn.Module):
    """``model``'s decode step for ``slots`` sessions in one call (``kv_decoder`` v2's ``decode_batch``).

    Shares ``model``'s weights (every projection runs once over the B rows) and holds one set of caches per
    slot (``k_cache_{i}_s{j}``): row ``j`` writes and attends over slot ``j``'s caches only, so with the
    sessions bound by slot each row computes what ``model``'s decode computes on that session alone.
    """

    def __init__(self, model: ToyDecoder, slots: int) -> None:
        super().__init__()
        self.model, self.slots = model, slots
        for j in range(slots):
            for i in range(model.layers):
                for kind in ("k", "v"):
                    self.register_buffer(f"{kind}_cache_{i}_s{j}", torch.zeros(1, model.heads, model.capacity, model.head_dim))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, 1, vocab]`` for ``tokens`` ``[B, 1]`` at ``positions`` ``[B]`` (row j: slot j)."""
        m = self.model
        x = m.embed(tokens)  # [B, 1, W]
        visible = torch.arange(m.capacity).unsqueeze(0) <= positions.unsqueeze(1)  # [B, S]
        bias = torch.where(visible, 0.0, -1e9)
        for i in range(m.layers):
            q, k, v, o = m.proj[i](x).chunk(4, dim=-1)
            rows = []
            for j in range(self.slots):
                k_cache = getattr(self, f"k_cache_{i}_s{j}")
                v_cache = getattr(self, f"v_cache_{i}_s{j}")
                shape = (1, 1, m.heads, m.head_dim)
                qj, kj, vj = (t[j : j + 1].reshape(shape).transpose(1, 2) for t in (q, k, v))
                k_cache.index_copy_(2, positions[j : j + 1], kj)
                v_cache.index_copy_(2, positions[j : j + 1], vj)
                scores = qj @ k_cache.transpose(-1, -2) / math.sqrt(m.head_dim) + bias[j]
                rows.append((scores.softmax(-1) @ v_cache).transpose(1, 2).reshape(1, 1, -1))
            x = x + torch.cat(rows) * torch.sigmoid(o)
        return m.head(x)

    def state_slots(self) -> dict[str, StateSlot]:
        """Buffer FQN -> (state identity, slot) of the kv_decoder contract."""
        return {
            f"{kind}_cache_{i}_s{j}": StateSlot(f"{kind}{i}", j)
            for j in range(self.slots) for i in range(self.model.layers) for kind in ("k", "v")
        }


def kv_decoder_contract(model: ToyDecoder, prefill_length: int, vocab: int | None = None, *, slots: int | None = None) -> Contract:
    """The core's ``kv_decoder`` specification bound to ``model``'s sizes, prefill of ``prefill_length`` tokens:
    v1, or with ``slots`` v2 (``decode_batch`` over that many sessions).

    ``vocab`` overrides the vocabulary size V (the bound on token ids) when a test needs a different one.
    """
    from etsdk._plugins.core_plugin import CONTRACTS_DIR

    version = 1 if slots is None else 2
    spec = Contract.from_bytes((CONTRACTS_DIR / "kv_decoder" / f"{version}.json").read_bytes())
    return spec.bind(
        T=prefill_length,
        S=model.capacity,
        H=model.heads,
        D=model.head_dim,
        V=vocab if vocab is not None else model.head.out_features,
        L=model.layers,
        **({} if slots is None else {"B": slots}),
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
