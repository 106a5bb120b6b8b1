"""The core's envelope around every delegate payload: the delegate's uid, then the plugin's payload untouched.

Both are sections of the etsdk blob container (:mod:`etsdk._format.blob`), with a required feature, so a runtime
that does not know this envelope refuses it instead of handing the wrong bytes to a backend.
"""

from __future__ import annotations

import json

from etsdk._format.blob import BlobReader, BlobWriter
from etsdk.errors import ProgramError

__all__ = ["DELEGATE_FEATURE", "unwrap_blob", "wrap_blob"]

DELEGATE_FEATURE = "etsdk.delegate.v2"
DELEGATE_SECTION = "etsdk.delegate"
PAYLOAD_SECTION = "payload"


def wrap_blob(payload: bytes, uid: str) -> bytes:
    """The core's container around a plugin payload: the delegate's uid, then the payload untouched."""
    writer = BlobWriter(required_features=[DELEGATE_FEATURE], producer="etsdk")
    writer.add_section(DELEGATE_SECTION, json.dumps({"uid": uid}, separators=(",", ":")).encode())
    writer.add_section(PAYLOAD_SECTION, payload, alignment=64)
    return writer.to_bytes()


def unwrap_blob(blob: memoryview | bytes, where: str) -> tuple[str, memoryview]:
    """``(uid, payload)`` of a wrapped delegate blob; a malformed or newer wrapper is refused."""
    reader = BlobReader(blob, known_features={DELEGATE_FEATURE})
    try:
        header = json.loads(bytes(reader.section(DELEGATE_SECTION)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProgramError(f"{where}: delegate header is not valid JSON: {exc}") from None
    uid = header.get("uid") if isinstance(header, dict) else None
    if not isinstance(uid, str) or not uid:
        raise ProgramError(f"{where}: delegate header has no uid")
    return uid, reader.section(PAYLOAD_SECTION)
