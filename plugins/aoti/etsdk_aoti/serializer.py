"""Preprocess: compile a partition with AOTInductor; blob = library + constant descriptions; weights streamed.

The blob (layout: :mod:`etsdk_aoti.blob_format`) holds the compiled ``.so``,
streamed from Inductor's output file; one record per constant the *container*
reports, in its order, with where its data comes from (a slot of the weights
entry, absent, or folded; a state reaching the library as a constant fails the
export); and the config: device, arity, the weights entry, the library's hash
and ``state_inputs``, the delegate's state bindings the library takes as inputs
after the engine inputs. This module builds that record; ``blob_format.encode``
writes it.

State is never an Inductor constant: each state buffer becomes an input of the
compiled library that the library updates in place (the runtime passes the
session's tensors each call, zero-copy). Constants are then weights only, so
Inductor's constant folding is safe again. Before compiling, the partition's
layout copies are turned back into views (edge lowering writes ``linear`` as
``permute_copy(weight)`` + ``mm``: a copy of every weight on every call) and
attention over repeated key/value heads reads the grouped heads directly.

Weights never enter the blob: each constant is its own named-data entry,
streamed by the partition's writer (``NamedDataWriter.add_weight``: through a
file, content-addressed), so no model-sized bytes object exists during export
and a weight another delegate of the program reads too is stored once.
Quantized weights are rewritten onto etsdk-aoti's kernels first
(:mod:`etsdk_aoti.quantized`).
Compilation uses Inductor options only (no patching of torch or executorch).

CPU code is compiled for the partition's CPU target (:mod:`etsdk_aoti.cpu`:
``cpp.march`` / ``cpp.simdlen``), recorded in ``config.cpu``. Where this host
cannot run that target, the compiled library is never loaded here: the
container's metadata is read from Inductor's generated source instead
(:class:`etsdk_aoti.library.GeneratedSource`), and the runtime checks it
against the container when the library first loads on a host that runs it.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from etsdk import ExportError
from etsdk.backend import DelegateSignature, Partition, StateBinding, dtype_name, host_cpu

from etsdk_aoti import blob_format, cpu, kernels, weights
from etsdk_aoti.attention import kernel_attention, kernel_attention_int8, kernel_attention_slots, rewrite_attention
from etsdk_aoti.blob_format import AotiBlob, Config, Constant, Derivation, Source, TensorView
from etsdk_aoti.float_linear import kernel_linear, kernel_linear16, rewrite_float_linears
from etsdk_aoti.library import ConstantKind, ContainerConstant, GeneratedSource, Library
from etsdk_aoti.op_names import op_name as _op_name
from etsdk_aoti.partitioner import CPU_TARGET_SPEC, DEVICE_SPEC, KERNEL_THREADS_SPEC
from etsdk_aoti.quantized import Derived, check_device, multiplies_int8_a8, rewrite_quantized
from etsdk_aoti.quantized import linear as _qmm_linear
from etsdk_aoti.quantized import linear_a8 as _qmm_linear_a8
from etsdk_aoti.quantized import linear_a8_fused as _qmm_linear_a8_fused

INDUCTOR_OPTIONS = {
    "aot_inductor.package": True,
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.package_constants_on_disk_format": "pickle_weights",
    "max_autotune": False,
    # State reaches the compiled graph as inputs (never constants), so folding constant subgraphs can no
    # longer bake a state's example value in (tests/integration/test_state.py::test_state_is_read_at_run_time_never_folded_...).
    "joint_graph_constant_folding": True,
}


def _copy_to_view_targets() -> dict[Any, Any]:
    from executorch.exir.dialects._ops import ops

    edge, aten = ops.edge.aten, torch.ops.aten
    pairs = [
        ("permute_copy", "default", "permute"),
        ("t_copy", "default", "t"),
        ("transpose_copy", "int", "transpose"),
        ("expand_copy", "default", "expand"),
        ("unsqueeze_copy", "default", "unsqueeze"),
        ("squeeze_copy", "dims", "squeeze"),
        ("view_copy", "default", "reshape"),  # reshape: a view where strides allow, a copy where they do not
    ]
    targets: dict[Any, Any] = {}
    for copy, overload, view in pairs:
        replacement = getattr(getattr(aten, view), overload)
        targets[getattr(getattr(edge, copy), overload)] = replacement
        targets[getattr(getattr(aten, copy), overload)] = replacement
    return targets


def copies_to_views(graph_module: Any, weights: set[str]) -> int:
    """Read weights in place: layout copies of weights become views; returns how many.

    Edge lowering writes ``linear`` as ``permute_copy(weight)`` + ``mm``; Inductor
    materialises that copy of every weight matrix on every call (unless constant
    folding precomputes it, which doubles the weights in memory). The partition
    graph is functional (nothing writes through a view), so a view is exact.
    Only copies of ``weights`` (constant placeholders) and of views of them
    change: turning activation copies into views lets Inductor's attention
    pattern match edge graphs whose scale is a tensor, which it cannot compile. A
    node whose value is a graph output keeps its copy (caution: the runtime copies
    results into the method's outputs today, but a library output aliasing a
    weight would hand out the weight's storage to whoever reads it later).
    """
    targets = _copy_to_view_targets()
    of_weights = {n for n in graph_module.graph.nodes if n.op == "placeholder" and n.name in weights}
    changed = 0
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target not in targets or node.args[0] not in of_weights:
            continue
        if any(user.op == "output" for user in node.users):
            continue
        node.target = targets[node.target]
        of_weights.add(node)
        changed += 1
    if changed:
        graph_module.graph.lint()
        graph_module.recompile()
    return changed


def _repeated_kv(node: Any) -> tuple[Any, int] | None:
    """``(kv, repeats)`` when ``node`` is transformers' ``repeat_kv(kv)``: unsqueeze(2) -> expand -> [clone] -> view."""
    if _op_name(node) not in ("view_copy", "view", "reshape", "_unsafe_view"):
        return None
    expanded = node.args[0]
    if "clone" in _op_name(expanded):
        expanded = expanded.args[0]
    if _op_name(expanded) not in ("expand_copy", "expand"):
        return None
    unsqueezed = expanded.args[0]
    if _op_name(unsqueezed) not in ("unsqueeze_copy", "unsqueeze") or unsqueezed.args[1] != 2:
        return None
    kv = unsqueezed.args[0]
    value = getattr(kv, "meta", {}).get("val")
    if value is None or value.dim() != 4 or len(expanded.args[1]) != 5:
        return None
    batch, heads, rows, dim = tuple(value.shape)
    size = tuple(expanded.args[1])
    repeats = size[2]
    if (size[0], size[1], size[3], size[4]) != (batch, heads, rows, dim):
        return None
    if tuple(node.args[1]) != (batch, heads * repeats, rows, dim):
        return None
    return kv, repeats


def grouped_attention(graph_module: Any) -> int:
    """``sdpa(q, repeat_kv(k), repeat_kv(v))`` -> ``sdpa(q, k, v, enable_gqa=True)``; returns how many.

    The same math (query head h reads key/value head h // repeats), without a
    per-call copy of every layer's key and value cache widened to the query heads:
    exported transformers models repeat them on every call, and Inductor's CPU
    flash attention reads grouped heads directly.
    """
    changed = 0
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or _op_name(node) != "scaled_dot_product_attention" or len(node.args) < 3:
            continue
        if node.kwargs.get("enable_gqa"):
            continue
        key, value = _repeated_kv(node.args[1]), _repeated_kv(node.args[2])
        if key is None or value is None or key[1] != value[1]:
            continue
        node.args = (node.args[0], key[0], value[0], *node.args[3:])
        node.kwargs = {**node.kwargs, "enable_gqa": True}
        changed += 1
    if changed:
        graph_module.graph.eliminate_dead_code()
        graph_module.graph.lint()
        graph_module.recompile()
    return changed


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare_graph` changed: weight copies turned into views, attentions reading grouped heads."""

    weight_copies_to_views: int
    grouped_attentions: int


def prepare_graph(graph_module: Any, weights: Iterable[str]) -> Prepared:
    """Rewrite a partition's graph so that a call reads every weight in place (before AOTInductor compiles it).

    ExecuTorch's ``ReplaceViewCopyWithViewPass`` (activation reshapes), then :func:`grouped_attention`, then
    :func:`copies_to_views` for the ``weights`` placeholders.
    """
    from executorch.backends.aoti.passes.replace_view_copy_with_view import ReplaceViewCopyWithViewPass

    ReplaceViewCopyWithViewPass()(graph_module)
    grouped = grouped_attention(graph_module)
    return Prepared(copies_to_views(graph_module, set(weights)), grouped)


def state_as_inputs(module: Any, states: Sequence[StateBinding]) -> Any:
    """``module`` (the unlifted partition) with every state buffer made an input, after the engine inputs.

    Unlifting wrote each state update as ``aten.copy_(buffer, new_value)``; with the
    buffer an input, AOTInductor compiles that as an in-place update of the
    caller's tensor (the cache write becomes an indexed store into the input), and
    no state is an Inductor constant.
    """
    import torch.utils._pytree as pytree
    from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo

    graph = module.graph
    existing = [n for n in graph.nodes if n.op == "placeholder"]
    placeholders: dict[str, Any] = {}
    anchor = existing[-1] if existing else None  # a partition fed by state alone has no engine input
    for index, binding in enumerate(states):
        where = graph.inserting_after(anchor) if anchor is not None else graph.inserting_before(next(iter(graph.nodes)))
        with where:
            anchor = graph.placeholder(f"etsdk_state_{index}")
        placeholders[binding.fqn] = anchor
    for node in list(graph.nodes):
        if node.op == "get_attr" and node.target in placeholders:
            placeholder = placeholders[node.target]
            for key, value in node.meta.items():  # AOTInductor traces from the placeholders' example values
                placeholder.meta.setdefault(key, value)
            node.replace_all_uses_with(placeholder)
            graph.erase_node(node)
    for fqn in placeholders:
        owner = module
        *path, leaf = fqn.split(".")
        for part in path:
            owner = getattr(owner, part)
        owner._buffers.pop(leaf, None)
    codegen = graph._codegen
    if not isinstance(codegen, _PyTreeCodeGen):
        raise ExportError(f"etsdk-aoti: unexpected code generator {type(codegen).__name__} on the unlifted partition")
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    in_spec = pytree.tree_flatten((tuple(names), {}))[1]
    graph._codegen = _PyTreeCodeGen(_PyTreeInfo(names, in_spec, codegen.pytree_info.out_spec))
    graph.lint()
    module.recompile()
    return module


def _find_tensor(edge_program: Any, produced: dict[str, Any], fqn: str) -> Any:
    if fqn in produced:
        entry = produced[fqn]
        return entry[0] if isinstance(entry, tuple) else entry
    if fqn in edge_program.state_dict:
        return edge_program.state_dict[fqn]
    return edge_program.constants.get(fqn)


@dataclass
class Compiled:
    """What :func:`compile_partition` made: the library, the tensors Inductor kept aside, the partition module
    it compiled (its buffers: the constants' values), and the constants derived from quantized weights."""

    library: Path
    produced: dict[str, Any]
    module: Any
    derived: dict[str, Derived]

    @property
    def calls_kernels(self) -> bool:
        return any(node.target is _qmm_linear for node in self.module.graph.nodes if node.op == "call_function")

    @property
    def calls_attention(self) -> bool:
        return any(node.target is kernel_attention for node in self.module.graph.nodes if node.op == "call_function")

    @property
    def calls_attention_int8(self) -> bool:
        return any(node.target is kernel_attention_int8 for node in self.module.graph.nodes if node.op == "call_function")

    @property
    def calls_attention_slots(self) -> bool:
        return any(node.target is kernel_attention_slots for node in self.module.graph.nodes if node.op == "call_function")

    @property
    def calls_linear(self) -> bool:
        return any(node.target in (kernel_linear, kernel_linear16) for node in self.module.graph.nodes if node.op == "call_function")

    @property
    def calls_linear16(self) -> bool:
        return any(node.target is kernel_linear16 for node in self.module.graph.nodes if node.op == "call_function")

    @property
    def calls_qmm_a8(self) -> bool:
        return any(node.target is _qmm_linear_a8 for node in self.module.graph.nodes if node.op == "call_function")

    @property
    def calls_qmm_a8_fused(self) -> bool:
        return any(node.target is _qmm_linear_a8_fused for node in self.module.graph.nodes if node.op == "call_function")

    @property
    def calls_qmm_a8_int8(self) -> bool:
        return multiplies_int8_a8(self.module)


def compile_partition(
    edge_program: Any,
    device: str,
    workdir: Path,
    states: Sequence[StateBinding] = (),
    weights: frozenset[str] = frozenset(),
    kernel_threads: int = 1,
    target_options: Mapping[str, Any] | None = None,
) -> Compiled:
    """AOTInductor-compile the partition with ``states`` as inputs after the engine inputs.

    ``weights``: the placeholders of the partition's constants (read in place, never copied per call).
    ``kernel_threads``: Inductor's ``cpp.threads`` for the generated CPU kernels (1: on the calling thread, so
    small decode kernels open no parallel region that a descheduled thread can stall; -1: the caller's team).
    ``target_options``: Inductor's options of the CPU target (:attr:`etsdk_aoti.cpu.Build.options`).
    Quantized-weight calls, attention and few-row float32 products are rewritten onto etsdk-aoti's kernels first
    (:mod:`etsdk_aoti.quantized`, :mod:`etsdk_aoti.attention`, :mod:`etsdk_aoti.float_linear`).
    """
    from torch.export.passes import move_to_device_pass

    check_device(edge_program, device)
    program = move_to_device_pass(edge_program, device) if device != "cpu" else edge_program
    prepare_graph(program.graph_module, weights)
    user_inputs = set(program.graph_signature.user_inputs)
    values = {n.name: n.meta["val"] for n in program.graph.nodes if n.op == "placeholder"}
    example = tuple(values[n.name] for n in program.graph.nodes if n.op == "placeholder" and n.name in user_inputs)
    module = program.module()
    derived = rewrite_quantized(module)
    rewrite_attention(module, device)
    rewrite_float_linears(module, device)
    if states:
        example += tuple(values[binding.placeholder] for binding in states)
        module = state_as_inputs(module, states)
    options: dict[str, Any] = dict(INDUCTOR_OPTIONS, **{"aot_inductor.output_path": str(workdir), "cpp.threads": kernel_threads})
    options.update(target_options or {})
    shims = {}
    targets = {node.target for node in module.graph.nodes if node.op == "call_function"}
    if _qmm_linear in targets:
        shims[kernels.QMM] = [kernels.C_SHIM]
    if _qmm_linear_a8 in targets:
        shims[kernels.QMM_A8] = [kernels.QMM_A8_C_SHIM]
    if _qmm_linear_a8_fused in targets:
        shims[kernels.QMM_A8_FUSED] = [kernels.QMM_A8_FUSED_C_SHIM]
    if kernel_attention in targets:
        shims[kernels.KERNEL_ATTENTION] = [kernels.ATTENTION_C_SHIM]
    if kernel_attention_int8 in targets:
        shims[kernels.KERNEL_ATTENTION_INT8] = [kernels.ATTENTION_INT8_C_SHIM]
    if kernel_attention_slots in targets:
        shims[kernels.KERNEL_ATTENTION_SLOTS] = [kernels.ATTENTION_SLOTS_C_SHIM]
    if kernel_linear in targets or kernel_linear16 in targets:
        shims[kernels.LINEAR] = [kernels.LINEAR_C_SHIM]
    if shims:
        options["aot_inductor.custom_ops_to_c_shims"] = shims
        # the compiled library calls into it: loaded before the library is (to read its constants); built for and
        # run on this host at its own level, whatever the library's target
        kernels.load()
    with torch.no_grad():
        outputs = torch._inductor.aot_compile(module, example, options=options)
    produced = outputs if isinstance(outputs, list) else [outputs]
    libraries = [Path(p) for p in produced if isinstance(p, (str, Path)) and str(p).endswith(".so")]
    tensors: Mapping[str, Any] = next((p for p in produced if isinstance(p, Mapping)), {})
    if len(libraries) != 1:
        listing = ", ".join(str(p) if isinstance(p, (str, Path)) else type(p).__name__ for p in produced)
        raise ExportError(
            f"AOTInductor produced {len(libraries)} compiled libraries (expected exactly one .so); it produced: {listing}"
        )
    return Compiled(libraries[0], dict(tensors.items()), module, derived)


def _module_tensor(module: Any, fqn: str) -> Any:
    found: Any = module
    for part in fqn.split("."):
        found = getattr(found, part, None)
    return found


def describe_constants(
    library: Library | GeneratedSource, edge_program: Any, compiled: Compiled, signature: DelegateSignature, named_data: Any
) -> tuple[Constant, ...]:
    """One record per container constant: its own named-data entry (written here, content-addressed: the same
    weight another delegate stores is one entry), derived at load, folded by the library, or absent.
    ``library``: the loaded container, or what the generated source declares it reports."""
    container: list[ContainerConstant] = library.constants()
    states = signature.state_by_fqn
    keys: dict[str, str] = {}  # fqn -> entry key (a weight read by two constants is written once)

    def entry(fqn: str, tensor: Any) -> str:
        if fqn not in keys:
            keys[fqn] = named_data.add_weight(tensor)
        return keys[fqn]

    records = []
    for constant in container:
        record = functools.partial(
            Constant, constant.name, constant.fqn, constant.kind, constant.folded, constant.dtype_code, constant.nbytes
        )
        if constant.folded or constant.kind is ConstantKind.FOLDED:
            records.append(record(Source.FOLDED))
            continue
        if constant.fqn in states:
            raise ExportError(
                f"etsdk-aoti: state '{states[constant.fqn].state}' ({constant.fqn}) reached the compiled library as a "
                "constant; state must be an input the library updates in place"
            )
        derivation = compiled.derived.get(constant.fqn)
        tensor = _module_tensor(compiled.module, constant.fqn) if derivation is not None else _find_tensor(
            edge_program, compiled.produced, constant.fqn
        )
        if tensor is None:
            records.append(record(Source.ABSENT))
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if not weights.size_matches(nbytes, constant.nbytes):
            raise ExportError(
                f"constant '{constant.name}' ({constant.fqn}): the container expects {constant.nbytes} bytes, "
                f"the tensor has {nbytes}"
            )
        view = TensorView(dtype_name(tensor.dtype), tuple(tensor.shape), tuple(tensor.contiguous().stride()))
        if derivation is None:
            records.append(record(Source.ENTRY, view=view, key=entry(constant.fqn, tensor)))
            continue
        stored = tuple(
            sorted((plane, entry(fqn, _module_tensor(compiled.module, fqn))) for plane, fqn in derivation.stored.items())
        )
        derive = Derivation(derivation.format, derivation.shape, stored, derivation.plane)
        records.append(record(Source.DERIVED, view=view, derive=derive))
    return tuple(records)


def _cpu_build(partition: Partition) -> cpu.Build:
    """The CPU target of the partition's compile specs, planned on this host (a note about it reported)."""
    name = partition.compile_specs.get(CPU_TARGET_SPEC, b"native").decode()
    try:
        build = cpu.plan(name)
    except ValueError as exc:
        raise ExportError(f"etsdk-aoti cpu_target: {exc}") from None
    if build.note:
        partition.progress(build.note)
    return build


def preprocess(partition: Partition) -> bytes:
    edge_program = partition.program
    device = partition.compile_specs.get(DEVICE_SPEC, b"cpu").decode()
    signature = partition.signature
    workdir = Path(tempfile.mkdtemp(prefix="etsdk-aoti-"))
    try:
        weights_read = frozenset(c.placeholder for c in partition.constants())
        kernel_threads = int(partition.compile_specs.get(KERNEL_THREADS_SPEC, b"1").decode())
        # every device: a CUDA library's host code is C++ too, compiled -march=native unless told otherwise
        build = _cpu_build(partition)
        compiled = compile_partition(edge_program, device, workdir, signature.states, weights_read, kernel_threads, build.options)
        host = host_cpu()
        library: Library | GeneratedSource
        if build.runs_on(host):
            # The constants' metadata is read from a container on the compile device: the
            # blob is written from what the container says, not from the state dict.
            library = Library(compiled.library, device)
        else:
            # Loading the library would run code this host cannot (its static initializers): read what the
            # container will report from the source Inductor generated; the runtime compares the two at load.
            library = GeneratedSource.read(workdir)
            partition.progress(
                f"not loaded on this host (it lacks {' '.join(host.lacks(build.features)) or build.machine}): "
                f"the {build.target} library's constants and arity were read from Inductor's generated source and "
                "are checked against the library when it first loads on a host that runs it"
            )
        try:
            constants = describe_constants(library, edge_program, compiled, signature, partition.named_data)
            num_inputs, num_outputs = library.num_inputs, library.num_outputs
        finally:
            library.close()
        expected_inputs = len(signature.inputs) + len(signature.states)
        if num_inputs != expected_inputs or num_outputs != len(signature.outputs):
            raise ExportError(
                f"the compiled library takes {num_inputs} inputs and returns {num_outputs} outputs, the delegate "
                f"binds {len(signature.inputs)} inputs + {len(signature.states)} states and {len(signature.outputs)} outputs"
            )
        config = Config(
            device=device,
            num_inputs=num_inputs,
            num_outputs=num_outputs,
            library_sha256=blob_format.library_sha256(compiled.library),
            # the library's inputs after the engine inputs: every state binding, in order
            state_inputs=tuple(range(len(signature.states))),
            cpu=build.record(host),
        )
        blob = AotiBlob(
            config, constants, compiled.library, calls_kernels=compiled.calls_kernels, calls_attention=compiled.calls_attention,
            calls_attention_int8=compiled.calls_attention_int8, calls_attention_slots=compiled.calls_attention_slots,
            calls_linear=compiled.calls_linear,
            calls_linear16=compiled.calls_linear16, calls_qmm_a8=compiled.calls_qmm_a8,
            calls_qmm_a8_fused=compiled.calls_qmm_a8_fused, calls_qmm_a8_int8=compiled.calls_qmm_a8_int8,
        )
        return blob_format.encode(blob)  # the library file is deleted below
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
