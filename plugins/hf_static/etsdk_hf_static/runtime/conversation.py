"""One conversation over an hf_static program: its state, its tokens, and what can be done with them.

A :class:`Conversation` owns a session of the program (KV caches and counters,
caller-owned, in the core), its own engine input tensors, and its token
history: the tokens whose cache rows are written (``position`` of them) followed
by the *pending* ones, chosen or given but not written yet (after a reply, the
last generated token). Because the state lives in the core's session, a
conversation can be forked, rewound, snapshotted, restored, saved and loaded
without knowing which backend computed it.

Exactness. A row of the cache is computed by the method that wrote it (prefill
over T rows or decode over one), from the rows before it. Everything here keeps
the calls a conversation makes the calls a fresh conversation going the same way
would make:

* :meth:`Conversation.rewind` drops tokens and leaves the last kept one pending,
  which is the state a fresh conversation is in after generating up to there;
  rows past the position are masked out and overwritten later.
* :meth:`Conversation.prefill` writes only the full prefill chunks of its
  tokens and keeps the rest pending: any prompt starting with them plans exactly
  those chunks first (:func:`~etsdk_hf_static.runtime.planning.full_chunks`), so a
  shared prefix forked into many conversations continues with the very calls,
  and so the very logits, of a whole-prompt run.

Threads: one conversation is used by one thread at a time. Conversations of one
runner may run on different threads: each fills its own inputs and binds its own
session, and calls into the program are serialised by the program's lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from etsdk import GenerationError, GenerationResult, Sampling

from etsdk_hf_static.runtime.detokenize import IncrementalText
from etsdk_hf_static.runtime.fitting import context_fixes, does_not_fit, rows_needed
from etsdk_hf_static.runtime.planning import (
    MethodInputs,
    Step,
    check_tokens,
    full_chunks,
    plan_prompt,
)
from etsdk_hf_static.runtime.sampling import choose, generator_for
from etsdk_hf_static.runtime.stops import find_stop

if TYPE_CHECKING:
    from etsdk import Session, Snapshot

    from etsdk_hf_static.runtime.model import LoadedModel

__all__ = ["Conversation", "Generation", "common_prefix", "run_decode_batch"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

#: key of the conversation's own record in a snapshot's metadata
SNAPSHOT_KEY = "hf_static.conversation"


class Conversation:
    """One independent stream over a loaded program: its own caller-owned state, inputs, tokens and position."""

    def __init__(self, model: LoadedModel, *, session: Session | None = None) -> None:
        meta = model.metadata
        self._model = model
        if session is None:
            session = model.program.new_session()
        else:
            session.check_owner(model.program)
        self.session = session
        # version 1 keeps a counter per layer (written from the step's start); version 2 writes at the positions
        self._counters = [session.tensor(f"c{layer}") for layer in range(meta.layers)] if meta.version == 1 else []
        self._inputs = {
            "prefill": MethodInputs.for_method(meta.prefill_length, meta),
            "decode": MethodInputs.for_method(1, meta),
        }
        self._tokens: list[int] = []  # rows 0 .. position-1 written, then the pending tokens
        self._position = 0
        self._gap: int | None = None  # a low-level step left rows before it unwritten: history unknown
        # one past the highest position any call wrote since the rows were last all written afresh (padded
        # prefill rows and rows later rewound included): what a ring cache may have overwritten
        self._written_end = 0
        self._live: Generation | None = None  # the generation under way, if any (one at a time)

    # ------------------------------------------------------------------ what it holds

    @property
    def position(self) -> int:
        """Cache rows written so far."""
        return self._position

    @property
    def pending(self) -> tuple[int, ...]:
        """Tokens of the conversation not yet written to the cache (the next call writes them first)."""
        return tuple(self._tokens[self._position :]) if self._gap is None else ()

    @property
    def tokens(self) -> tuple[int, ...]:
        """Every token of the conversation: the written rows', then the pending ones."""
        self._check_history("read its tokens")
        return tuple(self._tokens)

    def reset(self) -> None:
        """Back to an empty context (state at its initial values, in place); a generation under way is cancelled."""
        if self._live is not None:
            self._live.cancel()
        self.session.reset()
        self._tokens = []
        self._position = 0
        self._gap = None
        self._written_end = 0

    def encode(self, text: str) -> list[int]:
        """``text`` as token ids, starting with BOS when the conversation is empty (needs the tokenizer)."""
        return self._model.encode(text, bos=self._gap is None and not self._tokens)

    # ------------------------------------------------------------------ running

    def run_step(self, step: Step) -> torch.Tensor:
        """Write counters, positions and mask for ``step``, run it, return the logits of its last real row.

        A step must lie inside the cache (rows ``start .. start + rows - 1`` within ``0 .. S-1``) and carry
        1 .. rows token ids of the vocabulary; anything else is a :class:`GenerationError`, before it runs.
        """
        inputs = self._filled(step)  # checked first: a step of no method of this runner is refused by name
        outputs = self._model.methods[step.method].execute(inputs, session=self.session)
        self._ran(step)
        return outputs[-1][0, len(step.tokens) - 1]

    def _filled(self, step: Step) -> tuple[torch.Tensor, ...]:
        """``step`` checked (:meth:`run_step`'s rules), the counters written, and its engine inputs filled."""
        inputs = self._checked(step)
        for counter in self._counters:
            counter.fill_(step.start)
        return inputs.fill(step)

    def _checked(self, step: Step) -> MethodInputs:
        """The inputs of ``step``'s method, once ``step`` follows :meth:`run_step`'s rules (nothing is written)."""
        meta = self._model.metadata
        inputs = self._inputs.get(step.method)
        if inputs is None:
            raise GenerationError(f"hf_static has methods prefill and decode, not '{step.method}'")
        count = len(step.tokens)
        if step.rows != inputs.rows or not 1 <= count <= inputs.rows:
            raise GenerationError(
                f"a {step.method} step has {inputs.rows} row(s) and 1..{inputs.rows} token(s), "
                f"found rows={step.rows} with {count} token(s)"
            )
        if isinstance(step.start, bool) or not isinstance(step.start, int) or step.start < 0 or step.start + inputs.rows > meta.context_length:
            raise GenerationError(
                f"a {step.method} step at position {step.start!r} would use cache rows outside 0..{meta.context_length - 1} "
                f"(it covers {inputs.rows} row(s); S is {meta.context_length})"
            )
        check_tokens(step.tokens, meta.vocab_size, what=f"{step.method} step")
        return inputs

    def _ran(self, step: Step) -> None:
        """Keep what ``step`` (run) wrote."""
        self._written_end = step.start + step.rows if step.start == 0 else max(self._written_end, step.start + step.rows)
        self._wrote(step.start, step.tokens)

    def _wrote(self, start: int, tokens: tuple[int, ...]) -> None:
        """Keep the history: rows ``start ..`` now hold ``tokens``; what follows them stays pending if consistent."""
        end = start + len(tokens)
        if self._gap is not None or start > len(self._tokens):
            self._gap = start if self._gap is None else min(self._gap, start)
        elif self._tokens[start:end] != list(tokens):
            self._tokens[start:] = tokens
        self._position = end

    def generate(
        self,
        prompt_ids: Iterable[int],
        *,
        max_new_tokens: int = 32,
        sampling: Sampling | None = None,
        on_token: Callable[[int], None] | None = None,
        stop_at_eos: bool = True,
        continues: bool = True,
    ) -> GenerationResult:
        """Continue the conversation with ``prompt_ids`` and generate up to ``max_new_tokens``.

        Everything is checked and planned before the first step: token ids, room in
        the context (:func:`~etsdk_hf_static.runtime.fitting.rows_needed`: the conversation's
        tokens + ``len(prompt)`` + ``max_new_tokens`` ``<= S``; the message names the
        fixes that apply). ``on_token`` receives each token as it is chosen (streaming);
        the time it takes is not counted in ``decode_tokens_per_s``. An exception raised
        by ``on_token`` stops the generation between steps (``etsdk chat`` stops a reply
        on Ctrl-C this way): it propagates, and the tokens chosen so far stay in the
        conversation, the last one pending, as after a reply of that length.

        ``sampling`` (:class:`etsdk.Sampling`): penalties over the conversation's last
        ``repeat_last_n`` tokens (earlier turns, this prompt, the tokens generated so far);
        ``stop`` strings end the reply once the decoded text contains one (``stopped ==
        "stop"``; the result's ``text`` ends before it; needs the tokenizer);
        ``ignore_eos`` (or ``stop_at_eos=False``) generates past an EOS id.

        ``continues``: the result's ``text`` reads as the continuation of the prompt (a completion: a SentencePiece
        tokenizer's first word keeps its space, so prompt + text reads as the whole); False: as text on its own (a
        chat reply).

        The loop is :class:`Generation`'s (:meth:`begin`), one step per ``advance``: what a server interleaves.
        """
        generation = self.begin(
            prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling, stop_at_eos=stop_at_eos, continues=continues
        )
        try:
            while not generation.done:
                token = generation.advance()
                if token is not None and on_token is not None:
                    on_token(token)
        except BaseException:
            generation.cancel("interrupted")  # the tokens chosen stay; the conversation can go on
            raise
        return generation.result()

    def begin(
        self,
        prompt_ids: Iterable[int],
        *,
        max_new_tokens: int = 32,
        sampling: Sampling | None = None,
        stop_at_eos: bool = True,
        continues: bool = True,
    ) -> Generation:
        """A :class:`Generation` of ``prompt_ids``, checked and planned as :meth:`generate` does; nothing runs yet.

        One at a time: until it is done (or cancelled) the conversation refuses another, and a rewind or prefill.
        """
        return Generation(
            self, prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling, stop_at_eos=stop_at_eos, continues=continues
        )

    def keep_prefix(self, ids: Sequence[int]) -> int:
        """Rewind to the longest prefix of ``ids`` this conversation holds, keeping at least one of ``ids`` to run.

        Returns how many of ``ids`` are kept: the caller continues with ``ids[kept:]`` (its logits start the reply).
        What ``etsdk chat`` does before each message, and ``etsdk serve`` before each request on a slot.
        """
        have = self.tokens
        common = min(common_prefix(ids, have), len(ids) - 1)
        if common < len(have):
            self.rewind(len(have) - common)
        return max(common, 0)

    def _write(self, steps: list[Step], new: tuple[int, ...]) -> torch.Tensor | None:
        """Append ``new`` to the history and run ``steps``; on failure, forget the tokens no step wrote."""
        before = len(self._tokens)
        self._tokens.extend(new)
        logits = None
        try:
            for step in steps:
                logits = self.run_step(step)
        except BaseException:
            del self._tokens[max(self._position, before) :]
            raise
        return logits

    # ------------------------------------------------------------------ reuse

    def prefill(self, prompt_ids: Iterable[int]) -> int:
        """Add ``prompt_ids`` to the conversation without generating: a shared prefix, prefilled once.

        Writes the full prefill chunks of the pending tokens and keeps the rest pending, so that any
        continuation (here or in a :meth:`fork`) makes exactly the calls of a conversation that was given
        the whole prompt at once. Returns the number of cache rows written now.
        """
        meta = self._model.metadata
        ids = check_tokens(prompt_ids, meta.vocab_size)
        self._check_history("prefill")
        self._check_idle("prefill")
        used, S = len(self._tokens), meta.context_length
        if rows_needed(used, len(ids), 0) > S:
            raise GenerationError(does_not_fit(used, len(ids), 0, S, context_fixes(used, len(ids), 0, S)))
        before = self._position
        self._write(full_chunks(self._position, [*self.pending, *ids], meta), ids)
        return self._position - before

    def fork(self) -> Conversation:
        """A new conversation continuing from this one: a copy of its state and tokens (its own storage)."""
        twin = Conversation(self._model, session=self.session.fork())
        twin._tokens = list(self._tokens)
        twin._position = self._position
        twin._gap = self._gap
        twin._written_end = self._written_end
        return twin

    def rewind(self, count: int) -> None:
        """Drop the last ``count`` tokens (``0 .. len(tokens)``).

        The last token kept becomes pending (its row is written again by the next call, which needs its
        logits), exactly the state a fresh conversation is in after generating up to it. Rows past the
        position are masked out and overwritten by the next calls.

        Sliding-window layers (hf_static v2) keep ring caches: a ring of R rows still holds every row the next
        query needs as long as no call wrote more than ``R - W + 1`` positions past the new position
        (``metadata.rewind_reach()``, at least T), counting padded prefill rows and rows of earlier rewinds. A
        rewind beyond that keeps the tokens but leaves them all pending, so the next call writes them again
        from position 0 (a re-prefill, as a fresh conversation given them as one prompt would).
        """
        self._check_history("rewind")
        self._check_idle("rewind")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= len(self._tokens):
            raise GenerationError(
                f"rewind takes a number of tokens in 0..{len(self._tokens)} (the conversation's length), found {count!r}"
            )
        if count == 0:
            return
        del self._tokens[len(self._tokens) - count :]
        position = min(self._position, max(len(self._tokens) - 1, 0))
        reach = self._model.metadata.rewind_reach()
        if reach is not None and self._written_end - position > reach:
            # the ring caches of sliding-window layers no longer hold every row the kept tokens' next query needs
            # (later rows overwrote them): every kept token is written again by the next call, as for a fresh
            # conversation given them as its prompt
            position = 0
        self._position = position

    # ------------------------------------------------------------------ snapshots and files

    def snapshot(self, metadata: Mapping[str, Any] | None = None) -> Snapshot:
        """An immutable copy of this conversation (state, tokens, position); ``metadata``: JSON kept with it."""
        self._check_history("take a snapshot")
        record: dict[str, Any] = {"tokens": list(self._tokens), "position": self._position, "written_end": self._written_end}
        if metadata is not None:
            record["user"] = dict(metadata)
        return self.session.snapshot({SNAPSHOT_KEY: record})

    def restore(self, snapshot: Snapshot) -> dict[str, Any]:
        """Make this conversation the one in ``snapshot`` (taken on this model and state specs, any backend).

        Returns the metadata given to :meth:`snapshot` / :meth:`save`. Refused (``etsdk.StateError``) before
        anything changes for a snapshot of another model, another S, or one not taken from a conversation.
        """
        from etsdk import Snapshot, StateError

        self._check_idle("restore a snapshot")
        if not isinstance(snapshot, Snapshot):
            raise StateError(f"restore() takes an etsdk Snapshot, found {type(snapshot).__name__}")
        meta = self._model.metadata
        record = snapshot.metadata.get(SNAPSHOT_KEY)
        if not isinstance(record, Mapping) or not {"tokens", "position"} <= set(record) or set(record) - {"tokens", "position", "user", "written_end"}:
            raise StateError("the snapshot was not taken from an hf_static conversation (no conversation record)")
        tokens, position, user = record["tokens"], record["position"], record.get("user", {})
        if not isinstance(tokens, list) or len(tokens) > meta.context_length:
            raise StateError(f"the snapshot's tokens must be a list of at most S={meta.context_length} ids")
        try:
            tokens = list(check_tokens(tokens, meta.vocab_size, what="snapshot"))
        except GenerationError as exc:
            raise StateError(str(exc)) from None
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position <= len(tokens):
            raise StateError(f"the snapshot's position must be in 0..{len(tokens)}, found {position!r}")
        if not isinstance(user, Mapping):
            raise StateError("the snapshot's user metadata must be an object")
        # a snapshot without it (an older etsdk-hf-static's) may hold rows up to S: assume so (a rewind re-prefills)
        written_end = record.get("written_end", meta.context_length)
        if isinstance(written_end, bool) or not isinstance(written_end, int) or not position <= written_end <= meta.context_length:
            raise StateError(f"the snapshot's written_end must be in {position}..{meta.context_length}, found {written_end!r}")
        self.session.restore(snapshot)
        self._tokens, self._position, self._gap, self._written_end = tokens, position, None, written_end
        return dict(user)

    def save(self, path: str | Path, metadata: Mapping[str, Any] | None = None) -> Path:
        """Write this conversation to ``path`` (safetensors: state, tokens, position, ``metadata``)."""
        return self.snapshot(metadata).save(path)

    def load(self, path: str | Path) -> dict[str, Any]:
        """Replace this conversation by the one saved in ``path``; returns the metadata saved with it."""
        from etsdk import Snapshot

        return self.restore(Snapshot.load(path))

    def _check_idle(self, action: str) -> None:
        if self._live is not None:
            raise GenerationError(f"cannot {action}: a generation is under way on this conversation; let it finish or cancel() it")

    def _check_history(self, action: str) -> None:
        if self._gap is not None:
            raise GenerationError(
                f"cannot {action}: a step wrote at row {self._gap} or later with rows before it never written, so "
                "the conversation's tokens are unknown; reset() it"
            )


