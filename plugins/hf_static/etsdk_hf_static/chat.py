"""``etsdk chat model.pte``: a chat in the terminal through an hf_static program's runner.

Each line is a message (stdin may be a terminal, a pipe or a file), or a command:

``/reset``        forget the conversation (the system prompt stays)
``/rewind [N]``   drop the last N exchanges (your message and its reply; default 1)
``/save FILE``    save the conversation (state, tokens and messages) to FILE
``/load FILE``    continue the conversation saved in FILE (same model and context length, any backend)
``/exit``         leave (end of input does too)

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

A chat drives an :class:`~etsdk_hf_static.runner.HfStaticRunner`: its
``chat_prompt_ids(messages)`` and ``decode_text(ids)``, and one
:class:`~etsdk_hf_static.conversation.Conversation` (``generate``, ``tokens``,
``rewind``, ``reset``, ``save``, ``load``). The command itself is registered by
:mod:`etsdk_hf_static.commands` (moved here from ``etsdk._apps.chat``; the old
path ``etsdk.chat`` still imports, with a DeprecationWarning).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from etsdk import EtsdkError, GenerationError, GenerationResult, Sampling, StateError

from etsdk_hf_static.commands import open_runner

if TYPE_CHECKING:
    from etsdk_hf_static.runner import HfStaticRunner

__all__ = ["ChatSession", "Reply", "chat_runner", "cmd_chat", "open_runner", "run_chat"]

#: key of the chat's record (messages, turns) in a saved conversation's metadata (files saved before the move keep it)
_CHAT_KEY = "etsdk.chat"


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply: the generation result, its text, the template's ids it continues and how many of them were new."""

    result: GenerationResult
    text: str
    prompt_ids: tuple[int, ...]
    new_prompt_tokens: int

    def to_json(self) -> dict[str, Any]:
        out = self.result.to_json()
        out.update(text=self.text, prompt_ids=list(self.prompt_ids), new_prompt_tokens=self.new_prompt_tokens)
        return out


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class ChatSession:
    """A chat over one runner conversation: messages, turns, and the tokens that render them."""

    def __init__(
        self,
        runner: HfStaticRunner,
        *,
        system: str | None = None,
        max_new_tokens: int = 128,
        sampling: Sampling | None = None,
    ) -> None:
        self.runner = runner
        self.system = system
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling or Sampling()
        self.conversation = runner.new_conversation()
        self.messages: list[dict[str, str]] = []
        self.turns: list[tuple[int, int]] = []  # per exchange: messages before it, tokens kept when it started
        self.reset()

    def reset(self) -> None:
        self.conversation.reset()
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.turns = []

    def say(self, text: str, on_token: Callable[[int], None] | None = None) -> Reply:
        """Send a user message and generate the reply."""
        candidate = [*self.messages, {"role": "user", "content": text}]
        ids = list(self.runner.chat_prompt_ids(candidate))
        if not ids:
            raise GenerationError("the chat template rendered no tokens")
        have = self.conversation.tokens
        common = min(_common_prefix(ids, have), len(ids) - 1)  # at least one token runs: its logits start the reply
        if common < len(have):
            self.conversation.rewind(len(have) - common)
        result = self.conversation.generate(
            ids[common:], max_new_tokens=self.max_new_tokens, sampling=self.sampling, on_token=on_token
        )
        reply = str(self.runner.decode_text(result.token_ids))
        self.turns.append((len(self.messages), common))
        self.messages = [*candidate, {"role": "assistant", "content": reply}]
        return Reply(result, reply, tuple(ids), len(ids) - common)

    def rewind(self, exchanges: int = 1) -> None:
        """Drop the last ``exchanges`` messages-and-replies."""
        if not 1 <= exchanges <= len(self.turns):
            raise GenerationError(f"/rewind takes 1..{len(self.turns)} exchange(s) here, found {exchanges}")
        messages, kept = self.turns[-exchanges]
        del self.turns[-exchanges:]
        self.messages = self.messages[:messages]
        have = len(self.conversation.tokens)
        if kept < have:
            self.conversation.rewind(have - kept)

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
        ):
            raise StateError(f"{path}: its chat record (messages, turns) is malformed")
        self.conversation = conversation
        self.messages = messages
        self.turns = [(m, t) for m, t in turns]


