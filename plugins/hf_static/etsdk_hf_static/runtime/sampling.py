"""Choosing the next token from a row of logits, and finding stop strings in the text generated.

:func:`choose` applies an :class:`etsdk.Sampling` to one row, in llama.cpp's and vLLM's order:

1. penalties, over ``history``: the last ``repeat_last_n`` tokens of the conversation, which are the prompt
   (earlier turns included) and the tokens generated so far, as llama.cpp's penalty sampler counts them (it
   accepts the prompt's tokens into the same window). A token that occurs ``n`` times in the window has its
   logit divided by ``repeat_penalty`` when positive, multiplied by it otherwise (llama.cpp's rule), then
   lowered by ``presence_penalty`` and by ``n * frequency_penalty``;
2. greedy (``temperature == 0``): the first maximum of the (penalized) row, exactly ``torch.argmax``;
3. otherwise ``logits / temperature``, ``top_k``, softmax, ``top_p``, ``min_p``, and one draw from the
   seeded generator (with the defaults, the very draws of the sampler before ``top_k`` and ``min_p``
   existed).

Stop strings are found by :func:`etsdk_hf_static.runtime.stops.find_stop`, the rule the conversation stops by and
the command line streams by (it never prints a stop string).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from etsdk import GenerationError, Sampling

__all__ = ["choose", "generator_for", "penalize"]


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


def choose(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None, history: Sequence[int] = ()
) -> int:
    """The next token id from ``logits`` (shape ``[V]``); NaN or infinite logits are an error, not a token.

    ``history``: the conversation's tokens so far (prompt and generated), oldest first; the penalties look at
    its last ``sampling.repeat_last_n``. Without a penalty it is not read.
    """
    if sampling.penalized and history:
        if not bool(torch.isfinite(logits).all()):
            raise _non_finite()
        logits = penalize(logits, history, sampling)
    if sampling.greedy:
        # argmax propagates NaN (and picks +inf), so checking the chosen logit covers the whole row
        token = _argmax(logits)
        if not math.isfinite(float(logits[token])):
            raise _non_finite()
        return token
    if not bool(torch.isfinite(logits).all()):
        raise _non_finite()
    scaled = logits.float() / sampling.temperature
    if 0 < sampling.top_k < scaled.numel():
        kth = torch.topk(scaled, sampling.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)  # ties with the k-th stay, as in transformers
    probs = torch.softmax(scaled, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs[before >= sampling.top_p] = 0.0  # keeps the first token that crosses top_p
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if sampling.min_p > 0.0:
        probs = probs.masked_fill(probs < sampling.min_p * probs.max(), 0.0)  # the most likely token always stays
    return int(torch.multinomial(probs, 1, generator=generator))


def penalize(logits: torch.Tensor, history: Sequence[int], sampling: Sampling) -> torch.Tensor:
    """A float32 copy of ``logits`` with the repeat, presence and frequency penalties of ``sampling`` applied.

    The window is the last ``repeat_last_n`` ids of ``history`` (all of it for -1); each distinct id in it is
    penalized once, its count scaling ``frequency_penalty`` (llama.cpp's ``llama_sampler_penalties``).
    """
    window = list(history if sampling.repeat_last_n < 0 else history[-sampling.repeat_last_n :])
    out = logits.detach().to(torch.float32).clone()
    if not window or sampling.repeat_last_n == 0:
        return out
    ids, counts = torch.unique(torch.tensor(window, dtype=torch.long), return_counts=True)
    values = out[ids]
    if sampling.repeat_penalty != 1.0:
        values = torch.where(values <= 0, values * sampling.repeat_penalty, values / sampling.repeat_penalty)
    values = values - counts.to(torch.float32) * sampling.frequency_penalty - sampling.presence_penalty
    out[ids] = values
    return out


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
