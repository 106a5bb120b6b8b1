"""``etsdk generate`` / ``etsdk chat`` as llama.cpp and transformers users drive them, in subprocesses.

Sampling and stopping flags, the prompt from a file or stdin, the subcommand's own usage for an unknown flag,
text on stdout and statistics on stderr, ``--json`` with the text, one-token runs, and every refusal the
program's contract allows made before the program loads (checked with a program whose backend is disabled:
reaching ``etsdk.load`` would fail with a backend error instead).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import S

STATS = re.compile(r"^\[(\d+) prompt tokens, (\d+) generated \((eos|length|stop)\); prefill [\d.]+ ms; (.*)\]$")


def _etsdk(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "etsdk", *args], input=stdin, capture_output=True, text=True, timeout=900,
        env={**os.environ, **(env or {})},
    )


def _json(*args: str, stdin: str | None = None) -> dict[str, Any]:
    result = _etsdk(*args, "--json", stdin=stdin)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout  # one object, nothing else on stdout
    out: dict[str, Any] = json.loads(lines[0])
    return out


def _stats(stderr: str) -> re.Match[str]:
    found = [m for m in map(STATS.match, stderr.splitlines()) if m]
    assert len(found) == 1, stderr
    return found[0]


# --------------------------------------------------------------------------- output streams


def test_text_goes_to_stdout_and_statistics_to_stderr(chat_pte: Path) -> None:
    streamed = _etsdk("generate", str(chat_pte), "--prompt", "Hi there", "--max-new-tokens", "6")
    assert streamed.returncode == 0, streamed.stderr
    as_json = _json("generate", str(chat_pte), "--prompt", "Hi there", "--max-new-tokens", "6")
    assert streamed.stdout == "Hi there" + as_json["text"] + "\n"  # the echoed prompt, the text, nothing else
    stats = _stats(streamed.stderr)
    assert int(stats.group(1)) == len(as_json["prompt_ids"]) and int(stats.group(2)) == len(as_json["token_ids"])
    assert all(line.startswith(("etsdk", "[")) for line in streamed.stderr.splitlines()), streamed.stderr


def test_without_a_tokenizer_the_ids_print_as_the_json_text_says(exported: Any) -> None:
    # a program exported from a model object has no tokenizer beside it: its text is the ids joined by spaces, the
    # same on stdout as in --json (no context: ids have no joining rules)
    pte = str(exported("llama"))
    streamed = _etsdk("generate", pte, "--prompt-ids", "5,6,7", "--max-new-tokens", "4")
    assert streamed.returncode == 0, streamed.stderr
    as_json = _json("generate", pte, "--prompt-ids", "5,6,7", "--max-new-tokens", "4")
    assert as_json["text"] == " ".join(map(str, as_json["token_ids"]))
    assert streamed.stdout == as_json["text"] + "\n"


def test_json_has_the_text(chat_pte: Path) -> None:
    from etsdk_hf_static.metadata import tokenizer_dir
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(chat_pte))
    out = _json("generate", str(chat_pte), "--prompt", "Hi there", "--max-new-tokens", "6")
    assert set(out) == {"prompt_ids", "token_ids", "prefill_ms", "decode_tokens_per_s", "stopped", "text"}
    assert out["text"] == tokenizer.decode(out["token_ids"], skip_special_tokens=True)
    ids = _json("generate", str(chat_pte), "--prompt-ids", ",".join(map(str, out["prompt_ids"])), "--max-new-tokens", "6")
    assert (ids["token_ids"], ids["text"]) == (out["token_ids"], out["text"])


def test_one_new_token_reports_no_decode_rate(chat_pte: Path) -> None:
    result = _etsdk("generate", str(chat_pte), "--prompt", "Hi there", "--max-new-tokens", "1")
    assert result.returncode == 0, result.stderr
    stats = _stats(result.stderr)
    assert stats.group(2) == "1" and stats.group(4) == "decode n/a (one token: no decode step)"
    assert "0.0 tokens/s" not in result.stderr
    out = _json("generate", str(chat_pte), "--prompt", "Hi there", "--max-new-tokens", "1")
    assert len(out["token_ids"]) == 1 and out["decode_tokens_per_s"] is None


# --------------------------------------------------------------------------- the prompt from a file or stdin


def test_the_prompt_from_stdin_or_a_file_is_the_prompt(chat_pte: Path, tmp_path: Path) -> None:
    given = _json("generate", str(chat_pte), "--prompt", "Hi there", "--max-new-tokens", "4")
    piped = _json("generate", str(chat_pte), "--prompt-file", "-", "--max-new-tokens", "4", stdin="Hi there\n")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Hi there\n")  # one trailing newline is dropped, as from echo
    filed = _json("generate", str(chat_pte), "--prompt-file", str(prompt), "--max-new-tokens", "4")
    for out in (piped, filed):
        assert (out["prompt_ids"], out["token_ids"]) == (given["prompt_ids"], given["token_ids"])
    streamed = _etsdk("generate", str(chat_pte), "--prompt-file", "-", "--max-new-tokens", "4", stdin="Hi there\n")
    assert streamed.returncode == 0 and streamed.stdout == "Hi there" + given["text"] + "\n", streamed.stderr
    two = _etsdk("generate", str(chat_pte), "--prompt", "x", "--prompt-file", "-", stdin="y")
    assert two.returncode == 2 and "give exactly one of --prompt TEXT, --prompt-file PATH" in two.stderr
    empty = _etsdk("generate", str(chat_pte), "--prompt-file", "-", stdin="\n")
    assert empty.returncode == 2 and "the prompt read from stdin is empty" in empty.stderr
    missing = _etsdk("generate", str(chat_pte), "--prompt-file", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2 and "--prompt-file: no such file" in missing.stderr


# --------------------------------------------------------------------------- sampling and stopping flags


def test_top_k_1_equals_greedy_and_a_repeat_penalty_changes_the_sequence(chat_pte: Path) -> None:
    args = ("generate", str(chat_pte), "--prompt", "Hi there", "--max-new-tokens", "24", "--ignore-eos")
    greedy = _json(*args)
    top1 = _json(*args, "--temperature", "1.5", "--top-k", "1", "--seed", "3")
    assert top1["token_ids"] == greedy["token_ids"]
    penalized = _json(*args, "--repeat-penalty", "1.5")
    assert penalized["token_ids"] != greedy["token_ids"]
    assert len(set(penalized["token_ids"])) > len(set(greedy["token_ids"]))  # fewer repeats
    counted = _json(*args, "--presence-penalty", "1.0", "--frequency-penalty", "0.5")
    assert counted["token_ids"] != greedy["token_ids"]


def test_a_stop_string_stops_and_is_not_printed(chat_pte: Path) -> None:
    args = ("generate", str(chat_pte), "--prompt", "Hi there", "--max-new-tokens", "16", "--ignore-eos")
    full = _json(*args)["text"]
    stop = full[4:6]
    cut = full.find(stop)
    stopped = _json(*args, "--stop", stop)
    assert stopped["stopped"] == "stop" and stopped["text"] == full[:cut]
    streamed = _etsdk(*args, "--stop", "zz-never", "--stop", stop)
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == "Hi there" + full[:cut] + "\n"
    assert _stats(streamed.stderr).group(3) == "stop"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--top-k", "-2"], "--top-k: top_k must be an integer >= 0"),
        (["--min-p", "1.5"], "--min-p: min_p must be in [0, 1]"),
        (["--repeat-penalty", "0"], "--repeat-penalty: repeat_penalty must be a finite number > 0"),
        (["--presence-penalty", "nan"], "--presence-penalty: presence_penalty must be a finite number"),
        (["--repeat-last-n", "-5"], "--repeat-last-n: repeat_last_n must be an integer >= -1"),
        (["--stop", ""], "--stop: stop[0] must be a non-empty string"),
    ],
)
def test_bad_sampling_flags_name_the_flag_and_range(flags: list[str], message: str) -> None:
    for command in ("generate", "chat"):
        result = _etsdk(command, "/nonexistent.pte", *(["--prompt-ids", "1"] if command == "generate" else []), *flags)
        assert result.returncode == 2 and f"etsdk: error: {message}" in result.stderr, result.stderr


def test_chat_takes_the_same_flags(chat_pte: Path) -> None:
    helped = _etsdk("chat", "--help")
    for flag in ("--top-k", "--min-p", "--repeat-penalty", "--presence-penalty", "--frequency-penalty", "--stop", "--ignore-eos"):
        assert flag in helped.stdout, flag
    first = _etsdk("chat", str(chat_pte), "--max-new-tokens", "12", "--ignore-eos", "--json", stdin="Hello\n")
    assert first.returncode == 0, first.stderr
    text = json.loads(first.stdout)["text"]
    stop = text[3:5]
    stopped = _etsdk("chat", str(chat_pte), "--max-new-tokens", "12", "--ignore-eos", "--json", "--stop", stop, stdin="Hello\n")
    assert stopped.returncode == 0, stopped.stderr
    reply = json.loads(stopped.stdout)
    assert reply["stopped"] == "stop" and reply["text"] == text[: text.find(stop)]
    shown = _etsdk("chat", str(chat_pte), "--max-new-tokens", "12", "--ignore-eos", "--stop", stop, stdin="Hello\n")
    assert shown.returncode == 0 and shown.stdout == text[: text.find(stop)] + "\n", shown.stderr


# --------------------------------------------------------------------------- usage


@pytest.mark.parametrize(
    "args", [["generate", "x.pte"], ["chat", "x.pte"], ["export", "--model", "m", "-o", "x.pte"], ["inspect", "x.pte"]],
    ids=["generate", "chat", "export", "inspect"],
)
def test_an_unknown_flag_shows_the_commands_usage(args: list[str]) -> None:
    command = args[0]
    result = _etsdk(*args, "--top-kk", "40")
    assert result.returncode == 2
    assert result.stderr.startswith(f"usage: etsdk {command} "), result.stderr
    assert result.stderr.rstrip().endswith(f"etsdk {command}: error: unrecognized arguments: --top-kk 40"), result.stderr


# --------------------------------------------------------------------------- refused before the program loads


@pytest.fixture(scope="module")
def no_backend_pte(exported: Callable[..., Path], model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A program whose decode runs through etsdk-aoti, with a tokenizer beside it; the tests disable etsdk-aoti."""
    folder = tmp_path_factory.mktemp("no-backend")
    shutil.copy(exported("llama", prefill="reference", decode="aoti"), folder / "model.pte")
    shutil.copytree(model_dir, folder / "model.tokenizer")
    return folder / "model.pte"


