"""Room in the context: export's default sizes, the one row-count formula and its fixes, the chat's fitting of
replies, context shift, Ctrl-C, commands, and a chat driven through a pseudo-terminal on a default export."""

from __future__ import annotations

import io
import os
import re
import select
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import CHAT_S, MODEL_POSITIONS
from etsdk import GenerationError, Snapshot
from etsdk_hf_static.apps.chat import HELP, ChatSession, run_chat
from etsdk_hf_static.apps.commands import configure_export
from etsdk_hf_static.exporting.exporter import DEFAULT_CONTEXT_LENGTH, DEFAULT_PREFILL_LENGTH, default_sizes
from etsdk_hf_static.runtime.fitting import context_fixes, does_not_fit, rows_needed
from etsdk_hf_static.runtime.runner import HfStaticRunner

# --------------------------------------------------------------------------- export defaults


@pytest.mark.parametrize(
    ("positions", "given", "expected"),
    [
        (8192, (None, None), (DEFAULT_PREFILL_LENGTH, DEFAULT_CONTEXT_LENGTH)),  # SmolLM2: capped
        (512, (None, None), (DEFAULT_PREFILL_LENGTH, 512)),
        (48, (None, None), (48, 48)),  # T never exceeds S
        (None, (None, None), (DEFAULT_PREFILL_LENGTH, DEFAULT_CONTEXT_LENGTH)),  # the config does not say
        (8192, (16, 4096), (16, 4096)),  # explicit sizes win
        (8192, (None, 32), (32, 32)),
        (8192, (128, None), (128, DEFAULT_CONTEXT_LENGTH)),
    ],
)
def test_default_sizes_come_from_the_model(positions: int | None, given: tuple[Any, Any], expected: tuple[int, int]) -> None:
    config = SimpleNamespace(max_position_embeddings=positions) if positions is not None else SimpleNamespace()
    T, S, why = default_sizes(config, *given)
    assert (T, S) == expected
    if given[1] is None and positions is not None:
        assert f"max_position_embeddings {positions}" in why
        assert ("capped at" in why) == (positions > DEFAULT_CONTEXT_LENGTH)
    if given == (16, 4096):
        assert why == ""


def test_export_help_names_both_defaults_and_where_they_come_from() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    configure_export(parser)
    helps = {a.dest: a.help for a in parser._actions}
    assert f"default: {DEFAULT_PREFILL_LENGTH}" in helps["prefill_length"]
    assert "max_position_embeddings" in helps["context_length"] and f"at most {DEFAULT_CONTEXT_LENGTH}" in helps["context_length"]


# --------------------------------------------------------------------------- one formula, its fixes


def test_rows_needed_is_rows_in_use_plus_prompt_plus_new() -> None:
    assert rows_needed(0, 37, 128) == 165
    assert rows_needed(520, 40, 89) == 649
    assert rows_needed(5, 3, 0) == 8  # prefill: no new tokens


@pytest.mark.parametrize(
    ("args", "chat", "exchanges", "named", "not_named"),
    [
        ((0, 37, 128, 128), False, 0, ["--max-new-tokens 91", "--context-length"], ["reset", "shorter"]),
        ((0, 200, 8, 128), False, 0, ["a shorter prompt", "--context-length"], ["--max-new-tokens", "reset"]),
        ((100, 20, 16, 128), False, 0, ["--max-new-tokens 8", "reset() or rewind(n)", "--context-length"], ["shorter"]),
        ((120, 15, 1, 128), True, 2, ["/reset or /rewind N", "a shorter message", "--context-length"], ["--max-new-tokens"]),
        ((10, 130, 1, 128), True, 0, ["a shorter message", "--context-length"], ["/reset", "--max-new-tokens"]),
    ],
)
def test_the_fixes_named_are_those_that_apply(
    args: tuple[int, int, int, int], chat: bool, exchanges: int, named: list[str], not_named: list[str]
) -> None:
    fixes = context_fixes(*args, chat=chat, exchanges=exchanges)
    text = " | ".join(fixes)
    assert all(n in text for n in named), text
    assert not any(n in text for n in not_named), text
    assert fixes[-1].startswith("a program exported with a longer context")


