"""Prefill through TensorRT, decode through AOTInductor, one caller-owned cache: transformers' greedy tokens.

A tiny Llama (random weights, grouped-query attention, transformers' static
cache) exported with ``etsdk export --prefill-backend tensorrt --decode-backend
aoti``. Prefill's cache writes are ``arange(T) + counter``: they become ONNX
``TensorScatter`` (alias kind ``kv_cache_update``), the counters ``user``
aliases. Decode (AOTI) must read exactly what prefill (TensorRT) wrote into the
session's storage: a variant whose engine writes into storage of its own makes
the tokens differ, so the comparison can fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import etsdk
import pytest
import torch

pytest.importorskip("transformers")

from etsdk_hf_static.exporting.tiny import VOCAB, save_tiny_model  # noqa: E402
from etsdk_hf_static.runtime.runner import HfStaticRunner, Step  # noqa: E402
from etsdk_tensorrt import BACKEND_ID, blob_format  # noqa: E402

AOTI = "EtsdkAotiBackend"
S, T, NEW = 24, 8, 6
HARNESS = Path(__file__).resolve().parent / "standin" / "run_etsdk.py"


def _prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(1000 + length + seed)
    return torch.randint(3, VOCAB, (length,), generator=generator).tolist()


def _transformers_greedy(model: Any, prompt: list[int], new: int) -> tuple[list[int], float]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0,
            output_scores=True, return_dict_in_generate=True,
        )
    margins = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    return out.sequences[0, len(prompt) :].tolist(), min(margins)


def etsdk_cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """``etsdk ARGS`` in a subprocess that sees the stand-in as TensorRT (see standin/run_etsdk.py)."""
    env = dict(os.environ, ETSDK_TENSORRT_TEST_CACHE=str(cache))
    return subprocess.run(
        [sys.executable, str(HARNESS), *args], capture_output=True, text=True, timeout=1500, env=env
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama") / "model", "llama", seed=0)


@pytest.fixture(scope="module")
def mixed_pte(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mixed") / "tiny.pte"
    result = etsdk_cli(
        "export", "--model", str(model_dir), "--prefill-backend", "tensorrt", "--decode-backend", "aoti",
        "--prefill-length", str(T), "--context-length", str(S), "-o", str(out),
        cache=tmp_path_factory.mktemp("cli-engines"),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "compiling" in result.stderr and "EtsdkTensorRTBackend: building the engine" in result.stderr
    return out


def test_export_cli_puts_prefill_on_tensorrt_and_decode_on_aoti(mixed_pte: Path) -> None:
    program = etsdk.load(mixed_pte)
    assert program.delegates("prefill") == (BACKEND_ID,)
    assert program.delegates("decode") == (AOTI,)
    (record,) = program.record.methods["prefill"]  # type: ignore[union-attr]
    assert {s.state for s in record.signature.states} == {f"{k}{i}" for k in "kvc" for i in range(2)}


def test_prefill_cache_writes_are_tensor_scatter_aliases(mixed_pte: Path) -> None:
    (description,) = payloads_in(mixed_pte)
    kinds = {a.state: a.kind for a in description.aliases}
    assert kinds == {"k0": "kv_cache_update", "v0": "kv_cache_update", "k1": "kv_cache_update",
                     "v1": "kv_cache_update", "c0": "user", "c1": "user"}
    assert all(a.ownership == "caller" for a in description.aliases)
    assert description.device == "cpu" and description.engine is not None and description.onnx is not None


def test_the_onnx_weights_are_the_weight_entries_aoti_decode_reads(mixed_pte: Path, model_dir: Path) -> None:
    """Each ONNX initializer is a weight entry (``onnx.tensors``), the very entry AOTI's decode stores for that weight,
    and the engine TensorRT built at export holds none (weight-stripped, refitted from those entries at load: the
    token tests of this module run it): the program stores each weight once."""
    from safetensors import safe_open

    (description,) = payloads_in(mixed_pte)
    assert description.onnx is not None and description.onnx.weights is None and description.onnx.tensors
    listed = subprocess.run([sys.executable, "-m", "etsdk", "inspect", str(mixed_pte), "--json"], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr[-2000:]
    entries = {e["key"]: e["size"] for e in json.loads(listed.stdout)["named_data"]}
    assert {t.key for t in description.onnx.tensors} <= set(entries)
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        weights = {f.get_tensor(k).numpy().tobytes() for k in f.keys()}
    checkpoint_keys = {f"weights/{hashlib.sha256(w).hexdigest()}" for w in weights}
    matrices = [t for t in description.onnx.tensors if t.nbytes >= 4096]
    assert matrices and all(t.key in checkpoint_keys for t in matrices), "an initializer is not the model's own bytes"
    assert description.engine is not None and description.engine.stripped
    stored = sum(size for key, size in entries.items() if key.startswith("weights/"))
    others = {key: size for key, size in entries.items() if not key.startswith(("weights/", "etsdk/program/"))}
    assert set(others) == {description.engine.data.key}, others  # no whole-file ONNX weights entry any more
    assert stored <= 1.05 * sum(len(w) for w in weights), (stored, sum(len(w) for w in weights))
    assert others[description.engine.data.key] < 0.5 * stored  # the engine: its graph, not the weights


def payloads_in(pte: Path) -> list[blob_format.BlobDescription]:
    """The description of every etsdk-tensorrt payload inside a .pte (etsdk containers found by their magic)."""
    import struct

    data = pte.read_bytes()
    found, start = [], 0
    while (start := data.find(b"ETSDKBLB", start)) >= 0:
        total = struct.unpack_from("<Q", data, start + 16)[0]
        candidate = data[start : start + total]
        start += 8
        try:
            description, _ = blob_format.read(candidate)
        except etsdk.EtsdkError:
            continue  # the core's wrapper, or another backend's payload
        found.append(description)
    return found


@pytest.mark.parametrize("length", [T - 1, T + 3])
def test_generates_exactly_transformers_greedy_tokens(mixed_pte: Path, model_dir: Path, length: int) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = _prompt(length, seed=3)
    want, margin = _transformers_greedy(model, prompt, NEW)
    assert margin > 1e-2, "near-tied logits: the comparison would not be meaningful"
    runner = HfStaticRunner(etsdk.load(mixed_pte))
    got = runner.new_conversation().generate(prompt, max_new_tokens=NEW, stop_at_eos=False)
    assert list(got.token_ids) == want


def test_decode_reads_what_prefill_wrote(mixed_pte: Path) -> None:
    runner = HfStaticRunner(etsdk.load(mixed_pte))
    prompt = _prompt(T, seed=8)
    written = runner.new_conversation()
    pointers = {name: t.data_ptr() for name, t in written.session.state.items()}
    written.run_step(Step("prefill", 0, tuple(prompt), T))  # TensorRT writes rows 0..T-1 of the caller's cache
    assert written.session.state["k0"][0, :, :T].abs().sum() > 0
    assert not written.session.state["k0"][0, :, T:].any()
    after_prefill = written.run_step(Step("decode", T, (9,), 1)).clone()  # AOTI reads them
    unwritten = runner.new_conversation().run_step(Step("decode", T, (9,), 1)).clone()
    assert not torch.allclose(after_prefill, unwritten, atol=1e-3)
    assert {name: t.data_ptr() for name, t in written.session.state.items()} == pointers


def test_prefill_writing_elsewhere_fails_the_token_comparison(
    mixed_pte: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The historic bug: the delegate binds storage of its own instead of the caller's cache."""
    from etsdk_tensorrt import runtime
    from transformers import AutoModelForCausalLM

    original = runtime.TensorRTHandle.execute
    private: dict[int, list[torch.Tensor]] = {}

    def execute_on_private_state(self: Any, args: Any, state: Any) -> None:
        own = private.setdefault(id(self), [torch.zeros_like(s) for s in state])
        original(self, args, own)

    monkeypatch.setattr(runtime.TensorRTHandle, "execute", execute_on_private_state)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = _prompt(T + 3, seed=3)
    want, _ = _transformers_greedy(model, prompt, NEW)
    runner = HfStaticRunner(etsdk.load(mixed_pte))
    conversation = runner.new_conversation()
    got = conversation.generate(prompt, max_new_tokens=NEW, stop_at_eos=False)
    assert private, "the engine never ran"
    assert not conversation.session.state["k0"][0, :, :T].any(), "prefill reached the caller's cache after all"
    assert list(got.token_ids) != want


def test_generate_from_the_cli_equals_transformers(mixed_pte: Path, model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    prompt = [1, 40, 41, 42, 43]
    result = etsdk_cli(
        "generate", str(mixed_pte), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "5", "--json",
        cache=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    expected, margin = _transformers_greedy(model, prompt, 5)
    assert margin > 1e-2
    eos = model.generation_config.eos_token_id
    if eos in expected:  # the runner stops at EOS, transformers was told not to
        expected = expected[: expected.index(eos) + 1]
    assert out["token_ids"] == expected
