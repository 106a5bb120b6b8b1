"""``etsdk chat model.pte``: a chat in the terminal through an hf_static program's runner.

Each line is a message (stdin may be a terminal, a pipe or a file; a line ending
in a backslash continues on the next one), or a command:

``/help``         list the commands
``/context``      rows in use of the context length S
``/reset``        forget the conversation (the system prompt stays)
``/rewind [N]``   drop the last N exchanges (your message and its reply; default 1)
``/save FILE``    save the conversation (state, tokens and messages) to FILE
``/load FILE``    continue the conversation saved in FILE (same model and context length, any backend)
``/exit``         leave (so do ``/quit`` and the end of input)

Room. Each reply gets ``min(--max-new-tokens, rows left)`` tokens and stops at the
end of the context with a note. When a message and a whole reply (up to half the
context) do not fit, the chat drops the oldest exchanges, keeping the system
prompt, until they fit and at least half of the exchanges' rows are free (as
llama.cpp's context shift discards half), says so in one line, and re-prefills
the rest (the system prompt's rows are kept: prefix reuse). ``--no-context-shift``
keeps every exchange: a message that does not fit is refused, naming the fixes.
Every "does not fit" counts rows as :func:`~etsdk_hf_static.runtime.fitting.rows_needed`.

Ctrl-C during a reply stops it after the current step and keeps what was
generated (a SIGINT handler sets a flag the reply checks after each token, so no
backend call is interrupted); Ctrl-C at the prompt says how to leave, twice in a
row leaves.

Every reply is the tokenizer's chat template applied to the whole conversation
with the generation prompt (``apply_chat_template``), of which only the tokens
not already in the cache are run: the conversation's tokens always equal the
template's rendering. When the template renders earlier turns differently from
how they were generated (a reply cut at ``--max-new-tokens``, say), the
conversation rewinds to the longest common prefix first.

Output: the reply streams to stdout, then a line of timings to stderr; with
``--json`` each reply is one JSON object on stdout (``token_ids``, ``text``,
``prompt_ids``, ``new_prompt_tokens``, ``prefill_ms``, ``decode_tokens_per_s``,
``stopped``), each command one object, each error one ``{"error": ...}`` line.
An error ends a non-interactive chat (exit status 2); at a terminal it is shown
and the chat goes on.

A chat drives an :class:`~etsdk_hf_static.runtime.runner.HfStaticRunner`: its
``chat_prompt_ids(messages)`` and ``decode_text(ids)``, and one
:class:`~etsdk_hf_static.runtime.conversation.Conversation` (``generate``, ``tokens``,
``rewind``, ``reset``, ``save``, ``load``). The command itself is registered by
:mod:`etsdk_hf_static.apps.commands` (moved here from ``etsdk._apps.chat``; the old
path ``etsdk.chat`` still imports, with a DeprecationWarning).
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from etsdk import EtsdkError, GenerationError, GenerationResult, Sampling, StateError

from etsdk_hf_static.apps.streaming import TextStream, decode_rate
from etsdk_hf_static.runtime.conversation import common_prefix
from etsdk_hf_static.runtime.fitting import context_fixes, does_not_fit

if TYPE_CHECKING:
    from etsdk_hf_static.runtime.runner import HfStaticRunner

__all__ = ["ChatSession", "Reply", "chat_runner", "continued_lines", "run_chat", "terminal_lines"]

#: key of the chat's record (messages, turns) in a saved conversation's metadata (files saved before the move keep it)
_CHAT_KEY = "etsdk.chat"


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply: the generation result, its text, the template's ids it continues and how many of them were new.

    ``stopped``: ``"eos"``, ``"length"`` (``--max-new-tokens``), ``"context"`` (the end of the context came
    first) or ``"interrupted"`` (Ctrl-C; the tokens so far are kept). ``rows``: rows in use after it, of
    ``context_length``; ``dropped_exchanges`` / ``dropped_tokens``: what the context shift before it dropped.
    """

    result: GenerationResult
    text: str
    prompt_ids: tuple[int, ...]
    new_prompt_tokens: int
    stopped: str = ""
    rows: int = 0
    context_length: int = 0
    dropped_exchanges: int = 0
    dropped_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        out = self.result.to_json()
        out.update(
            text=self.text, prompt_ids=list(self.prompt_ids), new_prompt_tokens=self.new_prompt_tokens,
            stopped=self.stopped or self.result.stopped, rows=self.rows, context_length=self.context_length,
            dropped_exchanges=self.dropped_exchanges, dropped_tokens=self.dropped_tokens,
        )
        return out


