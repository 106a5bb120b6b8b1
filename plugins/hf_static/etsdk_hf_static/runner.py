"""The hf_static v1 runner: the IO manager that drives ``prefill`` and ``decode`` over caller-owned state.

Before the first step it checks the program: the embedded metadata
(:mod:`etsdk_hf_static.metadata`) against the contract record, and every
method's engine inputs and outputs (shape *and* dtype: equal byte sizes are not
enough) against what the metadata implies. Before every step it writes the
positions and every layer's counter from ``start_pos`` and builds the mask
(:func:`~etsdk_hf_static.module.causal_mask`). A prompt is planned completely
before anything runs: full prefill chunks, a padded last chunk when it fits the
context, otherwise the tail goes through decode; a request that would not fit
the context is refused before the first step.

One :class:`Conversation` per independent stream; positions carry on across
``generate`` calls (multi-turn) until :meth:`Conversation.reset`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from etsdk import Contract, ContractError, GenerationError, GenerationResult, MethodInfo, Program, Sampling, dtype_name

from etsdk_hf_static.metadata import HfStaticMetadata, read_metadata
from etsdk_hf_static.module import causal_mask
from etsdk_hf_static.sampling import choose, generator_for

__all__ = [
    "Conversation",
    "EngineTensor",
    "HfStaticRunner",
    "ProgramMismatchError",
    "Step",
    "check_program",
    "check_tokens",
    "expected_io",
    "plan_prompt",
]


class ProgramMismatchError(ContractError):
    """A method's engine inputs or outputs are not what the hf_static metadata implies."""


@dataclass(frozen=True, slots=True)
class Step:
    """One method call: ``tokens`` (the real ones) written at ``start``; ``rows`` is the method's row count."""

    method: str
    start: int
    tokens: tuple[int, ...]
    rows: int


@dataclass(frozen=True, slots=True)
class EngineTensor:
    """One engine input or output the runner binds: name, dtype name, shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def describe(self) -> str:
        return f"{self.dtype} {list(self.shape)}"


def expected_io(meta: HfStaticMetadata) -> dict[str, tuple[tuple[EngineTensor, ...], tuple[EngineTensor, ...]]]:
    """Per method: the engine inputs and outputs the runner binds, in binding order."""
    out: dict[str, tuple[tuple[EngineTensor, ...], tuple[EngineTensor, ...]]] = {}
    for method, rows in (("prefill", meta.prefill_length), ("decode", 1)):
        inputs = (
            EngineTensor("input_ids", "int64", (1, rows)),
            EngineTensor("positions", "int64", (rows,)),
            EngineTensor("attention_mask", "bool", (1, 1, rows, meta.context_length)),
        )
        outputs = (EngineTensor("logits", meta.logits_dtype, (1, rows, meta.vocab_size)),)
        out[method] = (inputs, outputs)
    return out


def check_program(record: Contract | None, infos: Mapping[str, MethodInfo]) -> HfStaticMetadata:
    """Metadata, state and every method's engine I/O, before any step runs. ``infos``: method name -> info."""
    meta = read_metadata(record)
    assert record is not None  # read_metadata refuses a missing record
    cache = ("float32", (1, meta.kv_heads, meta.context_length, meta.head_dim))
    expected_states: dict[str, tuple[str, tuple[int, ...]]] = {}
    for layer in range(meta.layers):
        expected_states.update({f"k{layer}": cache, f"v{layer}": cache, f"c{layer}": ("int64", ())})
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
    for method, (inputs, outputs) in expected_io(meta).items():
        if method not in infos:
            raise ProgramMismatchError(f"the program has no method '{method}' (methods: {', '.join(sorted(infos))})")
        for bound in (i for i in record.method(method).inputs if i.state is not None):
            if (bound.dtype, tuple(bound.shape)) != found_states.get(bound.state or ""):
                raise ProgramMismatchError(
                    f"method '{method}' binds state '{bound.state}' as {bound.dtype} {list(bound.shape)}, "
                    f"the state is {found_states.get(bound.state or '')}"
                )
        info = infos[method]
        for side, wanted, present in (("input", inputs, info.inputs), ("output", outputs, info.outputs)):
            if len(present) != len(wanted):
                raise ProgramMismatchError(
                    f"method '{method}' has {len(present)} engine {side}(s), expected {len(wanted)} "
                    f"({', '.join(w.name for w in wanted)})"
                )
            for index, (want, tensor) in enumerate(zip(wanted, present)):
                if tensor is None or (dtype_name(tensor.dtype), tuple(tensor.shape)) != (want.dtype, want.shape):
                    found = "a non-tensor value" if tensor is None else f"{dtype_name(tensor.dtype)} {list(tensor.shape)}"
                    raise ProgramMismatchError(
                        f"method '{method}' {side} {index} ('{want.name}'): expected {want.describe()}, found {found}"
                    )
    return meta


