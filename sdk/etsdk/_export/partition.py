"""What a backend's ``preprocess`` receives: one delegated partition, its signature, and a named-data writer.

A :class:`Partition` is the partition's edge ``ExportedProgram`` seen through
etsdk's contract: its engine inputs and outputs in binding order (the
:class:`~etsdk._state.signature.DelegateSignature`), its constants (parameters,
non-state buffers, lifted tensor constants: weights to store, never state), the
state it binds and the values that update that state. A backend never reads
``graph_signature`` kinds itself, and never imports ExecuTorch's private
``NamedDataStore``: constants and large files go through :class:`NamedDataWriter`,
whose keys are content-addressed and verifiable.
"""

from __future__ import annotations

import functools
import hashlib
import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etsdk._format.mapped_pages import CHUNK
from etsdk._state.signature import DelegateSignature, StateBinding
from etsdk.errors import ExportError

__all__ = ["Constant", "NamedDataWriter", "Partition", "StateUpdate", "StoredWeights"]


#: Weights of this many bytes or more are spooled through a temporary file by ``add_weight``; smaller ones are
#: held as bytes (a temporary file each would cost more than it saves).
SPOOL_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Constant:
    """A tensor the partition reads that is part of the model: a parameter, buffer or lifted constant.

    ``placeholder``: the partition's input node name; ``target``: the module FQN
    (or lifted-constant name); ``tensor``: the value (shared with the exported
    program: read it, never modify it).
    """

    placeholder: str
    target: str
    tensor: Any


@dataclass(frozen=True, slots=True)
class StateUpdate:
    """A state the partition writes: the binding, and the graph node computing the new value.

    Export functionalises in-place writes (``index_copy_`` becomes ``index_put``
    plus this update); the runtime binding turns it back into an in-place update
    of the session's storage.
    """

    #: The state written (identity, buffer, dtype, shape).
    binding: StateBinding
    #: The ``torch.fx.Node`` computing the state's new value (a whole new tensor in the functional graph).
    value: Any


@dataclass(frozen=True, slots=True)
class _Stored:
    alive: Callable[[], Any]  # the tensor (or storage) stored, None once its memory may have been freed
    version: int  # the tensor's in-place write counter when it was stored
    key: str
    data: Any  # bytes, or executorch's FileBackedData over the spooled or mapped bytes
    fast: str | None


