"""Claims the edge-dialect aten calls the reference runtime can compute with torch."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from etsdk.backend import OperatorPartitioner, aten_name
from etsdk.reference_backend import BACKEND_ID


def _computable(node: torch.fx.Node) -> bool:
    return aten_name(node.target) is not None


class ReferencePartitioner(OperatorPartitioner):
    """Delegate supported calls to the reference backend.

    ``ops``: aten names to claim (``"aten::linear"`` for every overload, or
    ``"aten::add.Tensor"``); every functional aten call when omitted.
    ``backend_id``: tag partitions for another backend that reuses this
    partitioner and serializer with its own runtime binding (tests, examples).
    """

    def __init__(self, ops: Iterable[str] | None = None, backend_id: str = BACKEND_ID) -> None:
        super().__init__(backend_id, ops=ops, supports=_computable)
