"""Quantized weight formats: names, planes, the math, GGUF blocks, the quantized layers and quantize_model.

No export here: the formats as data, the reference math against dequantizing by hand and against the gguf
package's own reader, and the eager quantized layers.
"""

from __future__ import annotations

import pytest
import torch
from etsdk import QuantizationPlan, WeightFormat, quantize_model
from etsdk.backend import WeightLayout, dequantize, weight_planes


@pytest.mark.parametrize(
    ("text", "name", "planes"),
    [
        ("int8", "int8", {"qdata": ("int8", (4, 64)), "scales": ("float32", (4,))}),
        ("int8:g32", "int8:g32", {"qdata": ("int8", (4, 64)), "scales": ("float32", (4, 2))}),
        ("int4", "int4:g32", {"qdata": ("uint8", (4, 32)), "scales": ("float32", (4, 2))}),
        ("int4:64", "int4:g64", {"qdata": ("uint8", (4, 32)), "scales": ("float32", (4, 1))}),
        ("int4:g32:min:f16", "int4:g32:min:f16", {"qdata": ("uint8", (4, 32)), "scales": ("float16", (4, 2)), "mins": ("float16", (4, 2))}),
        ("int4:a8", "int4:g32:a8", {"qdata": ("uint8", (4, 32)), "scales": ("float32", (4, 2))}),
        ("int8:a8:64", "int8:g64:a8", {"qdata": ("int8", (4, 64)), "scales": ("float32", (4, 1))}),
        ("int4:a8:min:64", "int4:g64:min:a8", {"qdata": ("uint8", (4, 32)), "scales": ("float32", (4, 1)), "mins": ("float32", (4, 1))}),
        ("q8_0", "q8_0", {"blocks": ("uint8", (4, 68))}),
        ("q4_0", "q4_0", {"blocks": ("uint8", (4, 36))}),
        ("q4_1", "q4_1", {"blocks": ("uint8", (4, 40))}),
    ],
)
def test_a_format_has_one_name_and_its_planes(text: str, name: str, planes: dict) -> None:
    fmt = WeightFormat.parse(text)
    assert fmt.name == name == str(fmt) and WeightFormat.parse(name) == fmt
    assert fmt.planes(4, 64) == planes
    sizes = {"int8": 1, "uint8": 1, "float32": 4, "float16": 2}
    assert fmt.nbytes(4, 64) == sum(sizes[d] * torch.Size(s).numel() for d, s in planes.values())


