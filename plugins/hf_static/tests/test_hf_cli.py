"""``etsdk export`` / ``etsdk generate`` end to end, in subprocesses, from a local model directory."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MARGIN, S, T, hf_generate

#: lines other libraries print at import or export (torchao, torch logging, warnings, progress bars)
STATS = re.compile(r"^\[\d+ prompt tokens, \d+ generated \((eos|length|stop)\); prefill [\d.]+ ms; decode ")
FOREIGN = re.compile(r"Warning|warnings\.warn|^\s*return |^[WEI]\d{4} |Failed to load|it/s\]|Traceback")


def _foreign(lines: list[str]) -> list[str]:
    """Lines that are not etsdk's own: every stderr line etsdk prints starts with ``etsdk``, but for the
    statistics line of ``etsdk generate`` (``[6 prompt tokens, 6 generated (length); prefill ...]``)."""
    return [line for line in lines if line.strip() and not line.startswith("etsdk") and not STATS.match(line)]


def _etsdk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "etsdk", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def cli_pte(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "tiny.pte"
    result = _etsdk(
        "export", "--model", str(model_dir), "--prefill-backend", "reference", "--decode-backend", "aoti",
        "--prefill-length", str(T), "--context-length", str(S), "--external-data", "-o", str(out),
    )
    assert result.returncode == 0, result.stderr
    for stage in ("loading", "tracing 'prefill'", "compiling", "writing"):
        assert stage in result.stderr, f"no '{stage}' progress line"
    assert not _foreign(result.stderr.splitlines()), "etsdk export printed other libraries' lines"
    assert {p.name for p in out.parent.iterdir()} == {"tiny.pte", "tiny.ptd", "tiny.tokenizer"}
    return out


def test_generate_json_equals_transformers(cli_pte: Path, model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    result = _etsdk("generate", str(cli_pte), "--prompt-ids", "1,40,41,42", "--max-new-tokens", "5", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(out) >= {"prompt_ids", "token_ids", "prefill_ms", "decode_tokens_per_s"}
    assert out["prompt_ids"] == [1, 40, 41, 42]
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    expected, margin = hf_generate(model, [1, 40, 41, 42], 5)
    assert margin > MARGIN
    eos = model.generation_config.eos_token_id
    if eos in expected:  # the runner stops at EOS, transformers was told not to
        expected = expected[: expected.index(eos) + 1]
    assert out["token_ids"] == expected
    assert out["prefill_ms"] > 0


def test_generate_streams_text_with_the_saved_tokenizer(cli_pte: Path) -> None:
    result = _etsdk("generate", str(cli_pte), "--prompt", "Hi there", "--max-new-tokens", "6")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Hi there") and not STATS.search(result.stdout)  # the text alone on stdout
    assert [line for line in result.stderr.splitlines() if STATS.match(line)], result.stderr  # statistics on stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "--model", "/nonexistent/model", "-o", "x.pte"], "not a transformers model directory"),
        (["export", "--model", ".", "--backend", "nosuch", "-o", "x.pte"], "backend 'nosuch'"),
        (["generate", "/nonexistent.pte", "--prompt-ids", "1"], "program file not found"),
    ],
)
def test_cli_errors_are_one_clear_line(args: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    result = subprocess.run([sys.executable, "-m", "etsdk", *args], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_generate_refuses_bad_ids_and_overflow(cli_pte: Path) -> None:
    bad = _etsdk("generate", str(cli_pte), "--prompt-ids", "1,x")
    assert bad.returncode == 2 and "comma-separated integers" in bad.stderr
    too_long = _etsdk("generate", str(cli_pte), "--prompt-ids", ",".join(["5"] * S), "--max-new-tokens", "2")
    assert too_long.returncode == 2 and f"context length S is {S}" in too_long.stderr


def test_seeded_sampling_from_the_cli_repeats(cli_pte: Path) -> None:
    args = ("generate", str(cli_pte), "--prompt-ids", "1,40,41", "--max-new-tokens", "6", "--json",
            "--temperature", "1.2", "--top-p", "0.9", "--seed", "7")
    first, second = _etsdk(*args), _etsdk(*args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    ids = [json.loads(r.stdout.strip().splitlines()[-1])["token_ids"] for r in (first, second)]
    assert ids[0] == ids[1] and len(ids[0]) >= 1
    bad = _etsdk("generate", str(cli_pte), "--prompt-ids", "1", "--top-p", "0")
    assert bad.returncode == 2 and "top_p must be in (0, 1]" in bad.stderr


def test_generate_prints_no_line_from_another_library(cli_pte: Path) -> None:
    """Issue 15: torchao's "Failed to load", torch's W1203 lines, FutureWarnings and progress bars stay hidden."""
    result = _etsdk("generate", str(cli_pte), "--prompt", "Hi there", "--max-new-tokens", "6")
    assert result.returncode == 0, result.stderr
    assert not _foreign(result.stderr.splitlines()), result.stderr
    assert not [line for line in result.stdout.splitlines() if FOREIGN.search(line)], result.stdout
    if importlib.util.find_spec("torchao") is not None:  # the noise this environment makes: --verbose shows it
        verbose = _etsdk("generate", str(cli_pte), "--prompt", "Hi there", "--max-new-tokens", "2", "--verbose")
        assert verbose.returncode == 0 and _foreign(verbose.stderr.splitlines()), verbose.stderr


def test_inspect_is_readable_and_verify_finds_nothing_unverifiable(chat_pte: Path) -> None:
    """A fresh hf_static export: layers folded into ranges, metadata as aligned lines, every entry verifiable."""
    inspected = _etsdk("inspect", str(chat_pte))
    assert inspected.returncode == 0, inspected.stderr
    text = inspected.stdout
    assert "    state k0..k1: float32 [" in text and "state c0..c1: reads and writes int64 [] (buffers " in text
    assert "{'" not in text and re.search(r"^      hf_static\.context_length: +128$", text, re.M), text
    verified = _etsdk("verify", str(chat_pte))
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.rstrip().endswith(", 0 damaged, 0 unverifiable (key is not a content hash)"), verified.stdout


def test_ctrl_c_during_export_is_one_line_and_leaves_no_file(model_dir: Path, tmp_path: Path) -> None:
    """SIGINT while the export compiles: exit 130, "etsdk: interrupted", no traceback, nothing at the output path."""
    import os
    import signal
    import time

    out = tmp_path / "cut.pte"
    process = subprocess.Popen(
        [sys.executable, "-m", "etsdk", "export", "--model", str(model_dir), "-o", str(out), "--context-length", str(S)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stderr is not None
    seen = []
    for line in process.stderr:  # wait until the export is past loading, in the middle of its work
        seen.append(line)
        if "compiling" in line or "tracing 'decode'" in line:
            time.sleep(1.0)
            os.kill(process.pid, signal.SIGINT)
            break
    rest = process.stderr.read()
    code = process.wait(timeout=300)
    transcript = "".join(seen) + rest
    assert code == 130, transcript
    assert rest.strip().splitlines()[-1] == "etsdk: interrupted", transcript
    assert "Traceback" not in transcript and "KeyboardInterrupt" not in transcript
    assert not list(tmp_path.iterdir()), sorted(p.name for p in tmp_path.iterdir())
