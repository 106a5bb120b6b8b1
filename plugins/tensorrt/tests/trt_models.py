"""Small models for the etsdk-tensorrt tests, and how each is exported.

:class:`Seam`: one method ``step`` writing ``x`` into a cache at a counter
(``arange(T) + count``: a ``TensorScatter`` write, alias kind ``kv_cache_update``),
advancing the counter (a ``user`` alias) and returning ``y``, a user output
shaped exactly like the cache, and ``z``. The engine orders its outputs states
first, the delegate ``y, z``: binding by engine order would put the cache in
``y``'s slot without any shape or dtype noticing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import etsdk
import torch
from etsdk_tensorrt import BACKEND_ID

H, S, T, D = 2, 8, 2, 4
SEAM_CONTRACT = Path(__file__).resolve().parent / "data" / "seam_cache.json"


class Seam(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(5)
        self.scale = torch.nn.Parameter(torch.randn(D, generator=generator))
        self.register_buffer("cache", torch.zeros(1, H, S, D))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.arange(T) + self.count
        self.count.add_(T)
        self.cache.index_copy_(2, index, x * self.scale)
        return self.cache * 3 + 1, x.sum(-1)


def seam_contract() -> etsdk.Contract:
    etsdk.register_contracts(
        [etsdk.ContractSpec(name="test_tensorrt_seam", version=1, path=SEAM_CONTRACT)], "etsdk-tensorrt-test-contracts"
    )
    return etsdk.Contract.from_bytes(SEAM_CONTRACT.read_bytes()).bind(H=H, S=S, T=T, D=D)


def export_seam(path: Path, **options: Any) -> Path:
    """``Seam`` through TensorRT (``device="cpu"``: the stand-in's engines live on the host) to ``path``."""
    model = Seam().eval()
    source = etsdk.MethodSource(
        model, (torch.zeros(1, H, T, D),), (BACKEND_ID,), {BACKEND_ID: {"device": "cpu", **options}},
        state={"cache": "cache", "count": "count"},
    )
    with torch.no_grad():
        etsdk.lower({"step": source}, contract=seam_contract()).save(path)
    return path


def seam_inputs(steps: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, T, D, generator=generator) for _ in range(steps)]
