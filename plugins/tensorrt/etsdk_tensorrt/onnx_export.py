"""A partition becomes ONNX (opset 24) through torch's own exporter, with its state made explicit.

Exporting a partition as it is would freeze its state: a buffer the graph mutates
becomes an ONNX initializer and the mutation is dropped. So before exporting:

1. Every declared state becomes an explicit graph input (``state.<identity>``)
   and, when the partition writes it, an explicit graph output
   (``state.<identity>.updated``) that aliases that input. Parameters, other
   buffers and lifted constants become the ONNX weights (shared with the
   partition's tensors, never copied).
2. A state write ``index_put(cache, [None, .., index], update)`` (or
   ``index_copy``) whose ``index`` is provably one contiguous run
   ``arange(n) + start`` (or a constant ``arange(a, a + n)``), on a rank-4 cache
   along axis 2 (TensorRT's KV-cache layout ``[batch, heads, sequence, dim]``),
   whose only reader is that write, becomes ONNX ``TensorScatter`` (the
   functional form of an in-place KV-cache update, which TensorRT imports as its
   KV-cache update layer; alias kind ``kv_cache_update``). Every other write
   stays what torch exports (``ScatterND``, ``Add``, ...) and its output is a
   ``user`` alias of the input.
3. Engine tensors get names the blob binds by: user inputs ``input.<i>.<name>``
   and user outputs ``output.<i>.<name>`` (``i`` the delegate argument index),
   states as above. The engine's own order is states first, then user tensors:
   it differs from the delegate's on purpose, and nothing relies on it.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from etsdk import ExportError
from etsdk.backend import quantized_call, release_mapped_weights
from torch.export.graph_signature import InputKind, OutputKind

from etsdk_tensorrt import BACKEND_ID
from etsdk_tensorrt.blob_format import Alias, StateTensor, TensorSpec
from etsdk_tensorrt.partitioner import overload

__all__ = [
    "OPSET",
    "OnnxPartition",
    "export",
    "input_name",
    "kv_cache_update_op",
    "lift",
    "output_name",
    "state_input",
    "state_output",
]

OPSET = 24
_KV_OP_NAME = "etsdk_tensorrt::kv_cache_update"


def input_name(index: int, name: str) -> str:
    return f"input.{index}.{name}"


def output_name(index: int, name: str) -> str:
    return f"output.{index}.{name}"


def state_input(identity: str, slot: int = 0) -> str:
    """The engine tensor of a state binding: its identity, and its slot in a method over several sessions (where
    one identity is bound once per slot)."""
    return f"state.{identity}" + (f".slot{slot}" if slot else "")


def state_output(identity: str, slot: int = 0) -> str:
    return f"{state_input(identity, slot)}.updated"


@dataclass(frozen=True, slots=True)
class OnnxPartition:
    """The ONNX of one partition: files on disk and how its tensors bind."""

    model_path: Path  # the graph; weights (if any) in weights_path, named weights_location inside the graph
    weights_path: Path | None
    weights_location: str | None
    inputs: tuple[TensorSpec, ...]  # delegate order
    outputs: tuple[TensorSpec, ...]
    states: tuple[StateTensor, ...]
    aliases: tuple[Alias, ...]
    engine_inputs: tuple[str, ...]  # the ONNX graph's own order
    engine_outputs: tuple[str, ...]
    #: every initializer in ``weights_path``: (name, offset, nbytes), in file order
    external: tuple[tuple[str, int, int], ...] = ()
    #: the partition's constants by the initializer name they were exported under (the model's own tensors)
    constants: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def graph_sha256(self) -> str:
        return hashlib.sha256(self.model_path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- the TensorScatter op


def kv_cache_update_op() -> Any:
    """``etsdk_tensorrt::kv_cache_update(cache, update, start, axis)``: functional write of ``update`` at ``start``.

    Defined once per process; exported to ONNX as ``TensorScatter`` (mode linear).
    """
    namespace = torch.ops.etsdk_tensorrt
    if not hasattr(namespace, "kv_cache_update"):

        @torch.library.custom_op(_KV_OP_NAME, mutates_args=())
        def kv_cache_update(cache: torch.Tensor, update: torch.Tensor, start: torch.Tensor, axis: int) -> torch.Tensor:
            index = torch.arange(update.shape[axis], device=cache.device) + start.reshape(()).to(torch.int64)
            return cache.index_copy(axis, index, update)

        @kv_cache_update.register_fake
        def _(cache: torch.Tensor, update: torch.Tensor, start: torch.Tensor, axis: int) -> torch.Tensor:
            return torch.empty_like(cache)

    return torch.ops.etsdk_tensorrt.kv_cache_update.default


def _tensor_scatter_translation() -> Any:
    from onnxscript.onnx_opset import opset24

    op: Any = opset24

    def tensor_scatter(cache: Any, update: Any, start: Any, axis: int) -> Any:
        batch = int(cache.shape[0])
        first = op.Reshape(op.Cast(start, to=7), op.Constant(value_ints=[1]))  # to=INT64
        write_indices = op.Expand(first, op.Constant(value_ints=[batch]))
        return op.TensorScatter(cache, update, write_indices, axis=axis, mode="linear")

    return tensor_scatter


# ----------------------------------------------------------------------------- lifting


#: Edge lowering's copying view variants -> the views torch's ONNX exporter translates (same values: the
#: partition's graph is functional, nothing writes through a view).
_VIEW_OF_COPY = {
    "slice_copy": "slice",
    "permute_copy": "permute",
    "expand_copy": "expand",
    "unsqueeze_copy": "unsqueeze",
    "squeeze_copy": "squeeze",
    "select_copy": "select",
    "t_copy": "t",
    "transpose_copy": "transpose",
    "alias_copy": "alias",
    "split_with_sizes_copy": "split_with_sizes",
    "split_copy": "split",
    "unbind_copy": "unbind",
    "detach_copy": "detach",
}


def _aten(node: torch.fx.Node) -> None:
    """Edge-dialect call -> the ATen call torch's ONNX exporter knows."""
    target = overload(node.target)
    name = target.name() if isinstance(target, torch._ops.OpOverload) else ""
    packet = name.removeprefix("aten::").split(".")[0]
    if name == "aten::view_copy":  # a view would need the input's strides to allow it; reshape never does
        node.target = torch.ops.aten.reshape.default
    elif name.startswith("aten::") and packet in _VIEW_OF_COPY:
        view = getattr(torch.ops.aten, _VIEW_OF_COPY[packet])
        node.target = getattr(view, target._overloadname)
    elif name == "dim_order_ops::_to_dim_order_copy":
        kwargs = {k: v for k, v in node.kwargs.items() if k != "dim_order"}
        _check_contiguous_order(node)
        node.target, node.kwargs = torch.ops.aten._to_copy.default, kwargs
    elif name == "dim_order_ops::_clone_dim_order":
        _check_contiguous_order(node)
        node.target, node.kwargs = torch.ops.aten.clone.default, {}
    else:
        node.target = target