def chat_runner(runner: object) -> HfStaticRunner:
    """``runner`` as the :class:`~etsdk_hf_static.runner.HfStaticRunner` a chat needs (the tokenizer's chat template)."""
    from etsdk_hf_static.runner import HfStaticRunner

    if not isinstance(runner, HfStaticRunner):
        raise EtsdkError(
            f"this program's runner ({type(runner).__module__}.{type(runner).__qualname__}) does not support chat: "
            "etsdk chat and generate --chat drive etsdk-hf-static's HfStaticRunner (hf_static programs)"
        )
    return runner


class _Stream:
    """Prints a reply's text as tokens arrive (decoding everything so far: a character may span tokens)."""

    def __init__(self, runner: HfStaticRunner, out: TextIO) -> None:
        self.runner, self.out = runner, out
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = str(self.runner.decode_text(self.ids))
        self.out.write(text[len(self.shown) :] if text.startswith(self.shown) else text)
        self.out.flush()
        self.shown = text


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
                if command == "/reset":
                    chat.reset()
                    note("conversation reset", {"command": "reset"})
                elif command == "/rewind":
                    try:
                        count = int(rest) if rest else 1
                    except ValueError:
                        raise GenerationError(f"/rewind takes a number of exchanges, found {rest!r}") from None
                    chat.rewind(count)
                    note(f"rewound {count} exchange(s)", {"command": "rewind", "exchanges": count, "tokens": len(chat.conversation.tokens)})
                elif command in ("/save", "/load"):
                    if not rest:
                        raise GenerationError(f"{command} takes a file name")
                    if command == "/save":
                        note(f"saved {chat.save(rest)}", {"command": "save", "file": rest})
                    else:
                        chat.load(rest)
                        note(f"loaded {rest}", {"command": "load", "file": rest, "tokens": len(chat.conversation.tokens)})
                else:
                    raise GenerationError(f"unknown command {command} (commands: /reset, /rewind N, /save FILE, /load FILE, /exit)")
                continue
            if as_json:
                reply = chat.say(line)
                emit(reply.to_json())
            else:
                reply = chat.say(line, on_token=_Stream(chat.runner, out))
                out.write("\n")
                out.flush()
                r = reply.result
                print(
                    f"[{len(r.token_ids)} tokens ({r.stopped}); prefill {r.prefill_ms:.1f} ms; "
                    f"decode {r.decode_tokens_per_s:.1f} tokens/s]",
                    file=err, flush=True,
                )
        except EtsdkError as exc:
            message = str(exc)
            if isinstance(exc, GenerationError) and "context length" in message:
                message += " (/rewind N or /reset to make room)"
            if as_json:
                emit({"error": message})
            else:
                print(f"etsdk: error: {message}", file=err, flush=True)
            if not interactive:
                return 2
    return 0


def _terminal_lines(prompt: str) -> Iterator[str]:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    while True:
        try:
            yield input(prompt)
        except EOFError:
            print()
            return


def cmd_chat(args: argparse.Namespace) -> int:
    """``etsdk chat`` (its arguments: :func:`etsdk_hf_static.commands.configure_chat`)."""
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    if isinstance(args.max_new_tokens, bool) or args.max_new_tokens < 1:
        raise GenerationError(f"--max-new-tokens must be a positive integer, found {args.max_new_tokens}")
    runner = chat_runner(open_runner(args.program, args.data))
    chat = ChatSession(runner, system=args.system, max_new_tokens=args.max_new_tokens, sampling=sampling)
    interactive = sys.stdin.isatty()
    lines: Iterable[str] = _terminal_lines("> ") if interactive else sys.stdin
    if interactive and not args.json:
        print("etsdk chat: /reset, /rewind N, /save FILE, /load FILE, /exit", file=sys.stderr, flush=True)
    try:
        return run_chat(chat, lines, sys.stdout, sys.stderr, as_json=args.json, interactive=interactive)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
