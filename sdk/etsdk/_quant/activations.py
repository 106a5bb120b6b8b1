"""Int8 activations, the ``:a8`` weight formats: a linear layer's input rounded to int8 in blocks of 32 values.

The math (llama.cpp's Q8_0 activations): for each block of 32 consecutive values
of a row, ``d = max|x| / 127`` and ``q = round(x * (1 / d))`` rounded half to
even (``q = 0`` where ``d == 0``), every step in float32; the layer then computes
with ``q * d`` in place of ``x``. A kernel multiplies the int8 ``q`` by the
weight's integers and applies ``d`` and the weight's scale once per block; the
eager implementation here (dequantize both, then ``linear``) is the reference
those kernels are checked against: equal up to float rounding, since every
block's integer products are exact.
"""

from __future__ import annotations

import torch

__all__ = ["ACTIVATION_BLOCK", "dequantize_activations", "quantize_activations"]

#: Values of a row sharing one activation scale.
ACTIVATION_BLOCK = 32


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[..., K]`` (K a multiple of 32) as ``(q, d)``: ``q`` float32 ``[..., K]`` holding integers in
    -127..127, ``d`` float32 ``[..., K / 32]``, one scale per block. Raises ``ValueError`` for another K."""
    columns = int(x.shape[-1])
    if columns % ACTIVATION_BLOCK:
        raise ValueError(f"int8 activations come in blocks of {ACTIVATION_BLOCK} values; a row has {columns}")
    blocks = x.float().reshape(*x.shape[:-1], columns // ACTIVATION_BLOCK, ACTIVATION_BLOCK)
    d = blocks.abs().amax(-1) / 127.0
    inverse = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inverse.unsqueeze(-1))
    return q.reshape(x.shape), d


def dequantize_activations(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``q * d`` per block: the values a layer with int8 activations computes with (float32 ``[..., K]``)."""
    columns = int(q.shape[-1])
    blocks = q.reshape(*q.shape[:-1], columns // ACTIVATION_BLOCK, ACTIVATION_BLOCK) * d.unsqueeze(-1)
    return blocks.reshape(q.shape)