def test_does_not_fit_counts_visibly_and_ends_with_the_fixes() -> None:
    message = does_not_fit(0, 37, 128, 128, context_fixes(0, 37, 128, 128))
    assert message.startswith(
        "37 prompt token(s) + 128 new token(s) = 165 cache rows, but the program's context length S is 128; "
        "to make it fit: fewer new tokens (--max-new-tokens 91) or a program exported with a longer context"
    )
    assert not message.rstrip().endswith(":")
    later = does_not_fit(520, 40, 89, 600, context_fixes(520, 40, 89, 600))
    assert later.startswith("520 row(s) in use + 40 prompt token(s) + 89 new token(s) = 649 cache rows, but the program's context length S is 600")
    assert "--max-new-tokens 40" in later and "reset() or rewind(n)" in later


# --------------------------------------------------------------------------- the chat fits replies into the room left


@pytest.fixture(scope="module")
def chat_runner(chat_pte: Path) -> HfStaticRunner:
    return HfStaticRunner.from_file(chat_pte)  # S = CHAT_S, T = 8, reference backend


def _render(runner: HfStaticRunner, messages: Sequence[Mapping[str, str]]) -> tuple[int, ...]:
    return tuple(runner.chat_prompt_ids(messages))


def test_the_first_message_is_answered_when_max_new_tokens_exceeds_the_room(chat_runner: HfStaticRunner) -> None:
    system = "You answer. " * 6  # a long system prompt: little room left
    chat = ChatSession(chat_runner, system=system, max_new_tokens=10 * CHAT_S)
    reply = chat.say("Hi")
    room = CHAT_S - len(reply.prompt_ids)
    assert 0 < room < 40
    assert reply.stopped in ("context", "eos")
    assert len(reply.result.token_ids) == room or reply.stopped == "eos"
    assert reply.rows == chat.rows_in_use <= CHAT_S and reply.context_length == CHAT_S
    assert chat.conversation.tokens == (*reply.prompt_ids, *reply.result.token_ids)


