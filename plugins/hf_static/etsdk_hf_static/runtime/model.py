"""A loaded hf_static program, checked once: its metadata, its methods, its tokenizer.

:class:`LoadedModel` is what conversations run on (:mod:`~etsdk_hf_static.runtime.conversation`), and what the
runner (:class:`~etsdk_hf_static.runtime.runner.HfStaticRunner`) is: before the first step it checks the
embedded metadata (:mod:`etsdk_hf_static.metadata`) against the contract record, and every method's engine inputs
and outputs (shape *and* dtype: equal byte sizes are not enough) against what the metadata implies.

The tokenizer helpers need no loaded program: ``etsdk generate`` encodes a prompt and checks that it fits the
context before the program's methods load.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from etsdk import Contract, ContractError, GenerationError, MethodInfo, Program, dtype_name

from etsdk_hf_static.metadata import HfStaticMetadata, read_metadata
from etsdk_hf_static.runtime.planning import check_tokens

__all__ = [
    "LoadedModel",
    "ProgramMismatchError",
    "chat_template_ids",
    "check_program",
    "encode_text",
    "load_tokenizer",
    "no_tokenizer",
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
    for method in ("prefill", "decode", *(["decode_batch"] if "decode_batch" in infos else [])):
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


class LoadedModel:
    """A checked hf_static program with its ``prefill`` and ``decode`` methods loaded (and ``decode_batch`` when it
    has one), and its tokenizer (or None).

    Shared by any number of conversations and threads: it holds no conversation state, and its text methods
    take turns on the tokenizer (a transformers fast tokenizer may change its own settings inside a call, and
    refuses a second thread meanwhile: "Already borrowed").
    """

    def __init__(self, program: Program, *, tokenizer: Any = None) -> None:
        from etsdk_hf_static.runtime.startup import mark

        mark("tokenizer")  # from_program loaded it before it made the model
        self.program = program
        self.metadata = check_program(program.contract, {m: program.method_info(m) for m in program.methods})
        self.methods = {method: program.load_method(method) for method in ("prefill", "decode")}
        #: how many conversations the program's ``decode_batch`` advances in one call (None: it has none)
        self.decode_batch: int | None = None
        if "decode_batch" in program.methods and program.contract is not None:
            self.methods["decode_batch"] = program.load_method("decode_batch")
            self.decode_batch = program.contract.slots_of("decode_batch")
        mark("methods")
        self.tokenizer = tokenizer
        self._text_lock = threading.RLock()

    def require_tokenizer(self) -> Any:
        """The tokenizer, or the error naming what to do without one."""
        if self.tokenizer is None:
            raise no_tokenizer(self.program.path.name)
        return self.tokenizer

    def encode(self, text: str, *, bos: bool) -> list[int]:
        """``text`` as token ids, after the model's BOS id when ``bos``."""
        tokenizer = self.require_tokenizer()
        with self._text_lock:
            return encode_text(tokenizer, text, self.metadata.bos_id if bos else None)

    def decode_text(self, ids: Sequence[int]) -> str:
        """``ids`` as text (special tokens skipped); ids joined by spaces when there is no tokenizer."""
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        with self._text_lock:
            return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The ids of ``messages`` (``{"role", "content"}``) through the tokenizer's chat template, ready for a reply."""
        tokenizer = self.require_tokenizer()
        with self._text_lock:
            return chat_template_ids(tokenizer, messages, self.metadata.vocab_size, self.program.path.name)


# ---------------------------------------------------------------------- the tokenizer, without a loaded program


def load_tokenizer(program_path: str | Path) -> Any:
    """The tokenizer export saved beside ``program_path`` (``model.tokenizer/``), or None when there is none.

    Needs no loaded program: ``etsdk generate`` encodes a text prompt with it and checks that the request fits
    the context before the program's methods load.
    """
    from etsdk_hf_static.metadata import tokenizer_dir

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
