"""``etsdk.keep_16bit_weights``: 16-bit linear / embedding weights kept as they are (no copy, ties kept), every
other tensor float32, and the model computing exactly what its float32-upcast copy computes."""

from __future__ import annotations

import copy

import pytest
import torch
from etsdk import QuantizedEmbedding, WidenedEmbedding, WidenedLinear, keep_16bit_weights


class _Scaled(torch.nn.Embedding):
    """An embedding subclass that scales its rows, as Gemma's does."""

    def __init__(self, n: int, d: int) -> None:
        super().__init__(n, d)
        self.register_buffer("embed_scale", torch.tensor(d**0.5), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * self.embed_scale.to(self.weight.dtype)


class _Tiny(torch.nn.Module):
    def __init__(self, scaled: bool = False) -> None:
        super().__init__()
        self.embed = _Scaled(50, 16) if scaled else torch.nn.Embedding(50, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16, bias=False)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("table", torch.linspace(0, 1, 16))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(ids) + self.table)
        return self.head(h + self.down(torch.relu(self.up(h))))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scaled", [False, True])
def test_16bit_weights_are_kept_in_place_and_compute_what_the_upcast_model_computes(dtype: torch.dtype, scaled: bool) -> None:
    torch.manual_seed(0)
    model = _Tiny(scaled).to(dtype).eval()
    upcast = copy.deepcopy(model).float()
    stored = {name: model.get_submodule(name).weight.data_ptr() for name in ("embed", "up", "down")}
    report = keep_16bit_weights(model)
    assert set(report.kept) == {"embed", "up", "down", "head"}
    assert isinstance(model.embed, WidenedEmbedding) and isinstance(model.up, WidenedLinear)
    for name, pointer in stored.items():  # the same storage: nothing copied
        assert model.get_submodule(name).weight.data_ptr() == pointer
        assert model.get_submodule(name).weight.dtype == dtype
    assert model.head.weight is model.embed.weight  # still tied: stored once
    assert report.kept_bytes == sum(int(w.numel()) * 2 for w in (model.embed.weight, model.up.weight, model.down.weight))
    assert model.norm.weight.dtype == model.up.bias.dtype == model.table.dtype == torch.float32
    ids = torch.tensor([[1, 7, 49, 0]])
    with torch.no_grad():
        got, want = model(ids), upcast(ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # a 16-bit value is exact in float32
    assert "bfloat16" in report.summary() or "float16" in report.summary()


def test_a_float32_model_is_left_as_it_is() -> None:
    model = _Tiny()
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    report = keep_16bit_weights(model)
    assert not report.kept and report.converted_bytes == 0
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == before
    assert type(model.up) is torch.nn.Linear


def test_a_quantized_embedding_computes_in_float32() -> None:
    from etsdk import quantize_model

    torch.manual_seed(0)
    model = _Tiny().to(torch.bfloat16)
    quantize_model(model, None, embedding="int8")
    keep_16bit_weights(model)
    assert isinstance(model.embed, QuantizedEmbedding) and model.embed.dtype == torch.float32
    assert model.embed(torch.tensor([[3]])).dtype == torch.float32


def test_a_quantized_layers_stored_tensors_keep_their_formats_dtypes() -> None:
    """float16 scales are the format's bytes (int4:g32:f16, Q4_0's): converting them would break the format."""
    from etsdk import QuantizationPlan, quantize_model

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 32)).to(torch.bfloat16)
    quantize_model(model, QuantizationPlan.for_format("int4:g32:min:f16:a8", embedding="int8:g32:f16", head="float"))
    stored = {n: (t.dtype, t.data_ptr()) for n, t in model.named_parameters() if n.rsplit(".", 1)[-1] in ("qdata", "scales", "mins")}
    assert {d for d, _ in stored.values()} == {torch.uint8, torch.int8, torch.float16}
    keep_16bit_weights(model)
    after = {n: (t.dtype, t.data_ptr()) for n, t in model.named_parameters() if n in stored}
    assert after == stored  # neither converted nor copied
    assert model[1].weight.dtype == torch.float32 and model(torch.tensor([[3, 4]])).dtype == torch.float32


def test_widened_modules_refuse_a_weight_they_do_not_widen() -> None:
    with pytest.raises(ValueError, match="keeps a 2-D bfloat16 or float16 weight, found torch.float32"):
        WidenedLinear(torch.nn.Parameter(torch.zeros(4, 4)), None)
    with pytest.raises(ValueError, match="table, found torch.bfloat16 \\[4\\]"):
        WidenedEmbedding(torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16)))
