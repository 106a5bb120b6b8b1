"""Exports refused before any tracing: a model hf_static cannot express (naming the layer and the feature), and
a disk that cannot hold the program; an export says what it will take before it starts."""

from __future__ import annotations

import shutil
from pathlib import Path

import etsdk
import pytest
import torch
import transformers
from etsdk import ExportError
from etsdk_hf_static.exporting.exporter import export


def _model(config: object) -> object:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _llama4() -> object:
    return transformers.Llama4TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, intermediate_size_mlp=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64, attention_chunk_size=8,
    )


def _qwen3_next() -> object:
    return transformers.Qwen3NextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, layer_types=["linear_attention", "full_attention"],
    )


@pytest.mark.parametrize(("config", "expected"), [
    # chunked attention gets a sliding-window cache in transformers, but attends by blocks: never exported as a window
    (_llama4, r"llama4_text: layer 0 uses chunked attention \(attention within fixed blocks of positions\) "
              r"\(StaticSlidingWindowLayer\), and the hf_static contracts hold full-attention and sliding-window key / "
              r"value caches only; its layer types: chunked_attention"),
    (_qwen3_next, r"qwen3_next: layer 0 uses linear attention \(a recurrent state, not a key / value cache\)"),
], ids=["llama4_text", "qwen3_next"])
def test_a_model_hf_static_cannot_hold_is_refused_naming_the_layer(config: object, expected: str, tmp_path: Path) -> None:
    out = tmp_path / "model.pte"
    with pytest.raises(ExportError, match=expected):
        export(_model(config()), out, backend="EtsdkReferenceBackend", prefill_length=4, context_length=32, quiet=True)  # type: ignore[operator]
    assert list(tmp_path.iterdir()) == []


def test_an_export_says_what_it_takes_and_a_full_disk_refuses_it_before_tracing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from etsdk_hf_static.exporting.exporter import model_size
    from etsdk_hf_static.exporting.tiny import tiny_model

    model = tiny_model("llama", hidden=512, layers=1)  # 1 MiB weights: a model object's large weights are spooled
    count, size = model_size(model)
    assert count == sum(p.numel() for p in model.parameters())
    assert size == 4 * count + sum(b.numel() * b.element_size() for b in model.buffers())  # fp32, nothing tied
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=size))  # less than 2x + 5 %
    traced: list[object] = []
    monkeypatch.setattr("etsdk_hf_static.exporting.exporter.method_sources", lambda *a, **k: traced.append(a))
    out = tmp_path / "model.pte"
    with pytest.raises(ExportError, match=r"not enough free space: the export needs about .*B for the program in "
                       rf"{tmp_path} and .*B for temporary copies of the weights in .*, and that file system has "
                       r".* free; free some space, or write elsewhere \(TMPDIR"):
        export(model, out, backend="EtsdkReferenceBackend", prefill_length=4, context_length=32)
    assert not traced and list(tmp_path.iterdir()) == []
    said = capsys.readouterr().err
    assert f"{count / 1e6:.1f}M parameters, " in said and f"writes about {etsdk.format_bytes(size)} to {tmp_path}" in said


@pytest.mark.parametrize(("options", "expected"), [
    ({"full_logits": "yes"}, "hf_static's option full_logits takes true or false, found 'yes'"),
    ({"meta_trace": 1}, "hf_static's option meta_trace takes true or false, found 1"),
    ({"attention": 5}, "hf_static's option attention takes a string, found 5"),
    ({"logits": True}, "hf_static's exporter takes the options attention, kv_cache, weights_dtype, meta_trace, "
                       "cpu_target and full_logits, not logits"),
])
def test_an_export_request_with_an_option_of_the_wrong_type_is_refused(options: dict, expected: str, tmp_path: Path) -> None:
    # an option of the wrong type never silently means its default: refused before anything loads
    from etsdk_hf_static.exporting.exporter import export_request

    request = etsdk.ExportRequest(model=tmp_path / "no-model", output=tmp_path / "out.pte", backend="reference",
                                  options=options)
    with pytest.raises(ExportError) as caught:
        export_request(request)
    assert str(caught.value) == expected
    assert not (tmp_path / "out.pte").exists()


@pytest.mark.parametrize("b", [1, 0, -3, True, "4"])
def test_a_decode_batch_of_fewer_than_two_conversations_is_refused(b: object, tmp_path: Path) -> None:
    from etsdk_hf_static.exporting.exporter import export_request

    request = etsdk.ExportRequest(model=tmp_path / "no-model", output=tmp_path / "out.pte", backend="reference",
                                  sizes={"B": b})
    with pytest.raises(ExportError, match="an integer of 2 or more, found"):
        export_request(request)
    assert not (tmp_path / "out.pte").exists()
