"""See what an export hands to backends, and change it on purpose (conformance kit, tests).

:func:`capture_delegates` records every delegate ``etsdk.lower`` produces on
this thread (backend, method, signature, payload bytes, named data), so a test
can call a runtime binding directly or find the payload in the written file.
:func:`transform_payloads` rewrites payloads *before* the core seals them (the
program then stays self-consistent: hashes match), which is how the kit builds
a blob that requires an unknown feature or carries damaged bytes the backend
itself must refuse. :func:`with_required_feature` adds a required feature to an
etsdk blob container.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from etsdk._format.blob import BlobReader, BlobWriter
from etsdk._state.signature import DelegateSignature

__all__ = ["CapturedDelegate", "capture_delegates", "transform_payloads", "with_required_feature"]


@dataclass(frozen=True)
class CapturedDelegate:
    """One delegate as the core sealed it: ``payload`` is what the runtime binding's ``context.blob`` will be."""

    #: The backend id the delegate was lowered to.
    backend_id: str
    #: The method it belongs to.
    method: str
    #: Its sealed signature (uid and payload hash included): what ``context.signature`` will be.
    signature: DelegateSignature
    payload: bytes
    #: Every named-data entry the partition wrote, key -> bytes (a :class:`NamedDataStub` serves them to ``init``).
    named_data: dict[str, bytes] = field(repr=False)
    #: What the partitioner's compile specs carried: ``context.compile_specs``.
    compile_specs: dict[str, bytes] = field(default_factory=dict)


def _entries(writer: Any) -> dict[str, bytes]:
    output = writer.output()
    out: dict[str, bytes] = {}
    maps = [output.pte_data, *output.external_data.values()]
    for mapping in maps:
        for key, entry in mapping.items():
            data = output.buffers[entry.buffer_index]
            if not isinstance(data, (bytes, bytearray, memoryview)):
                with open(data._path, "rb") as f:  # FileBackedData: read while it still exists
                    data = f.read()
            out[key] = bytes(data)
    return out


@contextmanager
def capture_delegates() -> Iterator[list[CapturedDelegate]]:
    """Collect every delegate sealed by ``etsdk.lower`` calls on this thread inside the block."""
    from etsdk._export.core_partitioner import export_hooks

    captured: list[CapturedDelegate] = []

    def observe(partition: Any, signature: DelegateSignature, payload: bytes) -> None:
        captured.append(
            CapturedDelegate(
                partition.backend_id, partition.method, signature, payload, _entries(partition.named_data),
                dict(partition.compile_specs),
            )
        )

    with export_hooks(observe=observe):
        yield captured


@contextmanager
def transform_payloads(transform: Callable[[str, str, bytes], bytes]) -> Iterator[None]:
    """``transform(backend_id, method, payload) -> payload`` for every delegate exported on this thread."""
    from etsdk._export.core_partitioner import export_hooks

    with export_hooks(transform=transform):
        yield


def with_required_feature(payload: bytes, feature: str) -> bytes:
    """``payload`` (an etsdk blob) re-written to also require ``feature``; sections and alignment kept."""
    required, optional = BlobReader.declared_features(payload)
    reader = BlobReader(payload, known_features=required)
    writer = BlobWriter(required_features=[*required, feature], optional_features=optional, producer=reader.producer)
    for section in reader.sections:
        writer.add_section(section.name, reader.section(section.name), alignment=section.alignment)
    return writer.to_bytes()
