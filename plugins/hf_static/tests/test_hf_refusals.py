"""Exports refused before any tracing: a model hf_static v1 cannot express (naming the layer and the feature), and
a disk that cannot hold the program; an export says what it will take before it starts."""

from __future__ import annotations

import shutil
from pathlib import Path

import etsdk
import pytest
import torch
import transformers
from etsdk import ExportError
from etsdk_hf_static.exporter import export


def _model(config: object) -> object:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _gemma3() -> object:
    return transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=64,
    )


def _mistral() -> object:
    return transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, sliding_window=8, max_position_embeddings=64,
    )


@pytest.mark.parametrize(("config", "expected"), [
    (_gemma3, r"gemma3_text: layer 0 uses sliding-window attention \(a ring cache of 8 rows\) \(StaticSlidingWindowLayer\)"
              r", and the hf_static v1 contract holds full-attention key / value caches only; its layer types: "
              r"full_attention, sliding_attention"),
    (_mistral, r"mistral: layer 0 uses sliding-window attention \(a ring cache of 8 rows\)"),
], ids=["gemma3_text", "mistral"])
def test_a_sliding_window_model_is_refused_naming_the_layer(config: object, expected: str, tmp_path: Path) -> None:
    out = tmp_path / "model.pte"
    with pytest.raises(ExportError, match=expected):
        export(_model(config()), out, backend="EtsdkReferenceBackend", prefill_length=4, context_length=32, quiet=True)  # type: ignore[operator]
    assert list(tmp_path.iterdir()) == []


def test_an_export_says_what_it_takes_and_a_full_disk_refuses_it_before_tracing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from etsdk_hf_static.exporter import model_size
    from etsdk_hf_static.tiny import tiny_model

    model = tiny_model("llama")
    count, size = model_size(model)
    assert count == sum(p.numel() for p in model.parameters())
    assert size == 4 * count + sum(b.numel() * b.element_size() for b in model.buffers())  # fp32, nothing tied
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=size))  # less than 2x + 5 %
    traced: list[object] = []
    monkeypatch.setattr("etsdk_hf_static.exporter.method_sources", lambda *a, **k: traced.append(a))
    out = tmp_path / "model.pte"
    with pytest.raises(ExportError, match=r"not enough free space: the export needs about .*B for the program in "
                       rf"{tmp_path} and .*B for temporary copies of the weights in .*, and that file system has "
                       r".* free; free some space, or write elsewhere \(TMPDIR"):
        export(model, out, backend="EtsdkReferenceBackend", prefill_length=4, context_length=32)
    assert not traced and list(tmp_path.iterdir()) == []
    said = capsys.readouterr().err
    assert f"{count / 1e6:.1f}M parameters, " in said and f"writes about {etsdk.format_bytes(size)} to {tmp_path}" in said
