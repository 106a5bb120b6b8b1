"""The conformance kit's models: small, deterministic, each aimed at one behaviour."""

from __future__ import annotations

import torch

D = 8  # width of the pair model
S = 6  # rows of its cache


class Mlp(torch.nn.Module):
    """Linear layers and activations: what almost every backend claims."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(11)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class WithUnclaimed(torch.nn.Module):
    """Linear layers around operators a backend may well not claim (cumulative sum, flip): portable kernels run them."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(12)
        self.first = torch.nn.Linear(8, 8)
        self.second = torch.nn.Linear(8, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        h = torch.cumsum(h, dim=-1)
        h = torch.flip(h, dims=[-1])
        return self.second(h)


class TwoOutputs(torch.nn.Module):
    """Two outputs of one shape and dtype with different values: a swapped binding shows."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(13)
        self.a = torch.nn.Linear(D, D)
        self.b = torch.nn.Linear(D, D)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x) * 3.0


class CachePair(torch.nn.Module):
    """A cache update (an aliased, caller-owned output) beside two user outputs (contract etsdk_kit_pair v1)."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(14)
        self.a = torch.nn.Linear(D, D)
        self.b = torch.nn.Linear(D, D)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator))
        self.k: torch.Tensor
        self.register_buffer("k", torch.zeros(S, D))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k.index_copy_(0, positions, x)
        memory = self.k.sum(0, keepdim=True)
        return self.a(x) + memory, self.b(x) * 3.0


class QuantizedMlp(torch.nn.Module):
    """An embedding, two linear layers and a head, to be quantized (``etsdk.quantize_model``) in a format the
    backend declares: rows of 64 values, so every group size of 32 or 64 divides them."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(15)
        self.embed = torch.nn.Embedding(32, 64)
        self.up = torch.nn.Linear(64, 64)
        self.down = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 32, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(torch.relu(self.up(self.embed(ids)))))

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head


class FilledAttention(torch.nn.Module):
    """``etsdk::attention`` in both of its forms over a cache of 40 rows (grouped heads of 64 values): float32
    keys / values, and the same rows as int8 with a scale per row. Inputs: the query and the boolean mask."""

    def __init__(self) -> None:
        super().__init__()
        from etsdk._ops.attention import quantize_rows

        generator = torch.Generator().manual_seed(16)
        keys, values = (torch.randn(1, 2, 40, 64, generator=generator) for _ in range(2))
        (k8, ks), (v8, vs) = quantize_rows(keys), quantize_rows(values)
        for name, tensor in (("k", keys), ("v", values), ("k8", k8), ("ks", ks), ("v8", v8), ("vs", vs)):
            self.register_buffer(name, tensor)

    def forward(self, query: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attention = torch.ops.etsdk.attention
        return (
            attention(query, self.k, self.v, mask, 0.125),
            attention(query, self.k8, self.v8, mask, 0.125, self.ks, self.vs),
        )
