"""etsdk-aoti's quantized kernels and their partitions: the native kernel against the formats' reference math,
a quantized model compiled and run, constants derived at load, refusals.

hf_static programs quantized end to end (int8, int4, GGUF files, mixed backends): plugins/hf_static/tests/
test_hf_quantized.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import etsdk
import pytest
import torch
from etsdk import QuantizationPlan, WeightFormat, quantize_model
from etsdk.backend import BlobReader, dequantize, weight_planes
from etsdk.testing import capture_delegates
from etsdk_aoti import BACKEND_ID, blob_format, kernels

FORMATS = ["int8", "int8:g32", "int8:g64", "int4:g32", "int4:g64:min", "int4:g128"]


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 64])  # decode (the dot-product path) and prefill (the tiles)
def test_the_kernel_computes_the_formats_math(name: str, rows: int) -> None:
    fmt = WeightFormat.parse(name)
    generator = torch.Generator().manual_seed(rows)
    for n, k in ((37, 256), (100, 128)):  # an output count that fills no tile or vector evenly
        weight = torch.randn(n, k, generator=generator)
        stored = etsdk.quantize_weight(weight, fmt)
        exact = dequantize(weight_planes(fmt, stored, (n, k)))
        x, bias = torch.randn(rows, k, generator=generator), torch.randn(n, generator=generator)
        got = kernels.qmm(x, stored["qdata"], stored["scales"], stored.get("mins"), bias, bits=fmt.bits, group=fmt.group_size or 0)
        want = x @ exact.t() + bias
        torch.testing.assert_close(got, want, atol=2e-5 * float(want.abs().max()), rtol=0)


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize(
    "name", ["int4:g32:a8", "int4:g64:min:a8", "int4:g128:a8", "int4:g32:f16:a8", "int4:g64:min:f16:a8", "int8:a8", "int8:g32:a8",
             "int8:g64:a8", "int8:g128:a8"],
)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 64])  # decode (each count of rows) and prefill (integer tiles, a pass short)
def test_the_int8_activation_kernel_computes_the_formats_math(name: str, rows: int) -> None:
    fmt = WeightFormat.parse(name)
    generator = torch.Generator().manual_seed(rows)
    for n, k in ((37, 256), (100, 128), (9, 160)):  # 160: the last 64-column chunk holds one block of 32
        if k % (fmt.group_size or 32):
            continue
        weight = torch.randn(n, k, generator=generator)
        stored = etsdk.quantize_weight(weight, fmt)
        x, bias = 3 * torch.randn(rows, k, generator=generator), torch.randn(n, generator=generator)
        x[0, :32] = 0.0  # a block of zeros: scale 0
        x[-1, 32:35] = torch.tensor([127.0, 62.5, -62.5])  # d = 1: exact ties, rounded to even as the reference
        args = (x, stored["qdata"], stored["scales"], stored.get("mins"), bias)
        got = kernels.qmm(*args, bits=fmt.bits, group=fmt.group_size or 0, int8_activations=True)
        want = torch.ops.etsdk.linear_q(*args, name)  # the core's reference math for the format
        torch.testing.assert_close(got, want, atol=2e-6 * float(want.abs().max()), rtol=0)
        float_activations = torch.ops.etsdk.linear_q(*args, name.removesuffix(":a8"))
        assert (float_activations - want).abs().max() > 1e-4 * float(want.abs().max())  # the rounding is visible


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("name", ["float", "int8:g64", "int4:g32:min", "int8:g64:a8", "int4:g32:min:f16:a8", "fused"])
@pytest.mark.parametrize(("rows", "real"), [(8, 3), (64, 25), (4, 0)])
def test_trailing_zero_rows_are_not_multiplied_and_get_the_bias(name: str, rows: int, real: int) -> None:
    # a padded prefill chunk: its linear layers read the padded rows as zeros (etsdk-hf-static zeroes them)
    generator = torch.Generator().manual_seed(rows + real)
    k = 192
    x = torch.zeros(rows, k)
    x[:real] = 3 * torch.randn(real, k, generator=generator)
    if real > 1:
        x[real // 2] = 0.0  # a zero row before a real one is multiplied like any other
    weights = [torch.randn(n, k, generator=generator) for n in (48, 37)]
    biases = [torch.randn(w.shape[0], generator=generator) for w in weights]

    def product(rows_of_x: torch.Tensor) -> torch.Tensor:
        if name == "float":
            return kernels.linear(rows_of_x, weights[1], biases[1])
        if name == "fused":
            stored = [etsdk.quantize_weight(w, "int8:g64:a8") for w in weights]
            return kernels.qmm_a8_fused(rows_of_x, [s["qdata"] for s in stored], [s["scales"] for s in stored], [], biases, group=64)
        fmt = WeightFormat.parse(name)
        stored = etsdk.quantize_weight(weights[1], fmt)
        return kernels.qmm(rows_of_x, stored["qdata"], stored["scales"], stored.get("mins"), biases[1], bits=fmt.bits,
                           group=fmt.group_size or 0, int8_activations=fmt.int8_activations)

    before = kernels.rows_multiplied()
    got = product(x)
    assert kernels.rows_multiplied() - before == real
    bias = torch.cat(biases) if name == "fused" else biases[1]
    assert got.shape == (rows, bias.shape[0])
    assert torch.equal(got[real:], bias.expand(rows - real, -1))  # the bias, not a product
    if real:
        assert torch.equal(got[:real], product(x[:real]))  # the rows in use: the very call on them alone
        torch.testing.assert_close(got[real // 2], bias, atol=1e-6, rtol=0)  # a zero row inside is multiplied
    signed = x.clone()
    signed[real] = -0.0  # not the +0.0 bytes padding has: multiplied (equal to zero, never wrong)
    before = kernels.rows_multiplied()
    product(signed)
    assert kernels.rows_multiplied() - before == real + 1


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("name", ["int4:g32:f16:a8", "int4:g64:min:a8", "int8:g64:a8", "int8:a8"])
@pytest.mark.parametrize("rows", [1, 5])
def test_the_fused_int8_activation_kernel_equals_one_call_per_weight(name: str, rows: int) -> None:
    # a layer's query / key / value products in one call: each weight's columns equal its own call's, bit for bit
    fmt = WeightFormat.parse(name)
    group = fmt.group_size or 0
    generator = torch.Generator().manual_seed(7 + rows)
    k = 192
    x = 3 * torch.randn(rows, k, generator=generator)
    stored = [etsdk.quantize_weight(torch.randn(n, k, generator=generator), fmt) for n in (48, 16, 37)]
    biases = [torch.randn(int(s["qdata"].shape[0]), generator=generator) for s in stored]
    for bias in (biases, []):
        mins = [s["mins"] for s in stored] if fmt.with_min else []
        got = kernels.qmm_a8_fused(x, [s["qdata"] for s in stored], [s["scales"] for s in stored], mins, bias, group=group)
        alone = [
            kernels.qmm(x, s["qdata"], s["scales"], s.get("mins"), bias[i] if bias else None, bits=fmt.bits, group=group, int8_activations=True)
            for i, s in enumerate(stored)
        ]
        assert torch.equal(got, torch.cat(alone, dim=1))
    with pytest.raises(ValueError, match="refused"):  # one bias for three weights
        kernels.qmm_a8_fused(x, [s["qdata"] for s in stored], [s["scales"] for s in stored], mins, biases[:1], group=group)
    with pytest.raises(ValueError, match="refused"):  # a weight of another row length
        other = etsdk.quantize_weight(torch.randn(8, 2 * k, generator=generator), fmt)
        kernels.qmm_a8_fused(x, [stored[0]["qdata"], other["qdata"]], [stored[0]["scales"], other["scales"]], group=group)
    with pytest.raises(ValueError, match="refused"):  # 4-bit and int8 weights in one call
        other = etsdk.quantize_weight(torch.randn(8, k, generator=generator), "int4:g64" if fmt.bits == 8 else "int8:g64")
        kernels.qmm_a8_fused(x, [stored[0]["qdata"], other["qdata"]], [stored[0]["scales"], other["scales"]], group=64)


@pytest.mark.usefixtures("kernel_level")
def test_one_scale_per_row_takes_any_row_length() -> None:
    fmt = WeightFormat.parse("int8")
    weight, x = torch.randn(24, 83), torch.randn(2, 83)  # 83: a vector and a masked tail
    stored = etsdk.quantize_weight(weight, fmt)
    want = x @ dequantize(weight_planes(fmt, stored, (24, 83))).t()
    for rows in (x[:1], x, x.repeat(4, 1)):
        got = kernels.qmm(rows, stored["qdata"], stored["scales"], bits=8, group=0)
        torch.testing.assert_close(got, rows @ dequantize(weight_planes(fmt, stored, (24, 83))).t(), atol=1e-4, rtol=0)
    assert want.shape == (2, 24)


def test_the_kernel_refuses_tensors_it_cannot_read() -> None:
    q = torch.zeros(8, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="refused the tensors"):
        kernels.qmm(torch.zeros(1, 32), q, torch.zeros(8, 2, dtype=torch.float16), bits=4, group=32)  # float16 scales
    with pytest.raises(ValueError, match="refused the tensors"):
        kernels.qmm(torch.zeros(1, 31), q, torch.zeros(8, 1), bits=4, group=32)  # K differs from the weight's
    with pytest.raises(ValueError, match="refused the tensors"):
        kernels.qmm(torch.zeros(2, 64)[:, ::2], q, torch.zeros(8, 1), bits=4, group=32)  # strided x
    q8 = torch.zeros(8, 83, dtype=torch.int8)
    with pytest.raises(ValueError, match="refused the tensors"):  # int8 activations come in whole blocks of 32
        kernels.qmm(torch.zeros(1, 83), q8, torch.zeros(8), bits=8, group=0, int8_activations=True)
    with pytest.raises(ValueError, match="refused the tensors"):  # int8 weights' :a8 scales are float32
        kernels.qmm(torch.zeros(1, 64), q8[:, :64].contiguous(), torch.zeros(8, 2, dtype=torch.float16), bits=8, group=32, int8_activations=True)
    with pytest.raises(ValueError, match="refused the tensors"):  # int8 :a8 groups: 32 or whole steps of 64
        kernels.qmm(torch.zeros(1, 192), torch.zeros(8, 192, dtype=torch.int8), torch.zeros(8, 2), bits=8, group=96, int8_activations=True)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(40, 64)
        self.up = torch.nn.Linear(64, 128)
        self.gate = torch.nn.Linear(64, 96)  # reads up's input: the :a8 formats run both in one call
        self.down = torch.nn.Linear(128 + 96, 64)
        self.head = torch.nn.Linear(64, 40, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.head(self.down(torch.nn.functional.silu(torch.cat([self.up(x), self.gate(x)], dim=-1))))

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head


IDS = torch.tensor([[1, 5, 39, 2, 2, 7]])


def _gguf_net() -> Net:
    """Net with llama.cpp's blocks as its linear layers (Q4_0, Q4_1) and embedding (Q8_0), as a GGUF import makes."""
    gguf = pytest.importorskip("gguf")
    from etsdk import QuantizedEmbedding, QuantizedLinear

    net = Net().eval()

    def blocks(weight: torch.Tensor, kind: str) -> dict[str, torch.Tensor]:
        qtype = gguf.GGMLQuantizationType[kind]
        return {"blocks": torch.from_numpy(gguf.quants.quantize(weight.detach().numpy(), qtype))}

    net.embed = QuantizedEmbedding(WeightFormat.parse("q8_0"), blocks(net.embed.weight, "Q8_0"))
    net.up = QuantizedLinear(WeightFormat.parse("q4_0"), blocks(net.up.weight, "Q4_0"), net.up.bias)
    net.down = QuantizedLinear(WeightFormat.parse("q4_1"), blocks(net.down.weight, "Q4_1"), net.down.bias)
    return net