def test_context_shift_drops_the_oldest_exchanges_keeps_the_system_prompt_and_stays_exact(chat_runner: HfStaticRunner) -> None:
    chat = ChatSession(chat_runner, system="Be brief.", max_new_tokens=6)
    shifts: list[tuple[int, int, int]] = []
    said = [f"message {i}" for i in range(8)]
    replies = [chat.say(text, on_shift=lambda *a: shifts.append(a)) for text in said]
    shifted = [r for r in replies if r.dropped_exchanges]
    assert shifted and shifts, "eight exchanges of ~30 tokens overflow 128 rows"
    assert [(r.dropped_exchanges, r.dropped_tokens) for r in shifted] == [(e, t) for e, t, _ in shifts]
    assert chat.messages[0] == {"role": "system", "content": "Be brief."}
    assert chat.messages[-2] == {"role": "user", "content": said[-1]}
    assert {"role": "user", "content": said[0]} not in chat.messages  # the oldest went first
    last = replies[-1]
    assert len(last.prompt_ids) + min(6, CHAT_S // 2) <= CHAT_S
    # the conversation is exactly the template's rendering of what is left, and the reply a fresh run's
    assert last.prompt_ids == _render(chat_runner, chat.messages[:-1])
    assert chat.conversation.tokens == (*last.prompt_ids, *last.result.token_ids)
    fresh = chat_runner.new_conversation().generate(list(last.prompt_ids), max_new_tokens=6)
    assert last.result.token_ids == fresh.token_ids
    # turns were renumbered: /rewind still removes exactly the last exchanges
    before = len(chat.turns)
    assert before >= 2, "a shift frees about half the exchanges' rows, not all of them"
    removed = chat.rewind(1)
    assert removed > 0 and len(chat.turns) == before - 1 and chat.messages[-1]["role"] == "assistant"
    again = chat.say("and again")
    assert chat.conversation.tokens == (*again.prompt_ids, *again.result.token_ids)


def test_without_context_shift_a_message_that_does_not_fit_is_refused_naming_the_fixes(chat_runner: HfStaticRunner) -> None:
    chat = ChatSession(chat_runner, max_new_tokens=2 * CHAT_S, context_shift=False)
    first = chat.say("x" * 40)
    assert first.stopped in ("context", "eos")
    tokens = chat.conversation.tokens
    with pytest.raises(GenerationError) as caught:
        chat.say("y" * 40)
    message = str(caught.value)
    assert re.search(r"^\d+ row\(s\) in use \+ \d+ prompt token\(s\) \+ 1 new token\(s\) = \d+ cache rows", message), message
    for fix in ("/reset or /rewind N", "a shorter message", "--context-length"):
        assert fix in message
    assert "--max-new-tokens" not in message  # the chat fits replies itself
    assert chat.conversation.tokens == tokens and len(chat.turns) == 1  # nothing changed
    with pytest.raises(GenerationError, match="there is no exchange to drop yet"):
        ChatSession(chat_runner).rewind(1)


def test_a_stopped_reply_keeps_its_tokens_and_the_chat_goes_on(chat_runner: HfStaticRunner) -> None:
    chat = ChatSession(chat_runner, max_new_tokens=20)
    seen: list[int] = []
    reply = chat.say("Hello", on_token=seen.append, stop=lambda: len(seen) >= 3)
    assert reply.stopped == "interrupted" and reply.result.token_ids == tuple(seen) and len(seen) == 3
    assert reply.to_json()["stopped"] == "interrupted"
    assert chat.conversation.tokens == (*reply.prompt_ids, *seen)
    assert chat.messages[-1] == {"role": "assistant", "content": reply.text} and reply.text
    nxt = chat.say("Go on")
    assert nxt.prompt_ids == _render(chat_runner, chat.messages[:-1])
    assert chat.conversation.tokens == (*nxt.prompt_ids, *nxt.result.token_ids)


def test_commands_say_what_they_did(chat_runner: HfStaticRunner, tmp_path: Path) -> None:
    chat = ChatSession(chat_runner, max_new_tokens=3)
    out, err = io.StringIO(), io.StringIO()
    saved = tmp_path / "c.safetensors"
    lines = ["/help", "Hello", "Again", "/context", "/rewind", f"/save {saved}", "/reset", f"/load {saved}", "/context"]
    assert run_chat(chat, lines, out, err) == 0
    for name, _ in HELP:
        assert name in out.getvalue()
    notes = [line for line in err.getvalue().splitlines() if line.startswith("etsdk")]
    timings = [line for line in err.getvalue().splitlines() if line.startswith("[")]
    assert len(timings) == 2 and all(re.search(rf"; \d+ of {CHAT_S} rows\]$", t) for t in timings)
    assert re.fullmatch(rf"etsdk: \d+ of {CHAT_S} rows in use; 2 exchanges; prefill length T=8; context shift on", notes[0])
    assert re.fullmatch(rf"etsdk: removed 1 exchange \(\d+ tokens\); \d+ of {CHAT_S} rows in use", notes[1]), notes[1]
    assert notes[2].startswith(f"etsdk: saved {saved} (1 exchange, ")
    assert notes[3] == f"etsdk: conversation reset; 0 of {CHAT_S} rows in use"
    assert re.fullmatch(rf"etsdk: loaded {re.escape(str(saved))}: restored 1 exchange \(\d+ tokens\); \d+ of {CHAT_S} rows in use", notes[4])
    assert not [line for line in err.getvalue().splitlines() if line.rstrip().endswith(":")]


# --------------------------------------------------------------------------- a terminal chat on a default export


class _Terminal:
    """``etsdk chat`` in a pseudo-terminal (stdin, stdout and stderr on it): what a person at a terminal sees."""

    def __init__(self, *args: str) -> None:
        import pty

        env = dict(os.environ, TERM="dumb", COLUMNS="200")
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its controlling terminal, so "\x03" is SIGINT
            # as a person's shell starts it: SIGINT not ignored (a test run started in the background by a shell
            # without job control ignores it, and an ignored signal stays ignored across exec)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execvpe(sys.executable, [sys.executable, "-m", "etsdk", "chat", *args], env)
        self.seen = ""
        self.pos = 0  # what read_until consumed
        self.status: int | None = None  # the exit status, once reaped

    def read_until(self, pattern: str, timeout: float = 300.0) -> str:
        """Read until ``pattern`` (a regex) matches the output after what earlier calls consumed; return that part."""
        deadline = time.monotonic() + timeout
        while not (found := re.search(pattern, self.seen[self.pos :])):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} in {self.seen[self.pos:]!r}")
            if select.select([self.fd], [], [], min(left, 1.0))[0]:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # the child is gone
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the chat ended before {pattern!r}: {self.seen[self.pos:]!r}")
                self.seen += chunk.decode("utf-8", "replace").replace("\r\n", "\n")
        part = self.seen[self.pos : self.pos + found.end()]
        self.pos += found.end()
        return part

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([self.fd], [], [], 0.2)[0]:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                self.seen += chunk.decode("utf-8", "replace").replace("\r\n", "\n")
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
        raise AssertionError(f"the chat did not end: {self.seen[-2000:]!r}")

    def close(self) -> None:
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            self.status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        os.close(self.fd)


