"""Quantized weights in a TensorRT partition: ``DequantizeLinear`` (blocked, opset 21+) feeding ``MatMul``.

Each ``etsdk::linear_q`` becomes what TensorRT fuses into a weight-only INT8 / INT4 GEMM: the weight as an
INT8 or UINT4 initializer (UINT4 packs two values per byte, the first in the low nibble: the same bytes as
etsdk's 4-bit planes), ``DequantizeLinear`` with the weight's scales (``axis=1, block_size=group`` for groups,
``axis=0`` for one scale per row; a symmetric 4-bit weight has zero point 8), a groups' minimum added after
(``w = q * s + m``), then ``MatMul`` against the transposed weight. ``etsdk::embedding_q`` gathers the rows it
needs and dequantizes them with the same math. A GGUF weight is turned into the planes it holds at export
(the blocks hold exactly those values).

How: before torch's ONNX exporter runs, :func:`to_planes` rewrites GGUF weights as planes; the exporter then
translates both operators with :func:`translations`; the 4-bit weights reach ONNX as uint8 unpacked and cast
to UINT4, which :func:`fold_uint4` replaces by one UINT4 initializer holding the original bytes, so the weight
feeds ``DequantizeLinear`` directly, as TensorRT's fusion requires.
"""

from __future__ import annotations

from typing import Any

import torch
from etsdk import ExportError
from etsdk.backend import WeightFormat, WeightLayout, call_arguments, quantized_call, weight_planes

from etsdk_tensorrt import BACKEND_ID

__all__ = ["fold_uint4", "to_planes", "translations"]

_ONNX_FLOAT = 1
_ONNX_UINT4 = 21
_ONNX_DTYPE = {"float32": 1, "float16": 10, "bfloat16": 16}


def to_planes(gm: torch.fx.GraphModule) -> int:
    """Rewrite every quantized call on GGUF blocks as a call on the planes those blocks hold; returns how many."""
    graph = gm.graph
    changed = 0
    for node in list(graph.nodes):
        call = quantized_call(node)
        if call is None or call.format.layout is WeightLayout.PLANES:
            continue
        if getattr(call.qdata, "op", None) != "get_attr":
            raise ExportError(f"backend '{BACKEND_ID}': quantized weight {call.describe()} is not a constant of the partition")
        blocks = getattr(gm, str(call.qdata.target))
        planes = weight_planes(call.format, {"blocks": blocks}, call.shape)
        names = {}
        for plane in ("qdata", "scales", "mins"):
            tensor = getattr(planes, plane)
            if tensor is None:
                continue
            attr = f"{call.qdata.target}_{plane}"
            gm.register_buffer(attr, tensor.contiguous())
            with graph.inserting_before(node):
                names[plane] = graph.get_attr(attr)
        given = call_arguments(node)
        fmt = planes.format.name
        if node.args and len(node.args) >= 6 and call.use.value == "linear":
            node.args = (given["x"], names["qdata"], names["scales"], names.get("mins"), given["bias"], fmt)
        else:
            node.args = (names["qdata"], names["scales"], names.get("mins"), given["indices"], fmt, given["dtype"])
        node.kwargs = {}
        changed += 1
    if changed:
        graph.eliminate_dead_code()
        graph.lint()
        gm.recompile()
    return changed


def _dequantized(op: Any, qdata: Any, scales: Any, mins: Any, fmt: WeightFormat, rows: int, columns: int) -> Any:
    """The float32 weight ``[rows, columns]`` of planes in ``fmt`` (ONNX values), by DequantizeLinear."""
    if fmt.bits == 4:
        low = op.BitwiseAnd(qdata, op.Cast(op.Constant(value_int=15), to=2))  # to=UINT8
        high = op.BitShift(qdata, op.Cast(op.Constant(value_int=4), to=2), direction="RIGHT")
        pairs = op.Concat(op.Unsqueeze(low, op.Constant(value_ints=[-1])), op.Unsqueeze(high, op.Constant(value_ints=[-1])), axis=-1)
        values = op.Cast(op.Reshape(pairs, op.Constant(value_ints=[rows, columns])), to=_ONNX_UINT4)
    else:
        values = qdata
    if _ONNX_DTYPE[fmt.scale_dtype] != _ONNX_FLOAT:  # DequantizeLinear computes in its scales' dtype: float32 as eager
        scales = op.Cast(scales, to=_ONNX_FLOAT)
        mins = op.Cast(mins, to=_ONNX_FLOAT) if mins is not None else None
    if fmt.group_size is None:
        weight = op.DequantizeLinear(values, scales, axis=0)
    else:
        if fmt.bits == 4 and not fmt.with_min:
            zero = op.Cast(op.Expand(op.Constant(value_int=8), op.Shape(scales)), to=_ONNX_UINT4)
            weight = op.DequantizeLinear(values, scales, zero, axis=1, block_size=fmt.group_size)
        else:
            weight = op.DequantizeLinear(values, scales, axis=1, block_size=fmt.group_size)
        if mins is not None:
            groups = columns // fmt.group_size
            spread = op.Expand(op.Unsqueeze(mins, op.Constant(value_ints=[-1])), op.Constant(value_ints=[rows, groups, fmt.group_size]))
            weight = op.Add(weight, op.Reshape(spread, op.Constant(value_ints=[rows, columns])))
    return weight