class ChatSession:
    """A chat over one runner conversation: messages, turns, and the tokens that render them.

    ``context_shift``: when a message and a whole reply do not fit, drop the oldest exchanges (keeping the
    system prompt) instead of refusing the message.
    """

    def __init__(
        self,
        runner: HfStaticRunner,
        *,
        system: str | None = None,
        max_new_tokens: int = 128,
        sampling: Sampling | None = None,
        context_shift: bool = True,
    ) -> None:
        self.runner = runner
        self.system = system
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling or Sampling()
        self.context_shift = context_shift
        self.conversation = runner.new_conversation()
        self.messages: list[dict[str, str]] = []
        self.turns: list[tuple[int, int]] = []  # per exchange: messages before it, tokens kept when it started
        self.reset()

    @property
    def context_length(self) -> int:
        """S: the rows the program's cache holds."""
        return self.runner.metadata.context_length

    @property
    def rows_in_use(self) -> int:
        """The conversation's tokens: its written rows and its pending token (whose row the next call writes)."""
        return len(self.conversation.tokens)

    def usage(self) -> str:
        """``"41 of 2048 rows in use"``."""
        return f"{self.rows_in_use} of {self.context_length} rows in use"

    def reset(self) -> None:
        self.conversation.reset()
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.turns = []

    def _render(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return list(self.runner.chat_prompt_ids(messages))

    def _fit(self, text: str) -> tuple[list[dict[str, str]], list[int], int, int]:
        """The messages of the next prompt, their ids, and the exchanges and tokens dropped to make room.

        Without a shift: every message and ``text``. With one (``context_shift``, when the prompt and a reply
        of ``min(max_new_tokens, S // 2)`` tokens do not fit): the oldest exchanges go, the messages before the
        first one (the system prompt) stay, until the rest fits and at least half the exchanges' rows are free.
        """
        user = {"role": "user", "content": text}
        candidate = [*self.messages, user]
        ids = self._render(candidate)
        S = self.context_length
        reserve = min(self.max_new_tokens, S // 2)
        if not self.context_shift or not self.turns or len(ids) + reserve <= S:
            return candidate, ids, 0, 0
        kept = self.messages[: self.turns[0][0]]
        full, base = len(ids), len(self._render([*kept, user]))
        dropped = 0
        while dropped < len(self.turns):
            dropped += 1
            rest = self.messages[self.turns[dropped][0] :] if dropped < len(self.turns) else []
            candidate = [*kept, *rest, user]
            ids = self._render(candidate)
            if len(ids) + reserve <= S and 2 * (full - len(ids)) >= full - base:
                break
        return candidate, ids, dropped, full - len(ids)

    def _shifted(self, dropped: int, messages: list[dict[str, str]], ids: Sequence[int]) -> None:
        """Messages and turns after the oldest ``dropped`` exchanges went; ``ids``: the prompt now in the cache."""
        first = self.turns[0][0]
        gone = (self.turns[dropped][0] if dropped < len(self.turns) else len(self.messages)) - first
        turns = []
        for before, _ in self.turns[dropped:]:
            rendered = self._render(messages[: before - gone + 1])  # up to the exchange's own message
            turns.append((before - gone, min(common_prefix(rendered, ids), len(rendered) - 1)))
        self.messages, self.turns = messages, turns

    def say(
        self,
        text: str,
        on_token: Callable[[int], None] | None = None,
        *,
        stop: Callable[[], bool] | None = None,
        on_shift: Callable[[int, int, int], None] | None = None,
    ) -> Reply:
        """Send a user message and generate the reply, in the room the context has left.

        ``stop`` is asked after each token (Ctrl-C): True ends the reply there, and what it has is kept
        (``stopped == "interrupted"``). ``on_shift(exchanges, tokens, rows)`` is called before the reply when
        the context shift dropped ``exchanges`` (``tokens`` of the prompt) and ``rows`` are in use after it.
        """
        candidate, ids, dropped, dropped_tokens = self._fit(text)
        if not ids:
            raise GenerationError("the chat template rendered no tokens")
        S = self.context_length
        room = S - len(ids)
        if room < 1:
            have = self.conversation.tokens
            common = min(common_prefix(ids, have), len(ids) - 1)
            exchanges = 0 if self.context_shift else len(self.turns)  # a shift already dropped every exchange
            fixes = context_fixes(common, len(ids) - common, 1, S, chat=True, exchanges=exchanges)
            raise GenerationError(does_not_fit(common, len(ids) - common, 1, S, fixes))
        if dropped and on_shift is not None:
            on_shift(dropped, dropped_tokens, len(ids))
        new = min(self.max_new_tokens, room)
        common = self.conversation.keep_prefix(ids)  # at least one token runs: its logits start the reply
        generation = self.conversation.begin(ids[common:], max_new_tokens=new, sampling=self.sampling, continues=False)
        while not generation.done:
            token = generation.advance()
            if token is None:
                continue
            if on_token is not None:
                on_token(token)
            if stop is not None and not generation.done and stop():
                generation.cancel("interrupted")  # the tokens chosen stay, the last one pending: a shorter reply
        result = generation.result()
        stopped = "context" if result.stopped == "length" and new < self.max_new_tokens else result.stopped
        reply = result.text if result.text is not None else str(self.runner.decode_text(result.token_ids))  # ends before a stop string
        if dropped:
            self._shifted(dropped, candidate[:-1], ids)
        self.turns.append((len(candidate) - 1, common))
        self.messages = [*candidate, {"role": "assistant", "content": reply}]
        return Reply(
            result, reply, tuple(ids), len(ids) - common, stopped=stopped, rows=self.rows_in_use,
            context_length=S, dropped_exchanges=dropped, dropped_tokens=dropped_tokens,
        )

    def rewind(self, exchanges: int = 1) -> int:
        """Drop the last ``exchanges`` messages-and-replies; returns the tokens removed."""
        if not self.turns:
            raise GenerationError("/rewind: there is no exchange to drop yet")
        if not 1 <= exchanges <= len(self.turns):
            raise GenerationError(f"/rewind takes 1..{len(self.turns)} exchange(s) here, found {exchanges}")
        messages, kept = self.turns[-exchanges]
        del self.turns[-exchanges:]
        self.messages = self.messages[:messages]
        have = len(self.conversation.tokens)
        if kept < have:
            self.conversation.rewind(have - kept)
        return max(have - kept, 0)

    def save(self, path: str | Path) -> Path:
        record = {"messages": self.messages, "turns": [list(t) for t in self.turns]}
        return Path(self.conversation.save(path, {_CHAT_KEY: record}))

    def load(self, path: str | Path) -> None:
        """Continue the chat saved in ``path``; the file's messages replace this chat's (system prompt included)."""
        conversation = self.runner.new_conversation()
        metadata = conversation.load(path)
        record = metadata.get(_CHAT_KEY, {"messages": [], "turns": []})
        messages = record.get("messages") if isinstance(record, dict) else None
        turns = record.get("turns") if isinstance(record, dict) else None
        if not (
            isinstance(messages, list)
            and all(isinstance(m, dict) and set(m) == {"role", "content"} and all(isinstance(v, str) for v in m.values()) for m in messages)
            and isinstance(turns, list)
            and all(
                isinstance(t, list) and len(t) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in t)
                and 0 <= t[0] <= len(messages) and 0 <= t[1] <= len(conversation.tokens)
                for t in turns
            )
            and all(a[0] < b[0] for a, b in zip(turns, turns[1:]))  # exchanges in order, as the shift drops them
        ):
            raise StateError(f"{path}: its chat record (messages, turns) is malformed")
        self.conversation = conversation
        self.messages = messages
        self.turns = [(m, t) for m, t in turns]


def chat_runner(runner: object) -> HfStaticRunner:
    """``runner`` as the :class:`~etsdk_hf_static.runtime.runner.HfStaticRunner` a chat needs (the tokenizer's chat template)."""
    from etsdk_hf_static.runtime.runner import HfStaticRunner

    if not isinstance(runner, HfStaticRunner):
        raise EtsdkError(
            f"this program's runner ({type(runner).__module__}.{type(runner).__qualname__}) does not support chat: "
            "etsdk chat and generate --chat drive etsdk-hf-static's HfStaticRunner (hf_static programs)"
        )
    return runner


#: ``/help``: every command, and how to write a message
HELP = (
    ("/help", "list these commands"),
    ("/context", "rows in use of the context length S"),
    ("/reset", "forget the conversation (the system prompt stays)"),
    ("/rewind [N]", "drop the last N exchanges, your message and its reply (default 1)"),
    ("/save FILE", "save the conversation (state, tokens, messages) to FILE"),
    ("/load FILE", "continue the conversation saved in FILE (same model and context length)"),
    ("/exit, /quit", "leave (so does Ctrl-D, the end of input)"),
)
HELP_NOTES = (
    "a line ending in \\ continues on the next line (one message over several lines)",
    "Ctrl-C stops a reply and keeps what it has; at the prompt, Ctrl-C twice in a row leaves",
)


class _Interrupt:
    """While :meth:`catching`, SIGINT (Ctrl-C) sets a flag instead of raising KeyboardInterrupt.

    The reply asks :meth:`is_set` after each token, so it stops between two steps: no backend call is ever
    interrupted (a KeyboardInterrupt raised inside a delegate's execute fails the call in the runtime, which
    logs it). Outside the main thread signals cannot be handled; the flag then stays unset.
    """

    def __init__(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag

    def _handler(self, signum: int, frame: object) -> None:
        self.flag = True

    @contextlib.contextmanager
    def catching(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def run_chat(
    chat: ChatSession, lines: Iterable[str], out: TextIO, err: TextIO, *, as_json: bool = False, interactive: bool = False
) -> int:
    """Run the chat over ``lines``; returns the exit status (0, or 2 after an error when not interactive)."""

    def emit(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    def note(text: str, obj: dict[str, Any]) -> None:
        if as_json:
            emit(obj)
        else:
            print(f"etsdk: {text}", file=err, flush=True)

    def rows() -> dict[str, int]:
        return {"rows": chat.rows_in_use, "context_length": chat.context_length}

    def shifted(exchanges: int, tokens: int, in_use: int) -> None:
        if not as_json:  # --json: the reply's dropped_exchanges and dropped_tokens say it
            print(
                f"etsdk: context full: dropped the oldest {_plural(exchanges, 'exchange')} ({_plural(tokens, 'token')}), "
                f"kept the system prompt; {in_use} of {chat.context_length} rows in use",
                file=err, flush=True,
            )

    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        try:
            if line.startswith("/"):
                command, _, rest = line.partition(" ")
                rest = rest.strip()
                if command in ("/exit", "/quit"):
                    break
                if command == "/help":
                    if as_json:
                        emit({"command": "help", "commands": dict(HELP), "notes": list(HELP_NOTES)})
                    else:
                        width = max(len(name) for name, _ in HELP)
                        text = [f"  {name.ljust(width)}  {what}" for name, what in HELP] + [f"  {n}" for n in HELP_NOTES]
                        out.write("\n".join(text) + "\n")
                        out.flush()
                elif command == "/context":
                    shift = "on" if chat.context_shift else "off"
                    note(
                        f"{chat.usage()}; {_plural(len(chat.turns), 'exchange')}; prefill length T={chat.runner.metadata.prefill_length}; "
                        f"context shift {shift}",
                        {"command": "context", **rows(), "exchanges": len(chat.turns), "context_shift": chat.context_shift},
                    )
                elif command == "/reset":
                    chat.reset()
                    note(f"conversation reset; {chat.usage()}", {"command": "reset", **rows()})
                elif command == "/rewind":
                    try:
                        count = int(rest) if rest else 1
                    except ValueError:
                        raise GenerationError(f"/rewind takes a number of exchanges, found {rest!r}") from None
                    removed = chat.rewind(count)
                    note(
                        f"removed {_plural(count, 'exchange')} ({_plural(removed, 'token')}); {chat.usage()}",
                        {"command": "rewind", "exchanges": count, "removed_tokens": removed,
                         "tokens": len(chat.conversation.tokens), **rows()},
                    )
                elif command in ("/save", "/load"):
                    if not rest:
                        raise GenerationError(f"{command} takes a file name")
                    if command == "/save":
                        saved = chat.save(rest)
                        note(
                            f"saved {saved} ({_plural(len(chat.turns), 'exchange')}, {_plural(chat.rows_in_use, 'token')})",
                            {"command": "save", "file": rest, "exchanges": len(chat.turns), **rows()},
                        )
                    else:
                        chat.load(rest)
                        note(
                            f"loaded {rest}: restored {_plural(len(chat.turns), 'exchange')} "
                            f"({_plural(chat.rows_in_use, 'token')}); {chat.usage()}",
                            {"command": "load", "file": rest, "exchanges": len(chat.turns),
                             "tokens": len(chat.conversation.tokens), **rows()},
                        )
                else:
                    names = ", ".join(name.split(" ")[0].rstrip(",") for name, _ in HELP)
                    raise GenerationError(f"unknown command {command} (commands: {names}; /help says what they do)")
                continue
            interrupt = _Interrupt()
            with interrupt.catching():
                if as_json:
                    reply = chat.say(line, stop=interrupt.is_set)
                    emit(reply.to_json())
                    continue
                stream = TextStream(chat.runner.decode_text, out, chat.sampling.stop)  # never prints a stop string
                try:
                    reply = chat.say(line, on_token=stream, stop=interrupt.is_set, on_shift=shifted)
                except BaseException:
                    stream.end_line()  # an error message starts on its own line
                    raise
                stream.finish(reply.text)
                if not stream.shown:
                    out.write("\n")  # one line per reply, an empty one too
                    out.flush()
            r = reply.result
            if reply.stopped == "interrupted":
                print(f"[stopped: kept {_plural(len(r.token_ids), 'token')} of the reply; {chat.usage()}]", file=err, flush=True)
                continue
            print(
                f"[{len(r.token_ids)} tokens ({reply.stopped}); prefill {r.prefill_ms:.1f} ms; "
                f"{decode_rate(r)}; {chat.rows_in_use} of {chat.context_length} rows]",
                file=err, flush=True,
            )
            if reply.stopped == "context":
                then = (
                    "the next message drops the oldest exchanges" if chat.context_shift
                    else "/reset or /rewind N makes room, or export with a longer --context-length"
                )
                print(f"etsdk: the reply stopped at the end of the context ({chat.usage()}); {then}", file=err, flush=True)
        except EtsdkError as exc:
            if as_json:
                emit({"error": str(exc)})
            else:
                print(f"etsdk: error: {exc}", file=err, flush=True)
            if not interactive:
                return 2
    return 0


def continued_lines(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` with every line ending in a backslash joined to the next (a newline in its place)."""
    parts: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        yield "\n".join([*parts, line])
        parts = []
    if parts:
        yield "\n".join(parts)


def terminal_lines(prompt: str, err: TextIO) -> Iterator[str]:
    """Messages typed at a terminal: a trailing backslash continues the message on a ``... `` line.

    Ctrl-C drops what was typed and says how to leave; a second Ctrl-C in a row raises KeyboardInterrupt.
    """
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    parts: list[str] = []
    interrupted = False
    while True:
        try:
            line = input("... " if parts else prompt)
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            if interrupted:
                raise
            interrupted, parts = True, []
            print(file=err)
            print("etsdk: /quit or Ctrl-D to leave (Ctrl-C again leaves now)", file=err, flush=True)
            continue
        interrupted = False
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        yield "\n".join([*parts, line])
        parts = []
