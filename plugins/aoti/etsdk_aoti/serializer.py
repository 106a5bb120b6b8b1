"""Preprocess: compile a partition with AOTInductor; blob = library + constant descriptions; weights streamed.

The blob (etsdk container, feature ``aoti.container.v1``) holds three sections:

* ``library``: the compiled ``.so``, streamed from Inductor's output file;
* ``constants``: every constant the *container* reports, in its order: name,
  original FQN, kind, folded or not, dtype, shape, stride, size, and where its
  data comes from (``weights``: a slot of the weights entry; ``state``: a
  session's storage, bound per call; ``absent``; ``folded``);
* ``config``: device, input / output counts, the weights' named-data key and size.

Weights never enter the blob: they are written tensor by tensor to a file in
the layout of :mod:`etsdk_aoti.weights` and handed to the partition's named-data
writer as a file, so no model-sized bytes object exists during export.
Compilation uses Inductor options only (no patching of torch or executorch).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from etsdk import ExportError
from etsdk.backend import BlobWriter, DelegateSignature, Partition, dtype_name

from etsdk_aoti import BLOB_FEATURE, weights
from etsdk_aoti.library import ConstantKind, Library
from etsdk_aoti.partitioner import DEVICE_SPEC

INDUCTOR_OPTIONS = {
    "aot_inductor.package": True,
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.package_constants_on_disk_format": "pickle_weights",
    "max_autotune": False,
    # State (caches, counters) reaches the compiled graph as buffers, i.e. constants to Inductor: folding
    # "constant" subgraphs would bake the state's example value into the library (silently wrong output).
    "joint_graph_constant_folding": False,
}


def _find_tensor(edge_program: Any, produced: dict[str, Any], fqn: str) -> Any:
    if fqn in produced:
        entry = produced[fqn]
        return entry[0] if isinstance(entry, tuple) else entry
    if fqn in edge_program.state_dict:
        return edge_program.state_dict[fqn]
    return edge_program.constants.get(fqn)


def compile_partition(edge_program: Any, device: str, workdir: Path) -> tuple[Path, dict[str, Any]]:
    """AOTInductor-compile the partition; returns the library path and the weights Inductor kept aside."""
    from executorch.backends.aoti.passes.replace_view_copy_with_view import ReplaceViewCopyWithViewPass
    from torch.export.passes import move_to_device_pass

    program = move_to_device_pass(edge_program, device) if device != "cpu" else edge_program
    ReplaceViewCopyWithViewPass()(program.graph_module)
    user_inputs = set(program.graph_signature.user_inputs)
    example = tuple(n.meta["val"] for n in program.graph.nodes if n.op == "placeholder" and n.name in user_inputs)
    options = dict(INDUCTOR_OPTIONS, **{"aot_inductor.output_path": str(workdir)})
    with torch.no_grad():
        outputs = torch._inductor.aot_compile(program.module(), example, options=options)
    produced = outputs if isinstance(outputs, list) else [outputs]
    libraries = [Path(p) for p in produced if isinstance(p, (str, Path)) and str(p).endswith(".so")]
    tensors: Mapping[str, Any] = next((p for p in produced if isinstance(p, Mapping)), {})
    if len(libraries) != 1:
        listing = ", ".join(str(p) if isinstance(p, (str, Path)) else type(p).__name__ for p in produced)
        raise ExportError(
            f"AOTInductor produced {len(libraries)} compiled libraries (expected exactly one .so); it produced: {listing}"
        )
    return libraries[0], dict(tensors.items())


def describe_constants(
    library: Library, edge_program: Any, produced: dict[str, Any], signature: DelegateSignature
) -> tuple[list[dict[str, Any]], list[Any]]:
    """One record per container constant; plus the tensors to write, in slot order."""
    states = signature.state_by_fqn
    records: list[dict[str, Any]] = []
    tensors: list[Any] = []
    for constant in library.constants():
        record: dict[str, Any] = {
            "name": constant.name,
            "fqn": constant.fqn,
            "kind": constant.kind.value,
            "folded": constant.folded,
            "dtype_code": constant.dtype_code,
            "nbytes": constant.nbytes,
        }
        tensor = _find_tensor(edge_program, produced, constant.fqn)
        if constant.folded or constant.kind is ConstantKind.FOLDED:
            record["source"] = "folded"
        elif constant.fqn in states:
            state = states[constant.fqn]
            record.update(source="state", index=signature.states.index(state), dtype=state.dtype, shape=list(state.shape))
        elif tensor is None:
            record["source"] = "absent"
        else:
            tensor = tensor.detach()
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes != constant.nbytes:
                raise ExportError(
                    f"constant '{constant.name}' ({constant.fqn}): the container expects {constant.nbytes} bytes, "
                    f"the tensor has {nbytes}"
                )
            record.update(
                source="weights",
                dtype=dtype_name(tensor.dtype),
                shape=list(tensor.shape),
                stride=list(tensor.contiguous().stride()),
            )
            tensors.append(tensor)
        records.append(record)
    return records, tensors


def preprocess(partition: Partition) -> bytes:
    edge_program = partition.program
    device = partition.compile_specs.get(DEVICE_SPEC, b"cpu").decode()
    signature = partition.signature
    workdir = Path(tempfile.mkdtemp(prefix="etsdk-aoti-"))
    weights_path: Path | None = None
    weights_key = None
    try:
        library_path, produced = compile_partition(edge_program, device, workdir)
        # The constants' metadata is read from a container on the compile device: the
        # blob is written from what the container says, not from the state dict.
        library = Library(library_path, device)
        records, tensors = describe_constants(library, edge_program, produced, signature)
        num_inputs, num_outputs = library.num_inputs, library.num_outputs
        library.close()
        del produced
        if num_inputs != len(signature.inputs) or num_outputs != len(signature.outputs):
            raise ExportError(
                f"the compiled library takes {num_inputs} inputs and returns {num_outputs} outputs, the delegate "
                f"binds {len(signature.inputs)} and {len(signature.outputs)}"
            )
        slots, total = weights.layout([(r["name"], r["nbytes"]) for r in records if r["source"] == "weights"], device)
        offsets = {slot.name: slot.offset for slot in slots}
        for record in records:
            if record["name"] in offsets:
                record["offset"] = offsets[record["name"]]
        if slots:
            fd, name = tempfile.mkstemp(prefix="etsdk-aoti-weights-", suffix=".bin")
            os.close(fd)
            weights_path = Path(name)
            digest = weights.write_file(weights_path, slots, tensors)
            # the writer deletes the file once the program is written
            weights_key = partition.named_data.add_file(weights_path, sha256=digest, cleanup=True)
        del tensors
        library_sha256 = _sha256_file(library_path)
        config = {
            "device": device,
            "num_inputs": num_inputs,
            "num_outputs": num_outputs,
            "weights_key": weights_key,
            "weights_bytes": total,
            "library_sha256": library_sha256,
        }
        writer = BlobWriter(required_features=[BLOB_FEATURE], producer="etsdk-aoti")
        writer.add_section("config", json.dumps(config).encode())
        writer.add_section("constants", json.dumps(records).encode())
        writer.add_file_section("library", library_path, alignment=4096)
        return writer.to_bytes()  # the library file is deleted below
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if weights_path is not None and weights_key is None:
            weights_path.unlink(missing_ok=True)  # failed before the writer took it


def _sha256_file(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 * 1024 * 1024):
            h.update(chunk)
    return h.hexdigest()
