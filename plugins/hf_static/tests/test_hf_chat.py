"""``etsdk chat`` and ``etsdk generate --chat``: the tokenizer's chat template, streaming, commands, JSON, stdin.

The expected tokens come from outside the chat code: ``apply_chat_template`` on the messages, a fresh
conversation generating from those ids, and transformers' eager ``generate`` with a meaningful top-2 margin.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import MARGIN, hf_generate
from etsdk import GenerationError, StateError
from etsdk_hf_static.apps.chat import ChatSession, run_chat
from etsdk_hf_static.metadata import tokenizer_dir
from etsdk_hf_static.runtime.runner import HfStaticRunner

NEW_CHAT = 4
EOS = 2


def _etsdk(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "etsdk", *args], input=stdin, capture_output=True, text=True, timeout=900)


def _template_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    encoded = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if isinstance(encoded, Mapping) else encoded)


@pytest.fixture(scope="module")
def tokenizer(chat_pte: Path) -> Any:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(tokenizer_dir(chat_pte))
    assert loaded.chat_template, "the tiny tokenizer ships a chat template"
    return loaded


@pytest.fixture(scope="module")
def eager(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def chat_runner(chat_pte: Path) -> HfStaticRunner:
    return HfStaticRunner.from_file(chat_pte)


def _expected_reply(runner: HfStaticRunner, eager: Any, ids: list[int]) -> list[int]:
    """A fresh conversation's reply to the whole prompt, checked against transformers (stopping at EOS as chat does)."""
    got = list(runner.new_conversation().generate(ids, max_new_tokens=NEW_CHAT).token_ids)
    want, margin = hf_generate(eager, ids, NEW_CHAT)
    if EOS in want:
        want = want[: want.index(EOS) + 1]
    assert margin > MARGIN, f"eager top-2 margin {margin:.2e} too small for a token comparison"
    assert got == want
    return got


def test_chat_through_stdin_turns_rewind_save_load(
    chat_pte: Path, chat_runner: HfStaticRunner, tokenizer: Any, eager: Any, tmp_path: Path
) -> None:
    saved = tmp_path / "chat.safetensors"
    script = ["Hello", "What is 2+2?", "/rewind 1", "Tell me more", f"/save {saved}", "/reset", f"/load {saved}", "Again", "/exit", "never read"]
    result = _etsdk("chat", str(chat_pte), "--json", "--max-new-tokens", str(NEW_CHAT), stdin="\n".join(script) + "\n")
    assert result.returncode == 0, result.stderr
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    replies = [o for o in objects if "token_ids" in o]
    assert [o["command"] for o in objects if "command" in o] == ["rewind", "save", "reset", "load"]
    assert len(replies) == 4 and not [o for o in objects if "error" in o]

    messages: list[dict[str, str]] = []

    def turn(text: str, reply: dict[str, Any]) -> None:
        nonlocal messages
        candidate = [*messages, {"role": "user", "content": text}]
        ids = _template_ids(tokenizer, candidate)
        assert reply["prompt_ids"] == ids  # the conversation is exactly apply_chat_template's rendering
        expected = _expected_reply(chat_runner, eager, ids)
        assert reply["token_ids"] == expected
        assert reply["text"] == tokenizer.decode(expected, skip_special_tokens=True)
        messages = [*candidate, {"role": "assistant", "content": reply["text"]}]

    turn("Hello", replies[0])
    after_first = list(messages)
    turn("What is 2+2?", replies[1])
    messages = after_first  # /rewind 1: the second exchange is gone
    turn("Tell me more", replies[2])
    turn("Again", replies[3])  # /save, /reset, /load: the chat goes on from the saved one
    assert 0 < replies[3]["new_prompt_tokens"] < len(replies[3]["prompt_ids"])  # only the new tokens ran
    assert saved.is_file()


