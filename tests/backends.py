"""In-process test backends built from the reference backend's parts (public API only)."""

from __future__ import annotations

import hashlib
import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import etsdk
from etsdk.backend import Option
from etsdk.reference_backend.runtime import ReferenceBinding


def make_backend_plugin(
    backend_id: str,
    binding: Callable[[], Any],
    *,
    module_name: str | None = None,
    state_device: str | None = None,
    keep_whole: tuple[Any, ...] = (),
    partitioner: Callable[..., Any] | None = None,
    weight_formats: tuple[str, ...] = (),
) -> types.ModuleType:
    """A plugin module providing ``backend_id`` with the reference partitioner/serializer and ``binding``.

    ``state_device``: the partitioner asks for caller-owned state on that device. ``keep_whole``: operators
    the partitioner keeps out of decompositions. ``partitioner``: replaces the reference partitioner.
    ``weight_formats``: the quantized weight formats the backend declares (none by default).
    """

    def make_partitioner(**options: Any) -> Any:
        if partitioner is not None:
            return partitioner(**options)
        from etsdk.reference_backend.partitioner import ReferencePartitioner

        made = ReferencePartitioner(backend_id=backend_id, **options)
        made.keep_whole = keep_whole
        if state_device is not None:
            made.state_device = state_device
        return made

    def preprocess(partition: Any) -> Any:
        from etsdk.reference_backend.serializer import preprocess as reference_preprocess

        return reference_preprocess(partition)

    module = types.ModuleType(module_name or f"plugin_{backend_id}")
    module.ETSDK_PLUGIN_API = ">=2,<3"  # type: ignore[attr-defined]

    @etsdk.hookimpl
    def etsdk_register_backends() -> list[etsdk.BackendSpec]:
        return [
            etsdk.BackendSpec(
                id=backend_id,
                version="0",
                partitioner=make_partitioner,
                preprocess=preprocess,
                runtime=binding,
                options=(Option("ops", (list, tuple, set, frozenset), None, "aten operators to claim"),),
                weight_formats=weight_formats,
            )
        ]

    module.etsdk_register_backends = etsdk_register_backends  # type: ignore[attr-defined]
    return module


class RaisingBinding(ReferenceBinding):
    """Raises from init or from execute, with a recognisable message."""

    def __init__(self, where: str) -> None:
        self.where = where

    def init(self, context: Any) -> Any:
        if self.where == "init":
            raise LookupError("init refused: blob checksum 0xdead")
        handle = super().init(context)

        def execute(args: Any, state: Any) -> None:
            fail_in_binding(args)

        handle.execute = execute
        return handle


def fail_in_binding(args: Any) -> None:
    raise ValueError(f"binding failed on {len(args)} arguments: boom 42")


def patched_record(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    """The program with ``old`` replaced by ``new`` inside its record, and the record's content key resealed
    (an edited record under its old key is refused as damaged before it is read)."""
    assert len(old) == len(new)
    data = src.read_bytes()
    start = data.index(b'{"format":"etsdk.program"')
    _, length = json.JSONDecoder().raw_decode(data[start:].decode("latin-1"))
    at = data.index(old, start)
    data = data[:at] + new + data[at + len(old) :]
    before = hashlib.sha256(src.read_bytes()[start : start + length]).hexdigest().encode()
    after = hashlib.sha256(data[start : start + length]).hexdigest().encode()
    assert data.count(b"etsdk/program/" + before) == 1
    dst.write_bytes(data.replace(b"etsdk/program/" + before, b"etsdk/program/" + after))
    return dst
