"""etsdk-aoti's few-row GEMV (``etsdk_aoti::etsdk_linear``): the kernel against ``linear`` (float32 weights, and
bfloat16 / float16 ones widened in registers), the tensors it refuses, and the rewrite that points a decode step's
products at it while prefill's keep the library GEMM."""

from __future__ import annotations

import pytest
import torch
from etsdk_aoti import kernels
from etsdk_aoti.float_linear import kernel_linear, kernel_linear16, rewrite_float_linears


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])  # the decode sizes, and more rows four at a time
@pytest.mark.parametrize(("n", "k"), [(37, 83), (100, 576), (16, 16)])  # tails of the row chunks and of a vector
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_kernel_computes_linear(rows: int, n: int, k: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(rows * 1000 + n + k)
    x, weight = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    bias = torch.randn(n, generator=g) if with_bias else None
    got, want = kernels.linear(x, weight, bias), torch.nn.functional.linear(x, weight, bias)
    # float32 sums in another order: within a few units in the last place of the largest output
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6 * float(want.abs().max()))


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 3, 6])
@pytest.mark.parametrize(("n", "k"), [(37, 83), (100, 576)])  # a K past the last whole 32 (the scalar tail), and not
def test_the_kernel_widens_16bit_weights_exactly(dtype: torch.dtype, rows: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(rows * 1000 + n + k)
    x, weight, bias = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g).to(dtype), torch.randn(n, generator=g)
    if dtype == torch.float16:  # subnormal, zero, infinity-free extremes: the scalar tail's widening covers them
        weight[0, -3:] = torch.tensor([6e-8, -0.0, 65504.0], dtype=dtype)
    got, want = kernels.linear(x, weight, bias), torch.nn.functional.linear(x, weight.float(), bias)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6 * float(want.abs().max()))


def test_tensors_the_kernel_cannot_take_are_refused() -> None:
    x, weight = torch.randn(1, 32), torch.randn(8, 32)
    for bad in (
        (x.double(), weight, None),  # float64 activations
        (x, weight[:, :16], None),  # K differs from the weight's
        (torch.randn(2, 64)[:, ::2], weight, None),  # strided x
        (x, weight, torch.randn(7)),  # a bias of the wrong length
        (x[0], weight, None),  # x of one dimension
        (x.bfloat16(), weight, None),  # 16-bit activations (only weights may be 16-bit)
        (x, weight.to(torch.int8), None),  # an integer weight
        (x, weight, torch.randn(8).bfloat16()),  # a 16-bit bias
    ):
        with pytest.raises(ValueError, match="refused the tensors"):
            kernels.linear(*bad)


class _Decoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 48)
        self.down = torch.nn.Linear(48, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _unlifted(rows: int) -> torch.fx.GraphModule:
    from etsdk_aoti.serializer import prepare_graph
    from executorch.exir import EdgeCompileConfig, to_edge

    torch.manual_seed(0)
    exported = torch.export.export(_Decoder().eval(), (torch.randn(rows, 32),), strict=True)
    program = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    prepare_graph(program.graph_module, set(program.graph_signature.inputs_to_parameters))
    return program.module()


@pytest.mark.parametrize(("rows", "device", "expected"), [(1, "cpu", 2), (4, "cpu", 2), (5, "cpu", 0), (1, "cuda", 0)])
def test_few_row_float_products_are_pointed_at_the_kernel(rows: int, device: str, expected: int) -> None:
    module = _unlifted(rows)
    x = torch.randn(rows, 32)
    want = module(x)
    assert rewrite_float_linears(module, device) == expected
    calls = [n for n in module.graph.nodes if n.op == "call_function" and n.target is kernel_linear]
    assert len(calls) == expected
    if expected:
        assert [n.args[2] is None for n in calls] == [False, True]  # addmm's bias carried over; mm has none
        # the weight itself (no per-call transpose copy left), and the graph computes what it did
        assert all(n.args[1].op == "get_attr" for n in calls)
    torch.testing.assert_close(module(x), want, rtol=1e-5, atol=1e-5)


class _Widened(torch.nn.Module):
    """What ``etsdk.keep_16bit_weights`` exports: 16-bit weights widened to float32 where they are used."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        from etsdk import WidenedLinear

        torch.manual_seed(1)
        self.up = WidenedLinear(torch.nn.Parameter(torch.randn(48, 32).to(dtype), requires_grad=False), torch.randn(48))
        self.down = WidenedLinear(torch.nn.Parameter(torch.randn(32, 48).to(dtype), requires_grad=False), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 8, 33])
def test_products_of_widened_16bit_weights_read_them_as_stored(dtype: torch.dtype, rows: int) -> None:
    from etsdk_aoti.serializer import prepare_graph
    from executorch.exir import EdgeCompileConfig, to_edge

    exported = torch.export.export(_Widened(dtype).eval(), (torch.randn(rows, 32),), strict=True)
    program = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    prepare_graph(program.graph_module, set(program.graph_signature.inputs_to_parameters))
    module = program.module()
    x = torch.randn(rows, 32)
    want = module(x)
    assert rewrite_float_linears(module, "cpu") == 2  # decode and prefill shapes alike
    calls = [n for n in module.graph.nodes if n.op == "call_function" and n.target is kernel_linear16]
    assert len(calls) == 2
    for call in calls:  # the 16-bit constant itself: no widened copy of the weight is left for Inductor to make
        assert call.args[1].op == "get_attr"
        assert module.get_parameter(str(call.args[1].target)).dtype == dtype
    assert not any(n.op == "call_function" and "to_dim_order_copy" in str(n.target) for n in module.graph.nodes)
    torch.testing.assert_close(module(x), want, rtol=1e-5, atol=1e-5)
