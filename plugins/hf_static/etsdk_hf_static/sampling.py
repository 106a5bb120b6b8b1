"""Choosing the next token from a row of logits: greedy, temperature, top-p (nucleus), seeded."""

from __future__ import annotations

import math

import torch
from etsdk import GenerationError, Sampling

__all__ = ["choose", "generator_for"]


def generator_for(sampling: Sampling) -> torch.Generator | None:
    """A CPU generator seeded from ``sampling.seed`` (None for greedy decoding)."""
    if sampling.greedy:
        return None
    generator = torch.Generator()
    if sampling.seed is not None:
        generator.manual_seed(sampling.seed)
    else:
        generator.seed()
    return generator


def choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The next token id from ``logits`` (shape ``[V]``); NaN or infinite logits are an error, not a token."""
    if sampling.greedy:
        # argmax propagates NaN (and picks +inf), so checking the chosen logit covers the whole row
        token = _argmax(logits)
        if not math.isfinite(float(logits[token])):
            raise _non_finite()
        return token
    if not bool(torch.isfinite(logits).all()):
        raise _non_finite()
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs[before >= sampling.top_p] = 0.0  # keeps the first token that crosses top_p
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def _argmax(logits: torch.Tensor) -> int:
    """``torch.argmax`` (first maximum; NaN wins), on the calling thread for CPU float rows.

    torch's argmax over a vocabulary-sized row is an OpenMP region on every thread: when another process holds a
    core it waits for the descheduled thread, once per generated token. numpy's runs on this thread alone, with
    the same result.
    """
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64, torch.float16):
        return int(logits.detach().numpy().argmax())
    return int(torch.argmax(logits))


def _non_finite() -> GenerationError:
    return GenerationError("the model produced non-finite logits (NaN or inf); refusing to pick a token")
