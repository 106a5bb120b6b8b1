"""Which backend may claim a quantized weight: the formats it declares, checked before and after it partitions.

A call of ``etsdk::linear_q`` / ``etsdk::embedding_q`` carries its weight's
format (:mod:`etsdk._format.weight_format`). Before a backend's partitioner
runs, the core marks every such call whose format the backend does not declare
(``BackendSpec.weight_formats``) with the reason (:data:`REFUSED_META`);
``OperatorPartitioner`` never claims a marked call, and the core refuses a
partitioner of another kind that claims one anyway. Every reason is kept, so
a quantized call no backend of its method claimed fails the export naming the
weight, its format, and why each backend left it
(:func:`check_weights_claimed`), rather than a program the runtime could not
run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from etsdk._quant.ops import quantized_call
from etsdk._state.signature import NODE_ID_META
from etsdk.errors import ExportError

__all__ = ["REFUSED_META", "check_claims", "check_weights_claimed", "mark_refusals"]

#: Node meta key: why the backend partitioning now may not claim this quantized call (set for one pass).
REFUSED_META = "etsdk_weight_refused"


def _declared(formats: Iterable[str]) -> str:
    names = sorted(formats)
    return ", ".join(names) if names else "none"


def mark_refusals(ep: Any, backend_id: str, formats: Iterable[str], reasons: dict[str, list[str]]) -> None:
    """Mark the quantized calls of ``graph`` that ``backend_id`` (declaring ``formats``) may not claim.

    ``ep``: the method's ExportedProgram; ``reasons``: node id -> reasons so far (one per backend that could
    not claim it), extended here.
    """
    declared = frozenset(formats)
    for node in ep.graph.nodes:
        node.meta.pop(REFUSED_META, None)
        call = quantized_call(node)
        if call is None or call.format.name in declared:
            continue
        why = f"{backend_id} does not declare weight format {call.format.name} (it declares: {_declared(declared)})"
        node.meta[REFUSED_META] = why
        key = node.meta.get(NODE_ID_META)
        if key is not None and why not in reasons.setdefault(key, []):
            reasons[key].append(why)


def check_claims(ep: Any, tags: Iterable[str], where: str) -> None:
    """Refuse a partition result that claimed a call marked by :func:`mark_refusals`; then clear the marks."""
    ours = set(tags)
    for node in ep.graph.nodes:
        why = node.meta.pop(REFUSED_META, None)
        if why is not None and node.meta.get("delegation_tag") in ours:
            call = quantized_call(node)
            described = call.describe(ep) if call is not None else f"'{node.name}'"
            raise ExportError(f"{where}: the partitioner claimed weight {described}, but {why}")


def check_weights_claimed(method: str, ep: Any, reasons: Mapping[str, list[str]]) -> None:
    """Every quantized call of a lowered method (its ExportedProgram ``ep``) must be inside a delegate: name each
    one left, and why."""
    left = []
    for node in ep.graph.nodes:
        call = quantized_call(node)
        if call is None:
            continue
        why = reasons.get(node.meta.get(NODE_ID_META, ""), [])
        left.append(f"{call.describe(ep)}: {'; '.join(why) if why else 'no backend of the method claimed it'}")
    if left:
        shown = left[:5] + ([f"... and {len(left) - 5} more"] if len(left) > 5 else [])
        raise ExportError(
            f"method '{method}': {len(left)} quantized weight(s) would run outside every delegate (ExecuTorch has no "
            f"kernel for them): {' | '.join(shown)}. Export the method to a backend that declares the format "
            "(etsdk plugins lists each backend's weight formats), or quantize to one it declares"
        )