@pytest.mark.parametrize("source", ["int4", "int8:g32:f16:a8", "int4:g32:a8", "int4:g32:min:f16:a8", "gguf"])
def test_a_quantized_model_compiles_runs_like_eager_and_derives_only_what_it_must(source: str, tmp_path: Path) -> None:
    if source == "gguf":
        net = _gguf_net()
    else:
        net = Net().eval()
        quantize_model(net, QuantizationPlan.for_format(source))
    path = tmp_path / "q.pte"
    with capture_delegates() as captured:
        etsdk.lower(module=net, example_inputs=(IDS,), backend=BACKEND_ID, partitioner_options={"device": "cpu"}).save(path)
    program = etsdk.load(path)
    with torch.no_grad():
        want = net(IDS)
    torch.testing.assert_close(program.run("forward", IDS)[0], want, atol=1e-4 * float(want.abs().max()), rtol=0)
    (delegate,) = captured
    reader = BlobReader(delegate.payload, known_features=blob_format.KNOWN_FEATURES)
    assert blob_format.KERNELS_FEATURE in reader.required_features  # the embedding / head's int8 (default plan)
    assert (blob_format.QMM_A8_FEATURE in reader.required_features) == source.endswith(":a8")
    # up and gate read the same input: one call of the fused kernel (down, alone, the single one)
    assert (blob_format.QMM_A8_FUSED_FEATURE in reader.required_features) == source.endswith(":a8")
    assert (blob_format.QMM_A8_INT8_FEATURE in reader.required_features) == source.startswith("int8")  # int8 weights' kernel
    if source.endswith(":a8"):  # every linear layer's weight went to the :a8 kernels
        symbols = bytes(reader.section("library"))
        assert b"aoti_torch_cpu_etsdk_qmm_a8\0" in symbols and b"aoti_torch_cpu_etsdk_qmm_a8_fused\0" in symbols
    constants = json.loads(bytes(reader.section("constants")))
    derived = [c for c in constants if c["source"] == "derived"]
    if source in ("int4", "int4:g32:a8", "int4:g32:min:f16:a8"):  # the kernels read the stored planes themselves
        assert derived == []  # (the :a8 kernel reads float16 scales and minimums as they are)
    elif source == "int8:g32:f16:a8":  # float16 scales become float32 at load; the int8 values are read as stored
        assert {c["derive"]["plane"] for c in derived} == {"scales"} and all(c["derive"]["format"] == source for c in derived)
    else:  # every plane of a GGUF weight, from the stored blocks (the blocks themselves are the stored entries)
        assert {(c["derive"]["format"], c["derive"]["plane"]) for c in derived} >= {("q4_0", "qdata"), ("q4_1", "mins"), ("q8_0", "scales")}
        stored_keys = {key for c in derived for _, key in c["derive"]["stored"].items()}
        for key in stored_keys:
            assert key in delegate.named_data
        up = net.up.qdata.contiguous().numpy().tobytes()
        assert any(bytes(v) == up for v in delegate.named_data.values())  # the file's blocks, byte for byte