def test_every_format_parses_back_to_itself() -> None:
    every = WeightFormat.every()
    assert len({f.name for f in every}) == len(every) == 42
    assert all(WeightFormat.parse(f.name) == f for f in every)
    assert WeightFormat.parse("q4_1").planes_format == WeightFormat.parse("int4:g32:min:f16")
    with_a8 = WeightFormat.every(int8_activations=True)
    added = [f for f in with_a8 if f not in every]
    assert len(added) == 24 + 15 and all(f.int8_activations and WeightFormat.parse(f.name) == f for f in added)
    assert sum(f.bits == 8 for f in added) == 15  # int8 per row and in each group size, with each scale dtype


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("int3", "unknown weight format 'int3'"),
        ("int4:g48", "group size must be one of 32, 64, 128, 256"),
        ("int8:min", "8-bit weights are symmetric"),

        ("int4:g32:fp8", "unknown part 'fp8'"),
        ("", "a weight format is a name"),
    ],
)
def test_a_wrong_format_name_says_what_is_expected(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WeightFormat.parse(text)


def test_a_layout_fixed_by_llama_cpp_refuses_other_fields() -> None:
    with pytest.raises(ValueError, match="layout q4_0 is fixed by llama.cpp"):
        WeightFormat(4, 64, False, "float16", WeightLayout.GGUF_Q4_0)
    with pytest.raises(ValueError, match="not a multiple of 32"):
        WeightFormat.parse("int4:g32").check_shape(8, 80)
    with pytest.raises(ValueError, match=r"int8 activations \(:a8\) are an option of the planes formats .* not of llama.cpp's q8_0 blocks"):
        WeightFormat(8, 32, False, "float16", WeightLayout.GGUF_Q8_0, int8_activations=True)


@pytest.mark.parametrize("name", ["int8", "int8:g32", "int4:g32", "int4:g64:min", "int4:g32:bf16"])
def test_quantize_then_dequantize_stays_within_the_formats_step(name: str) -> None:
    fmt = WeightFormat.parse(name)
    weight = torch.randn(16, 128, generator=torch.Generator().manual_seed(0))
    stored = etsdk_quantize(weight, fmt)
    planes = weight_planes(fmt, stored, (16, 128))
    back = dequantize(planes)
    group = fmt.group_size or 128
    spread = weight.reshape(16, -1, group)
    step = (spread.amax(-1) - spread.amin(-1)) / 15 if fmt.with_min else spread.abs().amax(-1) / (127 if fmt.bits == 8 else 7)
    tolerance = step.repeat_interleave(group, dim=1) * (0.51 if fmt.scale_dtype == "float32" else 0.6)
    assert (back - weight).abs().le(tolerance + 1e-6).all()
    rows = torch.tensor([[3, 0], [15, 3]])
    assert torch.equal(dequantize(planes, rows), back[rows])  # an embedding's rows: the same math


def etsdk_quantize(weight: torch.Tensor, fmt: WeightFormat) -> dict[str, torch.Tensor]:
    from etsdk._quant.planes import quantize

    return quantize(weight, fmt)


def test_int4_planes_pack_two_values_per_byte_low_nibble_first() -> None:
    fmt = WeightFormat.parse("int4:g32")
    values = torch.arange(64).remainder(16).to(torch.uint8).reshape(1, 64)
    scales = torch.ones(1, 2)
    from etsdk._quant.planes import pack_int4

    packed = pack_int4(values)
    assert packed[0, 0].item() == 0 | (1 << 4) and packed[0, 7].item() == 14 | (15 << 4)
    back = dequantize(weight_planes(fmt, {"qdata": packed, "scales": scales}, (1, 64)))
    assert torch.equal(back, values.float() - 8)  # symmetric 4-bit: (q - 8) * s


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1"])
def test_gguf_blocks_read_as_the_gguf_package_reads_them(name: str) -> None:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    weight = np.random.default_rng(1).standard_normal((8, 128)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[name.upper()]
    blocks = gguf.quants.quantize(weight, qtype)
    fmt = WeightFormat.parse(name)
    planes = weight_planes(fmt, {"blocks": torch.from_numpy(blocks)}, (8, 128))
    assert planes.format == fmt.planes_format and planes.scales.dtype == torch.float16
    assert np.array_equal(dequantize(planes).numpy(), gguf.quants.dequantize(blocks, qtype))
    from etsdk._quant.planes import gguf_blocks

    assert np.array_equal(gguf_blocks(planes, fmt.layout).numpy(), blocks)  # and back, byte for byte


def test_stored_tensors_are_checked_before_any_math() -> None:
    fmt = WeightFormat.parse("int4:g32")
    with pytest.raises(ValueError, match=r"format int4:g32: scales must be float32 \[4, 2\], found float16 \[4, 2\]"):
        weight_planes(fmt, {"qdata": torch.zeros(4, 32, dtype=torch.uint8), "scales": torch.zeros(4, 2, dtype=torch.float16)}, (4, 64))
    with pytest.raises(ValueError, match="format int4:g32 stores qdata, scales, found qdata"):
        weight_planes(fmt, {"qdata": torch.zeros(4, 32, dtype=torch.uint8)}, (4, 64))


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 64)
        self.proj = torch.nn.Linear(64, 96)
        self.head = torch.nn.Linear(96, 50, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.proj(self.embed(ids))))

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head


def test_quantize_model_swaps_the_layers_and_computes_the_formats_math() -> None:
    net = _Net().eval()
    ids = torch.tensor([[1, 7, 49]])
    expected_layers = {"embed": "int8", "proj": "int4:g32", "head": "int8:g32"}
    report = quantize_model(net, QuantizationPlan.for_format("int4", head="int8:g32"))
    assert report.quantized == expected_layers and not report.kept
    assert report.float_bytes == (50 * 64 + 64 * 96 + 96 * 50) * 4
    assert report.quantized_bytes == sum(WeightFormat.parse(f).nbytes(*s) for f, s in [("int8", (50, 64)), ("int4:g32", (96, 64)), ("int8:g32", (50, 96))])
    assert report.summary().startswith("quantized 1 x int4:g32, 1 x int8, 1 x int8:g32: ")
    proj = net.proj
    weight = dequantize(weight_planes(WeightFormat.parse("int4:g32"), {"qdata": proj.qdata, "scales": proj.scales}, (96, 64)))
    x = torch.randn(2, 64)
    torch.testing.assert_close(proj(x), torch.nn.functional.linear(x, weight, proj.bias))
    out = net(ids)
    assert out.shape == (1, 3, 50) and torch.isfinite(out).all()


def test_a_layer_the_format_cannot_hold_is_named_and_nothing_changes() -> None:
    net = _Net().eval()
    with pytest.raises(ValueError, match=r"linear 'proj' \[96, 64\]: format int4:g128 groups 128 values .* pick a group that divides 64"):
        quantize_model(net, "int4:g128")
    assert type(net.proj) is torch.nn.Linear  # refused before any layer was swapped


def test_a_plan_keeps_layers_in_float_when_asked() -> None:
    plan = QuantizationPlan.for_format("int8", embedding="float", head="float")
    assert (plan.embedding, plan.head) == (None, None) and plan.describe() == "linear int8, embedding float, head float"
    net = _Net().eval()
    report = quantize_model(net, plan)
    assert report.quantized == {"proj": "int8"} and type(net.embed) is torch.nn.Embedding and type(net.head) is torch.nn.Linear


