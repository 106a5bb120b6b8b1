"""Quantized weights in an AOTInductor partition: rewrite the calls onto etsdk-aoti's kernels before compiling.

Every ``etsdk::linear_q`` becomes a call of :data:`etsdk_aoti.kernels.QMM` (the
native kernels read the packed bytes; :data:`~etsdk_aoti.kernels.QMM_A8` for the
int8-activation ``:a8`` formats, blob feature ``aoti.kernels.qmm_a8.v1``, and ``aoti.kernels.qmm_a8_int8.v1`` where
one multiplies int8 weights; the ``:a8`` products that read the
same input merged into one call of :data:`~etsdk_aoti.kernels.QMM_A8_FUSED`, feature ``aoti.kernels.qmm_a8_fused.v1``), every ``etsdk::embedding_q`` a row
gather and a dequantization that Inductor generates. The kernels read the
planes layout with float32 scales; a weight stored otherwise (GGUF blocks,
float16 / bfloat16 scales) gets the planes it needs as new constants of the
library, described as *derived*: the runtime computes them at load from the
weight's stored tensors (``etsdk.backend.weight_planes``), so the program
stores each weight once, in its own format, whichever backends read it.

Formats: every one etsdk describes (8-bit per row or in groups, 4-bit in
groups with or without a minimum, with float or int8 activations, any scale
dtype, the GGUF blocks Q8_0 / Q4_0 / Q4_1), on the CPU only: a CUDA partition with a quantized weight is refused at
export.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from etsdk import ExportError
from etsdk.backend import WeightFormat, WeightLayout, WeightUse, call_arguments, quantized_call, weight_planes

from etsdk_aoti import kernels

__all__ = [
    "Derived", "check_device", "derive_planes", "fuse_shared_inputs", "linear", "linear_a8", "linear_a8_fused", "multiplies_int8_a8",
    "rewrite_quantized",
]

PLANES = ("qdata", "scales", "mins")


@dataclass(frozen=True, slots=True)
class Derived:
    """A library constant computed at load: ``plane`` of the planes of a weight in ``format`` (logical ``shape``)
    stored as ``stored`` (plane name -> the module parameter FQN holding it)."""

    format: str
    shape: tuple[int, int]
    stored: Mapping[str, str]
    plane: str


def derive_planes(fmt: WeightFormat, stored: Mapping[str, torch.Tensor], shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    """The planes the kernels read (float32 scales and minimums) of a weight stored as ``stored``."""
    planes = weight_planes(fmt, stored, shape)
    out = {"qdata": planes.qdata.contiguous(), "scales": planes.scales.float().contiguous()}
    if planes.mins is not None:
        out["mins"] = planes.mins.float().contiguous()
    return out


def _on_rows(x: torch.Tensor, rows: int, bias: Any, product: Any) -> torch.Tensor:
    """``product(x as float32 [M, K], float32 bias)`` reshaped back to ``x``'s leading dims and dtype."""
    flat = x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    out = product(flat, bias.to(torch.float32) if bias is not None else None)
    return out.reshape(*x.shape[:-1], rows).to(x.dtype)


def linear(x: torch.Tensor, qdata: torch.Tensor, scales: torch.Tensor, mins: Any, bias: Any, bits: int, group: int) -> torch.Tensor:
    """``x @ w.T + bias`` on the kernels (what a rewritten ``etsdk::linear_q`` calls)."""
    return _on_rows(x, qdata.shape[0], bias, lambda flat, b: kernels.QMM(flat, qdata, scales, mins, b, bits, group))


def linear_a8(x: torch.Tensor, qdata: torch.Tensor, scales: torch.Tensor, mins: Any, bias: Any, group: int) -> torch.Tensor:
    """``x @ w.T + bias`` for the ``:a8`` formats (4-bit or int8 weights, ``x`` rounded to int8 per block of 32)."""
    return _on_rows(x, qdata.shape[0], bias, lambda flat, b: kernels.QMM_A8(flat, qdata, scales, mins, b, group))


