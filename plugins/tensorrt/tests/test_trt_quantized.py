"""Quantized weights through etsdk-tensorrt: the ONNX holds each weight as an INT8 / UINT4 initializer feeding a
blocked DequantizeLinear and MatMul (the pattern TensorRT fuses into weight-only GEMMs), and ONNX Runtime (the
stand-in) computes what eager does."""

from __future__ import annotations

from pathlib import Path

import etsdk
import numpy as np
import onnx
import pytest
import torch
from etsdk import QuantizationPlan, WeightFormat, quantize_model
from etsdk.testing import capture_delegates
from trt_helpers import onnx_files, run_onnx


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(40, 64)
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)
        self.head = torch.nn.Linear(64, 40, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(torch.nn.functional.silu(self.up(self.embed(ids)))))

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head


IDS = torch.tensor([[1, 5, 39, 2]])


def _gguf(net: Net) -> Net:
    gguf = pytest.importorskip("gguf")
    from etsdk import QuantizedEmbedding, QuantizedLinear

    def blocks(weight: torch.Tensor, kind: str) -> dict[str, torch.Tensor]:
        return {"blocks": torch.from_numpy(gguf.quants.quantize(weight.detach().numpy(), gguf.GGMLQuantizationType[kind]))}

    net.embed = QuantizedEmbedding(WeightFormat.parse("q8_0"), blocks(net.embed.weight, "Q8_0"))
    net.up = QuantizedLinear(WeightFormat.parse("q4_0"), blocks(net.up.weight, "Q4_0"), net.up.bias)
    net.down = QuantizedLinear(WeightFormat.parse("q4_1"), blocks(net.down.weight, "Q4_1"), net.down.bias)
    return net


@pytest.mark.parametrize("source", ["int8", "int4", "int4:g64:min", "int8:g32:f16", "gguf"])
def test_quantized_weights_reach_onnx_as_dequantize_linear_and_run_like_eager(source: str, tmp_path: Path) -> None:
    from etsdk_tensorrt import BACKEND_ID

    net = Net().eval()
    if source == "gguf":
        net = _gguf(net)
    else:
        quantize_model(net, QuantizationPlan.for_format(source))
    path = tmp_path / "q.pte"
    with capture_delegates() as captured, torch.no_grad():
        etsdk.lower(module=net, example_inputs=(IDS,), backend=BACKEND_ID, partitioner_options={BACKEND_ID: {"device": "cpu"}}).save(path)
        want = net(IDS)
    (delegate,) = captured
    onnx_path, description = onnx_files(delegate, tmp_path)
    onnx.checker.check_model(str(onnx_path), full_check=True)
    model = onnx.load(str(onnx_path), load_external_data=True)
    initializers = {t.name: t for t in model.graph.initializer}
    dequantize = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    fed = {initializers[n.input[0]].data_type for n in dequantize if n.input[0] in initializers}
    expected = {onnx.TensorProto.INT8} if source.startswith("int8") else {onnx.TensorProto.UINT4, onnx.TensorProto.INT8}
    if source == "gguf":
        expected = {onnx.TensorProto.UINT4, onnx.TensorProto.INT8}
    assert fed == expected, (fed, [n.input for n in dequantize])
    assert not [n for n in model.graph.node if n.op_type in ("BitShift", "BitwiseAnd")], "4-bit weights left unpacked"
    if source in ("int4", "gguf"):
        blocked = [n for n in dequantize if any(a.name == "block_size" and a.i == 32 for a in n.attribute)]
        assert blocked, "4-bit groups of 32 need DequantizeLinear(block_size=32)"
    (name,) = [s.name for s in description.inputs]
    (out,) = run_onnx(onnx_path, {name: IDS.numpy()}).values()
    np.testing.assert_allclose(out, want.numpy(), atol=1e-4 * float(want.abs().max()), rtol=0)
    program = etsdk.load(path)
    torch.testing.assert_close(program.run("forward", IDS)[0], want, atol=1e-4 * float(want.abs().max()), rtol=0)


def test_the_partitioner_table_names_the_quantized_operators() -> None:
    from etsdk_tensorrt.partitioner import OPERATORS

    assert "DequantizeLinear" in OPERATORS["etsdk::linear_q"] and "etsdk::embedding_q" in OPERATORS
    assert "int4:g32" in etsdk.get_backend("EtsdkTensorRTBackend").weight_formats




def test_int8_activation_formats_are_refused_at_export_naming_the_weight_and_the_format() -> None:
    """etsdk-tensorrt lowers weight-only formats; the :a8 math (rounding the input per block) is not declared."""
    from etsdk_tensorrt import BACKEND_ID

    assert "int4:g32:a8" not in etsdk.get_backend(BACKEND_ID).weight_formats
    net = Net().eval()
    quantize_model(net, QuantizationPlan.for_format("int4:g32:a8"))
    with pytest.raises(etsdk.ExportError, match=r"'up' \(int4:g32:a8 \[128, 64\], linear\): EtsdkTensorRTBackend does not declare weight format int4:g32:a8"):
        etsdk.lower(module=net, example_inputs=(IDS,), backend=BACKEND_ID, partitioner_options={BACKEND_ID: {"device": "cpu"}})
