"""The operators that read quantized weights: ``etsdk::linear_q`` and ``etsdk::embedding_q``.

A quantized model's graph calls these instead of ``linear`` / ``embedding``;
the weight arrives as its stored tensors and the format's name, so every
partitioner sees each weight's format in the graph and claims the call only in
formats its backend declares (``BackendSpec.weight_formats``). Their eager
implementations are the reference: dequantize by the format's math
(:func:`etsdk._quant.planes.dequantize`, float32), then compute (for the
``:a8`` formats, on the input rounded to int8 per block:
:mod:`etsdk._quant.activations`). Backends
replace them with kernels that read the packed bytes (etsdk-aoti) or lower
them to their own IR.

Schemas::

    etsdk::linear_q(Tensor x, Tensor qdata, Tensor? scales, Tensor? mins, Tensor? bias, str format) -> Tensor
    etsdk::embedding_q(Tensor qdata, Tensor? scales, Tensor? mins, Tensor indices, str format, ScalarType dtype) -> Tensor

``qdata`` is the GGUF blocks for a GGUF format (``scales`` and ``mins`` None).
Importing this module registers both with torch (once per process).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from etsdk._format.weight_format import GGUF_BLOCK, WeightFormat, WeightLayout, WeightUse
from etsdk._quant.activations import dequantize_activations, quantize_activations
from etsdk._quant.planes import dequantize, weight_planes

__all__ = ["EMBEDDING_Q", "LINEAR_Q", "QuantizedCall", "call_arguments", "columns_of", "quantized_call"]


@functools.lru_cache(maxsize=64)
def weight_format(name: str) -> WeightFormat:
    """The format named ``name`` (parsed once)."""
    return WeightFormat.parse(name)


def columns_of(fmt: WeightFormat, qdata_shape: tuple[int, ...]) -> int:
    """K of a weight whose stored ``qdata`` (or GGUF blocks) has ``qdata_shape``."""
    width = int(qdata_shape[-1])
    if fmt.layout is not WeightLayout.PLANES:
        return width // fmt.block_bytes * GGUF_BLOCK
    return width * 2 if fmt.bits == 4 else width


def _stored(fmt: WeightFormat, qdata: torch.Tensor, scales: torch.Tensor | None, mins: torch.Tensor | None) -> dict[str, torch.Tensor]:
    if fmt.layout is not WeightLayout.PLANES:
        return {"blocks": qdata, **({"scales": scales} if scales is not None else {}), **({"mins": mins} if mins is not None else {})}
    stored = {"qdata": qdata}
    if scales is not None:
        stored["scales"] = scales
    if mins is not None:
        stored["mins"] = mins
    return stored


@torch.library.custom_op("etsdk::linear_q", mutates_args=())
def linear_q(
    x: torch.Tensor,
    qdata: torch.Tensor,
    scales: torch.Tensor | None,
    mins: torch.Tensor | None,
    bias: torch.Tensor | None,
    format: str,
) -> torch.Tensor:
    fmt = weight_format(format)
    shape = (int(qdata.shape[0]), columns_of(fmt, tuple(qdata.shape)))
    weight = dequantize(weight_planes(fmt, _stored(fmt, qdata, scales, mins), shape))
    values = dequantize_activations(*quantize_activations(x)) if fmt.int8_activations else x.float()
    out = torch.nn.functional.linear(values, weight, bias.float() if bias is not None else None)
    return out.to(x.dtype)


@linear_q.register_fake
def _(x: torch.Tensor, qdata: torch.Tensor, scales: Any, mins: Any, bias: Any, format: str) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], qdata.shape[0]))


@torch.library.custom_op("etsdk::embedding_q", mutates_args=())
def embedding_q(
    qdata: torch.Tensor,
    scales: torch.Tensor | None,
    mins: torch.Tensor | None,
    indices: torch.Tensor,
    format: str,
    dtype: torch.dtype,
) -> torch.Tensor:
    fmt = weight_format(format)
    shape = (int(qdata.shape[0]), columns_of(fmt, tuple(qdata.shape)))
    planes = weight_planes(fmt, _stored(fmt, qdata, scales, mins), shape)
    return dequantize(planes, indices).to(dtype)


@embedding_q.register_fake
def _(qdata: torch.Tensor, scales: Any, mins: Any, indices: torch.Tensor, format: str, dtype: torch.dtype) -> torch.Tensor:
    fmt = weight_format(format)
    return qdata.new_empty((*indices.shape, columns_of(fmt, tuple(qdata.shape))), dtype=dtype)


LINEAR_Q = torch.ops.etsdk.linear_q.default
EMBEDDING_Q = torch.ops.etsdk.embedding_q.default


class QuantizedCall:
    """One call of a quantized operator in a graph, read from its node (``quantized_call(node)``).

    ``use``: linear or embedding; ``format``: the weight's format; ``qdata`` / ``scales`` / ``mins``: the nodes
    of the stored tensors (``qdata`` is the GGUF blocks for GGUF formats; ``scales`` / ``mins`` may be None);
    ``shape``: the weight's logical ``[N, K]``; ``node``: the call.
    """

    __slots__ = ("format", "mins", "node", "qdata", "scales", "shape", "use")

    def __init__(self, node: Any, use: WeightUse, fmt: WeightFormat, qdata: Any, scales: Any, mins: Any) -> None:
        self.node = node
        self.use = use
        self.format = fmt
        self.qdata = qdata
        self.scales = scales
        self.mins = mins
        value = qdata.meta.get("val") if hasattr(qdata, "meta") else None
        self.shape = (int(value.shape[0]), columns_of(fmt, tuple(value.shape))) if value is not None else (0, 0)

    def weight_name(self, program: Any = None) -> str:
        """The weight's module name (``model.layers.0.mlp.up_proj``): the FQN of its ``qdata`` placeholder without
        ``.qdata``, read from ``program`` (the ExportedProgram the call is in, or its ``graph_signature``; a
        quantized layer's stored tensors are parameters, a backend may add buffers); else the graph's name."""
        name = getattr(self.qdata, "name", "?")
        fqn = stored_names(program).get(name)
        return fqn.removesuffix(".qdata") if fqn else name

    def describe(self, program: Any = None) -> str:
        """``'model.layers.0.mlp.up_proj' (int4:g32 [1536, 576], linear)``: how errors name the weight
        (``program`` as in :meth:`weight_name`)."""
        return f"'{self.weight_name(program)}' ({self.format.name} {list(self.shape)}, {self.use.value})"


def stored_names(program: Any) -> Mapping[str, str]:
    """Placeholder name -> FQN of every parameter and buffer of ``program`` (an ExportedProgram or its graph
    signature; None gives an empty mapping)."""
    signature = getattr(program, "graph_signature", program)
    if signature is None:
        return {}
    return {**signature.inputs_to_parameters, **signature.inputs_to_buffers}


def _target_op(target: Any) -> Any:
    return target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", None)


def call_arguments(node: Any) -> dict[str, Any]:
    """The arguments of a quantized call by schema name (positional or keyword), defaults filled in."""
    op = _target_op(node.target)
    found: dict[str, Any] = {}
    for index, argument in enumerate(op._schema.arguments):
        if index < len(node.args):
            found[argument.name] = node.args[index]
        elif argument.name in node.kwargs:
            found[argument.name] = node.kwargs[argument.name]
        else:
            found[argument.name] = argument.default_value if argument.has_default_value() else None
    return found


def quantized_call(node: Any) -> QuantizedCall | None:
    """The quantized call ``node`` makes (ATen or edge dialect), or None when it calls no quantized operator."""
    if getattr(node, "op", None) != "call_function":
        return None
    op = _target_op(node.target)
    if op is not LINEAR_Q and op is not EMBEDDING_Q:
        return None
    a = call_arguments(node)
    use = WeightUse.LINEAR if op is LINEAR_Q else WeightUse.EMBEDDING
    return QuantizedCall(node, use, weight_format(a["format"]), a["qdata"], a["scales"], a["mins"])
