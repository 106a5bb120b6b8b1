"""The hf_static v1 runner: the IO manager that drives ``prefill`` and ``decode`` over caller-owned state.

Before the first step it checks the program: the embedded metadata
(:mod:`etsdk_hf_static.metadata`) against the contract record, and every
method's engine inputs and outputs (shape *and* dtype: equal byte sizes are not
enough) against what the metadata implies. Before every step it writes the
positions and every layer's counter from ``start_pos`` and builds the mask
(:func:`~etsdk_hf_static.module.causal_mask`). A prompt is planned completely
before anything runs (:mod:`etsdk_hf_static.planning`); a request that would
not fit the context is refused before the first step.

One :class:`~etsdk_hf_static.conversation.Conversation` per independent stream;
positions carry on across ``generate`` calls (multi-turn) until ``reset``;
conversations fork, rewind, snapshot, restore, save and load.

Threads: a runner (its program, metadata, tokenizer) may be shared by threads;
a conversation is used by one thread at a time. Conversations of one runner on
different threads each fill their own inputs and bind their own state; calls
into the program are serialised by the program's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from etsdk import Contract, ContractError, GenerationError, GenerationResult, MethodInfo, Program, Sampling, dtype_name

from etsdk_hf_static.conversation import Conversation
from etsdk_hf_static.metadata import HfStaticMetadata, read_metadata
from etsdk_hf_static.planning import MethodInputs, Step, check_tokens, plan_prompt

_MethodInputs = MethodInputs  # the name tests and older callers use

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


class ProgramMismatchError(ContractError):
    """A method's engine inputs or outputs are not what the hf_static metadata implies."""


def check_program(record: Contract | None, infos: Mapping[str, MethodInfo]) -> HfStaticMetadata:
    """Metadata, state and every method's engine I/O, before any step runs. ``infos``: method name -> info."""
    meta = read_metadata(record)
    assert record is not None  # read_metadata refuses a missing record
    expected_states: dict[str, tuple[str, tuple[int, ...]]] = {}
    for layer in range(meta.layers):
        expected_states.update(meta.cache_states(layer))
        if meta.version == 1:
            expected_states[f"c{layer}"] = ("int64", ())
    found_states = {s.name: (s.dtype, tuple(int(d) for d in s.shape)) for s in record.states}
    for name, (dtype, shape) in expected_states.items():
        if name not in found_states:
            raise ProgramMismatchError(f"state '{name}' is missing (metadata declares {meta.layers} layers)")
        found_dtype, found_shape = found_states[name]
        if (found_dtype, found_shape) != (dtype, shape):
            raise ProgramMismatchError(
                f"state '{name}': expected {dtype} {list(shape)}, found {found_dtype} {list(found_shape)}"
            )
    extra = sorted(set(found_states) - set(expected_states))
    if extra:
        raise ProgramMismatchError(f"unexpected state(s) {', '.join(extra)} for {meta.layers} layers")
    for method in ("prefill", "decode"):
        if method not in infos:
            raise ProgramMismatchError(f"the program has no method '{method}' (methods: {', '.join(sorted(infos))})")
        for bound in (i for i in record.method(method).inputs if i.state is not None):
            if (bound.dtype, tuple(bound.shape)) != found_states.get(bound.state or ""):
                raise ProgramMismatchError(
                    f"method '{method}' binds state '{bound.state}' as {bound.dtype} {list(bound.shape)}, "
                    f"the state is {found_states.get(bound.state or '')}"
                )
        info = infos[method]
        record.check_engine_io(  # the one engine-I/O check export and load make too
            method,
            [None if t is None else (dtype_name(t.dtype), tuple(t.shape)) for t in info.inputs],
            [None if t is None else (dtype_name(t.dtype), tuple(t.shape)) for t in info.outputs],
            where="hf_static runner",
            error=ProgramMismatchError,
        )
    return meta


class HfStaticRunner:
    """Drives a loaded hf_static program: checks it once, then serves any number of conversations.

    An :class:`etsdk.TextRunner` (``encode``, ``decode_text``, ``generate``: what ``etsdk generate`` drives),
    and more: conversations, and the tokenizer's chat template (``chat_prompt_ids``, for ``etsdk chat``).
    """

    def __init__(self, program: Program, *, tokenizer: Any = None) -> None:
        from etsdk_hf_static.startup import mark

        mark("tokenizer")  # from_program loaded it before it made the runner
        self.program = program
        self.metadata = check_program(program.contract, {m: program.method_info(m) for m in program.methods})
        self._methods = {method: program.load_method(method) for method in ("prefill", "decode")}
        mark("methods")
        self._tokenizer = tokenizer
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

    # ------------------------------------------------------------------ text

    def _require_tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise no_tokenizer(self.program.path.name)
        return self._tokenizer

    def encode(self, text: str, *, bos: bool | None = None) -> list[int]:
        """``text`` as token ids; ``bos``: start with the model's BOS id (default: when the default conversation is empty)."""
        tokenizer = self._require_tokenizer()
        if bos is None:
            bos = self.default.position == 0 and not self.default.pending
        return encode_text(tokenizer, text, self.metadata.bos_id if bos else None)

    def decode_text(self, ids: Sequence[int]) -> str:
        if self._tokenizer is None:
            return " ".join(map(str, ids))
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=True))

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The ids of ``messages`` (``{"role", "content"}``) through the tokenizer's chat template, ready for a reply."""
        return chat_template_ids(self._require_tokenizer(), messages, self.metadata.vocab_size, self.program.path.name)


# ---------------------------------------------------------------------- the tokenizer, without a loaded program


def load_tokenizer(program_path: str | Path) -> Any:
    """The tokenizer export saved beside ``program_path`` (``model.tokenizer/``), or None when there is none.

    Needs no loaded program: ``etsdk generate`` encodes a text prompt with it and checks that the request fits
    the context before the program's methods load.
    """
    from etsdk_hf_static.exporter import tokenizer_dir

    if not tokenizer_dir(program_path).is_dir():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir(program_path))


def no_tokenizer(program_name: str) -> GenerationError:
    """The error for text asked of a program without a tokenizer."""
    return GenerationError(
        f"{program_name} has no tokenizer saved beside it (export from a model directory with one); "
        "pass token ids instead (--prompt-ids)"
    )


def encode_text(tokenizer: Any, text: str, bos_id: int | None) -> list[int]:
    """``text`` as ids of ``tokenizer`` (no special tokens added by it), after ``bos_id`` when one is given."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return [bos_id, *ids] if bos_id is not None else ids


def chat_template_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]], vocab_size: int, program_name: str) -> list[int]:
    """``messages`` through ``tokenizer``'s chat template with the generation prompt, as checked ids."""
    if not getattr(tokenizer, "chat_template", None):
        raise GenerationError(f"the tokenizer saved beside {program_name} has no chat template; prompt it without --chat")
    try:
        encoded = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # jinja2 errors, template exceptions: the template's, reported as one line
        raise GenerationError(f"the chat template failed: {type(exc).__name__}: {exc}") from None
    ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
    return list(check_tokens(list(ids), vocab_size, what="chat template"))


if TYPE_CHECKING:
    from etsdk import TextRunner

    def _is_a_text_runner(runner: HfStaticRunner) -> TextRunner:
        return runner  # mypy checks that HfStaticRunner satisfies etsdk.TextRunner (etsdk generate drives it)
