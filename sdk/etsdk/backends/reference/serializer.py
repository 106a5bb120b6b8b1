"""Preprocess: turn a delegated partition into an etsdk blob plus named data.

Constants (parameters, buffers, lifted tensors) never enter the blob: each goes
to named data under a content-addressed key, so a weight shared by two
delegates or two methods is stored once, and with the ``external_data``
compile spec it lands in a ``.ptd`` instead of the ``.pte``.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
from typing import Any

import torch
from executorch.exir._serialize._named_data_store import NamedDataStore
from executorch.exir.backend.backend_details import PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export.graph_signature import InputKind, OutputKind

from etsdk.backends.reference.graph_format import EXTERNAL_DATA_SPEC, GRAPH_FEATURE, GRAPH_SECTION
from etsdk.backends.reference.partitioner import aten_name
from etsdk.blob import BlobWriter
from etsdk.dtypes import dtype_name as _dtype_name
from etsdk.errors import ExportError
from etsdk.signature import DelegateSignature

_CONSTANT_KINDS = {InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR}



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


def _constant_key(tensor: torch.Tensor) -> str:
    data = tensor.detach().contiguous().reshape(-1)
    digest = hashlib.sha256(data.view(torch.uint8).numpy().data if data.numel() else b"")
    digest.update(f"{_dtype_name(data.dtype)}{list(data.shape)}".encode())
    return f"etsdk_ref/{digest.hexdigest()[:32]}"


def preprocess(edge_program: torch.export.ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
    specs = {spec.key: bytes(spec.value) for spec in compile_specs}
    external = specs.get(EXTERNAL_DATA_SPEC, b"").decode() or None
    delegate = DelegateSignature.from_edge_program(edge_program, compile_specs)
    states = delegate.state_by_placeholder
    state_of_fqn = {s.fqn: s.state for s in delegate.states}
    signature = edge_program.graph_signature
    input_specs = {spec.arg.name: spec for spec in signature.input_specs}
    store = NamedDataStore()
    slots: dict[torch.fx.Node, int] = {}
    inputs: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    outputs: list[Any] = []
    state_updates: list[dict[str, Any]] = []
    user_index = 0
    for node in edge_program.graph.nodes:
        if node.op == "placeholder":
            spec = input_specs[node.name]
            if spec.kind == InputKind.USER_INPUT:
                inputs.append({"kind": "user", "index": user_index})
                user_index += 1
            elif node.name in states:
                # declared state: bound from the session at run time, never frozen as a constant
                inputs.append({"kind": "state", "state": states[node.name].state})
            elif spec.kind in _CONSTANT_KINDS:
                target = spec.target
                tensor = (
                    edge_program.state_dict[target]
                    if target in edge_program.state_dict
                    else edge_program.constants[target]
                )
                tensor = tensor.detach().contiguous()
                key = _constant_key(tensor)
                store.add_named_data(key, tensor, alignment=64, external_tag=external)
                inputs.append(
                    {"kind": "constant", "key": key, "dtype": _dtype_name(tensor.dtype), "shape": list(tensor.shape)}
                )
            else:
                raise ExportError(
                    f"reference backend: input '{node.name}' of kind {spec.kind.name} is not supported yet"
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
        elif node.op == "output":
            for value, spec in zip(node.args[0], signature.output_specs):
                encoded = _encode(value, slots, "output")
                if spec.kind == OutputKind.USER_OUTPUT:
                    outputs.append(encoded)
                elif spec.kind == OutputKind.BUFFER_MUTATION and spec.target in state_of_fqn:
                    state_updates.append({"state": state_of_fqn[spec.target], "value": encoded})
                else:
                    raise ExportError(
                        f"reference backend: output '{spec.arg.name}' of kind {spec.kind.name} is not supported "
                        "(mutated buffers must be declared as state)"
                    )
    document = {"inputs": inputs, "nodes": nodes, "outputs": outputs, "state_updates": state_updates}
    writer = BlobWriter(required_features=[GRAPH_FEATURE], producer="etsdk-reference")
    writer.add_section(GRAPH_SECTION, json.dumps(document, separators=(",", ":")).encode())
    return PreprocessResult(processed_bytes=writer.to_bytes(), data_store_output=store.get_named_data_store_output())