def run_decode_batch(conversations: Sequence[Conversation], steps: Sequence[Step], spares: Sequence[Conversation]) -> list[torch.Tensor]:
    """One ``decode_batch`` call for several conversations of one model: row ``j`` is ``steps[j]`` (a decode step)
    on ``conversations[j]``'s session, each bound to its own slot; returns each one's logits, as :meth:`Conversation.
    run_step` would (within float rounding: the rows are multiplied together).

    The program's ``decode_batch`` runs over B sessions: rows beyond ``len(conversations)`` are filled by ``spares``
    (conversations of the same model whose caches take a throwaway row at position 0; they keep no history of it).
    Refused before anything runs (:class:`GenerationError`): a program without the method, more conversations than
    B, too few spares, conversations of another model or given twice, a step that is not a decode step.
    """
    if not conversations:
        raise GenerationError("run_decode_batch needs at least one conversation")
    model = conversations[0]._model
    method, slots = model.methods.get("decode_batch"), model.decode_batch
    if method is None or slots is None:
        raise GenerationError(
            f"{model.program.path.name} has no decode_batch method; export it with decode_batch (etsdk export --decode-batch 4)"
        )
    padding = slots - len(conversations)
    if len(steps) != len(conversations) or padding < 0 or len(spares) < padding:
        raise GenerationError(
            f"decode_batch advances {slots} conversations: {len(conversations)} given with {len(steps)} step(s) and "
            f"{len(spares)} spare(s)"
        )
    bound = [*conversations, *spares[:padding]]
    if any(c._model is not model for c in bound) or len({id(c) for c in bound}) != len(bound):
        raise GenerationError("decode_batch takes distinct conversations of one loaded model")
    if any(step.method != "decode" for step in steps):
        raise GenerationError(f"decode_batch runs decode steps, found {', '.join(sorted({s.method for s in steps}))}")
    rows = [*steps, *[Step("decode", 0, (0,), 1)] * padding]  # a spare's row: position 0
    for conversation, step in zip(bound, rows):
        conversation._checked(step)  # every step before any session's counters are written
    parts = [conversation._filled(step) for conversation, step in zip(bound, rows)]
    inputs = tuple(torch.cat([part[i] for part in parts]) for i in range(len(parts[0])))
    outputs = method.execute(inputs, sessions=[c.session for c in bound])
    for conversation, step in zip(conversations, steps):
        conversation._ran(step)
    return [outputs[-1][j, 0] for j in range(len(conversations))]