def _check_contiguous_order(node: torch.fx.Node) -> None:
    order = node.kwargs.get("dim_order")
    order_: Any = order
    if order_ is not None and list(order_) != list(range(len(order_))):
        raise ExportError(
            f"backend '{BACKEND_ID}': node '{node.name}' asks for dim order {list(order_)}; ONNX tensors are contiguous"
        )


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _contiguous_start(graph: torch.fx.Graph, index: Any, length: int) -> torch.fx.Node | None:
    """The node holding ``start`` when ``index`` is provably ``arange(length) + start``, else None."""
    if not isinstance(index, torch.fx.Node) or index.op != "call_function":
        return None
    target = overload(index.target)

    def arange_from(node: Any) -> int | None:  # start of an arange(a, a + length, 1), else None
        if not isinstance(node, torch.fx.Node) or node.op != "call_function":
            return None
        t = overload(node.target)
        if t is torch.ops.aten.arange.default and node.args == (length,):
            return 0
        if t is torch.ops.aten.arange.start_step:
            start, end = node.args[0], node.args[1]
            step = node.args[2] if len(node.args) > 2 else node.kwargs.get("step", 1)
            if isinstance(start, int) and isinstance(end, int) and step == 1 and end - start == length:
                return start
        if t is torch.ops.aten.arange.start and len(node.args) == 2:
            start, end = node.args
            if isinstance(start, int) and isinstance(end, int) and end - start == length:
                return start
        return None

    def scalar_int(node: Any) -> bool:
        v = _val(node)
        return isinstance(v, torch.Tensor) and v.numel() == 1 and not v.dtype.is_floating_point and v.dtype != torch.bool

    constant = arange_from(index)
    if constant is not None:
        with graph.inserting_before(index):
            return graph.call_function(torch.ops.aten.full.default, ([], constant), {"dtype": torch.int64})
    if target is torch.ops.aten.add.Tensor and index.kwargs.get("alpha", 1) == 1 and len(index.args) == 2:
        a, b = index.args
        for ramp, start in ((a, b), (b, a)):
            if arange_from(ramp) == 0 and scalar_int(start):
                return start  # type: ignore[return-value]
    return None