def check_tokens(tokens: Iterable[Any], vocab: int, what: str = "prompt") -> tuple[int, ...]:
    """Token ids as Python ints in ``0 .. vocab-1``; anything else is a :class:`GenerationError`."""
    if isinstance(tokens, torch.Tensor):
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.dtype.is_complex:
            raise GenerationError(f"{what} token ids must be integers, found a {dtype_name(tokens.dtype)} tensor")
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


class _MethodInputs:
    """Pre-allocated engine inputs of one method, filled in place before each call."""

    def __init__(self, rows: int, context: int) -> None:
        self.rows = rows
        self.context = context
        self.ids = torch.zeros(1, rows, dtype=torch.long)
        self.positions = torch.zeros(rows, dtype=torch.long)
        self.mask = torch.zeros(1, 1, rows, context, dtype=torch.bool)
        self._offsets = torch.arange(rows)

    def fill(self, step: Step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Tokens (zero-padded), positions ``start ..``, and the mask of :func:`causal_mask`."""
        n = len(step.tokens)
        self.ids.zero_()
        self.ids[0, :n] = torch.tensor(step.tokens, dtype=torch.long)
        torch.add(self._offsets, step.start, out=self.positions)
        causal_mask(step.start, n, self.rows, self.context, out=self.mask)
        return self.ids, self.positions, self.mask


class Conversation:
    """One independent stream over a loaded program: its own caller-owned state and position."""

    def __init__(self, runner: HfStaticRunner) -> None:
        self._runner = runner
        self.session = runner.program.new_session()
        self._counters = [self.session.tensor(f"c{layer}") for layer in range(runner.metadata.layers)]
        self.position = 0  # cache rows written so far
        self.pending: tuple[int, ...] = ()  # the last generated token, not yet written to the cache

    def reset(self) -> None:
        """Back to an empty context (state at its initial values, in place)."""
        self.session.reset()
        self.position = 0
        self.pending = ()

    def run_step(self, step: Step) -> torch.Tensor:
        """Write counters, positions and mask for ``step``, run it, return the logits of its last real row."""
        runner = self._runner
        for counter in self._counters:
            counter.fill_(step.start)
        inputs = runner._inputs[step.method].fill(step)
        outputs = runner._methods[step.method].execute(inputs, session=self.session)
        self.position = step.start + len(step.tokens)
        return outputs[-1][0, len(step.tokens) - 1]

    def generate(
        self,
        prompt_ids: Iterable[int],
        *,
        max_new_tokens: int = 32,
        sampling: Sampling | None = None,
        on_token: Callable[[int], None] | None = None,
        stop_at_eos: bool = True,
    ) -> GenerationResult:
        """Continue the conversation with ``prompt_ids`` and generate up to ``max_new_tokens``.

        Everything is checked and planned before the first step: token ids, room in
        the context (``position + len(prompt) + max_new_tokens - 1 <= S``).
        ``on_token`` receives each token as it is chosen (streaming); the time it takes
        is not counted in ``decode_tokens_per_s``.
        """
        meta = self._runner.metadata
        sampling = sampling or Sampling()
        prompt = check_tokens(prompt_ids, meta.vocab_size)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be a positive integer, found {max_new_tokens!r}")
        feed = self.pending + prompt
        if not feed:
            raise GenerationError("the prompt is empty and the conversation has no pending token")
        needed = self.position + len(feed) + max_new_tokens - 1
        if needed > meta.context_length:
            raise GenerationError(
                f"{len(prompt)} prompt token(s) plus {max_new_tokens} new token(s) need {needed} cache rows "
                f"({self.position} already used), but the program's context length S is {meta.context_length}"
            )
        steps = plan_prompt(self.position, feed, meta)
        generator = generator_for(sampling)
        started = time.perf_counter()
        logits = None
        for step in steps:
            logits = self.run_step(step)
        assert logits is not None
        token = choose(logits, sampling, generator)
        prefill_ms = (time.perf_counter() - started) * 1e3
        generated: list[int] = []
        streaming_s = 0.0  # time spent in on_token: the caller's, not the model's

        def emit(token: int) -> None:
            nonlocal streaming_s
            generated.append(token)
            self.pending = (token,)
            if on_token is not None:
                before = time.perf_counter()
                on_token(token)
                streaming_s += time.perf_counter() - before

        emit(token)
        streaming_s = 0.0
        stopped = "length"
        decode_started = time.perf_counter()
        while True:
            if stop_at_eos and token in meta.eos_ids:
                stopped = "eos"
                break
            if len(generated) == max_new_tokens:
                break
            logits = self.run_step(Step("decode", self.position, (token,), 1))
            token = choose(logits, sampling, generator)
            emit(token)
        decode_s = time.perf_counter() - decode_started - streaming_s
        decoded = len(generated) - 1
        return GenerationResult(
            prompt_ids=prompt,
            token_ids=tuple(generated),
            prefill_ms=prefill_ms,
            decode_tokens_per_s=decoded / decode_s if decoded and decode_s > 0 else 0.0,
            stopped=stopped,
        )


class HfStaticRunner:
    """Drives a loaded hf_static program: checks it once, then serves any number of conversations."""

    def __init__(self, program: Program, *, tokenizer: Any = None) -> None:
        self.program = program
        self.metadata = check_program(program.contract, {m: program.method_info(m) for m in program.methods})
        self._methods = {method: program.load_method(method) for method in ("prefill", "decode")}
        self._inputs = {
            "prefill": _MethodInputs(self.metadata.prefill_length, self.metadata.context_length),
            "decode": _MethodInputs(1, self.metadata.context_length),
        }
        self._tokenizer = tokenizer
        self._default: Conversation | None = None

    @classmethod
    def from_program(cls, program: Program) -> HfStaticRunner:
        """A runner for ``program``, with the tokenizer export saved beside it when there is one."""
        from etsdk_hf_static.exporter import tokenizer_dir

        tokenizer = None
        if tokenizer_dir(program.path).is_dir():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(program.path))
        return cls(program, tokenizer=tokenizer)

    @classmethod
    def from_file(cls, path: str | Path, data: str | Path | None = None) -> HfStaticRunner:
        """Load ``model.pte`` (and its ``.ptd``: given, or ``model.ptd`` beside it)."""
        import etsdk

        return cls.from_program(etsdk.load(path, data=data if data is not None else etsdk.data_beside(path)))

    def new_conversation(self) -> Conversation:
        return Conversation(self)

    @property
    def default(self) -> Conversation:
        if self._default is None:
            self._default = Conversation(self)
        return self._default

    def generate(self, prompt_ids: Iterable[int], **options: Any) -> GenerationResult:
        """:meth:`Conversation.generate` on this runner's default conversation."""
        return self.default.generate(prompt_ids, **options)

    def reset(self) -> None:
        self.default.reset()

    # ------------------------------------------------------------------ text

    def encode(self, text: str) -> list[int]:
        if self._tokenizer is None:
            raise GenerationError(
                f"{self.program.path.name} has no tokenizer saved beside it (export from a model directory with one); "
                "pass token ids instead (--prompt-ids)"
            )
        ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        if self.metadata.bos_id is not None and self.default.position == 0 and not self.default.pending:
            ids = [self.metadata.bos_id, *ids]
        return ids

    def decode_text(self, ids: Sequence[int]) -> str:
        if self._tokenizer is None:
            return " ".join(map(str, ids))
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=True))