class Generation:
    """One request on a conversation, advanced one step at a time: the generation loop of ``generate``, ``etsdk
    chat`` and ``etsdk serve`` alike.

    Made by :meth:`Conversation.begin`, which checks and plans everything first. Each :meth:`advance` runs one
    call: a prefill chunk of the prompt (returns None until the last one, which chooses the first token) or one
    decode step (returns the token it chose). :attr:`done` says when it stopped (:attr:`stopped`: ``"eos"``,
    ``"stop"``, ``"length"``, or what :meth:`cancel` was given). The tokens chosen stay in the conversation, the
    last one pending, whenever it stops; a prompt chunk that never ran is forgotten (:meth:`cancel`, or an error).
    Times count only the generation's own calls, so requests interleaved on one program each report their own.
    """

    def __init__(
        self,
        conversation: Conversation,
        prompt_ids: Iterable[int],
        *,
        max_new_tokens: int,
        sampling: Sampling | None,
        stop_at_eos: bool,
        continues: bool = True,
    ) -> None:
        model = conversation._model
        meta = model.metadata
        sampling = sampling or Sampling()
        if sampling.stop and model.tokenizer is None:
            raise GenerationError("stop strings need the tokenizer saved beside the program (it decodes the text they match)")
        prompt = check_tokens(prompt_ids, meta.vocab_size)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be a positive integer, found {max_new_tokens!r}")
        conversation._check_history("generate")
        conversation._check_idle("generate")
        feed = conversation.pending + prompt
        if not feed:
            raise GenerationError("the prompt is empty and the conversation has no pending token")
        used, S = len(conversation._tokens), meta.context_length
        if rows_needed(used, len(prompt), max_new_tokens) > S:
            fixes = context_fixes(used, len(prompt), max_new_tokens, S)
            raise GenerationError(does_not_fit(used, len(prompt), max_new_tokens, S, fixes))
        self.conversation = conversation
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.stop_at_eos = stop_at_eos and not sampling.ignore_eos
        self._steps = plan_prompt(conversation._position, feed, meta)
        #: cache rows the prompt's calls write (its new tokens and the pending one; padding not counted)
        self.prompt_rows = len(feed)
        self._generator = generator_for(sampling)
        self._before = len(conversation._tokens)
        conversation._tokens.extend(prompt)
        # the text: decoded as tokens come, after the conversation's last ids (a tokenizer's; ids joined by spaces
        # have no joining rules to follow)
        context = conversation._tokens if continues and model.tokenizer is not None else ()
        self._decoded = IncrementalText(model.decode_text, context)
        conversation._live = self
        self.tokens: list[int] = []  # chosen so far
        self.stopped: str | None = None
        self._prefill_s = 0.0
        self._decode_s = 0.0
        self._searched = 0
        self._cut: int | None = None  # stop strings: the text searched so far, where one begins

    @property
    def done(self) -> bool:
        return self.stopped is not None

    def advance(self) -> int | None:
        """Run the next call; the token it chose, or None after a prompt chunk that chooses none."""
        if self.stopped is not None:
            raise GenerationError(f"this generation has stopped ({self.stopped})")
        conversation = self.conversation
        started = time.perf_counter()
        try:
            if self._steps:
                logits = conversation.run_step(self._steps.pop(0))
                if self._steps:
                    self._prefill_s += time.perf_counter() - started
                    return None
            else:
                logits = conversation.run_step(Step("decode", conversation._position, (self.tokens[-1],), 1))
        except BaseException:
            self.failed()
            raise
        return self.took(logits, started)

    @property
    def decode_step(self) -> Step | None:
        """The decode step the next call is, or None while prompt chunks remain (or once stopped): a caller may
        run it together with other conversations' (:func:`run_decode_batch`), then hand the logits to :meth:`took`."""
        if self.stopped is not None or self._steps or not self.tokens:
            return None
        return Step("decode", self.conversation._position, (self.tokens[-1],), 1)

    def failed(self) -> None:
        """The call of this generation's step failed (it raised): stop here, forgetting what no step wrote."""
        self._forget_unwritten()
        self.stopped = self.stopped or "error"
        self._ended()

    def took(self, logits: torch.Tensor, started: float) -> int:
        """Choose the next token from the logits of this generation's step, which began at ``started``
        (``time.perf_counter()``); what :meth:`advance` does after its call. Once per :attr:`decode_step` run
        (refused while prompt chunks remain, or once stopped)."""
        if self.stopped is not None:
            raise GenerationError(f"this generation has stopped ({self.stopped})")
        if self._steps:
            raise GenerationError(f"this generation's prompt has {len(self._steps)} chunk(s) left to run before a token is chosen")
        try:
            token = choose(logits, self.sampling, self._generator, self.conversation._tokens)
        except BaseException:
            self.failed()
            raise
        conversation = self.conversation
        self.tokens.append(token)
        conversation._tokens.append(token)  # pending until the next step writes it
        self._check_stop(token)
        if self.stopped is not None:
            self._ended()
        elapsed = time.perf_counter() - started
        if len(self.tokens) == 1:
            self._prefill_s += elapsed
        else:
            self._decode_s += elapsed
        return token

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop here (a client left, Ctrl-C): the tokens chosen stay, a prompt chunk not run is forgotten."""
        if self.stopped is None:
            self._forget_unwritten()
            self.stopped = reason
            self._ended()

    def _ended(self) -> None:
        if self.conversation._live is self:
            self.conversation._live = None

    def _forget_unwritten(self) -> None:
        conversation = self.conversation
        if self._steps or not self.tokens:  # the prompt is not all written: drop what no step wrote
            del conversation._tokens[max(conversation._position, self._before) :]
            self._steps = []

    def _check_stop(self, token: int) -> None:
        if self.stop_at_eos and token in self.conversation._model.metadata.eos_ids:
            self.stopped = "eos"
            return
        if self.sampling.stop:
            text = self.decoded
            self._cut, self._searched = find_stop(text, self.sampling.stop, self._searched), len(text)
            if self._cut is not None:
                self.stopped = "stop"
                return
        if len(self.tokens) == self.max_new_tokens:
            self.stopped = "length"

    @property
    def decoded(self) -> str:
        """The text of the tokens chosen so far (stop strings included), complete characters only until it is done:
        what a stream shows (through :func:`~etsdk_hf_static.runtime.stops.visible_text`)."""
        self._decoded.extend(self.tokens[self._decoded.count :])
        return self._decoded.final() if self.done else self._decoded.text

    @property
    def text(self) -> str:
        """The text generated so far, up to a stop string."""
        if self._cut is not None:
            return self.decoded[: self._cut]
        self._decoded.extend(self.tokens[self._decoded.count :])
        return self._decoded.final()

    def result(self) -> GenerationResult:
        """The result so far (``stopped`` is ``"length"`` while it runs)."""
        decoded = len(self.tokens) - 1
        return GenerationResult(
            prompt_ids=self.prompt,
            token_ids=tuple(self.tokens),
            prefill_ms=self._prefill_s * 1e3,
            decode_tokens_per_s=decoded / self._decode_s if decoded > 0 and self._decode_s > 0 else 0.0,
            stopped=self.stopped or "length",
            text=self.text,
        )
