"""Claims the operators the ONNX -> TensorRT path supports: one delegate per method.

:data:`OPERATORS` is the table of claimed edge-dialect operators (every overload
of an ATen operator unless an overload is named) and the ONNX operators each
becomes; the README renders the same table. A node is claimed when its operator
is in the table, no tensor it produces or reads is float64 or complex (TensorRT
computes neither), an ``index_put`` does not accumulate, an ``index`` selects along one
dimension by one integer tensor (a Gather: hf_static's last-real-row logits) and a ``sort``
spans at most 3840 elements (TensorRT's TopK limit).

One delegate per method: the claimed nodes are grouped into convex partitions
and only the largest becomes a TensorRT engine; the rest stay for later
partitioners or ExecuTorch's portable kernels. Declared state is tagged into
that delegate by the core: the serializer makes each state an engine input plus,
when written, an aliased engine output, never a constant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from etsdk.backend import OperatorPartitioner, aten_name

from etsdk_tensorrt import BACKEND_ID
from etsdk_tensorrt.options import OPTIONS_SPEC, BuildOptions

#: Edge-dialect operator -> the ONNX operator(s) torch's exporter turns it into (opset 24), which
#: TensorRT's ONNX parser imports. "ns::op" claims every overload, "ns::op.overload" only that one.
OPERATORS: Mapping[str, str] = {
    "aten::abs": "Abs",
    "aten::add": "Add",
    "aten::sub": "Sub",
    "aten::mul": "Mul",
    "aten::div": "Div",
    "aten::neg": "Neg",
    "aten::pow": "Pow",
    "aten::sqrt": "Sqrt",
    "aten::rsqrt": "Sqrt, Reciprocal",
    "aten::reciprocal": "Reciprocal",
    "aten::exp": "Exp",
    "aten::log": "Log",
    "aten::sin": "Sin",
    "aten::cos": "Cos",
    "aten::tanh": "Tanh",
    "aten::erf": "Erf",
    "aten::sigmoid": "Sigmoid",
    "aten::relu": "Relu",
    "aten::gelu": "Gelu",
    "aten::clamp": "Clip",
    "aten::maximum": "Max",
    "aten::minimum": "Min",
    "aten::mm": "MatMul",
    "aten::bmm": "MatMul",
    "aten::addmm": "Gemm",
    "aten::linear": "Gemm / MatMul",
    "aten::view_copy": "Reshape",
    "aten::permute_copy": "Transpose",
    "aten::t_copy": "Transpose",
    "aten::transpose_copy": "Transpose",
    "aten::expand_copy": "Expand",
    "aten::slice_copy": "Slice",
    "aten::select_copy": "Gather",
    "aten::unsqueeze_copy": "Unsqueeze",
    "aten::squeeze_copy": "Squeeze",
    "aten::cat": "Concat",
    "aten::split_with_sizes_copy": "Split",
    "aten::alias_copy": "Identity",
    "aten::clone": "Identity",
    "aten::embedding": "Gather",
    "aten::index_select": "Gather",
    "aten::index.Tensor": "Gather (one integer index tensor, the other dimensions whole)",
    "aten::mean": "ReduceMean",
    "aten::sum": "ReduceSum",
    "aten::amax": "ReduceMax",
    "aten::cumsum": "CumSum",
    "aten::sort": "TopK (sorted dimension up to 3840)",
    "aten::any": "ReduceMax on Cast",
    "aten::_softmax": "Softmax",
    "aten::_log_softmax": "LogSoftmax",
    "aten::native_layer_norm": "LayerNormalization",
    "aten::eq": "Equal",
    "aten::ne": "Equal, Not",
    "aten::lt": "Less",
    "aten::le": "LessOrEqual",
    "aten::gt": "Greater",
    "aten::ge": "GreaterOrEqual",
    "aten::logical_not": "Not",
    "aten::logical_and": "And",
    "aten::logical_or": "Or",
    "aten::where": "Where",
    "aten::full": "Expand of a constant",
    "aten::full_like": "Expand of a constant",
    "aten::scalar_tensor": "Constant",
    "aten::arange": "Range",
    "aten::_to_copy": "Cast",
    "dim_order_ops::_to_dim_order_copy": "Cast",
    "dim_order_ops::_clone_dim_order": "Identity",
    "aten::index_put": "TensorScatter (a state's contiguous write) or ScatterND",
    "aten::index_copy": "TensorScatter (a state's contiguous write) or ScatterND",
    "etsdk::linear_q": "DequantizeLinear (INT8 / UINT4 weight, blocked scales) + MatMul",
    "etsdk::embedding_q": "DequantizeLinear + Gather",
}

_UNSUPPORTED_DTYPES = {torch.float64, torch.complex64, torch.complex128}


def overload(target: Any) -> Any:
    """The ATen ``OpOverload`` behind an edge-dialect operator (or the target itself)."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    return getattr(target, "_op", target)  # EdgeOpOverload keeps its ATen overload in _op


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


#: TensorRT's TopK takes k up to 3840: a sort over a longer dimension stays outside.
MAX_SORT = 3840


def supported(node: torch.fx.Node) -> bool:
    """Beyond the operator table: no float64 / complex tensors, no accumulating ``index_put``, an ``index`` that is
    a Gather (one integer index tensor), no long sorts."""
    name = aten_name(node.target) or ""
    if name.startswith("aten::index_put") and (len(node.args) > 3 and node.args[3] or node.kwargs.get("accumulate")):
        return False
    if name == "aten::index.Tensor":
        indices = node.args[1] if len(node.args) > 1 else ()
        given = [i for i in indices if i is not None] if isinstance(indices, (list, tuple)) else []
        value = given[0].meta.get("val") if len(given) == 1 and isinstance(given[0], torch.fx.Node) else None
        if value is None or value.dtype not in (torch.int64, torch.int32) or value.dim() != 1:
            return False
    if name.startswith("aten::sort"):
        source = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)
        if source is None or not isinstance(dim, int) or source.dim() == 0 or source.shape[dim] > MAX_SORT:
            return False
    values = _tensors(node.meta.get("val"))
    for arg in node.all_input_nodes:
        values += _tensors(arg.meta.get("val"))
    return not any(t.dtype in _UNSUPPORTED_DTYPES for t in values)


class TensorRTPartitioner(OperatorPartitioner):
    """Tags the largest convex group of supported operators of a method for TensorRT.

    Options: see :mod:`etsdk_tensorrt.options` (``device``, ``precision``, ``build``,
    ``keep_onnx``, ``workspace_mib``, ``optimization_level``, ``progress``).
    """

    def __init__(self, **options: Any) -> None:
        self.options = BuildOptions.from_options(options)
        super().__init__(
            BACKEND_ID,
            ops=OPERATORS,
            supports=supported,
            compile_specs={OPTIONS_SPEC: self.options.to_bytes()},
            state_device=self.options.state_device,
            max_partitions=1,  # one engine per method: the largest convex group
        )