def linear_a8_fused(
    x: torch.Tensor, qdata: list[torch.Tensor], scales: list[torch.Tensor], mins: list[torch.Tensor], bias: list[torch.Tensor], group: int
) -> tuple[torch.Tensor, ...]:
    """:func:`linear_a8` of several weights that read the same ``x`` (``mins`` / ``bias``: one per weight or none),
    in one kernel call: one output per weight."""
    rows = [int(q.shape[0]) for q in qdata]
    flat = x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    out = kernels.QMM_A8_FUSED(flat, qdata, scales, mins, [b.to(torch.float32) for b in bias], group)
    return tuple(out.reshape(*x.shape[:-1], sum(rows)).to(x.dtype).split(rows, dim=-1))


def multiplies_int8_a8(module: torch.fx.GraphModule) -> bool:
    """Whether a :func:`linear_a8` call of ``module`` (alone or fused) multiplies int8 weights (``int8[:gGROUP]:a8``)."""
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target in (linear_a8, linear_a8_fused):
            qdata = node.args[1][0] if isinstance(node.args[1], (list, tuple)) else node.args[1]
            if _attr(module, qdata).dtype == torch.int8:
                return True
    return False


def fuse_shared_inputs(graph: torch.fx.Graph) -> int:
    """Merge the :func:`linear_a8` calls that read the same input (a layer's query / key / value products, its
    gate / up ones) into one :func:`linear_a8_fused` each; the number of calls merged.

    A decode step's 4-bit products are short (tens of microseconds): the start of the kernels' thread team, the
    output's allocation and the input's rounding to int8 are paid per call, so three calls in one pay them once.
    Calls merge when their weights' bits and group size and their having minimums and biases agree (the kernel's
    one loop)."""
    sharing: dict[tuple[Any, ...], list[torch.fx.Node]] = {}
    module = graph.owning_module
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not linear_a8:
            continue
        x, qdata, scales, mins, bias, group = node.args
        if all(a is None or getattr(a, "op", None) == "get_attr" for a in (qdata, scales, mins, bias)):
            dtype = _attr(module, qdata).dtype if module is not None else None
            sharing.setdefault((x, group, dtype, mins is None, bias is None), []).append(node)
    merged = 0
    for (x, group, *_), calls in sharing.items():
        if len(calls) < 2:
            continue
        with graph.inserting_before(calls[0]):
            # the constants read again here: a later call's own get_attr nodes may come after the first call
            constants = [
                [graph.get_attr(str(arg.target)) for arg in (call.args[position] for call in calls) if isinstance(arg, torch.fx.Node)]
                for position in (1, 2, 3, 4)
            ]
            fused = graph.call_function(linear_a8_fused, (x, *constants, group))
            for i, call in enumerate(calls):
                call.replace_all_uses_with(graph.call_function(operator.getitem, (fused, i)))
        for call in calls:
            graph.erase_node(call)
        merged += len(calls)
    return merged


def _embedding(qdata: torch.Tensor, scales: torch.Tensor, mins: Any, indices: torch.Tensor, bits: int, group: int, dtype: torch.dtype) -> torch.Tensor:
    flat = indices.reshape(-1)
    rows = qdata.index_select(0, flat)
    if bits == 8:
        values = rows.to(torch.float32)
    else:
        values = torch.stack([rows & 0x0F, rows >> 4], dim=-1).reshape(rows.shape[0], -1).to(torch.float32)
        if mins is None:
            values = values - 8.0
    columns = values.shape[1]
    picked = scales.index_select(0, flat)
    factor = picked.unsqueeze(1) if group == 0 else picked.repeat_interleave(group, dim=1)
    out = values * factor
    if mins is not None:
        out = out + mins.index_select(0, flat).repeat_interleave(group, dim=1)
    return out.reshape(*indices.shape, columns).to(dtype)


