"""Export side: lower a model's methods to plugin backends and write ``.pte`` / ``.ptd``.

ExecuTorch finds a backend's ``preprocess`` by the *class name* of a
``BackendDetails`` subclass equal to the backend id. For each plugin backend
used, etsdk creates that class once per process (kept referenced here) and
forwards ``preprocess`` to the plugin's serializer, wrapping what it returns
with the delegate's signature (:mod:`etsdk.signature`): plugins never subclass
ExecuTorch internals themselves.

State (KV caches, counters) is declared, never inferred: each method maps the
module buffers that hold state to state identities of the contract
(``MethodSource(state={"layers.0.k_cache": "k0"})``). Those buffers are tagged
into the delegate that uses them, so they leave the top-level program (no
planning, no copy-back, no constant freezing); the delegate binds the session's
storage at run time. A mutated buffer that is not declared is an error.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from etsdk.dtypes import dtype_name as _dtype_name
from etsdk.errors import ExportError

__all__ = ["Lowered", "MethodSource", "check_output_path", "lower"]

_details_lock = threading.Lock()
_details_classes: dict[str, type] = {}
_progress_state = threading.local()  # (quiet, started) of the lower() call running on this thread


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
            from etsdk.signature import DelegateSignature, wrap_blob

            signature = DelegateSignature.from_edge_program(edge_program, compile_specs)
            quiet, started = getattr(_progress_state, "value", (True, 0.0))
            nodes = sum(1 for n in edge_program.graph.nodes if n.op == "call_function")
            _progress(f"compiling a {nodes}-operator partition with {backend_id}", quiet, started)
            result = get_backend(backend_id).preprocess(edge_program, compile_specs)
            if not isinstance(result, PreprocessResult):
                raise ExportError(
                    f"backend '{backend_id}' preprocess returned {type(result).__name__}, expected PreprocessResult"
                )
            result.processed_bytes, _ = wrap_blob(bytes(result.processed_bytes), signature)
            return result

        def copy_for_preprocess(cls: type, edge_program: Any, compile_specs: list[Any]) -> Any:
            # ExecuTorch deep-copies every partition before preprocess; copying the
            # weights too would hold a second model-sized copy during export. Plugins
            # may change the graph they are given but never its tensors, so the copy
            # shares them.
            import copy

            import torch

            tensors = [*edge_program.state_dict.values(), *edge_program.constants.values()]
            memo = {id(t): t for t in tensors if isinstance(t, torch.Tensor)}
            return copy.deepcopy(edge_program, memo)

        cls = type(
            backend_id,
            (BackendDetails,),
            {
                "preprocess": staticmethod(preprocess),
                "copy_exported_program_for_preprocess": classmethod(copy_for_preprocess),
                "__module__": __name__,
                "__doc__": f"etsdk backend {backend_id}",
            },
        )
        _details_classes[backend_id] = cls
        return cls


@dataclass(frozen=True, slots=True)
class MethodSource:
    """One method to export.

    ``backends``: ids to lower to, each claiming what it supports, in order.
    ``state``: module buffer FQN -> state identity of the contract, for every
    buffer that holds state (read or written). ``example_kwargs`` are passed by
    name (the engine binds them after the positional inputs, in this order).
    ``strict``: use strict ``torch.export`` (Hugging Face static caches need it).
    """

    module: Any
    example_inputs: tuple[Any, ...]
    backends: tuple[str, ...] = ()
    partitioner_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    strict: bool = False
    state: Mapping[str, str] = field(default_factory=dict)
    example_kwargs: Mapping[str, Any] = field(default_factory=dict)


class _StateTagging:
    """Wraps a plugin partitioner: tags declared state buffers into the delegate that uses them."""

    def __init__(self, inner: Any, state: Mapping[str, str], method: str) -> None:
        from executorch.exir.backend.partitioner import Partitioner

        self.inner = inner
        self.state = dict(state)
        self.method = method
        # ExecuTorch checks isinstance(partitioner, Partitioner); build a subclass instance lazily.
        wrapper = self

        class _Wrapped(Partitioner):
            def partition(self, exported_program: Any) -> Any:
                return wrapper.partition(exported_program)

            def ops_to_not_decompose(self, ep: Any) -> Any:
                return inner.ops_to_not_decompose(ep)

        self.partitioner = _Wrapped()

    def partition(self, exported_program: Any) -> Any:
        from executorch.exir.backend.compile_spec_schema import CompileSpec
        from executorch.exir.backend.partitioner import DelegationSpec

        from etsdk.signature import STATE_COMPILE_SPEC

        result = self.inner.partition(exported_program)
        buffers = exported_program.graph_signature.inputs_to_buffers
        per_tag: dict[str, dict[str, str]] = {}
        for node in exported_program.graph.nodes:
            if node.op != "placeholder" or buffers.get(node.name) not in self.state:
                continue
            fqn = buffers[node.name]
            tags = {user.meta.get("delegation_tag") for user in node.users}
            if not tags:
                continue
            if len(tags) != 1 or None in tags or next(iter(tags)) not in result.partition_tags:
                outside = sorted(u.name for u in node.users if u.meta.get("delegation_tag") is None)
                raise ExportError(
                    f"method '{self.method}': state '{self.state[fqn]}' (buffer '{fqn}') must be used by exactly one "
                    f"delegate of this backend; used outside it by {outside or 'another delegate'}"
                )
            tag = next(iter(tags))
            node.meta["delegation_tag"] = tag
            per_tag.setdefault(tag, {})[fqn] = self.state[fqn]
        for tag, mapping in per_tag.items():
            old = result.partition_tags[tag]
            specs = [cs for cs in old.compile_specs if cs.key != STATE_COMPILE_SPEC]
            specs.append(CompileSpec(STATE_COMPILE_SPEC, json.dumps(mapping, sort_keys=True).encode()))
            result.partition_tags[tag] = DelegationSpec(old.backend_id, specs)
        return result


def _progress(stage: str, quiet: bool, started: float) -> None:
    if not quiet:
        print(f"etsdk: {stage} ({time.perf_counter() - started:.1f}s)", file=sys.stderr, flush=True)


@dataclass
class Lowered:
    """An ExecuTorch program ready to be written."""

    manager: Any  # ExecutorchProgramManager
    quiet: bool = True

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
        """Write the ``.pte`` and every ``.ptd`` beside it, atomically; returns the paths written.

        The paths are checked first (:func:`check_output_path`). Every file is
        written to a temporary file in the target directory and flushed to
        disk; only when all are complete are they renamed into place (each
        ``.ptd``, then the ``.pte``). A failure (a full disk, a kill) leaves the
        previous files byte-identical and no partial file under the final
        names. A program already loaded from the old files keeps running on
        them: a rename never changes an open file.
        """
        path = check_output_path(path, self.data_files)
        started = time.perf_counter()
        _progress(f"writing {path}", self.quiet, started)
        written = [path] + [path.parent / f"{name}.ptd" for name in self.data_files]
        staging = _Staging(path.parent)
        try:
            with staging.file(path) as f:
                self.manager.write_to_file(f)
            if self.data_files:
                _progress(f"writing {', '.join(n + '.ptd' for n in self.data_files)}", self.quiet, started)
                self.manager.write_tensor_data_to_file(str(staging.directory()))
                for name in self.data_files:
                    staging.adopt(staging.directory() / f"{name}.ptd", path.parent / f"{name}.ptd")
            staging.commit()
        except OSError as exc:
            staging.abort()
            raise ExportError(
                f"writing {path} failed: {exc.strerror or exc}; "
                f"{'the previous files are unchanged' if any(p.exists() for p in written) else 'nothing was written'}"
            ) from None
        except BaseException:
            staging.abort()
            raise
        _progress("written", self.quiet, started)
        return written


def lower(
    methods: Mapping[str, MethodSource] | None = None,
    *,
    module: Any = None,
    example_inputs: Sequence[Any] | None = None,
    backend: str | Sequence[str] | None = None,
    partitioner_options: Mapping[str, Any] | None = None,
    contract: Any = None,
    quiet: bool = True,
) -> Lowered:
    """Export and lower a model.

    Either one method (``module``, ``example_inputs``, ``backend``: exported as
    ``forward``) or several (``methods``: name -> :class:`MethodSource`), each
    with its own backends (for example prefill on one backend, decode on
    another). ``contract``: a bound :class:`etsdk.contract.Contract` record the
    methods follow; it is checked here and embedded in the program. Progress
    goes to stderr unless ``quiet``.
    """
    import torch
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower

    from etsdk.registry import edge_transform_passes, get_backend
    from etsdk.signature import PROGRAM_RECORD_KEY, ProgramRecord, check_binding_order
    from etsdk.tracing import weights_shared_while_tracing

    if methods is None:
        if module is None or example_inputs is None:
            raise ExportError("lower() needs either methods= or module= and example_inputs=")
        backends = (backend,) if isinstance(backend, str) else tuple(backend or ())
        options = {b: dict(partitioner_options or {}) for b in backends}
        methods = {"forward": MethodSource(module, tuple(example_inputs), backends, options)}
    if contract is not None and not contract.is_bound:
        raise ExportError(f"contract '{contract.name}' must be bound to sizes (contract.bind(...)) before export")
    started = time.perf_counter()
    exported: dict[str, Any] = {}
    partitioners: dict[str, list[Any]] = {}
    passes: list[Any] = []
    state_devices: set[str] = set()  # where the partitioners that take state want its storage
    for name, source in methods.items():
        _progress(f"tracing '{name}'", quiet, started)
        try:
            with weights_shared_while_tracing():
                exported[name] = torch.export.export(
                    source.module,
                    tuple(source.example_inputs),
                    kwargs=dict(source.example_kwargs) or None,
                    strict=source.strict,
                )
        except Exception as exc:
            raise ExportError(f"torch.export of method '{name}' failed: {type(exc).__name__}: {exc}") from exc
        _check_state_declarations(name, source, exported[name], contract)
        if contract is not None:
            _check_engine_io(name, exported[name], contract)
        partitioners[name] = []
        for backend_id in source.backends:
            spec = get_backend(backend_id, require_available=True)
            backend_details_class(backend_id)
            inner = spec.partitioner(**dict(source.partitioner_options.get(backend_id, {})))
            partitioners[name].append(_StateTagging(inner, source.state, name).partitioner if source.state else inner)
            if source.state:
                state_devices.add(str(getattr(inner, "state_device", "cpu")))
            for p in edge_transform_passes(backend_id):
                if p not in passes:
                    passes.append(p)
    if contract is not None:
        missing = [m.name for m in contract.methods if m.name not in methods]
        if missing:
            raise ExportError(f"contract '{contract.name}' needs method(s) {', '.join(missing)} that were not given")
    if contract is not None and contract.states:
        contract = _with_state_device(contract, state_devices)
    _progress("lowering to edge and partitioning", quiet, started)
    _progress_state.value = (quiet, started)
    try:
        edge = to_edge_transform_and_lower(
            exported,
            partitioner=partitioners,
            transform_passes=passes or None,
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        )
    finally:
        _progress_state.value = (True, 0.0)
    _progress("checking binding order and state placement", quiet, started)
    records = {}
    for name, source in methods.items():
        lowered_program = edge.exported_program(name)
        # torch.export may keep in-place ops un-functionalised; after edge lowering
        # every mutation left at the top level is visible here.
        undeclared = sorted(set(lowered_program.graph_signature.buffers_to_mutate.values()) - set(source.state))
        if undeclared:
            raise ExportError(
                f"method '{name}' mutates buffer(s) {', '.join(undeclared)} that are not declared as state; map each "
                "to a state identity of a contract: MethodSource(state={fqn: identity})"
            )
        left = sorted(set(source.state) & set(lowered_program.graph_signature.buffers))
        if left:
            raise ExportError(
                f"method '{name}': state buffer(s) {', '.join(left)} stayed in the top-level program; every op "
                "using declared state must be claimed by one delegate"
            )
        records[name] = check_binding_order(name, lowered_program.graph_module, _details_classes)
    record = ProgramRecord(
        methods=records,
        contract=contract,
        producer=f"etsdk {_version()}",
        state_fqns={name: dict(source.state) for name, source in methods.items() if source.state},
    )
    store = getattr(edge, "_named_data_store", None)
    if store is None:
        raise ExportError("this executorch release has no program-level named data store; etsdk needs executorch==1.5.1")
    store.add_named_data(PROGRAM_RECORD_KEY, record.to_bytes())
    _progress("emitting the ExecuTorch program", quiet, started)
    manager = edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=True))
    _progress("ready to write", quiet, started)
    return Lowered(manager, quiet=quiet)


def _with_state_device(contract: Any, devices: set[str]) -> Any:
    """The record with state stored where the backends taking it run (a partitioner's ``state_device``)."""
    if len(devices) > 1:
        raise ExportError(
            f"contract '{contract.name}': the backends sharing its state want it on different devices "
            f"({', '.join(sorted(devices))}); one session storage cannot live on all of them"
        )
    device = next(iter(devices), "cpu")
    return contract if device == "cpu" else contract.with_state_device(device)


def _version() -> str:
    from etsdk import __version__

    return __version__



def _check_state_declarations(method: str, source: MethodSource, exported: Any, contract: Any) -> None:
    """Declared state must be real buffers of the right shape, dtype and initial value; mutation must be declared."""
    signature = exported.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    undeclared = sorted(mutated - set(source.state))
    if undeclared:
        raise ExportError(
            f"method '{method}' mutates buffer(s) {', '.join(undeclared)} that are not declared as state; map each "
            "to a state identity: MethodSource(state={fqn: identity})"
        )
    if source.state and contract is None:
        raise ExportError(f"method '{method}' declares state but no contract was given; state is described by a contract")
    buffers = dict(exported.named_buffers())
    for fqn, identity in source.state.items():
        if fqn not in buffers:
            raise ExportError(
                f"method '{method}': state '{identity}' names buffer '{fqn}', which the module does not have "
                f"(buffers: {', '.join(sorted(buffers)) or 'none'})"
            )
        spec = contract.state(identity)
        tensor = buffers[fqn]
        found = (_dtype_name(tensor.dtype), tuple(tensor.shape))
        if found != (spec.dtype, tuple(spec.shape)):
            raise ExportError(
                f"method '{method}': buffer '{fqn}' is {found[0]} {list(found[1])} but state '{identity}' is declared "
                f"{spec.dtype} {list(spec.shape)}"
            )
        if tensor.numel() and not bool((tensor == spec.initial).all()):
            raise ExportError(
                f"method '{method}': buffer '{fqn}' holds values other than state '{identity}''s declared initial "
                f"value {spec.initial}; reset the module's buffers before export (the program starts from the "
                "declared initial value, not from the buffer's contents)"
            )
    method_spec = contract.method(method) if contract is not None else None
    if method_spec is not None:
        used = set(method_spec.states_read) | set(method_spec.states_written)
        unmapped = sorted(used - set(source.state.values()))
        if unmapped:
            raise ExportError(
                f"method '{method}' uses state(s) {', '.join(unmapped)} per contract '{contract.name}' but maps no "
                "buffer to them (MethodSource(state={fqn: identity}))"
            )


def _check_engine_io(method: str, exported: Any, contract: Any) -> None:
    """The exported method's user inputs and outputs must be the contract's engine-bound ones, in order."""
    spec = contract.method(method)
    placeholders = {n.name: n for n in exported.graph.nodes if n.op == "placeholder"}
    output_node = next(n for n in exported.graph.nodes if n.op == "output")
    produced = dict(zip([s.arg.name for s in exported.graph_signature.output_specs], output_node.args[0]))
    sides = (
        ("input", spec.engine_inputs, [placeholders[n] for n in exported.graph_signature.user_inputs]),
        ("output", spec.engine_outputs, [produced[n] for n in exported.graph_signature.user_outputs]),
    )
    for side, wanted, nodes in sides:
        if len(wanted) != len(nodes):
            raise ExportError(
                f"method '{method}': contract '{contract.name}' binds {len(wanted)} {side}(s) through the engine "
                f"({', '.join(w.name for w in wanted)}), the module has {len(nodes)}"
            )
        for index, (want, node) in enumerate(zip(wanted, nodes)):
            value = node.meta.get("val")
            found = (_dtype_name(value.dtype), tuple(value.shape)) if value is not None else None
            if found != (want.dtype, tuple(want.shape)):
                raise ExportError(
                    f"method '{method}' {side} {index} ('{want.name}', role {want.role.value}): contract expects "
                    f"{want.dtype} {list(want.shape)}, module has {found[0] + ' ' + str(list(found[1])) if found else 'no tensor'}"
                )


# ----------------------------------------------------------------------------- writing files


def check_output_path(path: str | Path, data_files: Sequence[str] = ()) -> Path:
    """Check that ``path`` (a ``.pte``) and ``<name>.ptd`` beside it can be written; return ``path``.

    Raises a one-line :class:`ExportError` for a directory in the way, a file
    where a directory should be, or a place this process may not write, before
    any work is done (``etsdk export`` calls it before loading the model).
    """
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise ExportError(f"cannot write the program to {str(path)!r}: it names a directory, not a file")
    targets = [path] + [path.parent / f"{name}.ptd" for name in data_files]
    for target in targets:
        if target.is_dir():
            raise ExportError(f"cannot write {target}: it is a directory")
        if target.exists() and not target.is_file():
            raise ExportError(f"cannot write {target}: it exists and is not a regular file")
    ancestor = path.parent if str(path.parent) else Path(".")
    while not ancestor.exists():
        if ancestor.is_symlink():
            raise ExportError(f"cannot write {path}: {ancestor} is a broken symbolic link")
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ExportError(f"cannot write {path}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write {path}: no permission to write in {ancestor}")
    return path


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


class _Staging:
    """Temporary files beside their targets, renamed into place together by :meth:`commit`."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.parent = directory
        self._dir: Path | None = None
        self._files: list[tuple[Path, Path]] = []  # (temporary, target)

    def directory(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=".etsdk-", suffix=".tmp", dir=self.parent))
        return self._dir

    @contextlib.contextmanager
    def file(self, target: Path) -> Iterator[BinaryIO]:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=self.parent)
        self._files.append((Path(name), target))
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())

    def adopt(self, written: Path, target: Path) -> None:
        """A file something else wrote into :meth:`directory`: flushed here, renamed at commit."""
        fd = os.open(written, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._files.append((written, target))

    def commit(self) -> None:
        mode = 0o666 & ~_umask()
        for temporary, _ in self._files:
            os.chmod(temporary, mode)
        # data files first: a reader never sees a new .pte next to old data it does not name
        for temporary, target in sorted(self._files, key=lambda item: item[1].suffix == ".pte"):
            os.replace(temporary, target)
        self._files.clear()
        self._sync_directory()
        self.abort()

    def _sync_directory(self) -> None:
        try:
            fd = os.open(self.parent, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def abort(self) -> None:
        for temporary, _ in self._files:
            temporary.unlink(missing_ok=True)
        self._files.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