def test_products_of_int8_and_4_bit_weights_that_read_one_input_are_fused_apart() -> None:
    # up in int8:g64:a8, gate in int4:g64:a8, down in int8:g64:a8: up and gate read the same input, but one kernel
    # call multiplies weights of one kind, so they must not merge (down reads another input and stays alone)
    from etsdk import QuantizedLinear
    from etsdk_aoti.quantized import linear_a8, linear_a8_fused, multiplies_int8_a8, rewrite_quantized

    net = Net().eval()
    for name, fmt in (("up", "int8:g64:a8"), ("gate", "int4:g64:a8"), ("down", "int8:g32:a8")):
        layer = getattr(net, name)
        setattr(net, name, QuantizedLinear(WeightFormat.parse(fmt), etsdk.quantize_weight(layer.weight.detach(), fmt), layer.bias))
    module = torch.export.export(net, (IDS,)).module()
    with torch.no_grad():
        want = net(IDS)
    rewrite_quantized(module)
    calls = [node.target for node in module.graph.nodes if node.op == "call_function"]
    assert calls.count(linear_a8) == 3 and linear_a8_fused not in calls
    assert multiplies_int8_a8(module)
    with torch.no_grad():
        torch.testing.assert_close(module(IDS), want, atol=1e-5 * float(want.abs().max()), rtol=0)
    same = Net().eval()  # up and gate both int8:g32:a8: one fused call
    quantize_model(same, QuantizationPlan(linear=WeightFormat.parse("int8:g32:a8")))
    module = torch.export.export(same, (IDS,)).module()
    rewrite_quantized(module)
    calls = [node.target for node in module.graph.nodes if node.op == "call_function"]
    assert calls.count(linear_a8_fused) == 1 and calls.count(linear_a8) == 1


def test_quantized_weights_on_cuda_are_refused_at_export() -> None:
    net = Net().eval()
    quantize_model(net, "int8")
    with pytest.raises(etsdk.ExportError, match=r"etsdk-aoti runs quantized weights on the CPU only; weight 'up' \(int8 \[128, 64\], linear\) is in a partition compiled for cuda"):
        etsdk.lower(module=net, example_inputs=(IDS,), backend=BACKEND_ID, partitioner_options={"device": "cuda"})
