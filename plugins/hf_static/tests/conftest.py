"""Shared, expensive artifacts for the hf_static tests: each AOTInductor export happens once per run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from etsdk_hf_static.exporting.exporter import export  # noqa: E402
from etsdk_hf_static.exporting.tiny import VOCAB, save_tiny_model, tiny_model  # noqa: E402
from etsdk_hf_static.runtime.runner import HfStaticRunner  # noqa: E402

#: context length S, prefill length T, tokens generated per comparison. S is not a multiple of T, so a
#: prompt of S-1-NEW tokens ends in a tail whose padded prefill would run past the context (decode path).
S, T, NEW = 31, 8, 4
PROMPT_LENGTHS = (1, T - 1, T, T + 1, 2 * T + 3, S - 1 - NEW)
#: eager top-1 minus top-2 logit must exceed this for a token comparison to be meaningful (float32
#: rounding between two correct implementations is ~1e-5 here; tiny_model spreads logits over units).
MARGIN = 1e-2


def hf_generate(model: Any, prompt: Sequence[int], new: int) -> tuple[list[int], float]:
    """transformers' own greedy ``generate`` (eager): the generated ids and the smallest top-2 margin seen."""
    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0,
            output_scores=True, return_dict_in_generate=True,
        )
    margins = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    return out.sequences[0, len(prompt):].tolist(), min(margins)


def assert_generates_like(runner: Any, model: Any, lengths: Sequence[int], new: int, seed: int) -> None:
    """``runner`` generates transformers' greedy tokens of ``model`` for prompts of ``lengths`` (those whose top-1
    margin is clear: at least two of them)."""
    compared = 0
    for length in lengths:
        prompt = prompt_of(length, seed=seed)
        expected, margin = hf_generate(model, prompt, new)
        if margin < MARGIN:
            continue
        got = runner.new_conversation().generate(prompt, max_new_tokens=new, stop_at_eos=False).token_ids
        assert list(got) == expected, f"prompt of {length}: {got} != transformers {expected}"
        compared += 1
    assert compared >= 2, "too few prompts with a clear top-1 margin to compare"


def prompt_of(length: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(1000 + length + seed)
    return torch.randint(3, VOCAB, (length,), generator=generator).tolist()


@pytest.fixture(scope="session")
def models() -> dict[str, Any]:
    """``llama`` and ``qwen2``; ``llama-other``: the same Llama configuration with other weights."""
    return {"llama": tiny_model("llama", seed=0), "qwen2": tiny_model("qwen2", seed=1), "llama-other": tiny_model("llama", seed=7)}


@pytest.fixture(scope="session")
def exported(models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``exported(arch, prefill=..., decode=..., context_length=S)`` -> the .pte, exported once per combination."""
    cache: dict[tuple[str, str, str, int], Path] = {}

    def get(arch: str, prefill: str = "aoti", decode: str = "aoti", context_length: int = S) -> Path:
        key = (arch, prefill, decode, context_length)
        if key not in cache:
            path = tmp_path_factory.mktemp(f"{arch}-{prefill}-{decode}-{context_length}") / "model.pte"
            export(models[arch], path, prefill_backend=prefill, decode_backend=decode, prefill_length=T,
                   context_length=context_length, partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=True)
            cache[key] = path
        return cache[key]

    return get


@pytest.fixture(scope="session")
def runner(exported: Callable[..., Path]) -> HfStaticRunner:
    """The Llama program through AOTI (both methods)."""
    return HfStaticRunner.from_file(exported("llama"))


#: the model directory's max_position_embeddings: what `etsdk export` takes for S when none is given. Small, so
#: that a chat over a program exported with the defaults fills its context in one or two exchanges (the tiny
#: tokenizer spends one token per character); every explicit S of these tests is at most this.
MODEL_POSITIONS = 128


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transformers model directory (config, weights, tokenizer) written locally: no download."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama") / "model", "llama", seed=0, positions=MODEL_POSITIONS)


#: context length of the chat program: the tiny chat template spends about 20 character tokens per message
CHAT_S = 128


@pytest.fixture(scope="session")
def chat_pte(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model directory's Llama through the reference backend, with its tokenizer (and chat template) beside it,
    and decode_batch over 4 conversations (the server runs concurrent requests' decode steps together)."""
    path = tmp_path_factory.mktemp("chat") / "chat.pte"
    export(model_dir, path, backend="reference", prefill_length=T, context_length=CHAT_S, decode_batch=4, quiet=True)
    return path


@pytest.fixture(scope="session")
def default_chat_pte(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``etsdk export --model DIR --backend reference -o chat.pte``: no sizes given, so S = max_position_embeddings
    (:data:`MODEL_POSITIONS`) and T = the default, as a user's first export."""
    import subprocess
    import sys

    path = tmp_path_factory.mktemp("default-chat") / "chat.pte"
    result = subprocess.run(
        [sys.executable, "-m", "etsdk", "export", "--model", str(model_dir), "--backend", "reference", "-o", str(path)],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"S={MODEL_POSITIONS} (S from max_position_embeddings {MODEL_POSITIONS}" in result.stderr, result.stderr
    return path