def _as_tensor_scatter(graph: torch.fx.Graph, write: Any, placeholder: torch.fx.Node) -> bool:
    """Rewrite ``write`` (a state's new value) as ``kv_cache_update`` when the pattern allows; True if done."""
    if not isinstance(write, torch.fx.Node) or write.op != "call_function" or set(placeholder.users) != {write}:
        return False
    target = overload(write.target)
    args: Any = write.args
    if target is torch.ops.aten.index_put.default:
        cache, indices, update = args[:3]
        accumulate = args[3] if len(args) > 3 else write.kwargs.get("accumulate", False)
        positions = [i for i, x in enumerate(indices) if x is not None]
        if accumulate or len(positions) != 1 or positions[0] != len(indices) - 1:
            return False
        axis, index = positions[0], indices[positions[0]]
    elif target is torch.ops.aten.index_copy.default:
        cache, axis, index, update = args[:4]
    else:
        return False
    cache_val, update_val = _val(cache), _val(update)
    if cache is not placeholder or cache_val is None or update_val is None or cache_val.dim() != 4 or axis != 2:
        return False
    length = int(update_val.shape[axis])
    expected = list(cache_val.shape)
    expected[axis] = length
    if list(update_val.shape) != expected or update_val.dtype != cache_val.dtype:
        return False
    start = _contiguous_start(graph, index, length)
    if start is None:
        return False
    with graph.inserting_before(write):
        replacement = graph.call_function(kv_cache_update_op(), (cache, update, start, axis))
    replacement.meta = dict(write.meta)
    write.replace_all_uses_with(replacement)
    graph.erase_node(write)
    return True


@dataclass(frozen=True, slots=True)
class _Lifted:
    module: torch.fx.GraphModule
    example: tuple[torch.Tensor, ...]
    input_names: list[str]
    output_names: list[str]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    states: tuple[StateTensor, ...]
    aliases: tuple[Alias, ...]


