"""The server's engine: session slots over one program, a bounded queue, and requests interleaved step by step.

One thread (the engine's) owns the program and every slot. Each slot is a
:class:`~etsdk_hf_static.runtime.conversation.Conversation` (its own caller-owned caches) that keeps its tokens
between requests. A request (:class:`Job`) waits in a bounded queue (full: :class:`~.protocol.RequestError` 503)
until a slot is free; then:

* **prefix reuse**: the slot whose tokens share the longest prefix with the request's is chosen; when that slot is
  busy, an idle slot becomes a fork of it (a copy of its state), so no request's slot is ever taken from it; the
  conversation keeps that prefix (:meth:`~etsdk_hf_static.runtime.conversation.Conversation.keep_prefix`) and
  only the rest is prefilled;
* **interleaving**: every active request advances by one call per round (one prefill chunk or one decode step:
  :class:`~etsdk_hf_static.runtime.conversation.Generation`), so a long reply holds back another request's first
  token by at most a step per active request;
* **decoding together**: when the program has ``decode_batch`` (exported with ``--decode-batch B``), the requests whose
  next call is a decode step take it together, B at a time (:func:`~etsdk_hf_static.runtime.conversation.
  run_decode_batch`: each its own slot's caches, every weight read once for all of them); spare conversations fill
  the rows of a group smaller than B.

Events go back to the request's own event loop thread-safely (``emit``). A cancelled job (the client left) stops
before its next step and frees its slot. Nothing here knows HTTP.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etsdk import EtsdkError, GenerationError, Sampling

from etsdk_hf_static.apps.serve.metrics import Metrics
from etsdk_hf_static.apps.serve.protocol import RequestError
from etsdk_hf_static.runtime.conversation import Conversation, Generation, common_prefix, run_decode_batch
from etsdk_hf_static.runtime.model import LoadedModel
from etsdk_hf_static.runtime.planning import Step
from etsdk_hf_static.runtime.stops import visible_text

__all__ = ["Engine", "Job", "Outcome", "Started"]


@dataclass(frozen=True, slots=True)
class Started:
    """A job got its slot: prompt tokens reused from the slot (or its fork), rows the prompt's calls write."""

    cached_tokens: int
    prefill_tokens: int
    slot: int
    forked: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job ended: ``stopped`` (``eos``, ``stop``, ``length``, ``cancelled``), its text and token counts."""

    text: str
    stopped: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose cache rows were reused, not computed again
    prefill_tokens: int  # rows the prompt's calls wrote (its new tokens, and a pending one)
    slot: int
    forked: bool


@dataclass(eq=False)
class Job:
    """One request: the whole prompt's ids, how many tokens at most, how to sample; ``emit`` receives its events.

    Events: ``("start", Started)`` when it gets a slot, ``("text", str)`` for each piece of visible text, then ``("done", Outcome)`` or ``("error",
    RequestError)``. ``emit`` is called on the engine's thread; it must hand the event over and return.
    """

    ids: tuple[int, ...]
    max_tokens: int
    sampling: Sampling
    emit: Callable[[tuple[str, Any]], None]
    #: the reply's text continues the prompt (a completion), or stands alone (a chat reply): Conversation.begin's
    continues: bool = True
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False

    def cancel(self) -> None:
        """Stop before the next step (any thread); the slot is freed then."""
        self.cancelled = True


@dataclass(eq=False)
class _Slot:
    index: int
    conversation: Conversation
    job: Job | None = None
    generation: Generation | None = None
    used: int = 0  # when a request last ended here (a counter): the least recently used slot is reused first
    shown: str = ""
    cached: int = 0
    forked: bool = False
    first: float = 0.0


class Engine:
    """``slots`` conversations of ``model`` and a queue of at most ``queue`` waiting requests; call :meth:`start`."""

    def __init__(
        self, model: LoadedModel, *, slots: int, queue: int, metrics: Metrics, session_dir: Path | None = None,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        if slots < 1 or queue < 0:
            raise EtsdkError(f"the server needs at least one slot and a queue of 0 or more, found {slots} / {queue}")
        self.model = model
        self.metrics = metrics
        self.queue_limit = queue
        self.session_dir = session_dir
        self._log = log
        self._count = slots
        self._slots: list[_Slot] = []  # made on the engine's thread (see _run)
        self._spares: list[Conversation] = []  # decode_batch's unused rows (see run_decode_batch)
        self._waiting: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._clock = 0
        self._thread = threading.Thread(target=self._run, name="etsdk-serve-engine", daemon=True)
        self._started = False
        self._failure: str | None = None
        self._ready = threading.Event()

    # ------------------------------------------------------------------ outside the engine's thread

    @property
    def slot_bytes(self) -> int:
        """Bytes of caller-owned state one slot holds (its caches and counters), from the contract's state specs."""
        import math

        import torch

        states = self.model.program.contract.states if self.model.program.contract is not None else ()
        total = 0
        for spec in states:
            total += math.prod(int(d) for d in spec.shape) * torch.empty((), dtype=getattr(torch, spec.dtype)).element_size()
        return total

    @property
    def slots(self) -> int:
        return self._count

    @property
    def spare_count(self) -> int:
        """Conversations kept to fill a decode_batch call's unused rows: B - 2 (a group has 2 or more requests;
        a lone one takes an ordinary decode step), none without decode_batch or with one slot."""
        batch = self.model.decode_batch
        return max(batch - 2, 0) if batch and self._count > 1 else 0

    @property
    def alive(self) -> bool:
        """Whether the engine can take requests (started or startable, not stopping, its thread not failed)."""
        return not self._stopping and self._failure is None

    def start(self, *, again: bool = False) -> None:
        """Start the engine's thread (once; :meth:`submit` starts it too, for hosts that run no lifespan) and wait
        until its slots exist. ``again``: an engine that has stopped starts anew (the app's lifespan runs once per
        start of its host, and a host may start it again): new slots, the saved ones loaded from ``session_dir``;
        an :class:`EtsdkError` when the previous run's thread is still busy a minute after its stop."""
        if again and self._stopping and self._thread.is_alive():  # a stop that timed out: its requests were cancelled
            self._thread.join(60.0)
            if self._thread.is_alive():
                raise EtsdkError("the engine cannot start again: its previous run has not stopped (a step still running)")
        with self._cond:
            if again and self._started and self._stopping and not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="etsdk-serve-engine", daemon=True)
                self._started, self._stopping, self._failure = False, False, None
                self._ready = threading.Event()
            if not self._thread.is_alive() and not self._started:
                self._started = True
                self._thread.start()
        self._ready.wait()

    def submit(self, job: Job) -> None:
        """Queue ``job``; a :class:`RequestError` 503 (with ``Retry-After``) when the slots and the queue are full,
        the server is stopping, or the engine failed."""
        self.start()
        with self._cond:
            if self._stopping or self._failure is not None:
                why = "the server is shutting down" if self._stopping else f"the server's engine failed: {self._failure}"
                raise RequestError(why, status=503, kind="server_error", headers={"Retry-After": "5"})
            self._waiting = collections.deque(j for j in self._waiting if not j.cancelled)  # clients that left
            free = sum(s.job is None for s in self._slots)
            if len(self._waiting) >= free + self.queue_limit:
                self.metrics.count("rejected_total")
                raise RequestError(
                    f"every slot is busy ({len(self._slots)}) and the queue is full ({self.queue_limit} waiting); "
                    "retry later", status=503, kind="server_error", code="server_busy", headers={"Retry-After": "1"},
                )
            self._waiting.append(job)
            self.metrics.set("queue_depth", len(self._waiting))
            self._cond.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the requests in flight (up to ``timeout`` seconds, then cancel them), save the slots, stop."""
        with self._cond:
            self._stopping = True
            for job in self._waiting:
                job.emit(("error", _closing()))
            self._waiting.clear()
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(max(timeout, 0.0))
            if self._thread.is_alive():
                for slot in self._slots:
                    if slot.job is not None:
                        slot.job.cancel()
                self._thread.join(5.0)
        if self.session_dir is not None and not self._thread.is_alive():
            self._save_slots(self.session_dir)

    # ------------------------------------------------------------------ the engine's thread

    def _run(self) -> None:
        try:
            # Every slot's state is made here, on the thread that runs the program: a tensor filled on another
            # thread gives that thread an OpenMP team of its own, and once libgomp's threads outnumber the cores it
            # stops spinning between parallel regions: decode steps measured 1.7x slower (SmolLM2-135M's shape,
            # 2 cores). Nothing else of the server runs torch code off this thread.
            try:
                self._slots = [_Slot(i, Conversation(self.model)) for i in range(self._count)]
                self._spares = [Conversation(self.model) for _ in range(self.spare_count)]
                if self.session_dir is not None:
                    self._load_slots(self.session_dir)
            finally:
                self._ready.set()
            self._loop()
        except BaseException as exc:  # a bug of the engine itself: answer everyone, refuse what comes next
            self._log(f"the engine stopped: {type(exc).__name__}: {exc}")
            with self._cond:
                self._failure = f"{type(exc).__name__}: {exc}"
                failed = [*self._waiting, *(s.job for s in self._slots if s.job is not None)]
                self._waiting.clear()
            for job in failed:
                job.emit(("error", RequestError(f"the server's engine failed: {self._failure}", status=500,
                                                kind="server_error")))
            raise

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._active() and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self._active():
                    return
                starting: list[Job] = []
                free = sum(s.job is None for s in self._slots)
                while self._waiting and len(starting) < free:
                    job = self._waiting.popleft()
                    if job.cancelled:
                        self.metrics.count("cancelled_total")
                    else:
                        starting.append(job)
                self.metrics.set("queue_depth", len(self._waiting))
            for job in starting:
                self._guarded(job, None, self._start)
            active = self._active()
            together = self._decode_together(active)
            for slot in active:
                if slot.index not in together:
                    self._guarded(slot.job, slot, self._step)
            self.metrics.set("slots_busy", len(self._active()))

    def _guarded(self, job: Job | None, slot: _Slot | None, action: Callable[..., None]) -> None:
        """``action(slot or job)``; what it raises fails that job alone (500), its slot reset and freed."""
        try:
            action(slot if slot is not None else job)
        except Exception as exc:
            self._fail(job, slot, exc)

    def _fail(self, job: Job | None, slot: _Slot | None, exc: Exception) -> None:
        """``job`` failed with ``exc``: it gets a 500, its slot is reset and freed (the server keeps serving)."""
        self._log(f"a request failed{f' on slot {slot.index}' if slot else ''}: {type(exc).__name__}: {exc}")
        if job is not None:
            job.emit(("error", RequestError(f"generation failed: {type(exc).__name__}: {exc}", status=500,
                                            kind="server_error")))
        for held in self._slots:
            if held.job is job and job is not None:
                held.conversation.reset()
                self._release(held)

    def _decode_together(self, active: Sequence[_Slot]) -> set[int]:
        """Run the decode steps of ``active`` slots that are ready for one through ``decode_batch``, B at a time (a
        lone one is left to :meth:`_step`); the indices of the slots it advanced (or failed)."""
        size = self.model.decode_batch
        ready: list[tuple[_Slot, Generation, Step]] = []
        for slot in active:
            generation = slot.generation
            step = generation.decode_step if generation is not None and slot.job is not None and not slot.job.cancelled else None
            if generation is not None and step is not None:
                ready.append((slot, generation, step))
        if not size or len(ready) < 2:
            return set()
        done: set[int] = set()
        for first in range(0, len(ready), size):
            group = ready[first : first + size]
            if len(group) < 2:
                break
            started = time.perf_counter()
            try:
                rows = run_decode_batch([s.conversation for s, _, _ in group], [step for _, _, step in group], self._spares)
            except GenerationError as exc:  # refused before anything ran: each takes its own step instead
                self._log(f"decode_batch refused ({exc}); the requests step one at a time")
                continue
            except Exception as exc:  # the call failed: every request in it fails alone, the others go on
                for slot, generation, _ in group:
                    generation.failed()
                    self._fail(slot.job, slot, exc)
                done.update(s.index for s, _, _ in group)
                continue
            seconds = time.perf_counter() - started
            self.metrics.count("decode_batch_calls_total")
            self.metrics.count("decode_batch_rows_total", len(group))
            for (slot, _, _), logits in zip(group, rows):
                # each request's step took the call's time (not the time the rows before it spent choosing)
                at = time.perf_counter() - seconds
                self._guarded(slot.job, slot, lambda held, logits=logits, at=at: self._took(held, logits, at))
            done.update(s.index for s, _, _ in group)
        return done

    def _active(self) -> list[_Slot]:
        return [s for s in self._slots if s.job is not None]

    def _choose(self, ids: Sequence[int]) -> tuple[_Slot, bool]:
        """The slot for ``ids``: the idle one that keeps the most of its rows for them (then the least recently
        used: an empty slot before one holding a conversation), or an idle one made a fork of a busy slot that keeps
        more."""
        idle = [s for s in self._slots if s.job is None]
        best = max(idle, key=lambda s: (self._reuse(ids, s), -s.used))
        busy = [s for s in self._slots if s.job is not None]
        donor = max(busy, key=lambda s: self._reuse(ids, s), default=None)
        if donor is not None and self._reuse(ids, donor) > max(self._reuse(ids, best), 0):
            target = min(idle, key=lambda s: s.used)
            target.conversation = donor.conversation.fork()
            return target, True
        return best, False

    @staticmethod
    def _reuse(ids: Sequence[int], slot: _Slot) -> int:
        """Written cache rows of ``slot`` a request for ``ids`` keeps (the last token kept is written again, so a
        shared first token alone keeps none; a busy slot's prompt not yet written counts for nothing)."""
        conversation = slot.conversation
        kept = min(common_prefix(ids, conversation.tokens), len(ids) - 1)
        return max(min(kept - 1, conversation.position), 0)

    def _start(self, job: Job) -> None:
        slot, forked = self._choose(job.ids)
        conversation = slot.conversation
        try:
            kept = conversation.keep_prefix(job.ids)
        except GenerationError:  # a conversation whose history is unknown: start it afresh
            conversation.reset()
            kept = 0
        try:
            generation = conversation.begin(job.ids[kept:], max_new_tokens=job.max_tokens, sampling=job.sampling,
                                            continues=job.continues)
        except GenerationError as exc:
            job.emit(("error", RequestError(str(exc), code="context_length_exceeded")))
            return
        slot.job, slot.generation, slot.shown, slot.forked = job, generation, "", forked
        slot.cached = conversation.position  # rows kept: a sliding-window rewind may have to write them again
        slot.first = 0.0
        self.metrics.count("prompt_tokens_total", len(job.ids))
        self.metrics.count("prefill_tokens_total", generation.prompt_rows)
        if slot.cached:
            self.metrics.count("prefix_cache_hits_total")
            self.metrics.count("prefix_cache_tokens_total", slot.cached)
        if forked:
            self.metrics.count("slot_forks_total")
        job.emit(("start", Started(slot.cached, generation.prompt_rows, slot.index, forked)))

    def _step(self, slot: _Slot) -> None:
        job, generation = slot.job, slot.generation
        assert job is not None and generation is not None
        if job.cancelled:
            generation.cancel("cancelled")
            self.metrics.count("cancelled_total")
            self._finish(slot)
            return
        token = generation.advance()  # what it raises fails this request alone (_guarded)
        if token is not None:
            self._chosen(slot, token)

    def _took(self, slot: _Slot, logits: Any, started: float) -> None:
        """``slot``'s decode step ran in a decode_batch call (from ``started``): choose and show its token."""
        assert slot.generation is not None
        self._chosen(slot, slot.generation.took(logits, started))

    def _chosen(self, slot: _Slot, token: int) -> None:
        job, generation = slot.job, slot.generation
        assert job is not None and generation is not None
        if not slot.first:
            slot.first = time.perf_counter()
            self.metrics.observe("time_to_first_token_seconds", slot.first - job.submitted)
        self.metrics.count("completion_tokens_total")
        stops = job.sampling.stop
        shown = visible_text(generation.decoded, stops, final=generation.done)
        if len(shown) > len(slot.shown):
            job.emit(("text", shown[len(slot.shown) :]))
            slot.shown = shown
        if generation.done:
            self._finish(slot)

    def _finish(self, slot: _Slot) -> None:
        job, generation = slot.job, slot.generation
        assert job is not None and generation is not None
        result = generation.result()
        if len(result.token_ids) > 1:
            self.metrics.count("decode_seconds_total", (len(result.token_ids) - 1) / max(result.decode_tokens_per_s, 1e-9))
            self.metrics.count("decode_tokens_total", len(result.token_ids) - 1)
        job.emit(("done", Outcome(
            text=result.text if result.text is not None else slot.shown, stopped=generation.stopped or "length",
            prompt_tokens=len(job.ids), completion_tokens=len(result.token_ids), cached_tokens=slot.cached,
            prefill_tokens=generation.prompt_rows, slot=slot.index, forked=slot.forked,
        )))
        self._release(slot)

    def _release(self, slot: _Slot) -> None:
        if slot.generation is not None and not slot.generation.done:
            slot.generation.cancel("error")
        self._clock += 1
        slot.job, slot.generation, slot.used = None, None, self._clock

    # ------------------------------------------------------------------ --session-dir

    def _load_slots(self, directory: Path) -> None:
        from etsdk import EtsdkError as Refused

        for slot in self._slots:
            path = directory / f"slot-{slot.index}.safetensors"
            if not path.is_file():
                continue
            try:
                slot.conversation.load(path)
            except Refused as exc:  # another model, another S, a damaged file: the slot starts empty
                self._log(f"{path}: not restored ({exc})")
                slot.conversation.reset()
                continue
            self._log(f"restored slot {slot.index} from {path} ({len(slot.conversation.tokens)} tokens)")

    def _save_slots(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for slot in self._slots:
            path = directory / f"slot-{slot.index}.safetensors"
            if not slot.conversation.tokens:
                path.unlink(missing_ok=True)  # an empty slot: no older conversation comes back in its place
                continue
            partial = path.with_name(f"slot-{slot.index}.partial.safetensors")
            try:
                slot.conversation.save(partial)
                partial.replace(path)  # a file is replaced only by a whole one
            except (OSError, EtsdkError) as exc:
                self._log(f"slot {slot.index} not saved to {path}: {exc}")


def _closing() -> RequestError:
    return RequestError("the server is shutting down", status=503, kind="server_error", headers={"Retry-After": "5"})