NO_AOTI = {"ETSDK_DISABLE_PLUGINS": "aoti"}


def test_what_the_contract_refuses_is_refused_before_the_backends_load(no_backend_pte: Path) -> None:
    pte = str(no_backend_pte)
    # the control: a request that fits reaches etsdk.load, which needs the disabled backend
    reached = _etsdk("generate", pte, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", env=NO_AOTI)
    assert reached.returncode == 2 and "EtsdkAotiBackend" in reached.stderr, reached.stderr
    refusals = [
        (["--prompt-ids", "1", "--max-new-tokens", "0"], "--max-new-tokens must be a positive integer, found 0"),
        (["--prompt-ids", "1", "--max-new-tokens", "-3"], "--max-new-tokens must be a positive integer, found -3"),
        (["--prompt-ids", "1", "--max-new-tokens", str(S)], f"--max-new-tokens {S} cannot fit: the program's context length S is {S}"),
        (["--prompt-ids", ",".join(["5"] * (S - 2)), "--max-new-tokens", "3"],
         f"{S - 2} prompt token(s) + 3 new token(s) = {S + 1} cache rows, but the program's context length S is {S}; "
         "to make it fit: fewer new tokens (--max-new-tokens 2) or a program exported with a longer context"),
        (["--prompt-ids", "1,100000", "--max-new-tokens", "2"], "--prompt-ids: token 1 is 100000, outside the vocabulary"),
        (["--prompt", "Once upon a time, " * 3, "--max-new-tokens", "4"], f"but the program's context length S is {S}"),
        (["--prompt", "Hi", "--max-new-tokens", "2", "--top-p", "0"], "--top-p: top_p must be in (0, 1]"),
    ]
    for args, message in refusals:
        result = _etsdk("generate", pte, *args, env=NO_AOTI)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr, (args, result.stderr)
        assert "EtsdkAotiBackend" not in result.stderr, (args, result.stderr)  # etsdk.load was never reached
        assert result.stdout == "", (args, result.stdout)  # nothing echoed, so no error runs into a prompt


def test_an_error_after_the_echoed_prompt_starts_on_a_new_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A generation failing after the prompt and a token were printed: stdout's line is ended before the error
    propagates (the command line prints it to stderr), so the two never run together on a terminal."""
    import argparse

    from etsdk import GenerationError
    from etsdk_hf_static import commands

    class Failing:
        def encode(self, text: str) -> list[int]:
            return [1]

        def decode_text(self, ids: list[int]) -> str:
            return "!" * len(ids)

        def generate(self, prompt_ids: list[int], *, max_new_tokens: int, sampling: object, on_token: Callable[[int], None]) -> object:
            on_token(7)
            raise GenerationError("the model produced non-finite logits (NaN or inf); refusing to pick a token")

    monkeypatch.setattr(commands, "_preflight", lambda args, text, ids: [1, 2, 3])
    monkeypatch.setattr(commands, "open_runner", lambda program, data: Failing())
    parser = argparse.ArgumentParser()
    commands.configure_generate(parser)
    with pytest.raises(GenerationError, match="non-finite logits"):
        commands.run_generate(parser.parse_args(["any.pte", "--prompt", "Once upon a time"]))
    assert capsys.readouterr().out == "Once upon a time!\n"


# --------------------------------------------------------------------------- the demo's ending


def test_the_demo_keeps_its_files_in_a_documented_place_and_says_what_next(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without --out-dir the demo writes demo/ in etsdk's cache directory (never a temporary directory that goes
    away), and its last lines name the files, why the text is random and the commands to try."""
    from etsdk_hf_static.apps.demo import default_out_dir, ending

    monkeypatch.setenv("ETSDK_CACHE_DIR", str(tmp_path / "cache"))
    assert default_out_dir() == tmp_path / "cache" / "demo"
    pte = tmp_path / "my demo" / "tiny-llama.pte"
    text = ending(pte.with_name("tiny-llama"), pte, default=True)
    assert f"model directory: {pte.with_name('tiny-llama')}" in text and f"program:         {pte}" in text
    assert "etsdk's cache directory" in text and "random because the model's weights are" in text
    assert f"etsdk chat '{pte}'" in text and f"etsdk generate '{pte}' --prompt" in text  # quoted for the shell


def test_start_up_says_loading_first_and_times_its_stages_on_request(chat_pte: Path) -> None:
    """docs/cli.md's start-up paragraph: the loading line comes before anything else, and ETSDK_TIMING=1 prints
    each start-up stage once, in order, with a wall clock that does not run backwards."""
    result = _etsdk("generate", str(chat_pte), "--prompt", "Hi", "--max-new-tokens", "2", env={"ETSDK_TIMING": "1"})
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == f"etsdk: loading {chat_pte.name} ...", result.stderr
    stages = [json.loads(line.removeprefix("etsdk-timing: ")) for line in lines if line.startswith("etsdk-timing: ")]
    assert [s["stage"] for s in stages] == ["start", "program", "tokenizer", "methods", "prompt", "first_token"]
    assert all(a["t"] <= b["t"] for a, b in zip(stages, stages[1:]))
    quiet = _etsdk("generate", str(chat_pte), "--prompt", "Hi", "--max-new-tokens", "2", env={"ETSDK_TIMING": "0"})
    assert quiet.returncode == 0 and "etsdk-timing" not in quiet.stderr
