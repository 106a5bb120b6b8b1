"""Preprocess: turn a delegated partition into an etsdk blob plus named data.

Constants (parameters, buffers, lifted tensors) never enter the blob: each goes
to named data through the partition's writer under a content-addressed key, so
a weight shared by two delegates or two methods is stored once, and lands in
the ``.ptd`` when the export asked for external data.
"""

from __future__ import annotations

import json
import math
import operator
from typing import Any

import torch

from etsdk._format.dtypes import dtype_name as _dtype_name
from etsdk.backend import BlobWriter, Partition, aten_name
from etsdk.errors import ExportError
from etsdk.reference_backend.graph_format import GRAPH_FEATURE, GRAPH_SECTION


def _encode(value: Any, slots: dict[torch.fx.Node, int], where: str) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"ref": slots[value]}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": str(value)}
    if isinstance(value, (list, tuple)):
        return {"list": [_encode(v, slots, where) for v in value]}
    if isinstance(value, torch.dtype):
        return {"dtype": _dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    raise ExportError(f"reference backend: {where} has an argument of unsupported type {type(value).__name__}")


def preprocess(partition: Partition) -> BlobWriter:
    program = partition.program
    user_index = {node: i for i, node in enumerate(partition.user_inputs())}
    state_index = {node: i for i, node in enumerate(partition.state_inputs())}
    constants = {c.placeholder: c for c in partition.constants()}
    slots: dict[torch.fx.Node, int] = {}
    inputs: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    for node in program.graph.nodes:
        if node.op == "placeholder":
            if node in user_index:
                inputs.append({"kind": "user", "index": user_index[node]})
            elif node in state_index:
                # declared state: the session's storage at run time, never frozen as a constant
                inputs.append({"kind": "state", "index": state_index[node]})
            else:
                tensor = constants[node.name].tensor.detach().contiguous()
                key = partition.named_data.add_weight(tensor)
                inputs.append(
                    {"kind": "constant", "key": key, "dtype": _dtype_name(tensor.dtype), "shape": list(tensor.shape)}
                )
            slots[node] = len(slots)
        elif node.op == "call_function":
            where = f"node '{node.name}'"
            if node.target is operator.getitem:
                op = "getitem"
            else:
                name = aten_name(node.target)
                if name is None:
                    raise ExportError(f"reference backend: {where} calls {node.target}, not an aten op")
                op = name
            nodes.append(
                {
                    "op": op,
                    "args": [_encode(a, slots, where) for a in node.args],
                    "kwargs": {k: _encode(v, slots, where) for k, v in node.kwargs.items()},
                }
            )
            slots[node] = len(slots)
    outputs = [_encode(value, slots, "output") for value in partition.user_outputs()]
    bindings = {s.fqn: i for i, s in enumerate(partition.signature.states)}
    state_updates = [
        {"index": bindings[u.binding.fqn], "value": _encode(u.value, slots, "state update")}
        for u in partition.state_updates()
    ]
    document = {"inputs": inputs, "nodes": nodes, "outputs": outputs, "state_updates": state_updates}
    writer = BlobWriter(required_features=[GRAPH_FEATURE], producer="etsdk-reference")
    writer.add_section(GRAPH_SECTION, json.dumps(document, separators=(",", ":")).encode())
    return writer
