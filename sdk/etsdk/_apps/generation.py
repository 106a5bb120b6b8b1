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

from etsdk._format.weight_format import QuantizationPlan
from etsdk.errors import GenerationError

__all__ = ["MIN_TEMPERATURE", "ExportRequest", "GenerationError", "GenerationResult", "Sampling", "TextRunner"]


#: the smallest non-zero sampling temperature (logits / temperature must stay finite in float32)
MIN_TEMPERATURE = 1e-6


@dataclass(frozen=True, slots=True)
class Sampling:
    """How the next token is chosen, and when generation stops early: greedy (``temperature == 0``) or sampled.

    The options of llama.cpp's and vLLM's samplers, applied to each row of logits in this order:

    1. penalties (``repeat_penalty``, ``presence_penalty``, ``frequency_penalty``) over the last
       ``repeat_last_n`` tokens of the conversation: the prompt (earlier turns included) and the tokens
       generated so far, as llama.cpp counts them. A logit of a token in that window is divided by
       ``repeat_penalty`` when positive and multiplied by it otherwise, then lowered by
       ``presence_penalty`` once and by ``frequency_penalty`` per occurrence;
    2. greedy: the highest logit wins (``top_k``, ``top_p``, ``min_p`` and ``seed`` do not matter);
       otherwise ``temperature``, then ``top_k`` (keep the k most likely tokens), ``top_p`` (the smallest set
       whose probability reaches it: nucleus sampling), ``min_p`` (drop tokens less likely than ``min_p``
       times the most likely one), and a draw from a generator seeded with ``seed``.

    Stopping: ``stop`` strings end generation as soon as the decoded text contains one (the text reported
    ends before it); ``ignore_eos`` keeps generating past an end-of-sequence id. The defaults are plain
    greedy decoding that stops at EOS. Every field is checked here: a value out of range is a
    :class:`GenerationError` naming the field and its range.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    #: Keep only the k most likely tokens before sampling; 0 (the default) keeps all.
    top_k: int = 0
    #: Drop tokens whose probability is below ``min_p`` times the most likely token's, in [0, 1]; 0 is off.
    min_p: float = 0.0
    #: Divide a positive logit of a recent token by it (multiply a negative one); a finite number > 0, 1 is off.
    repeat_penalty: float = 1.0
    #: Subtracted once from the logit of every recent token; a finite number, 0 is off.
    presence_penalty: float = 0.0
    #: Subtracted from a recent token's logit per occurrence in the window; a finite number, 0 is off.
    frequency_penalty: float = 0.0
    #: The penalties' window: the last N tokens of the conversation (llama.cpp's default 64); -1: all, 0: none.
    repeat_last_n: int = 64
    #: Strings that end generation when the decoded text contains one (not part of the reported text).
    stop: tuple[str, ...] = ()
    #: True: an end-of-sequence id does not stop generation (it is generated like any token).
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
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
        for name, low in (("top_k", 0), ("repeat_last_n", -1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                what = "0 keeps every token" if name == "top_k" else "-1: the whole conversation, 0: no penalties"
                raise GenerationError(f"{name} must be an integer >= {low} ({what}), found {value!r}")
        if not 0.0 <= self.min_p <= 1.0:
            raise GenerationError(f"min_p must be in [0, 1] (0 is off), found {self.min_p}")
        if not math.isfinite(self.repeat_penalty) or self.repeat_penalty <= 0:
            raise GenerationError(f"repeat_penalty must be a finite number > 0 (1 is off), found {self.repeat_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise GenerationError(f"{name} must be a finite number (0 is off), found {getattr(self, name)}")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        try:
            stop = tuple(stop)
        except TypeError:
            raise GenerationError(f"stop must be a sequence of strings, found {type(self.stop).__name__}") from None
        for index, text in enumerate(stop):
            if not isinstance(text, str) or not text:
                raise GenerationError(f"stop[{index}] must be a non-empty string, found {text!r}")
        object.__setattr__(self, "stop", stop)  # frozen: normalised once, here
        if not isinstance(self.ignore_eos, bool):
            raise GenerationError(f"ignore_eos must be True or False, found {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        """True when ``temperature`` is 0: the highest logit wins, whatever the sampling options say."""
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """True when a penalty changes logits: a ``repeat_penalty`` other than 1 or a presence / frequency
        penalty other than 0, over a window of ``repeat_last_n != 0`` tokens."""
        active = self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        return active and self.repeat_last_n != 0


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """What one ``generate`` call produced; ``stopped`` is ``"eos"``, ``"length"`` or ``"stop"`` (a stop string)."""

    #: The prompt's ids, as the call was given them.
    prompt_ids: tuple[int, ...]
    #: The generated ids, the first one chosen from the prefill's logits (an EOS that stopped it included).
    token_ids: tuple[int, ...]
    #: Milliseconds from the call to the first token chosen (prefill and sampling).
    prefill_ms: float
    #: Decode steps per second after the first token, the caller's ``on_token`` time excluded; 0 for one token
    #: (no decode step ran: ``to_json`` gives null, the command line says ``n/a``).
    decode_tokens_per_s: float
    stopped: str
    #: The generated text as the runner decodes it, ending before the stop string that stopped it (None: not decoded).
    text: str | None = None

    @property
    def decode_steps(self) -> int:
        """Decode steps run: one per token after the first (the first comes from the prompt's logits)."""
        return max(len(self.token_ids) - 1, 0)

    def to_json(self) -> dict[str, object]:
        """What ``etsdk generate --json`` prints (ids as lists)."""
        return {
            "prompt_ids": list(self.prompt_ids),
            "token_ids": list(self.token_ids),
            "prefill_ms": self.prefill_ms,
            "decode_tokens_per_s": self.decode_tokens_per_s if self.decode_steps else None,  # no decode step: no rate
            "stopped": self.stopped,
            **({"text": self.text} if self.text is not None else {}),
        }


@dataclass(frozen=True, slots=True)
class ExportRequest:
    """Export ``model`` (a directory or a model object) to ``output``.

    ``backend``: backend for every method; ``method_backends`` overrides it per
    method (``{"prefill": "EtsdkReferenceBackend", "decode": "EtsdkAotiBackend"}``).
    ``sizes``: the contract's sizes the caller chooses (``{"T": 8, "S": 64}``).
    ``external_data``: weights in a ``.ptd`` beside the ``.pte``.
    ``partitioner_options``: backend id (or short name) -> partitioner options.
    ``quantization``: which layers to quantize to which weight format (None: keep the model's weights).
    ``allow_requantize``: a source stored in formats the exporter cannot keep as they are (a GGUF file's
    Q6_K, say) is dequantized instead of refused.
    ``options``: the contract exporter's own choices, by name (hf_static: ``attention``); an exporter refuses a
    name it does not know.
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
    quantization: QuantizationPlan | None = None
    allow_requantize: bool = False
    options: Mapping[str, object] = field(default_factory=dict)


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
        """The text of ``ids`` (a whole reply, or, while streaming, a window of its last few ids)."""
        ...

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int = ...,
        sampling: Sampling | None = ...,
        on_token: Callable[[int], None] | None = ...,
    ) -> GenerationResult:
        """Continue with ``prompt_ids`` and generate up to ``max_new_tokens``, calling ``on_token`` with each id.

        Every field of ``sampling`` applies, stop strings and ``ignore_eos`` included (``stopped == "stop"``
        and ``text`` ending before the stop string when one ended it).
        """
        ...
