"""Attention that follows the filled rows: at S=2048 a 16-token conversation reads the rows it holds, not 2048.

``etsdk export`` (``attention="auto"``) makes every attention layer call ``etsdk::attention`` when the chosen
backends claim it (etsdk-aoti's native kernel, the reference backend's reference): each call reads rows
``0 .. n-1`` only, ``n`` one past the last row its mask shows. The rows read are counted (the reference's and
the kernel's counters) against the conversation's own arithmetic, and the tokens equal full-length mode's
(``attention="full"``: SDPA over every row) and transformers'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import MARGIN, hf_generate, prompt_of
from etsdk import ExportError
from etsdk.backend import attention_rows_read
from etsdk_hf_static.exporting.attention import wanted
from etsdk_hf_static.exporting.exporter import export
from etsdk_hf_static.exporting.tiny import tiny_model
from etsdk_hf_static.runtime.planning import plan_prompt
from etsdk_hf_static.runtime.runner import HfStaticRunner

LONG_S, T, PROMPT, NEW = 2048, 8, 10, 6


@pytest.fixture(scope="module")
def long_model() -> Any:
    return tiny_model("llama", seed=4, positions=LONG_S)


def _export(model: Any, path: Path, backend: str, attention: str) -> HfStaticRunner:
    from etsdk.testing import capture_delegates

    with capture_delegates() as captured:
        export(model, path, backend=backend, prefill_length=T, context_length=LONG_S, attention=attention,
               partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=True)
    if backend == "aoti":  # a library that calls the attention kernel says so: a reader without it refuses the blob
        from etsdk.backend import BlobReader
        from etsdk_aoti import blob_format

        for delegate in captured:
            features = BlobReader(delegate.payload, known_features=blob_format.KNOWN_FEATURES).required_features
            assert (blob_format.ATTENTION_FEATURE in features) == (attention != "full"), (delegate.method, features)
            # decode's float32 products (one row) run on the native GEMV, and so does prefill's head (the last real
            # row's logits only); prefill's other products (T rows) keep the library GEMM
            assert blob_format.LINEAR_FEATURE in features, (delegate.method, features)
    return HfStaticRunner.from_file(path)


def _rows_expected(runner: HfStaticRunner, prompt: list[int], new: int) -> int:
    """Rows a conversation reads: per layer and call, one past its last real row's position."""
    steps = plan_prompt(0, prompt, runner.metadata)
    per_layer = sum(step.start + len(step.tokens) for step in steps)
    per_layer += sum(len(prompt) + i + 1 for i in range(new - 1))  # decode of generated tokens 1 .. new-1
    return per_layer * runner.metadata.layers


@pytest.mark.parametrize("backend", ["reference", "aoti"])
def test_decode_reads_the_rows_in_use_and_equals_full_length_mode(backend: str, long_model: Any, tmp_path: Path) -> None:
    prompt = prompt_of(PROMPT, seed=9)
    expected, margin = hf_generate(long_model, prompt, NEW)
    assert margin > MARGIN, f"eager top-2 margin {margin:.2e} too small for a token comparison"

    filled = _export(long_model, tmp_path / "filled.pte", backend, "auto")
    if backend == "aoti":
        from etsdk_aoti import kernels

        counter = kernels.attention_rows_read
    else:
        counter = attention_rows_read
    before = counter()
    got = filled.generate(prompt, max_new_tokens=NEW, stop_at_eos=False).token_ids
    read = counter() - before
    assert read == _rows_expected(filled, prompt, NEW)
    assert read < 40 * filled.metadata.layers * 8  # 16 positions in a cache of 2048 rows: far from 2048 per call
    assert list(got) == expected

    full = _export(long_model, tmp_path / "full.pte", backend if backend == "reference" else "aoti", "full")
    before = attention_rows_read()
    assert full.generate(prompt, max_new_tokens=NEW, stop_at_eos=False).token_ids == got
    assert attention_rows_read() == before  # full-length mode: SDPA over all S rows, no etsdk::attention


def test_a_model_whose_attention_the_operator_lacks_keeps_its_own() -> None:
    import transformers

    config = transformers.Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, attn_logit_softcapping=50.0,
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert not wanted("auto", ["EtsdkReferenceBackend"], model)  # full-length mode, the model's own attention
    with pytest.raises(ExportError, match=r"attention='filled': Gemma2ForCausalLM cannot use etsdk::attention: its "
                       r"attention soft-caps logits \(attn_logit_softcapping=50.0\)"):
        wanted("filled", ["EtsdkReferenceBackend"], model)


def test_filled_attention_needs_backends_that_claim_it() -> None:
    assert wanted("auto", ["EtsdkAotiBackend", "EtsdkReferenceBackend"])
    assert not wanted("full", ["EtsdkAotiBackend"])
    with pytest.raises(ExportError, match=r"attention must be one of auto, filled, full, found 'some'"):
        wanted("some", ["EtsdkAotiBackend"])
    pytest.importorskip("etsdk_tensorrt")
    assert not wanted("auto", ["EtsdkAotiBackend", "EtsdkTensorRTBackend"])  # TensorRT: full-length mode
    with pytest.raises(ExportError, match=r"attention='filled' needs every backend to claim etsdk::attention; "
                       r"EtsdkTensorRTBackend does not declare filled_attention"):
        wanted("filled", ["EtsdkTensorRTBackend", "EtsdkAotiBackend"])