PROMPT = r"\n> $"


def test_a_terminal_chat_on_a_default_export_fits_shifts_and_stops_cleanly(default_chat_pte: Path, tmp_path: Path) -> None:
    """The user's session: a program exported with the defaults, the chat's defaults, a person typing."""
    saved = tmp_path / "after-ctrl-c.safetensors"
    term = _Terminal(str(default_chat_pte))
    try:
        banner = term.read_until(r"> $")
        assert f"{MODEL_POSITIONS} rows of context" in banner and "/help" in banner
        # the first message: 128 new tokens by default do not fit in what is left, the reply gets the room
        term.send("Hello there, how are you today?\r")
        first = term.read_until(PROMPT)
        assert "error" not in first and re.search(rf"tokens \((context|eos)\); .*; \d+ of {MODEL_POSITIONS} rows\]", first), first
        term.send("/context\r")
        assert re.search(rf"etsdk: \d+ of {MODEL_POSITIONS} rows in use; 1 exchange;", term.read_until(PROMPT))
        # a second message does not fit beside the first exchange: the oldest is dropped, the chat goes on
        term.send("Tell me about dragons\r")
        second = term.read_until(PROMPT)
        assert "etsdk: context full: dropped the oldest 1 exchange (" in second, second
        assert re.search(r"rows\]\n", second) and "error" not in second
        # a message over two lines, then Ctrl-C once the reply streams: it stops between two steps
        term.send("What happened\\\r")
        term.read_until(r"\.\.\. $")
        term.send("next?\r")
        term.read_until(r"rows in use\n")  # the shift note (this message does not fit either) ...
        term.read_until(r"[^\n]")  # ... then the reply streams
        term.send("\x03")
        stopped = term.read_until(PROMPT)
        assert re.search(rf"\n\[stopped: kept \d+ tokens? of the reply; \d+ of {MODEL_POSITIONS} rows in use\]\n", stopped), stopped
        term.send(f"/save {saved}\r")
        assert f"etsdk: saved {saved}" in term.read_until(PROMPT)
        # Ctrl-C at the empty prompt says how to leave, and the chat stays. Not at the very instant the prompt
        # appears: Python's readline loses a SIGINT that lands between printing the prompt and waiting for input
        # (its select() then sleeps on), a window no typist hits but a driver sending on the prompt's bytes does
        time.sleep(0.5)
        term.send("\x03")
        assert "/quit or Ctrl-D to leave" in term.read_until(PROMPT)
        term.send("/quit\r")
        assert term.wait() == 0
    finally:
        term.close()
    transcript = term.seen
    assert "method.cpp" not in transcript and "Traceback" not in transcript and "KeyboardInterrupt" not in transcript
    own = [line for line in transcript.splitlines() if line.startswith(("etsdk", "[", "> etsdk"))]
    assert own and not [line for line in own if line.rstrip().endswith(":")], own
    # the partial reply is part of the conversation: the saved file holds it after the two-line message
    messages = Snapshot.load(saved).metadata["hf_static.conversation"]["user"]["etsdk.chat"]["messages"]
    assert messages[-2] == {"role": "user", "content": "What happened\nnext?"}
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"]