def memory_of(tensor: Any) -> tuple[Any, ...] | None:
    """Where ``tensor``'s bytes are: device, storage address, offset, dtype, shape, strides (None for a tensor
    without storage, such as a fake one)."""
    try:
        storage = tensor.untyped_storage().data_ptr()
        return (str(tensor.device), storage, tensor.storage_offset(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def mapped_range(data: Any) -> Any:
    """The file bytes a contiguous CPU tensor ``data`` is memory-mapped from (a :class:`FileRange`), when every page
    of it still holds the file's bytes: such a weight is copied from its file when the program is written instead
    of spooled. None otherwise (anonymous memory, or a page changed in memory: copy-on-write)."""
    from etsdk._format.mapped_pages import file_range, unchanged_file_pages

    size = data.numel() * data.element_size()
    if data.device.type != "cpu" or not data.is_contiguous() or size == 0:
        return None
    where = file_range(data.data_ptr(), size)
    return where if where is not None and unchanged_file_pages(data.data_ptr(), size) else None


def release_mapped_weights(tensors: Iterable[Any]) -> int:
    """Hand back the pages of each memory-mapped CPU tensor of ``tensors`` (a checkpoint's weight) that this process
    has read, where every one still holds the file's bytes; returns the size of the tensors whose pages were
    handed back (whole pages only: a partial page at either end stays).

    Call it after reading such weights outside etsdk (a converter writing them into a file of its own, such as
    ``torch.onnx.export``'s external data): read pages of a mapped file stay in the process until handed back, so
    a model's worth would otherwise count in the export's resident memory. They stay in the page cache, and the
    mapping reads them again when touched; anonymous memory and pages changed in memory are left as they are.
    A value that is not a tensor is an :class:`~etsdk.errors.ExportError` naming its type."""
    import torch

    from etsdk._format.mapped_pages import release_file_pages

    released = 0
    seen: set[int] = set()
    given = list(tensors)
    for tensor in given:  # every value checked before any page is handed back
        if not isinstance(tensor, torch.Tensor):
            raise ExportError(f"release_mapped_weights takes tensors, found {type(tensor).__name__}")
    for tensor in given:
        data = tensor.detach()
        if data.device.type != "cpu" or not data.is_contiguous() or data.data_ptr() in seen:
            continue
        seen.add(data.data_ptr())
        nbytes = data.numel() * data.element_size()
        if nbytes and release_file_pages(data.data_ptr(), nbytes):
            released += nbytes
    return released


def spooled(tensor: Any) -> bool:
    """Whether :meth:`NamedDataWriter.add_weight` keeps ``tensor`` in a temporary file until the program is
    written: a weight of :data:`SPOOL_BYTES` or more that is not :func:`mapped_range`."""
    return tensor.numel() * tensor.element_size() >= SPOOL_BYTES and mapped_range(tensor.detach()) is None


#: The key prefix of :meth:`NamedDataWriter.add_weight`'s entries (``weights/<sha256 hex>``), whoever stores them.
WEIGHTS_NAMESPACE = "weights/"

#: How a spooled weight's temporary file is named: ``etsdk-weight-<pid>-<random>.bin``.
SPOOL_PREFIX = "etsdk-weight-"


@functools.cache
def _sweep_spool_folder(folder: str) -> None:
    """Once per process and folder: remove spooled weights that killed exports left there."""
    from etsdk._export.spill import remove_orphans

    remove_orphans(Path(folder), SPOOL_PREFIX)


def hash_through(view: memoryview, address: int, sink: Callable[[memoryview], Any] | None = None) -> tuple[Any, Any]:
    """SHA-256 and (when installed) BLAKE3 hashers fed ``view`` (the bytes at ``address``) in chunks, each chunk
    also given to ``sink``; a mapped file's pages are dropped from the process as they are read."""
    from etsdk._format.content_hash import fast_hasher
    from etsdk._format.mapped_pages import read_through

    digest = hashlib.sha256()
    fast = fast_hasher(view.nbytes)

    def consume(chunk: memoryview) -> None:
        digest.update(chunk)
        if fast is not None:
            fast.update(chunk)
        if sink is not None:
            sink(chunk)

    read_through(view, address, consume)
    return digest, fast


class StoredWeights:
    """The weights one lowering has stored (and the memory-mapped ones it hashed for the model fingerprint), by the
    memory they were read from.

    Prefill and decode (and every backend of a mixed program) store the same weights: a weight met again is
    added under its key without being read, hashed or spooled a second time. An entry is used only while its
    memory cannot hold other bytes: the storage of a memory-mapped weight is kept (it costs no memory: its pages
    are dropped once read), any other is followed by a weak reference to the tensor first stored, whose storage
    must still be that memory; and only if the tensor met has not been written in place since (its version
    counter: a scratch tensor refilled with ``copy_`` is read again). Writes that bypass torch (through numpy or a
    raw pointer) are not seen: a backend must not change a tensor after storing it.
    """

    def __init__(self) -> None:
        self._by_memory: dict[tuple[Any, ...], _Stored] = {}

    def digest(self, tensor: Any) -> str:
        """SHA-256 hex of ``tensor``'s row-major bytes, for the model fingerprint. A memory-mapped weight that
        :meth:`NamedDataWriter.add_weight` would copy from its file is hashed with its BLAKE3 in the same read and
        remembered as that entry (what :meth:`find` gives ``add_weight``), so storing it reads it no more."""
        import torch

        from etsdk._export.file_range_data import FileRangeData
        from etsdk._format.fingerprint import _tensor_digest

        data = tensor.detach()
        memory = memory_of(tensor)
        where = mapped_range(data) if memory is not None and data.numel() * data.element_size() >= SPOOL_BYTES else None
        if memory is None or where is None:
            return _tensor_digest(tensor)
        found = self.find(memory, tensor)
        if found is not None:
            return found.key.removeprefix(WEIGHTS_NAMESPACE)
        sha, fast = hash_through(memoryview(data.reshape(-1).view(torch.uint8).numpy()), data.data_ptr())
        entry = FileRangeData(where, sha.digest())
        self.remember(memory, tensor, WEIGHTS_NAMESPACE + sha.hexdigest(), entry, fast and str(fast.hexdigest()), mapped=True)
        return sha.hexdigest()

    def find(self, memory: tuple[Any, ...], tensor: Any) -> _Stored | None:
        found = self._by_memory.get(memory)
        if found is None:
            return None
        held = found.alive()
        if held is None or held.untyped_storage().data_ptr() != memory[1] or found.version != tensor._version:
            del self._by_memory[memory]
            return None
        return found

    def remember(self, memory: tuple[Any, ...], tensor: Any, key: str, data: Any, fast: str | None, *, mapped: bool) -> None:
        if mapped:
            kept = tensor.detach()  # holds the storage (the mapping) alive
            self._by_memory[memory] = _Stored(lambda: kept, tensor._version, key, data, fast)
            return
        try:
            self._by_memory[memory] = _Stored(weakref.ref(tensor), tensor._version, key, data, fast)
        except TypeError:  # an object that takes no weak reference: not remembered, stored again next time
            pass


class NamedDataWriter:
    """Adds a partition's data to the program's named data (the ``.pte``, or the ``.ptd`` the export chose).

    Every key is ``"<namespace>/<sha256 hex of the bytes>"``: equal data is stored
    once, and ``etsdk verify`` can check every entry against its key. Nothing
    model-sized is held in memory: :meth:`add_file` streams a file the backend
    wrote.
    """

    def __init__(self, namespace: str, external: str | None = None, *, stored: StoredWeights | None = None) -> None:
        from executorch.exir._serialize._named_data_store import NamedDataStore

        self.namespace = namespace
        self.external = external
        self._stored = stored
        self._store = NamedDataStore()
        #: key -> BLAKE3 hex of its bytes (when ``blake3`` is installed): the program record keeps these, and
        #: every load checks each entry by them (etsdk._format.content_hash.check_entries)
        self.fast_digests: dict[str, str] = {}

    def _fast(self, key: str, data: Any) -> None:
        from etsdk._format.content_hash import fast_hasher

        hasher = fast_hasher(len(data) if hasattr(data, "__len__") else 0)
        if hasher is not None:
            hasher.update(data)
            self.fast_digests[key] = str(hasher.hexdigest())

    def _key(self, digest: str) -> str:
        return f"{self.namespace}/{digest}"

    def add_tensor(self, tensor: Any, *, alignment: int = 64) -> str:
        """Store ``tensor``'s bytes (contiguous); returns the key to read it back with ``NamedData.get_tensor``."""
        import torch

        data = tensor.detach().contiguous()
        flat = data.reshape(-1).view(torch.uint8).numpy().data if data.numel() else b""
        digest = hashlib.sha256(flat).hexdigest()
        key = self._key(digest)
        self._fast(key, flat)
        self._store.add_named_data(key, data, alignment=alignment, external_tag=self.external)
        return key

    def add_bytes(self, data: bytes | bytearray | memoryview, *, alignment: int = 64) -> str:
        """Store a copy of ``data``; returns its key ``"<backend id>/<sha256>"`` (``NamedData.get`` reads it back).

        Keys are content hashes, so equal bytes are stored once and ``etsdk verify`` can check them. For
        model-sized data prefer :meth:`add_file` (no copy in memory).
        """
        payload = bytes(data)
        key = self._key(hashlib.sha256(payload).hexdigest())
        self._fast(key, payload)
        self._store.add_named_data(key, payload, alignment=alignment, external_tag=self.external)
        return key

    def add_file(self, path: str | Path, *, sha256: str | None = None, cleanup: bool = False, alignment: int = 64) -> str:
        """Store a file's bytes without loading them; ``sha256`` (hex) saves a second read when known.

        ``cleanup``: delete the file once the program has been written.
        """
        from executorch.exir._serialize._cord import FileBackedData

        from etsdk._format.content_hash import fast_hasher

        path = Path(path)
        fast = fast_hasher(path.stat().st_size)
        h = hashlib.sha256() if sha256 is None else None
        if h is not None or fast is not None:
            with path.open("rb") as f:
                while chunk := f.read(CHUNK):
                    if h is not None:
                        h.update(chunk)
                    if fast is not None:
                        fast.update(chunk)
        if h is not None:
            sha256 = h.hexdigest()
        assert sha256 is not None
        key = self._key(sha256)
        if fast is not None:
            self.fast_digests[key] = str(fast.hexdigest())
        data = FileBackedData(str(path), cleanup=cleanup, sha256=bytes.fromhex(sha256))
        self._store.add_named_data(key, data, alignment=alignment, external_tag=self.external)
        return key

    def add_weight(self, tensor: Any, *, alignment: int = 64) -> str:
        """Store one weight tensor's contiguous bytes; returns ``"weights/<sha256>"``.

        The canonical entry of a weight: every backend that stores a model tensor this way under the same
        bytes shares one entry in the program (a mixed program stores each weight once), and the bytes are
        hashed while they are stored. A weight of :data:`SPOOL_BYTES` or more is never held in memory until the
        program is written: one memory-mapped from a file (a checkpoint's) is copied from that file then (its bytes
        checked again as they are copied), any other goes through a temporary file; a smaller one is held as bytes.
        A weight an earlier partition of the same export stored is added by its key without being read again (so
        is a memory-mapped one the model fingerprint read), and the pages of a memory-mapped weight (a
        checkpoint's) are handed back once read (:mod:`etsdk._format.mapped_pages`).
        ``NamedData.get_tensor(key, dtype, shape)`` reads it back zero-copy. A temporary file that cannot be
        written (a full disk) raises :class:`~etsdk.errors.ExportError`; nothing is written to the output.
        """
        import torch

        memory = memory_of(tensor) if self._stored is not None else None
        found = self._stored.find(memory, tensor) if self._stored is not None and memory is not None else None
        if found is not None:
            self._store.add_named_data(found.key, found.data, alignment=alignment, external_tag=self.external)
            if found.fast is not None:
                self.fast_digests[found.key] = found.fast
            return found.key
        data = tensor.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        data = data.contiguous()
        size = data.numel() * data.element_size()
        view = memoryview(data.reshape(-1).view(torch.uint8).numpy()) if size else memoryview(b"")
        where = None
        if size < SPOOL_BYTES:
            stored: Any = bytes(view)
            key = WEIGHTS_NAMESPACE + hashlib.sha256(stored).hexdigest()
            self._fast(key, stored)
            self._store.add_named_data(key, stored, alignment=alignment, external_tag=self.external)
        else:
            where = mapped_range(data)
            key, stored = (
                self._mapped_weight(view, where, data.data_ptr(), alignment)
                if where is not None
                else self._spool_weight(view, data.data_ptr(), alignment)
            )
        if self._stored is not None and memory is not None:
            self._stored.remember(memory, tensor, key, stored, self.fast_digests.get(key), mapped=where is not None)
        return key

    def weight_key(self, tensor: Any) -> str:
        """The key :meth:`add_weight` would give ``tensor`` (``weights/<sha256>`` of its row-major bytes), without
        storing it. A backend that holds a weight in another form (an ONNX initializer, a file it wrote) asks this
        to learn whether the model's tensor has the same bytes, and then stores the tensor itself with
        :meth:`add_weight`, sharing the entry other backends store. A memory-mapped weight read here is
        remembered (with its pages handed back), so storing it afterwards reads it no more."""
        from etsdk._format.fingerprint import _tensor_digest

        digest = self._stored.digest(tensor) if self._stored is not None else _tensor_digest(tensor)
        return WEIGHTS_NAMESPACE + digest

    def _add_large(self, sha256: bytes, fast: str | None, data: Any, alignment: int) -> tuple[str, Any]:
        key = WEIGHTS_NAMESPACE + sha256.hex()
        if fast is not None:
            self.fast_digests[key] = fast
        self._store.add_named_data(key, data, alignment=alignment, external_tag=self.external)
        return key, data

    def _mapped_weight(self, view: memoryview, where: Any, address: int, alignment: int) -> tuple[str, Any]:
        """A weight memory-mapped from a file (:func:`mapped_range`): hashed from memory, copied from the file when
        the program is written (:class:`~etsdk._export.file_range_data.FileRangeData`, which hashes the bytes again
        as it copies them)."""
        from etsdk._export.file_range_data import FileRangeData

        digest, fast = hash_through(view, address)
        return self._add_large(digest.digest(), fast and str(fast.hexdigest()), FileRangeData(where, digest.digest()), alignment)

    def _spool_weight(self, view: memoryview, address: int, alignment: int) -> tuple[str, Any]:
        import tempfile

        from executorch.exir._serialize._cord import FileBackedData

        name = None
        try:
            _sweep_spool_folder(tempfile.gettempdir())
            fd, name = tempfile.mkstemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-", suffix=".bin")
            with open(fd, "wb") as out:
                digest, fast = hash_through(view, address, out.write)
        except BaseException as exc:
            if name is not None:
                Path(name).unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise ExportError(
                    f"storing a {view.nbytes}-byte weight in a temporary file under {tempfile.gettempdir()} failed: "
                    f"{exc.strerror or exc}; nothing was written to the output (TMPDIR chooses the folder)"
                ) from exc
            raise
        fast_hex = str(fast.hexdigest()) if fast is not None else None
        return self._add_large(digest.digest(), fast_hex, FileBackedData(name, cleanup=True, sha256=digest.digest()), alignment)

    def output(self) -> Any:
        """ExecuTorch's ``NamedDataStoreOutput`` (the core hands it over; backends never need it)."""
        return self._store.get_named_data_store_output()


def _silent(stage: str) -> None:
    """Progress nobody shows (a partition built outside ``etsdk.lower``)."""


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition to compile, as ``preprocess(partition)`` receives it.

    ``program``: the partition's edge ``ExportedProgram`` (a copy whose graph you
    may change; its tensors are shared with the model: never modify them).
    ``signature``: engine inputs / outputs in the order the runtime binding
    receives them, and the state bindings in the order ``execute`` receives the
    session's tensors. ``compile_specs``: what the partitioner's
    ``DelegationSpec`` carried. ``named_data``: where weights go.
    :meth:`progress` reports a stage of long work (a compile, an engine build)
    the way ``etsdk.lower`` reports its own: on stderr unless the export is quiet.
    """

    #: The backend id being compiled for (a plugin may register several).
    backend_id: str
    #: The method the partition belongs to.
    method: str
    program: Any
    signature: DelegateSignature
    compile_specs: Mapping[str, bytes]
    named_data: NamedDataWriter
    #: Where :meth:`progress` lines go (set by the core; a backend calls :meth:`progress`, not this).
    reporter: Callable[[str], None] = field(default=_silent, repr=False)

    def progress(self, stage: str) -> None:
        """Report ``stage`` of this partition's compilation (shown unless the export is quiet)."""
        self.reporter(f"{self.backend_id}: {stage}")

    def _specs(self) -> dict[str, Any]:
        return {spec.arg.name: spec for spec in self.program.graph_signature.input_specs}

    def user_inputs(self) -> list[Any]:
        """The placeholder nodes of the engine inputs, in binding order."""
        from torch.export.graph_signature import InputKind

        specs = self._specs()
        return [
            n for n in self.program.graph.nodes if n.op == "placeholder" and specs[n.name].kind == InputKind.USER_INPUT
        ]

    def state_inputs(self) -> list[Any]:
        """The placeholder nodes of the bound state, in :attr:`signature` ``states`` order."""
        by_name = {n.name: n for n in self.program.graph.nodes if n.op == "placeholder"}
        return [by_name[s.placeholder] for s in self.signature.states]

    def constants(self) -> list[Constant]:
        """Parameters, non-state buffers and lifted tensor constants, in placeholder order.

        Lifted scalar constants arrive as buffers or tensor constants: they are
        constants here, never state (only declared state is state).
        """
        from torch.export.graph_signature import InputKind

        specs = self._specs()
        states = {s.placeholder for s in self.signature.states}
        out: list[Constant] = []
        for node in self.program.graph.nodes:
            if node.op != "placeholder" or node.name in states:
                continue
            spec = specs[node.name]
            if spec.kind == InputKind.USER_INPUT:
                continue
            if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                raise ExportError(
                    f"backend '{self.backend_id}', method '{self.method}': partition input '{node.name}' is a "
                    f"{spec.kind.name}, which etsdk does not hand to backends"
                )
            target = str(spec.target)
            tensor = self.program.state_dict.get(target)
            if tensor is None:
                tensor = self.program.constants.get(target)
            if tensor is None:
                raise ExportError(f"partition input '{node.name}' ({target}) has no value in the exported program")
            out.append(Constant(node.name, target, tensor))
        return out

    def state_updates(self) -> list[StateUpdate]:
        """Each written state with the node computing its new value, in signature order."""
        from torch.export.graph_signature import OutputKind

        output = next(n for n in self.program.graph.nodes if n.op == "output")
        by_fqn = self.signature.state_by_fqn
        found: dict[str, Any] = {}
        for value, spec in zip(output.args[0], self.program.graph_signature.output_specs):
            if spec.kind == OutputKind.BUFFER_MUTATION and spec.target in by_fqn:
                found[spec.target] = value
        return [StateUpdate(s, found[s.fqn]) for s in self.signature.states if s.fqn in found]

    def user_outputs(self) -> list[Any]:
        """The graph values of the engine outputs, in binding order."""
        from torch.export.graph_signature import OutputKind

        output = next(n for n in self.program.graph.nodes if n.op == "output")
        return [
            value
            for value, spec in zip(output.args[0], self.program.graph_signature.output_specs)
            if spec.kind == OutputKind.USER_OUTPUT
        ]
