"""Float32 products of a few rows by a weight, in an AOTInductor partition: pointed at etsdk-aoti's GEMV.

Edge lowering writes ``linear`` as ``mm(x, permute(weight, [1, 0]))`` (``addmm(bias, x, ...)`` with a bias). On
the CPU, a product whose ``x`` has at most :data:`etsdk_aoti.kernels.FEW_ROWS` rows (an LLM's decode step) and
whose weight is a float32 constant of the partition becomes a call of :data:`etsdk_aoti.kernels.LINEAR`
(``gemv.cpp``: the output rows split over every thread of torch's team, each weight read once); the blob then
requires :data:`~etsdk_aoti.blob_format.LINEAR_FEATURE`. Larger products (prefill) keep what Inductor picks.
"""

from __future__ import annotations

from typing import Any

import torch

from etsdk_aoti import kernels
from etsdk_aoti.op_names import op_name as _name

__all__ = ["kernel_linear", "rewrite_float_linears"]


def kernel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` on the native kernel (what a rewritten product calls)."""
    return kernels.LINEAR(x.contiguous(), weight, bias)


def _float_constant(module: torch.nn.Module, node: Any, rank: int) -> bool:
    """Whether ``node`` reads a contiguous float32 constant of ``module`` of ``rank`` dimensions."""
    if getattr(node, "op", None) != "get_attr":
        return False
    found: Any = module
    for part in str(node.target).split("."):
        found = getattr(found, part, None)
    return isinstance(found, torch.Tensor) and found.dtype == torch.float32 and found.dim() == rank and found.is_contiguous()


def _weight_of(module: torch.nn.Module, node: Any) -> Any:
    """The weight constant ``node`` is the transpose of (``permute(w, [1, 0])`` or ``t(w)``), or None."""
    if _name(node) == "permute" and list(node.args[1]) in ([1, 0], [-1, -2], [1, -2], [-1, 0]):
        source = node.args[0]
    elif _name(node) == "t":
        source = node.args[0]
    else:
        return None
    return source if _float_constant(module, source, 2) else None


def rewrite_float_linears(module: torch.fx.GraphModule, device: str) -> int:
    """Point the few-row float32 products of ``module`` (the unlifted partition) at the native GEMV; how many.

    Only on the CPU, only ``mm`` / ``addmm`` (beta = alpha = 1, a float32 constant bias of one dimension) whose
    right operand is the transpose of a float32 constant and whose left one is a float32 ``[M, K]`` with
    ``M <= FEW_ROWS`` known at export."""
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
        weight = _weight_of(module, right)
        value = getattr(x, "meta", {}).get("val")
        if weight is None or value is None or value.dtype != torch.float32 or value.dim() != 2:
            continue
        if not isinstance(value.shape[0], int) or value.shape[0] > kernels.FEW_ROWS:
            continue
        node.target = kernel_linear
        node.args = (x, weight, bias)
        node.kwargs = {}
        changed += 1
    if changed:
        graph.eliminate_dead_code()
        graph.lint()
        module.recompile()
    return changed