def test_generate_chat_prompt_ids_equal_apply_chat_template(chat_pte: Path, tokenizer: Any) -> None:
    result = _etsdk("generate", str(chat_pte), "--chat", "--system", "Be brief.", "--prompt", "Hi there", "--max-new-tokens", "3", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert out["prompt_ids"] == _template_ids(tokenizer, messages)
    bad = _etsdk("generate", str(chat_pte), "--chat", "--prompt-ids", "1,2")
    assert bad.returncode == 2 and "--chat applies the chat template to --prompt TEXT" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_chat_streams_text_and_a_scripted_chat_stops_at_its_first_error(chat_pte: Path) -> None:
    result = _etsdk("chat", str(chat_pte), "--max-new-tokens", "3", stdin="Hello\n/rewind 5\nnot reached\n")
    assert result.returncode == 2
    assert "etsdk: error: /rewind takes 1..1 exchange(s) here, found 5" in result.stderr
    timings = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert len(timings) == 1 and "tokens/s" in timings[0]  # one reply, then the error ended it
    assert all(line.startswith(("etsdk", "[")) for line in result.stderr.splitlines()), result.stderr
    assert result.stdout.strip()


def test_chat_tokens_always_equal_the_template_even_when_a_reply_renders_differently(
    chat_runner: HfStaticRunner, tokenizer: Any
) -> None:
    chat = ChatSession(chat_runner, system="Be brief.", max_new_tokens=3)
    first = chat.say("a")
    assert chat.conversation.tokens == (*first.prompt_ids, *first.result.token_ids)
    second = chat.say("bb")  # the first reply was cut at 3 tokens: the template closes it with EOS
    assert second.prompt_ids == tuple(_template_ids(tokenizer, chat.messages[:-1]))
    assert chat.conversation.tokens == (*second.prompt_ids, *second.result.token_ids)
    chat.messages[2]["content"] = "edited"  # the first reply now renders otherwise: rewind to the common prefix
    third = chat.say("ccc")
    assert third.new_prompt_tokens > len(_template_ids(tokenizer, [{"role": "user", "content": "ccc"}])) - 1
    assert chat.conversation.tokens == (*third.prompt_ids, *third.result.token_ids)
    fresh = chat_runner.new_conversation().generate(list(third.prompt_ids), max_new_tokens=3)
    assert third.result.token_ids == fresh.token_ids
    for bad in (0, 4):
        with pytest.raises(GenerationError, match="/rewind takes 1..3"):
            chat.rewind(bad)
    chat.rewind(2)
    assert len(chat.messages) == 3 and chat.conversation.tokens[: len(first.prompt_ids)] == first.prompt_ids


def test_chat_errors_are_one_json_line_and_a_terminal_chat_goes_on(chat_runner: HfStaticRunner, tmp_path: Path) -> None:
    chat = ChatSession(chat_runner, max_new_tokens=2)
    out, err = io.StringIO(), io.StringIO()
    lines = ["/bogus", f"/load {tmp_path / 'missing.safetensors'}", "/save", "Hi", "/rewind x"]
    assert run_chat(chat, lines, out, err, as_json=True, interactive=True) == 0
    objects = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [sorted(o) for o in objects][:3] == [["error"]] * 3 and "token_ids" in objects[3] and "error" in objects[4]
    assert "unknown command /bogus" in objects[0]["error"] and "not found" in objects[1]["error"]
    assert err.getvalue() == ""
    assert run_chat(ChatSession(chat_runner, max_new_tokens=2), ["/bogus", "Hi"], io.StringIO(), io.StringIO(), as_json=True) == 2


def test_chat_refuses_a_malformed_chat_record_and_a_tokenizer_without_template(
    chat_runner: HfStaticRunner, chat_pte: Path, tmp_path: Path
) -> None:
    conversation = chat_runner.new_conversation()
    conversation.generate([1, 40, 41], max_new_tokens=2)
    path = conversation.save(tmp_path / "odd.safetensors", {"etsdk.chat": {"messages": "not a list", "turns": []}})
    chat = ChatSession(chat_runner)
    with pytest.raises(StateError, match="chat record"):
        chat.load(path)
    bare = HfStaticRunner.from_file(chat_pte)
    bare.tokenizer.chat_template = None
    with pytest.raises(GenerationError, match="no chat template"):
        ChatSession(bare).say("Hi")
