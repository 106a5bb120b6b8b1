"""Float32 products of a few rows by a weight, in an AOTInductor partition: pointed at etsdk-aoti's GEMV.

Edge lowering writes ``linear`` as ``mm(x, permute(weight, [1, 0]))`` (``addmm(bias, x, ...)`` with a bias). On
the CPU, a product whose ``x`` has at most :data:`etsdk_aoti.kernels.FEW_ROWS` rows (an LLM's decode step) and
whose weight is a float32 constant of the partition becomes a call of :data:`etsdk_aoti.kernels.LINEAR`
(``gemv.cpp``: the output rows split over every thread of torch's team, each weight read once); the blob then
requires :data:`~etsdk_aoti.blob_format.LINEAR_FEATURE`. A bfloat16 / float16 constant widened to float32 first
(``_to_copy`` / ``_to_dim_order_copy``: what :func:`etsdk.keep_16bit_weights` exports) is handed to the kernel as
it is stored, which widens it in registers (half the bytes read; blob feature
:data:`~etsdk_aoti.blob_format.LINEAR16_FEATURE`), whatever the rows (prefill too: a weight chunk stays in the
core's cache over every row). Larger products of float32 weights (prefill) keep what Inductor picks.
"""

from __future__ import annotations

from typing import Any

import torch

from etsdk_aoti import kernels
from etsdk_aoti.op_names import op_name as _name

__all__ = ["kernel_linear", "kernel_linear16", "rewrite_float_linears"]

_WIDENED = (torch.bfloat16, torch.float16)


def kernel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` on the native kernel (what a rewritten product calls)."""
    return kernels.LINEAR(x.contiguous(), weight, bias)


def kernel_linear16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.float().T + bias`` with a bfloat16 / float16 ``weight`` widened in the kernel."""
    return kernels.LINEAR(x.contiguous(), weight, bias)


def _float_constant(module: torch.nn.Module, node: Any, rank: int, dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> bool:
    """Whether ``node`` reads a contiguous constant of ``module`` of ``rank`` dimensions and one of ``dtypes``."""
    if getattr(node, "op", None) != "get_attr":
        return False
    found: Any = module
    for part in str(node.target).split("."):
        found = getattr(found, part, None)
    return isinstance(found, torch.Tensor) and found.dtype in dtypes and found.dim() == rank and found.is_contiguous()


def _widened(module: torch.nn.Module, node: Any) -> Any:
    """The 16-bit constant ``node`` widens to float32 (``_to_copy`` / ``_to_dim_order_copy``, nothing else
    changed), or None."""
    if _name(node) not in ("_to_copy", "_to_dim_order_copy") or len(node.args) != 1:
        return None
    if set(node.kwargs) - {"dtype", "dim_order", "layout", "device"} or node.kwargs.get("dtype") != torch.float32:
        return None
    if node.kwargs.get("dim_order") not in (None, [0, 1]) or node.kwargs.get("device") not in (None, torch.device("cpu")):
        return None
    source = node.args[0]
    return source if _float_constant(module, source, 2, _WIDENED) else None


def _weight_of(module: torch.nn.Module, node: Any) -> tuple[Any, bool]:
    """The weight constant ``node`` is the transpose of (``permute(w, [1, 0])`` or ``t(w)``, or their ``_copy``
    forms: the graph is functional, a copy's value is the view's) and whether it is a 16-bit one widened on the
    way, or ``(None, False)``."""
    if _name(node) in ("permute", "permute_copy") and list(node.args[1]) in ([1, 0], [-1, -2], [1, -2], [-1, 0]):
        source = node.args[0]
    elif _name(node) in ("t", "t_copy"):
        source = node.args[0]
    else:
        return None, False
    if _float_constant(module, source, 2):
        return source, False
    narrow = _widened(module, source)
    return (narrow, True) if narrow is not None else (None, False)


def rewrite_float_linears(module: torch.fx.GraphModule, device: str) -> int:
    """Point the few-row float32 products of ``module`` (the unlifted partition) at the native GEMV; how many.

    Only on the CPU, only ``mm`` / ``addmm`` (beta = alpha = 1, a float32 constant bias of one dimension) whose
    right operand is the transpose of a float32 constant and whose left one is a float32 ``[M, K]`` with
    ``M <= FEW_ROWS`` known at export; or, any ``M``, the transpose of a bfloat16 / float16 constant widened to
    float32."""
    if device != "cpu":
        return 0
    graph = module.graph
    changed = 0
    for node in list(graph.nodes):
        name = _name(node)
        if name == "mm":
            bias, x, right = None, node.args[0], node.args[1]
        elif name == "addmm" and not node.kwargs and len(node.args) == 3:
            bias, x, right = node.args
            if not _float_constant(module, bias, 1):
                continue
        else:
            continue
        weight, narrow = _weight_of(module, right)
        value = getattr(x, "meta", {}).get("val")
        if weight is None or value is None or value.dtype != torch.float32 or value.dim() != 2:
            continue
        # float32 weights: decode's few rows only (prefill keeps the library GEMM); 16-bit ones: any rows (the
        # kernel reads each weight once per call and keeps it cached over the rows, where Inductor would widen
        # the whole weight to a float32 copy on every call first)
        if not narrow and (not isinstance(value.shape[0], int) or value.shape[0] > kernels.FEW_ROWS):
            continue
        node.target = kernel_linear16 if narrow else kernel_linear
        node.args = (x, weight, bias)
        node.kwargs = {}
        changed += 1
    if changed:
        graph.eliminate_dead_code()
        graph.lint()
        module.recompile()
    return changed
