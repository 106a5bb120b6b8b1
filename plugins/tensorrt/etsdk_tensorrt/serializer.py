"""Preprocess: partition -> ONNX -> (engine) -> blob, with the large parts in named data.

:func:`serialize` is the whole export side and takes plain inputs (the
partition's edge ExportedProgram, its delegate signature, the compile specs and
a named-data sink); :func:`preprocess` is the plugin API's entry point.

* The ONNX graph goes into the blob; the serialized engine goes to named data,
  streamed from its file, and so do the ONNX weights, one weight entry per
  initializer (:func:`store_initializers`): the model's own tensor where the
  initializer holds its bytes, so a program whose other methods run on another
  backend (AOTI decode) stores each weight once. ``external_data`` puts them in
  a ``.ptd``; the runtime rebuilds the external-data file from the entries.
* The engine is built here when ``build`` is ``"export"``, or ``"auto"`` and
  TensorRT is importable and a GPU is present; otherwise the blob carries the
  ONNX and the engine is built on first load on the target.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from etsdk import ExportError

from etsdk_tensorrt import blob_format, device, engine, onnx_export
from etsdk_tensorrt.options import BuildOptions

_CHUNK = 8 << 20


class NamedDataSink(Protocol):
    def add_file(self, path: Path, sha256: str) -> str:
        """Store the file's bytes as named data and return its key; the sink owns the file from here on."""
        ...

    def add_weight(self, tensor: Any) -> str:
        """Store a weight tensor's bytes as the shared weight entry (``NamedDataWriter.add_weight``); its key."""
        ...

    def weight_key(self, tensor: Any) -> str:
        """The key :meth:`add_weight` would give ``tensor``, without storing it (``NamedDataWriter.weight_key``)."""
        ...


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def build_at_export(options: BuildOptions) -> bool:
    if options.build == "load":
        return False
    if options.build == "export":
        return True
    return engine.tensorrt_importable() and device.gpu_present()


def serialize(
    program: Any, signature: Any, specs: Mapping[str, bytes], named: NamedDataSink, report: engine.Say | None = None
) -> bytes:
    """The blob payload of one partition; ``report`` shows progress (default: stderr)."""
    options = BuildOptions.from_compile_specs(specs)
    say = engine.progress_printer(options.progress) if report is None else (report if options.progress else lambda _: None)
    workdir = Path(tempfile.mkdtemp(prefix="etsdk-tensorrt-"))
    try:
        partition = onnx_export.export(program, signature, workdir)
        graph = partition.model_path.read_bytes()
        engine_record = None
        if build_at_export(options):  # before the weights move to named data: the parser reads them beside the graph
            trt = engine.import_tensorrt()
            shapes = {t.name: t.shape for t in partition.inputs} | {s.input: s.shape for s in partition.states}
            # with the ONNX kept, its weights are the program's copy: the engine is built without them and refitted
            strip = options.keep_onnx and partition.weights_path is not None and engine.can_strip(trt)
            serialized = engine.build(trt, partition.model_path, options, shapes, say=say, error=ExportError, strip=strip)
            plan = workdir / "engine.plan"
            with plan.open("wb") as f:
                f.write(serialized)
            del serialized
            digest, size = sha256_file(plan), plan.stat().st_size
            data = blob_format.NamedBytes(named.add_file(plan, digest), size, digest)
            engine_record = blob_format.EngineRecord(
                data, str(trt.__version__), device.compute_capability(), options.precision, strip
            )
        keep_onnx = engine_record is None or options.keep_onnx
        tensors = store_initializers(partition, named) if keep_onnx and partition.weights_path is not None else ()
        onnx_record = blob_format.OnnxRecord(
            onnx_export.OPSET, hashlib.sha256(graph).hexdigest(), None, partition.weights_location, tensors
        )
        description = blob_format.BlobDescription(
            device=options.state_device,
            inputs=partition.inputs,
            outputs=partition.outputs,
            states=partition.states,
            aliases=partition.aliases,
            engine=engine_record,
            onnx=onnx_record if keep_onnx else None,
            build={
                "precision": options.precision,
                "workspace_mib": options.workspace_mib,
                "optimization_level": options.optimization_level,
                "progress": options.progress,
            },
        )
        return blob_format.write(description, graph if keep_onnx else None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def store_initializers(partition: onnx_export.OnnxPartition, named: NamedDataSink) -> tuple[blob_format.OnnxTensor, ...]:
    """Each initializer of the partition's external-data file as a weight entry: the partition's own constant when
    the initializer holds exactly its bytes (the entry every other backend storing that weight shares, read in place
    when memory-mapped), else the initializer's bytes (a weight the export changed: quantized planes)."""
    import torch
    from etsdk.backend import WEIGHTS_NAMESPACE

    assert partition.weights_path is not None
    stored = []
    with partition.weights_path.open("rb") as f:
        for name, offset, nbytes in partition.external:
            source = partition.constants.get(name)
            if source is not None and source.numel() * source.element_size() == nbytes:  # a candidate: compare
                digest = hashlib.sha256()
                for start in range(0, nbytes, _CHUNK):
                    digest.update(os.pread(f.fileno(), min(_CHUNK, nbytes - start), offset + start))
                same = named.weight_key(source) == WEIGHTS_NAMESPACE + digest.hexdigest()
            else:
                same = False
            if same:
                key = named.add_weight(source)
            else:
                data = bytearray(nbytes)
                f.seek(offset)
                if f.readinto(data) != nbytes:
                    raise ExportError(f"the ONNX weights file ends inside initializer '{name}' ({nbytes} bytes at {offset})")
                key = named.add_weight(torch.frombuffer(data, dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8))
                del data
            stored.append(blob_format.OnnxTensor(name, offset, nbytes, key))
    return tuple(stored)


class _WriterSink:
    """Files handed to the core's named data: moved out of the work directory, deleted once the program is written."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def add_file(self, path: Path, sha256: str) -> str:
        fd, kept = tempfile.mkstemp(prefix="etsdk-tensorrt-", suffix=f"-{path.name}")
        os.close(fd)
        os.replace(path, kept)
        return str(self.writer.add_file(kept, sha256=sha256, cleanup=True, alignment=256))

    def add_weight(self, tensor: Any) -> str:
        return str(self.writer.add_weight(tensor))

    def weight_key(self, tensor: Any) -> str:
        return str(self.writer.weight_key(tensor))


def preprocess(partition: Any) -> bytes:
    """Plugin API: ``preprocess(partition) -> payload``."""
    return serialize(
        partition.program, partition.signature, partition.compile_specs, _WriterSink(partition.named_data), partition.progress
    )
