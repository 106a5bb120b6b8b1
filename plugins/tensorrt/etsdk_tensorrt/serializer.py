"""Preprocess: partition -> ONNX -> (engine) -> blob, with the large parts in named data.

:func:`serialize` is the whole export side and takes plain inputs (the
partition's edge ExportedProgram, its delegate signature, the compile specs and
a named-data sink); :func:`preprocess` adapts it to plugin API 1.

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
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from etsdk import ExportError

from etsdk_tensorrt import BACKEND_ID, blob_format, device, engine, onnx_export
from etsdk_tensorrt.options import EXTERNAL_DATA_SPEC, BuildOptions

_CHUNK = 8 << 20


class NamedDataSink(Protocol):
    def add_file(self, path: Path, sha256: str) -> str:
        """Store the file's bytes as named data; return its key. The file may be removed once written."""
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


def serialize(program: Any, signature: Any, specs: Mapping[str, bytes], named: NamedDataSink) -> bytes:
    """The blob payload of one partition."""
    options = BuildOptions.from_compile_specs(specs)
    say = engine.progress_printer(options.progress)
    workdir = Path(tempfile.mkdtemp(prefix="etsdk-tensorrt-"))
    try:
        partition = onnx_export.export(program, signature, workdir)
        graph = partition.model_path.read_bytes()
        weights = None
        if partition.weights_path is not None:
            digest = sha256_file(partition.weights_path)
            key = named.add_file(partition.weights_path, digest)
            weights = blob_format.NamedBytes(key, partition.weights_path.stat().st_size, digest)
        onnx_record = blob_format.OnnxRecord(
            onnx_export.OPSET, hashlib.sha256(graph).hexdigest(), weights, partition.weights_location
        )
        engine_record = None
        if build_at_export(options):
            trt = engine.import_tensorrt()
            shapes = {t.name: t.shape for t in partition.inputs} | {s.input: s.shape for s in partition.states}
            serialized = engine.build(trt, partition.model_path, options, shapes, say=say, error=ExportError)
            plan = workdir / "engine.plan"
            with plan.open("wb") as f:
                f.write(serialized)
            del serialized
            digest = sha256_file(plan)
            data = blob_format.NamedBytes(named.add_file(plan, digest), plan.stat().st_size, digest)
            engine_record = blob_format.EngineRecord(
                data, str(trt.__version__), device.compute_capability(), options.precision
            )
        keep_onnx = engine_record is None or options.keep_onnx
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
        _release(workdir)


# ----------------------------------------------------------------------------- plugin API 1


_held: dict[Path, int] = {}


def _hold(workdir: Path, owner: object) -> None:
    """Keep ``workdir`` until ``owner`` (named data still to be written) is collected."""
    _held[workdir] = _held.get(workdir, 0) + 1
    weakref.finalize(owner, _drop, workdir)


def _drop(workdir: Path) -> None:
    _held[workdir] -= 1
    if _held[workdir] == 0:
        del _held[workdir]
        shutil.rmtree(workdir, ignore_errors=True)


def _release(workdir: Path) -> None:
    if workdir not in _held:
        shutil.rmtree(workdir, ignore_errors=True)


class _StoreSink:
    """Named data through ExecuTorch's NamedDataStore (plugin API 1): files stay until the program is written."""

    def __init__(self, store: Any, external: str | None) -> None:
        self.store = store
        self.external = external

    def add_file(self, path: Path, sha256: str) -> str:
        from executorch.exir._serialize._cord import FileBackedData

        key = f"{BACKEND_ID}/{sha256}"
        data = FileBackedData(str(path), cleanup=False, sha256=bytes.fromhex(sha256))
        self.store.add_named_data(key, data, alignment=256, external_tag=self.external)
        _hold(path.parent, data)
        return key


def preprocess(edge_program: Any, compile_specs: list[Any]) -> Any:
    """Plugin API 1: ``preprocess(edge_program, compile_specs) -> PreprocessResult``."""
    from etsdk.signature import DelegateSignature
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir.backend.backend_details import PreprocessResult

    signature = DelegateSignature.from_edge_program(edge_program, compile_specs)
    specs = {spec.key: bytes(spec.value) for spec in compile_specs}
    external = specs.get(EXTERNAL_DATA_SPEC)
    store = NamedDataStore()
    payload = serialize(edge_program, signature, specs, _StoreSink(store, external.decode() if external else None))
    return PreprocessResult(processed_bytes=payload, data_store_output=store.get_named_data_store_output())
