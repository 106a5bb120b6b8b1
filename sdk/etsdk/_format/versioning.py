"""Fail closed on version skew: the one check every versioned etsdk document makes.

A document (contract record, program record) names its ``format`` and a
``format_version`` of ``[major, minor]``. A reader refuses another format with
the document's own error type, and a newer major version with
:class:`UnsupportedFeatureError`; newer minor versions are readable by design.
"""

from __future__ import annotations

from typing import Any

from etsdk.errors import EtsdkError, UnsupportedFeatureError

__all__ = ["check_format"]


def check_format(
    obj: Any, *, expected: str, major: int, minor: int, where: str, error: type[EtsdkError], what: str
) -> tuple[int, int]:
    """Return ``(major, minor)`` of ``obj`` or raise: ``error`` when malformed, UnsupportedFeatureError when newer."""
    found = obj.get("format") if isinstance(obj, dict) else None
    if found != expected:
        raise error(f"{where}: {what} has format {found!r}, expected {expected!r}")
    version = obj.get("format_version")
    if (
        not isinstance(version, list)
        or len(version) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in version)
    ):
        raise error(f"{where}: {what} format_version must be [major, minor], found {version!r}")
    if version[0] > major:
        raise UnsupportedFeatureError(
            f"{where}: {what} format {version[0]}.{version[1]} is newer than this etsdk reads ({major}.{minor}); "
            "upgrade etsdk",
            feature=f"{expected}-{version[0]}",
        )
    return version[0], version[1]
