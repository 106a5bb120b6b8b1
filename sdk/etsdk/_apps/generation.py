"""Typed requests, results and the runner protocol shared by the applications and the contract runners.

A plugin that owns a generative contract (``etsdk-hf-static`` for ``hf_static``)
registers a :class:`etsdk.RunnerSpec` whose ``factory(program)`` returns a
:class:`TextRunner` (``encode(text)``, ``decode_text(ids)`` and
``generate(prompt_ids, max_new_tokens=..., sampling=..., on_token=...)``
returning a :class:`GenerationResult`), and whose ``exporter(request)`` takes an
:class:`ExportRequest`. The applications over such contracts (the plugin's
``etsdk export`` / ``etsdk generate`` / ``etsdk chat`` commands) speak these
types, and the core never imports a plugin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from etsdk.errors import GenerationError

__all__ = ["MIN_TEMPERATURE", "ExportRequest", "GenerationError", "GenerationResult", "Sampling", "TextRunner"]


#: the smallest non-zero sampling temperature (logits / temperature must stay finite in float32)
MIN_TEMPERATURE = 1e-6


@dataclass(frozen=True, slots=True)
class Sampling:
    """How the next token is chosen: greedy (``temperature == 0``) or sampled with a seed.

    ``top_p`` keeps the smallest set of tokens whose probability reaches it
    (nucleus sampling); ``seed`` makes sampling reproducible.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise GenerationError(f"{name} must be a number, found {type(value).__name__} {value!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise GenerationError(f"temperature must be a finite number >= 0, found {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise GenerationError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, found {self.temperature:g}: "
                "smaller temperatures overflow the scaled logits; use 0 for greedy decoding"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise GenerationError(f"top_p must be in (0, 1], found {self.top_p}")
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int):
                raise GenerationError(f"seed must be an integer, found {type(self.seed).__name__} {self.seed!r}")
            if not 0 <= self.seed < 1 << 64:
                raise GenerationError(f"seed must be an integer in [0, 2**64), found {self.seed}")

    @property
    def greedy(self) -> bool:
        """True when ``temperature`` is 0: the highest logit wins, whatever the sampling options say."""
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """What one ``generate`` call produced; ``stopped`` is ``"eos"`` or ``"length"``."""

    #: The prompt's ids, as the call was given them.
    prompt_ids: tuple[int, ...]
    #: The generated ids, the first one chosen from the prefill's logits (an EOS that stopped it included).
    token_ids: tuple[int, ...]
    #: Milliseconds from the call to the first token chosen (prefill and sampling).
    prefill_ms: float
    #: Decode steps per second after the first token, the caller's ``on_token`` time excluded; 0 for one token.
    decode_tokens_per_s: float
    stopped: str

    def to_json(self) -> dict[str, object]:
        """What ``etsdk generate --json`` prints (ids as lists)."""
        return {
            "prompt_ids": list(self.prompt_ids),
            "token_ids": list(self.token_ids),
            "prefill_ms": self.prefill_ms,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "stopped": self.stopped,
        }


@dataclass(frozen=True, slots=True)
class ExportRequest:
    """Export ``model`` (a directory or a model object) to ``output``.

    ``backend``: backend for every method; ``method_backends`` overrides it per
    method (``{"prefill": "EtsdkReferenceBackend", "decode": "EtsdkAotiBackend"}``).
    ``sizes``: the contract's sizes the caller chooses (``{"T": 8, "S": 64}``).
    ``external_data``: weights in a ``.ptd`` beside the ``.pte``.
    ``partitioner_options``: backend id (or short name) -> partitioner options.
    """

    model: object
    output: Path
    backend: str
    method_backends: Mapping[str, str] = field(default_factory=dict)
    sizes: Mapping[str, int] = field(default_factory=dict)
    external_data: bool = False
    #: True: no progress lines on stderr (``etsdk export --quiet``).
    quiet: bool = False
    partitioner_options: Mapping[str, Mapping[str, object]] = field(default_factory=dict)


@runtime_checkable
class TextRunner(Protocol):
    """What a runner that generates text offers: ``etsdk generate`` drives any runner that satisfies it.

    A :class:`etsdk.RunnerSpec` of a generative contract returns one from ``factory(program)``
    (etsdk-hf-static's ``HfStaticRunner`` does; mypy checks it). ``isinstance(runner, TextRunner)``
    checks only that the three methods exist; their signatures are checked by a type checker.
    """

    def encode(self, text: str) -> list[int]:
        """``text`` as token ids, ready to be a prompt (a BOS id first where the model wants one)."""
        ...

    def decode_text(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (for streaming, called with every id generated so far)."""
        ...

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int = ...,
        sampling: Sampling | None = ...,
        on_token: Callable[[int], None] | None = ...,
    ) -> GenerationResult:
        """Continue with ``prompt_ids`` and generate up to ``max_new_tokens``, calling ``on_token`` with each id."""
        ...
