"""The short ATen name of a graph node's operator, edge dialect or ATen alike (the graph rewrites match on it)."""

from __future__ import annotations

from typing import Any

from etsdk.backend import aten_name

__all__ = ["op_name"]


def op_name(node: Any) -> str:
    """``view_copy`` for edge and ATen ``aten::view_copy.default`` (from :func:`aten_name`); "" for anything else."""
    name = aten_name(node.target) if getattr(node, "op", None) == "call_function" else None
    return name.split("::", 1)[1].split(".")[0] if name else ""
