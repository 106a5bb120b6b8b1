"""The masks an hf_static program's methods take: the contract's rule, shared by the exporter and the runtime.

Convention ``bool_true_visible``: ``mask[0, 0, i, j]`` is True when query row ``i`` may attend to cache row (or
ring slot) ``j``. The exporter traces with them; a conversation fills them before every step.
"""

from __future__ import annotations

import torch

__all__ = ["causal_mask", "last_real_row", "slot_mask"]


def slot_mask(
    start: int, real: int, rows: int, ring: int, window: int, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The ``[1, 1, rows, ring]`` bool mask of a ring cache for ``real`` tokens at ``start`` padded to ``rows``.

    Slot ``s`` holds the latest position ``q <= p`` with ``q = s (mod ring)``; query row ``i`` (position ``p =
    start + min(i, real - 1)``: padded rows see what the last real row sees) may attend to it when ``q >= 0`` and
    ``p - q < window``. With ``ring = window = S`` this is :func:`causal_mask`. The mask depends on positions
    only, never on history: a ring of ``W + T - 1`` rows written at ``position mod ring`` holds every row a
    query of the chunk needs.
    """
    p = (torch.clamp(torch.arange(rows), max=real - 1) + start).reshape(1, 1, rows, 1)
    age = torch.remainder(p - torch.arange(ring).reshape(1, 1, 1, ring), ring)
    visible = (age < window) & (age <= p)
    if out is None:
        return visible
    return out.copy_(visible)


def causal_mask(start_pos: int, real: int, rows: int, context: int, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The ``[1, 1, rows, context]`` bool mask for ``real`` tokens at ``start_pos`` padded to ``rows``.

    Row ``i`` sees cache rows ``0 .. min(start_pos + i, start_pos + real - 1)``: real
    rows are causal, padded rows see the real ones only (never padding, and never
    nothing, so no row's softmax is over an empty set). ``out``: fill it in place.
    """
    last = torch.clamp(torch.arange(rows) + start_pos, max=start_pos + real - 1).reshape(1, 1, rows, 1)
    columns = torch.arange(context).reshape(1, 1, 1, context)
    if out is None:
        return columns <= last
    return torch.le(columns, last, out=out)


def last_real_row(mask: torch.Tensor) -> torch.Tensor:
    """The index (``[1]`` int64) of a chunk's last real row, read from its :func:`causal_mask` (traced into programs).

    Under the mask's rule each real row sees one cache row more than the row before it and a padded row sees what
    the last real one sees, so the last real row is ``count[-1] - count[0]`` rows after the first (``count``: the
    visible cache rows of each row). Clamped to the chunk: a mask outside the rule never indexes out of it.
    """
    rows = mask[0, 0]
    first, last = rows[:1].sum(dim=-1), rows[-1:].sum(dim=-1)  # two rows of the mask, not all T
    return torch.clamp(last - first, min=0, max=mask.shape[2] - 1)