def lift(program: Any, signature: Any) -> _Lifted:
    """The partition as a plain GraphModule whose inputs and outputs are every engine tensor, state included."""
    gm = copy.deepcopy(program.graph_module)
    graph = gm.graph
    input_specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
    states = {s.fqn: (i, s) for i, s in enumerate(signature.states)}
    users: list[torch.fx.Node] = []
    state_nodes: dict[int, torch.fx.Node] = {}
    constant_count = 0
    for node in list(graph.nodes):
        if node.op == "call_function":
            _aten(node)
            continue
        if node.op != "placeholder":
            continue
        spec = input_specs[node.name]
        if spec.kind == InputKind.USER_INPUT:
            users.append(node)
        elif spec.kind == InputKind.BUFFER and spec.target in states:
            state_nodes[states[spec.target][0]] = node
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            tensor = program.state_dict.get(spec.target)
            if tensor is None:
                tensor = program.constants.get(spec.target)
            if not isinstance(tensor, torch.Tensor):
                raise ExportError(f"backend '{BACKEND_ID}': constant '{spec.target}' of the partition has no tensor")
            attr = f"_etsdk_constant_{constant_count}"
            constant_count += 1
            if isinstance(tensor, torch.nn.Parameter):
                gm.register_parameter(attr, torch.nn.Parameter(tensor.detach(), requires_grad=False))
            else:
                gm.register_buffer(attr, tensor.detach())
            with graph.inserting_before(node):
                got = graph.get_attr(attr)
            got.meta = dict(node.meta)
            node.replace_all_uses_with(got)
            graph.erase_node(node)
        else:
            raise ExportError(f"backend '{BACKEND_ID}': cannot lower a partition input of kind {spec.kind.name} ('{node.name}')")
    names = [n.name for n in users]
    if names != [a.name for a in signature.inputs]:
        raise ExportError(f"backend '{BACKEND_ID}': partition inputs {names} differ from the delegate's {[a.name for a in signature.inputs]}")
    missing = sorted(s.state for i, s in enumerate(signature.states) if i not in state_nodes)
    if missing:
        raise ExportError(f"backend '{BACKEND_ID}': the partition has no buffer for state(s) {', '.join(missing)}")

    output_node = next(n for n in graph.nodes if n.op == "output")
    values = list(output_node.args[0])
    user_values = [v for v, spec in zip(values, program.graph_signature.output_specs) if spec.kind == OutputKind.USER_OUTPUT]
    written = {
        spec.target: v for v, spec in zip(values, program.graph_signature.output_specs) if spec.kind == OutputKind.BUFFER_MUTATION
    }
    unknown = sorted(set(written) - set(states))
    if unknown:
        raise ExportError(f"backend '{BACKEND_ID}': the partition mutates undeclared buffer(s) {', '.join(unknown)}")
    if len(user_values) != len(signature.outputs):
        raise ExportError(
            f"backend '{BACKEND_ID}': the partition returns {len(user_values)} outputs, the delegate binds {len(signature.outputs)}"
        )

    # Cache writes -> TensorScatter where provably contiguous; then the engine's inputs, in engine order.
    kinds: dict[int, str] = {}
    state_values: dict[int, Any] = {}
    for fqn, value in written.items():
        index = states[fqn][0]
        placeholder = state_nodes[index]
        kinds[index] = "kv_cache_update" if _as_tensor_scatter(graph, value, placeholder) else "user"
    output_node = next(n for n in graph.nodes if n.op == "output")
    values = list(output_node.args[0])
    written = {
        spec.target: v for v, spec in zip(values, program.graph_signature.output_specs) if spec.kind == OutputKind.BUFFER_MUTATION
    }
    for fqn, value in written.items():
        state_values[states[fqn][0]] = value

    ordered = [state_nodes[i] for i in sorted(state_nodes)] + users
    engine_inputs = [state_input(signature.states[i].state, signature.states[i].slot) for i in sorted(state_nodes)]
    engine_inputs += [input_name(i, a.name) for i, a in enumerate(signature.inputs)]
    first = next(iter(graph.nodes))
    replacements = []
    for position, node in enumerate(ordered):
        with graph.inserting_before(first):
            fresh = graph.placeholder(f"engine_input_{position}")
        fresh.meta = dict(node.meta)
        replacements.append((node, fresh))
    for node, fresh in replacements:
        node.replace_all_uses_with(fresh)
        graph.erase_node(node)
    written_order = sorted(state_values)
    engine_outputs = [state_output(signature.states[i].state, signature.states[i].slot) for i in written_order]
    engine_outputs += [output_name(i, a.name) for i, a in enumerate(signature.outputs)]
    output_node.args = (tuple([state_values[i] for i in written_order] + user_values),)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    gm.eval()

    example = []
    for node in (fresh for _, fresh in replacements):
        val = _val(node)
        example.append(torch.zeros(tuple(val.shape), dtype=val.dtype))
    state_specs = []
    aliases = []
    for i, s in enumerate(signature.states):
        out = state_output(s.state, s.slot) if i in state_values else None
        state_specs.append(StateTensor(s.state, state_input(s.state, s.slot), out, s.dtype, tuple(s.shape)))
        if out is not None:
            aliases.append(Alias(out, state_input(s.state, s.slot), kinds[i], "caller", s.state))
    return _Lifted(
        module=gm,
        example=tuple(example),
        input_names=engine_inputs,
        output_names=engine_outputs,
        inputs=tuple(TensorSpec(input_name(i, a.name), a.dtype, tuple(a.shape)) for i, a in enumerate(signature.inputs)),
        outputs=tuple(TensorSpec(output_name(i, a.name), a.dtype, tuple(a.shape)) for i, a in enumerate(signature.outputs)),
        states=tuple(state_specs),
        aliases=tuple(aliases),
    )


