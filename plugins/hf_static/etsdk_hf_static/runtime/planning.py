"""Planning the calls of an hf_static program: which method writes which tokens at which rows.

A prompt is planned completely before anything runs (:func:`plan_prompt`): full
prefill chunks of T, a padded last chunk when ``start + T <= S``, otherwise (and
for a single token) the tail goes through decode. Each decision depends only on
the start row and the number of tokens left, which is what makes prompt-prefix
reuse exact: the full chunks a prefix plans are the first steps of the plan of
any prompt it starts, and the rest of that plan is the plan of the remaining
tokens (see ``Conversation.prefill``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from etsdk import GenerationError

from etsdk_hf_static.masks import causal_mask, slot_mask
from etsdk_hf_static.metadata import HfStaticMetadata

__all__ = [
    "MethodInputs",
    "Step",
    "check_tokens",
    "full_chunks",
    "plan_prompt",
]


@dataclass(frozen=True, slots=True)
class Step:
    """One method call: ``tokens`` (the real ones) written at ``start``; ``rows`` is the method's row count."""

    method: str
    start: int
    tokens: tuple[int, ...]
    rows: int


def check_tokens(tokens: Iterable[Any], vocab: int, what: str = "prompt") -> tuple[int, ...]:
    """Token ids as Python ints in ``0 .. vocab-1``; anything else is a :class:`GenerationError`."""
    if isinstance(tokens, torch.Tensor):
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.dtype.is_complex:
            dtype = str(tokens.dtype).removeprefix("torch.")
            raise GenerationError(f"{what} token ids must be integers, found a {dtype} tensor")
        tokens = tokens.reshape(-1).tolist()
    if isinstance(tokens, (str, bytes)):
        raise GenerationError(f"{what} must be token ids, found text; encode it first (runner.encode)")
    out = []
    for index, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, int):
            raise GenerationError(f"{what} token {index} must be an integer id, found {token!r}")
        if not 0 <= token < vocab:
            raise GenerationError(f"{what} token {index} is {token}, outside the vocabulary 0..{vocab - 1}")
        out.append(token)
    return tuple(out)


def plan_prompt(position: int, tokens: Sequence[int], meta: HfStaticMetadata) -> list[Step]:
    """The calls that write ``tokens`` at ``position``: full prefill chunks, a padded last chunk if it fits, else decode."""
    steps: list[Step] = []
    T, S = meta.prefill_length, meta.context_length
    i = 0
    while i < len(tokens):
        left = len(tokens) - i
        start = position + i
        if left >= T or (left > 1 and start + T <= S):
            n = min(left, T)
            steps.append(Step("prefill", start, tuple(tokens[i : i + n]), T))
            i += n
        else:  # one token, or a tail whose padded chunk would run past the context
            steps.append(Step("decode", start, (tokens[i],), 1))
            i += 1
    return steps


def full_chunks(position: int, tokens: Sequence[int], meta: HfStaticMetadata) -> list[Step]:
    """The leading full (unpadded) prefill chunks of ``plan_prompt(position, tokens)``.

    Any longer prompt starting with ``tokens`` plans exactly these steps first, so writing them now and
    the rest later gives the very calls a whole-prompt run makes.
    """
    steps = []
    for step in plan_prompt(position, tokens, meta):
        if step.method != "prefill" or len(step.tokens) != step.rows:
            break
        steps.append(step)
    return steps


class MethodInputs:
    """Pre-allocated engine inputs of one method, filled in place before each call (one set per conversation).

    ``ring``, ``window``: a version-2 (or 3) program's ring rows R and window W; its methods take a second mask, for
    the ring caches (:func:`~etsdk_hf_static.masks.slot_mask`). ``unread_window_mask``: a version-3 program without
    ring caches, whose methods take a one-column window mask they do not read.
    """

    def __init__(
        self, rows: int, context: int, *, ring: int | None = None, window: int | None = None, unread_window_mask: bool = False
    ) -> None:
        self.rows = rows
        self.context = context
        self.ring, self.window = ring, window
        self.ids = torch.zeros(1, rows, dtype=torch.long)
        self.positions = torch.zeros(rows, dtype=torch.long)
        self.mask = torch.zeros(1, 1, rows, context, dtype=torch.bool)
        self.window_mask = None if ring is None else torch.zeros(1, 1, rows, ring, dtype=torch.bool)
        self._unread = torch.ones(1, 1, rows, 1, dtype=torch.bool) if unread_window_mask else None
        self._offsets = torch.arange(rows)

    @classmethod
    def for_method(cls, rows: int, meta: HfStaticMetadata) -> MethodInputs:
        """The inputs of a method of ``rows`` rows of the program ``meta`` describes (version 1, 2 or 3)."""
        unread = meta.version == 3 and meta.ring_rows is None
        return cls(rows, meta.context_length, ring=meta.ring_rows, window=meta.window, unread_window_mask=unread)

    def fill(self, step: Step) -> tuple[torch.Tensor, ...]:
        """Tokens (zero-padded), positions ``start ..``, the mask of :func:`causal_mask` (and the ring's)."""
        n = len(step.tokens)
        self.ids.zero_()
        self.ids[0, :n] = torch.tensor(step.tokens, dtype=torch.long)
        torch.add(self._offsets, step.start, out=self.positions)
        causal_mask(step.start, n, self.rows, self.context, out=self.mask)
        if self._unread is not None:
            return self.ids, self.positions, self.mask, self._unread
        if self.window_mask is None:
            return self.ids, self.positions, self.mask
        assert self.ring is not None and self.window is not None
        slot_mask(step.start, n, self.rows, self.ring, self.window, out=self.window_mask)
        return self.ids, self.positions, self.mask, self.window_mask
