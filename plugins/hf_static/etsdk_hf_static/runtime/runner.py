"""The hf_static runner: the IO manager that drives ``prefill`` and ``decode`` over caller-owned state.

A :class:`HfStaticRunner` is a :class:`~etsdk_hf_static.runtime.model.LoadedModel` (the program, checked once:
metadata against the contract record, every method's engine I/O) that serves conversations, and an
:class:`etsdk.TextRunner` (what ``etsdk generate`` drives) over its default conversation. Before every step a
conversation writes the positions and every layer's counter and builds the mask
(:func:`~etsdk_hf_static.masks.causal_mask`); a prompt is planned completely before anything runs
(:mod:`etsdk_hf_static.runtime.planning`); a request that would not fit the context is refused before the first step.

One :class:`~etsdk_hf_static.runtime.conversation.Conversation` per independent stream; positions carry on across
``generate`` calls (multi-turn) until ``reset``; conversations fork, rewind, snapshot, restore, save and load.

Threads: a runner (its program, metadata, tokenizer) may be shared by threads; a conversation is used by one thread
at a time. Conversations of one runner on different threads each fill their own inputs and bind their own state;
calls into the program are serialised by the program's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from etsdk import GenerationResult, Program, Sampling

from etsdk_hf_static.runtime.conversation import Conversation
from etsdk_hf_static.runtime.model import (
    LoadedModel,
    ProgramMismatchError,
    chat_template_ids,
    check_program,
    encode_text,
    load_tokenizer,
    no_tokenizer,
)
from etsdk_hf_static.runtime.planning import Step, check_tokens, plan_prompt

__all__ = [
    "Conversation",
    "HfStaticRunner",
    "ProgramMismatchError",
    "Step",
    "chat_template_ids",
    "check_program",
    "check_tokens",
    "encode_text",
    "load_tokenizer",
    "no_tokenizer",
    "plan_prompt",
]


class HfStaticRunner(LoadedModel):
    """Drives a loaded hf_static program: checks it once, then serves any number of conversations.

    An :class:`etsdk.TextRunner` (``encode``, ``decode_text``, ``generate``: what ``etsdk generate`` drives),
    and more: conversations, and the tokenizer's chat template (``chat_prompt_ids``, for ``etsdk chat``).
    """

    def __init__(self, program: Program, *, tokenizer: Any = None) -> None:
        super().__init__(program, tokenizer=tokenizer)
        self._default: Conversation | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_program(cls, program: Program) -> HfStaticRunner:
        """A runner for ``program``, with the tokenizer export saved beside it when there is one."""
        return cls(program, tokenizer=load_tokenizer(program.path))

    @classmethod
    def from_file(cls, path: str | Path, data: str | Path | None = None) -> HfStaticRunner:
        """Load ``model.pte`` (and its ``.ptd``: given, or ``model.ptd`` beside it)."""
        import etsdk

        return cls.from_program(etsdk.load(path, data=data if data is not None else etsdk.data_beside(path)))

    def new_conversation(self) -> Conversation:
        return Conversation(self)

    def load_conversation(self, path: str | Path) -> tuple[Conversation, dict[str, Any]]:
        """A new conversation holding the one saved in ``path``, and the metadata saved with it."""
        conversation = Conversation(self)
        return conversation, conversation.load(path)

    @property
    def default(self) -> Conversation:
        """The conversation :meth:`generate` and :meth:`reset` use (one thread at a time, like any conversation)."""
        with self._lock:
            if self._default is None:
                self._default = Conversation(self)
            return self._default

    def generate(
        self,
        prompt_ids: Iterable[int],
        *,
        max_new_tokens: int = 32,
        sampling: Sampling | None = None,
        on_token: Callable[[int], None] | None = None,
        stop_at_eos: bool = True,
    ) -> GenerationResult:
        """:meth:`Conversation.generate` on this runner's default conversation."""
        return self.default.generate(
            prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling, on_token=on_token, stop_at_eos=stop_at_eos
        )

    def reset(self) -> None:
        self.default.reset()

    def encode(self, text: str, *, bos: bool | None = None) -> list[int]:
        """``text`` as token ids; ``bos``: start with the model's BOS id (default: when the default conversation is empty)."""
        if bos is None:
            self.require_tokenizer()  # the error without a tokenizer, before a conversation is made
            bos = self.default.position == 0 and not self.default.pending
        return super().encode(text, bos=bos)


if TYPE_CHECKING:
    from etsdk import TextRunner

    def _is_a_text_runner(runner: HfStaticRunner) -> TextRunner:
        return runner  # mypy checks that HfStaticRunner satisfies etsdk.TextRunner (etsdk generate drives it)