# ----------------------------------------------------------------------------- export


def export(program: Any, signature: Any, workdir: Path) -> OnnxPartition:
    """Write the partition's ONNX into ``workdir`` (graph and external weights), checked."""
    import onnx

    from etsdk_tensorrt import quantized

    lifted = lift(program, signature)
    has_quantized = any(quantized_call(n) is not None for n in lifted.module.graph.nodes)
    if has_quantized:
        quantized.to_planes(lifted.module)
    translations = {kv_cache_update_op(): _tensor_scatter_translation(), **quantized.translations()}
    try:
        with torch.no_grad():
            exported = torch.onnx.export(
                lifted.module,
                lifted.example,
                dynamo=True,
                opset_version=OPSET,
                input_names=lifted.input_names,
                output_names=lifted.output_names,
                custom_translation_table=translations,
                verbose=False,
                # not optimized: constant folding would store a linear layer's weight transposed (an initializer
                # named after the fold, with other bytes), so the ONNX could not share the model's weight entries
                # with other backends (TensorRT and ONNX Runtime fold the transpose when they build)
                optimize=False,
            )
    except Exception as exc:
        raise ExportError(f"backend '{BACKEND_ID}': torch.onnx.export of the partition failed: {type(exc).__name__}: {exc}") from exc
    if exported is None:
        raise ExportError(f"backend '{BACKEND_ID}': torch.onnx.export returned no program")
    model_path = workdir / "model.onnx"
    _save(exported.model, model_path)
    del exported
    if has_quantized:  # 4-bit weights as UINT4 initializers feeding DequantizeLinear (etsdk_tensorrt.quantized)
        whole = onnx.load(str(model_path))
        if quantized.fold_uint4(whole):
            for old in workdir.iterdir():
                if old != model_path:
                    old.unlink()
            onnx.save_model(whole, str(model_path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
        del whole
    model = onnx.load(str(model_path), load_external_data=False)
    _strip_debug_info(model)
    onnx.save_model(model, str(model_path))  # the graph only: the external weights are referenced, not rewritten
    _check_io(model, lifted)
    _check_tensor_scatter(model, lifted.aliases)
    try:
        onnx.checker.check_model(str(model_path), full_check=True)
    except Exception as exc:  # onnx raises its own ValidationError / InferenceError
        raise ExportError(f"backend '{BACKEND_ID}': the partition's ONNX does not pass onnx.checker: {exc}") from exc
    locations = sorted(
        {
            entry.value
            for tensor in model.graph.initializer
            if tensor.data_location == onnx.TensorProto.EXTERNAL
            for entry in tensor.external_data
            if entry.key == "location"
        }
    )
    if len(locations) > 1:
        raise ExportError(f"backend '{BACKEND_ID}': the ONNX weights landed in {len(locations)} files, expected one")
    weights_location = locations[0] if locations else None
    weights_path = workdir / weights_location if weights_location else None
    external = []
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            if "length" not in info:
                raise ExportError(f"backend '{BACKEND_ID}': ONNX initializer '{tensor.name}' has external data without a length")
            external.append((tensor.name, int(info.get("offset", 0)), int(info["length"])))
    constants = {**dict(lifted.module.named_parameters()), **dict(lifted.module.named_buffers())}
    return OnnxPartition(
        model_path=model_path,
        weights_path=weights_path,
        weights_location=weights_location,
        inputs=lifted.inputs,
        outputs=lifted.outputs,
        states=lifted.states,
        aliases=lifted.aliases,
        engine_inputs=tuple(i.name for i in model.graph.input),
        engine_outputs=tuple(o.name for o in model.graph.output),
        external=tuple(sorted(external, key=lambda e: e[1])),
        constants=constants,
    )


def _save(model: Any, path: Path) -> None:
    """Write ``model`` (an ``onnx_ir`` model, as ``torch.onnx.export`` makes it) to ``path`` with every initializer
    in ``<name>.data`` beside it, handing back each weight's pages once written.

    Writing the external data reads every weight: a checkpoint's memory-mapped pages, once read, would stay in
    the process until it ends, a model's worth on top of the export's own memory. The writer announces each
    tensor before writing it, so the one before it is done and goes back then (the last, after the save)."""
    import onnx_ir

    written: list[torch.Tensor] = []

    def next_tensor(tensor: Any, info: Any) -> None:
        release_mapped_weights(written)
        raw = getattr(tensor, "raw", None)
        written[:] = [raw] if isinstance(raw, torch.Tensor) else []

    onnx_ir.save(model, path, external_data=f"{path.name}.data", callback=next_tensor)
    release_mapped_weights(written)


def _strip_debug_info(model: Any) -> None:
    """Drop each node's debug metadata (the exporter's namespaces and Python stack traces: 2.2 of a 2.3 MB graph for
    a two-layer model, and local paths): the program carries the graph, not how it was traced."""
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""


def _check_io(model: Any, lifted: _Lifted) -> None:
    found_in = [i.name for i in model.graph.input]
    found_out = [o.name for o in model.graph.output]
    if found_in != lifted.input_names or found_out != lifted.output_names:
        raise ExportError(
            f"backend '{BACKEND_ID}': the exported ONNX binds inputs {found_in} and outputs {found_out}, expected "
            f"{lifted.input_names} and {lifted.output_names}"
        )


def _producer(model: Any, name: str) -> Any:
    """The node producing ``name``, looking through Identity."""
    producers = {out: node for node in model.graph.node for out in node.output}
    node = producers.get(name)
    while node is not None and node.op_type == "Identity":
        node = producers.get(node.input[0])
    return node


def _check_tensor_scatter(model: Any, aliases: Sequence[Alias]) -> None:
    """Each kv_cache_update alias must be a TensorScatter writing straight into its state input (TensorRT's rule)."""
    for alias in aliases:
        if alias.kind != "kv_cache_update":
            continue
        node = _producer(model, alias.output)
        if node is None or node.op_type != "TensorScatter" or node.input[0] != alias.input:
            found = "nothing" if node is None else f"{node.op_type}({', '.join(node.input)})"
            raise ExportError(
                f"backend '{BACKEND_ID}': state '{alias.state}' should be updated by TensorScatter({alias.input}, ...), "
                f"the ONNX produces '{alias.output}' with {found}"
            )