def translations() -> dict[Any, Any]:
    """The exporter's translation of ``etsdk::linear_q`` and ``etsdk::embedding_q`` (planes formats only)."""
    from onnxscript.onnx_opset import opset24

    op: Any = opset24

    def shape_of(value: Any) -> tuple[int, ...]:
        return tuple(int(d) for d in value.shape)

    def linear_q(x: Any, qdata: Any, scales: Any, mins: Any, bias: Any, format: str) -> Any:
        fmt = WeightFormat.parse(format)
        rows = shape_of(qdata)[0]
        columns = int(x.shape[-1])
        weight = _dequantized(op, qdata, scales, mins, fmt, rows, columns)
        out = op.MatMul(x, op.Transpose(weight, perm=[1, 0]))
        return op.Add(out, bias) if bias is not None else out

    def embedding_q(qdata: Any, scales: Any, mins: Any, indices: Any, format: str, dtype: Any) -> Any:
        fmt = WeightFormat.parse(format)
        rows = shape_of(qdata)[0]
        columns = shape_of(qdata)[1] * (2 if fmt.bits == 4 else 1)
        weight = _dequantized(op, qdata, scales, mins, fmt, rows, columns)
        return op.Gather(weight, indices, axis=0)

    return {torch.ops.etsdk.linear_q.default: linear_q, torch.ops.etsdk.embedding_q.default: embedding_q}


def fold_uint4(model: Any) -> int:
    """Replace each ``Cast(to=UINT4)`` of an unpacked uint8 initializer by a UINT4 initializer of the same bytes.

    The unpack chain is ``BitwiseAnd`` / ``BitShift`` -> ``Unsqueeze`` -> ``Concat`` -> ``Reshape`` -> ``Cast``,
    as :func:`_dequantized` writes it (or what the exporter's optimizer folded of it). Returns how many.
    """
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    initializers = {t.name: t for t in graph.initializer}
    folded = 0
    for node in list(graph.node):
        if node.op_type != "Cast" or next((a.i for a in node.attribute if a.name == "to"), None) != _ONNX_UINT4:
            continue
        source = _packed_source(node.input[0], producers, initializers)
        if source is None:
            continue
        packed = numpy_helper.to_array(initializers[source])
        shape_node = producers[node.input[0]]
        rows, columns = int(packed.shape[0]), int(packed.shape[1]) * 2
        replacement = helper.make_tensor(f"{source}.uint4", onnx.TensorProto.UINT4, [rows, columns], packed.tobytes(), raw=True)
        graph.initializer.append(replacement)
        for other in graph.node:
            for i, name in enumerate(other.input):
                if name == node.output[0]:
                    other.input[i] = replacement.name
        graph.node.remove(node)
        del shape_node
        folded += 1
    if folded:
        _drop_unused(model)
    return folded


def _packed_source(name: str, producers: dict[str, Any], initializers: dict[str, Any]) -> str | None:
    """The uint8 initializer ``name`` unpacks (through the chain :func:`fold_uint4` names), or None."""
    node = producers.get(name)
    if node is None or node.op_type != "Reshape":
        return None
    concat = producers.get(node.input[0])
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2:
        return None
    sources = set()
    for part in concat.input:
        unsqueeze = producers.get(part)
        if unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
            return None
        nibble = producers.get(unsqueeze.input[0])
        if nibble is None or nibble.op_type not in ("BitwiseAnd", "BitShift"):
            return None
        sources.add(nibble.input[0])
    if len(sources) != 1:
        return None
    (source,) = sources
    return source if source in initializers else None


def _drop_unused(model: Any) -> None:
    """Remove nodes and initializers nothing reads any more (the unpack chains :func:`fold_uint4` replaced)."""
    graph = model.graph
    while True:
        used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        dead = [node for node in graph.node if not any(out in used for out in node.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)
