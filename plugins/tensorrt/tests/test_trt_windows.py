"""A sliding-window model (hf_static v2, ring caches) with prefill through TensorRT and decode through AOTInductor.

A tiny Mistral whose every layer has a window of 6 positions, exported with ``etsdk export --prefill-backend
tensorrt --decode-backend aoti``: the ring caches (R = W + T - 1 rows, written at position mod R) are caller-owned
state shared by the TensorRT engine and the AOTI library; greedy generation well past the window equals
transformers'. etsdk-tensorrt does not claim ``etsdk::attention``, so the export keeps SDPA over every row.
"""

from __future__ import annotations

from pathlib import Path

import etsdk
import pytest
import torch

pytest.importorskip("transformers")

from etsdk_hf_static.exporting.tiny import save_tiny_model  # noqa: E402
from etsdk_hf_static.runtime.runner import HfStaticRunner  # noqa: E402
from test_trt_mixed_delegates import _prompt, _transformers_greedy, etsdk_cli  # noqa: E402

S, T, NEW, WINDOW = 24, 8, 8, 6


def test_ring_caches_shared_by_tensorrt_prefill_and_aoti_decode_generate_transformers_tokens(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = save_tiny_model(tmp_path / "model", "mistral", seed=2, window=WINDOW)
    out = tmp_path / "ring.pte"
    result = etsdk_cli(
        "export", "--model", str(model_dir), "--prefill-backend", "tensorrt", "--decode-backend", "aoti",
        "--prefill-length", str(T), "--context-length", str(S), "-o", str(out), cache=tmp_path / "engines",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "hf_static v2" in result.stderr and "attention over every row" in result.stderr, result.stderr[-2000:]
    runner = HfStaticRunner(etsdk.load(out))
    assert runner.metadata.layer_kinds == ("window", "window") and runner.metadata.ring_rows == WINDOW + T - 1
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    for length in (T - 1, T + 3):
        prompt = _prompt(length, seed=11)
        want, margin = _transformers_greedy(model, prompt, NEW)
        assert margin > 1e-2, "near-tied logits: the comparison would not be meaningful"
        with torch.no_grad():
            got = runner.new_conversation().generate(prompt, max_new_tokens=NEW, stop_at_eos=False)
        assert list(got.token_ids) == want, f"prompt of {length}"


def test_int8_caches_through_tensorrt_are_refused_before_the_model_loads(tmp_path: Path) -> None:
    result = etsdk_cli(
        "export", "--model", str(tmp_path / "no-model-needed"), "--prefill-backend", "tensorrt", "--decode-backend",
        "aoti", "--kv-cache", "int8", "-o", str(tmp_path / "m.pte"), cache=tmp_path / "engines",
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "kv_cache='int8' needs every backend to compute attention over int8 cache rows (filled_attention); " \
        "EtsdkTensorRTBackend does not declare it" in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "m.pte").exists()
