"""Export side: lower a model's methods to plugin backends and write ``.pte`` / ``.ptd``.

ExecuTorch finds a backend's ``preprocess`` by the *class name* of a
``BackendDetails`` subclass equal to the backend id. For each plugin backend
used, etsdk creates that class once per process (kept referenced here) and
forwards ``preprocess`` to the plugin's serializer: plugins never subclass
ExecuTorch internals themselves.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etsdk.errors import ExportError

__all__ = ["Lowered", "MethodSource", "lower"]

_details_lock = threading.Lock()
_details_classes: dict[str, type] = {}


def backend_details_class(backend_id: str) -> type:
    """The ``BackendDetails`` subclass ExecuTorch will look up for ``backend_id``."""
    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

    with _details_lock:
        found = _details_classes.get(backend_id)
        if found is not None:
            return found
        for existing in BackendDetails.__subclasses__():
            if existing.__name__ == backend_id:
                raise ExportError(
                    f"backend id '{backend_id}' is already defined by {existing.__module__}.{existing.__qualname__}; "
                    "an etsdk plugin cannot reuse a backend id ExecuTorch already has"
                )

        def preprocess(edge_program: Any, compile_specs: list[Any]) -> PreprocessResult:
            from etsdk.registry import get_backend

            result = get_backend(backend_id).preprocess(edge_program, compile_specs)
            if not isinstance(result, PreprocessResult):
                raise ExportError(
                    f"backend '{backend_id}' preprocess returned {type(result).__name__}, expected PreprocessResult"
                )
            return result

        cls = type(
            backend_id,
            (BackendDetails,),
            {"preprocess": staticmethod(preprocess), "__module__": __name__, "__doc__": f"etsdk backend {backend_id}"},
        )
        _details_classes[backend_id] = cls
        return cls


@dataclass(frozen=True, slots=True)
class MethodSource:
    """One method to export: a module, example inputs, and the backends to lower to (in order)."""

    module: Any
    example_inputs: tuple[Any, ...]
    backends: tuple[str, ...] = ()
    partitioner_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    strict: bool = False


def _progress(stage: str, quiet: bool, started: float) -> None:
    if not quiet:
        print(f"etsdk: {stage} ({time.perf_counter() - started:.1f}s)", file=sys.stderr, flush=True)


@dataclass
class Lowered:
    """An ExecuTorch program ready to be written."""

    manager: Any  # ExecutorchProgramManager

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(sorted(self.manager.methods))

    @property
    def data_files(self) -> tuple[str, ...]:
        """Names (without ``.ptd``) of the external data files this program needs."""
        # ExecutorchProgramManager keeps them as cords; reading its private map
        # avoids the bytes copy its public accessors would make.
        return tuple(sorted(getattr(self.manager, "_tensor_data", None) or {}))

    def save(self, path: str | Path) -> list[Path]:
        """Write the ``.pte`` and every ``.ptd`` beside it; returns the paths written."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            self.manager.write_to_file(f)
        written = [path]
        if self.data_files:
            self.manager.write_tensor_data_to_file(str(path.parent))
            written += [path.parent / f"{name}.ptd" for name in self.data_files]
        return written


def lower(
    methods: Mapping[str, MethodSource] | None = None,
    *,
    module: Any = None,
    example_inputs: Sequence[Any] | None = None,
    backend: str | Sequence[str] | None = None,
    partitioner_options: Mapping[str, Any] | None = None,
    quiet: bool = True,
) -> Lowered:
    """Export and lower a model.

    Either one method (``module``, ``example_inputs``, ``backend``: exported as
    ``forward``) or several (``methods``: name -> :class:`MethodSource`), each
    with its own backends (for example prefill on one backend, decode on
    another). ``backend`` may list several ids: each claims what it supports,
    in order. Progress goes to stderr unless ``quiet``.
    """
    import torch
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower

    from etsdk.registry import edge_transform_passes, get_backend

    if methods is None:
        if module is None or example_inputs is None:
            raise ExportError("lower() needs either methods= or module= and example_inputs=")
        backends = (backend,) if isinstance(backend, str) else tuple(backend or ())
        options = {b: dict(partitioner_options or {}) for b in backends}
        methods = {"forward": MethodSource(module, tuple(example_inputs), backends, options)}
    started = time.perf_counter()
    exported: dict[str, Any] = {}
    partitioners: dict[str, list[Any]] = {}
    passes: list[Any] = []
    for name, source in methods.items():
        _progress(f"tracing '{name}'", quiet, started)
        try:
            exported[name] = torch.export.export(source.module, tuple(source.example_inputs), strict=source.strict)
        except Exception as exc:
            raise ExportError(f"torch.export of method '{name}' failed: {type(exc).__name__}: {exc}") from exc
        partitioners[name] = []
        for backend_id in source.backends:
            spec = get_backend(backend_id)
            backend_details_class(backend_id)
            partitioners[name].append(spec.partitioner(**dict(source.partitioner_options.get(backend_id, {}))))
            for p in edge_transform_passes(backend_id):
                if p not in passes:
                    passes.append(p)
    _progress("lowering to edge and partitioning", quiet, started)
    edge = to_edge_transform_and_lower(
        exported,
        partitioner=partitioners,
        transform_passes=passes or None,
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )
    _progress("emitting the ExecuTorch program", quiet, started)
    manager = edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=True))
    _progress("done", quiet, started)
    return Lowered(manager)
