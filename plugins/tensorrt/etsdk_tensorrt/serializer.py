"""Preprocess: partition -> ONNX -> (engine) -> blob, with the large parts in named data.

:func:`serialize` is the whole export side and takes plain inputs (the
partition's edge ExportedProgram, its delegate signature, the compile specs and
a named-data sink); :func:`preprocess` is the plugin API's entry point.

* The ONNX graph goes into the blob; its weights (an external-data file) and
  the serialized engine go to named data, streamed from files, so neither is
  ever held whole in memory by etsdk and ``external_data`` puts them in a
  ``.ptd``.
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
            serialized = engine.build(trt, partition.model_path, options, shapes, say=say, error=ExportError)
            plan = workdir / "engine.plan"
            with plan.open("wb") as f:
                f.write(serialized)
            del serialized
            digest, size = sha256_file(plan), plan.stat().st_size
            data = blob_format.NamedBytes(named.add_file(plan, digest), size, digest)
            engine_record = blob_format.EngineRecord(
                data, str(trt.__version__), device.compute_capability(), options.precision
            )
        keep_onnx = engine_record is None or options.keep_onnx
        weights = None
        if keep_onnx and partition.weights_path is not None:
            digest, size = sha256_file(partition.weights_path), partition.weights_path.stat().st_size
            weights = blob_format.NamedBytes(named.add_file(partition.weights_path, digest), size, digest)
        onnx_record = blob_format.OnnxRecord(
            onnx_export.OPSET, hashlib.sha256(graph).hexdigest(), weights, partition.weights_location
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


class _WriterSink:
    """Files handed to the core's named data: moved out of the work directory, deleted once the program is written."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def add_file(self, path: Path, sha256: str) -> str:
        fd, kept = tempfile.mkstemp(prefix="etsdk-tensorrt-", suffix=f"-{path.name}")
        os.close(fd)
        os.replace(path, kept)
        return str(self.writer.add_file(kept, sha256=sha256, cleanup=True, alignment=256))


def preprocess(partition: Any) -> bytes:
    """Plugin API: ``preprocess(partition) -> payload``."""
    return serialize(
        partition.program, partition.signature, partition.compile_specs, _WriterSink(partition.named_data), partition.progress
    )
