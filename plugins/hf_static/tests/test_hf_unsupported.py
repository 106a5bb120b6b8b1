"""A model hf_static v1 cannot express is refused at export with an etsdk error naming the layer and the feature."""

from __future__ import annotations

from pathlib import Path

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