def test_int8_activations_round_each_block_of_32_as_llama_cpp_does() -> None:
    from etsdk.backend import dequantize_activations, quantize_activations

    generator = torch.Generator().manual_seed(0)
    x = 5 * torch.randn(3, 96, generator=generator)
    x[1, 32:64] = 0.0  # a block of zeros: scale 0, values 0
    x[2, :32] = 0.25  # a block whose largest value is 127: d = 1 exactly, so 62.5 and -62.5 are exact ties
    x[2, 2] = 127.0
    x[2, 0], x[2, 1] = 62.5, -62.5
    q, d = quantize_activations(x)
    assert q.shape == x.shape and d.shape == (3, 3)
    for row in range(3):
        for block in range(3):
            values = x[row, block * 32 : (block + 1) * 32].tolist()
            scale = torch.tensor(max(abs(v) for v in values), dtype=torch.float32) / 127  # float32 steps throughout
            inverse = 1 / scale if scale != 0 else torch.tensor(0.0)
            want = [float(torch.round(torch.tensor(v, dtype=torch.float32) * inverse)) for v in values]
            assert d[row, block] == scale
            assert q[row, block * 32 : (block + 1) * 32].tolist() == want
    assert q.abs().max() == 127 and q[2, :2].tolist() == [62.0, -62.0]  # ties to even (away from zero: 63)
    assert torch.equal(dequantize_activations(q, d)[1, 32:64], torch.zeros(32))
    with pytest.raises(ValueError, match="blocks of 32 values; a row has 40"):
        quantize_activations(torch.zeros(2, 40))


def test_a_linear_with_int8_activations_computes_on_the_rounded_input() -> None:
    from etsdk.backend import dequantize_activations, quantize_activations

    generator = torch.Generator().manual_seed(1)
    weight, x = torch.randn(24, 64, generator=generator), torch.randn(2, 64, generator=generator)
    net = torch.nn.Sequential(torch.nn.Linear(64, 24, bias=False))
    net[0].weight.data = weight
    quantize_model(net, QuantizationPlan(linear=WeightFormat.parse("int4:g32:a8")))
    layer = net[0]
    fmt = WeightFormat.parse(layer.format)
    exact = dequantize(weight_planes(fmt, {"qdata": layer.qdata, "scales": layer.scales}, (24, 64)))
    with torch.no_grad():
        got = net(x)
    rounded = dequantize_activations(*quantize_activations(x))
    torch.testing.assert_close(got, rounded @ exact.t(), atol=1e-5, rtol=0)
    assert not torch.allclose(got, x @ exact.t(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["int8", "int8:g64", "int4:g32", "int4:g32:min:f16", "int4:g128:bf16"])
def test_quantizing_a_slice_of_rows_at_a_time_changes_no_value(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from etsdk._quant import planes

    weight = torch.randn(37, 256) * torch.logspace(-2, 1, 37).unsqueeze(1)
    whole = planes.quantize(weight, WeightFormat.parse(name))
    monkeypatch.setattr(planes, "_ROW_CHUNK_VALUES", 3 * 256)  # 3 rows at a time, the last slice short
    sliced = planes.quantize(weight, WeightFormat.parse(name))
    assert whole.keys() == sliced.keys()
    for key in whole:
        assert whole[key].dtype == sliced[key].dtype and torch.equal(whole[key], sliced[key]), key


def test_a_tied_embedding_and_head_in_one_format_are_quantized_once_and_share_their_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    from etsdk._quant import modules

    net = _Net().eval()
    net.head = torch.nn.Linear(64, 50, bias=False)
    net.head.weight = net.embed.weight  # tied, as most small LLMs are
    calls: list[tuple[int, ...]] = []
    real = modules.quantize
    monkeypatch.setattr(modules, "quantize", lambda w, fmt, empty=None: calls.append(tuple(w.shape)) or real(w, fmt, empty))
    report = quantize_model(net, QuantizationPlan.for_format("int4", embedding="int8", head="int8"), head_module="head")
    assert calls.count((50, 64)) == 1 and report.quantized["head"] == report.quantized["embed"] == "int8"
    assert net.head.qdata is net.embed.qdata and net.head.scales is net.embed.scales
    assert report.float_bytes == (50 * 64 + 64 * 96) * 4  # the tied weight counted once, as its storage is
    assert report.quantized_bytes == sum(WeightFormat.parse(f).nbytes(*s) for f, s in [("int8", (50, 64)), ("int4:g32", (96, 64))])
    ids = torch.tensor([[1, 7, 49]])
    table = dequantize(weight_planes(WeightFormat.parse("int8"), {"qdata": net.embed.qdata, "scales": net.embed.scales}, (50, 64)))
    torch.testing.assert_close(net.head(table[ids]), table[ids] @ table.t())
    # in different formats they are two weights
    net = _Net().eval()
    net.head = torch.nn.Linear(64, 50, bias=False)
    net.head.weight = net.embed.weight
    quantize_model(net, QuantizationPlan.for_format("int4", embedding="int8", head="int8:g32"), head_module="head")
    assert net.head.qdata is not net.embed.qdata and net.head.format == "int8:g32"