def _attr(module: torch.nn.Module, node: Any) -> torch.Tensor:
    if getattr(node, "op", None) != "get_attr":
        raise ExportError(f"etsdk-aoti: a quantized weight must be a constant of the partition, found {getattr(node, 'op', node)!r}")
    found: Any = module
    for part in str(node.target).split("."):
        found = getattr(found, part)
    if not isinstance(found, torch.Tensor):
        raise ExportError(f"etsdk-aoti: constant '{node.target}' of a quantized weight is not a tensor")
    return found


def check_device(edge_program: Any, device: str) -> None:
    """Refuse a partition for a device other than the CPU that reads a quantized weight, naming the weight."""
    if device == "cpu":
        return
    for node in edge_program.graph.nodes:
        call = quantized_call(node)
        if call is not None:
            raise ExportError(
                f"etsdk-aoti runs quantized weights on the CPU only; weight {call.describe(edge_program)} is in a "
                f"partition compiled for {device} (export it with device='cpu', or keep the weight in float)"
            )


def rewrite_quantized(module: torch.fx.GraphModule) -> dict[str, Derived]:
    """Rewrite every quantized call of ``module`` (the unlifted partition, for the CPU: :func:`check_device`)
    in place; returns the derived constants added (parameter FQN -> :class:`Derived`)."""
    graph = module.graph
    derived: dict[str, Derived] = {}
    index = 0
    for node in list(graph.nodes):
        call = quantized_call(node)
        if call is None:
            continue
        fmt = call.format
        nodes = {"qdata": call.qdata, "scales": call.scales, "mins": call.mins}
        stored_nodes = {("blocks" if fmt.layout is not WeightLayout.PLANES and name == "qdata" else name): n for name, n in nodes.items() if n is not None}
        stored = {name: _attr(module, n) for name, n in stored_nodes.items()}
        planes = derive_planes(fmt, stored, call.shape)
        # the 4-bit :a8 kernel reads float16 scales and minimums as stored (Q4_0's bytes); the others, float32 planes
        halves = call.use is WeightUse.LINEAR and fmt.int8_activations and fmt.bits == 4 and fmt.scale_dtype == "float16"
        args: dict[str, Any] = {}
        for plane in PLANES:
            if plane not in planes:
                args[plane] = None
                continue
            original = stored.get(plane) if fmt.layout is WeightLayout.PLANES else None
            if original is not None and (original.dtype == planes[plane].dtype or halves):
                args[plane] = nodes[plane]  # the stored tensor itself: read from its own entry, zero-copy
                continue
            fqn = f"etsdk_q{index}_{plane}"
            # a parameter: AOTInductor clones every buffer of the graph it compiles (a second copy of each plane)
            module.register_parameter(fqn, torch.nn.Parameter(planes[plane], requires_grad=False))
            with graph.inserting_before(node):
                args[plane] = graph.get_attr(fqn)
            derived[fqn] = Derived(fmt.name, call.shape, {k: n.target for k, n in stored_nodes.items()}, plane)
        index += 1
        group = fmt.group_size or 0
        given = call_arguments(node)
        if call.use is WeightUse.LINEAR and fmt.int8_activations:
            node.target = linear_a8
            node.args = (given["x"], args["qdata"], args["scales"], args["mins"], given["bias"], group)
        elif call.use is WeightUse.LINEAR:
            node.target = linear
            node.args = (given["x"], args["qdata"], args["scales"], args["mins"], given["bias"], fmt.bits, group)
        else:
            indices, dtype = given["indices"], given["dtype"]
            node.target = _embedding
            node.args = (args["qdata"], args["scales"], args["mins"], indices, fmt.bits, group, dtype)
        node.kwargs = {}
    if index:
        fuse_shared_inputs(graph)
        graph.eliminate_dead_code()
        graph.lint()
        module.recompile()
    return derived
