"""``etsdk::attention`` in an AOTInductor partition: the native kernel on the CPU, SDPA elsewhere.

The core's ``etsdk::attention`` is SDPA under a boolean mask that reads only the key / value rows some query
sees. On the CPU every call is pointed at :data:`etsdk_aoti.kernels.KERNEL_ATTENTION` (``attention.cpp``: stops
at the last visible row, so an LLM's decode step costs what the conversation holds), or, for int8 caches, at
:data:`~etsdk_aoti.kernels.KERNEL_ATTENTION_INT8`; the compiled library then calls the kernels library, and the
blob requires :data:`~etsdk_aoti.blob_format.ATTENTION_FEATURE` (and
:data:`~etsdk_aoti.blob_format.ATTENTION_INT8_FEATURE`). On CUDA it becomes SDPA over every row (full-length:
no CUDA kernel yet), int8 rows dequantized first.

A batched decode step over several sessions, each with its own cache tensors, calls ``etsdk::attention`` once per
session (row ``b`` of the queries and of the mask over session ``b``'s caches) and concatenates the rows. On the CPU
:func:`fuse_slot_attention` merges such a concatenation into one call of
:data:`~etsdk_aoti.kernels.KERNEL_ATTENTION_SLOTS` (feature :data:`~etsdk_aoti.blob_format.ATTENTION_SLOTS_FEATURE`):
one parallel region per layer in which every session's heads are tasks, not one small region per session (three
tasks over two threads, and a team started and joined per session).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from etsdk_aoti import kernels

__all__ = ["fuse_slot_attention", "kernel_attention", "kernel_attention_int8", "kernel_attention_slots", "rewrite_attention"]


def kernel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``etsdk::attention`` on the native kernel (what a rewritten call computes): contiguous float32 operands."""
    out = kernels.KERNEL_ATTENTION(
        query.to(torch.float32).contiguous(), key.to(torch.float32).contiguous(), value.to(torch.float32).contiguous(),
        mask.contiguous(), scale,
    )
    return out.to(query.dtype)


def kernel_attention_int8(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
    key_scale: torch.Tensor, value_scale: torch.Tensor,
) -> torch.Tensor:
    """``etsdk::attention`` over int8 caches on the native kernel: float32 query, int8 rows, float32 scales."""
    out = kernels.KERNEL_ATTENTION_INT8(
        query.to(torch.float32).contiguous(), key.contiguous(), key_scale.contiguous(), value.contiguous(),
        value_scale.contiguous(), mask.contiguous(), scale,
    )
    return out.to(query.dtype)


def kernel_attention_slots(
    query: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], mask: torch.Tensor, scale: float,
    key_scales: Sequence[torch.Tensor], value_scales: Sequence[torch.Tensor],
) -> torch.Tensor:
    """Row ``b`` of ``query`` over session ``b``'s caches in one native kernel call (what a fused concatenation of
    per-session ``etsdk::attention`` calls computes): float32 rows, or int8 rows with their scales."""
    int8 = bool(key_scales)
    out = kernels.KERNEL_ATTENTION_SLOTS(
        query.to(torch.float32).contiguous(),
        [k.contiguous() if int8 else k.to(torch.float32).contiguous() for k in keys],
        [v.contiguous() if int8 else v.to(torch.float32).contiguous() for v in values],
        mask.contiguous(), scale, [s.contiguous() for s in key_scales], [s.contiguous() for s in value_scales],
    )
    return out.to(query.dtype)


def _sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
    key_scale: torch.Tensor | None = None, value_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    from etsdk.backend import dequantize_rows

    if key_scale is not None and value_scale is not None:
        key, value = dequantize_rows(key, key_scale).to(query.dtype), dequantize_rows(value, value_scale).to(query.dtype)
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1]
    )


def _int8(node: torch.fx.Node) -> bool:
    """Whether an ``etsdk::attention`` call has its int8 operands (the scales)."""
    return _operands(node)["key_scale"] is not None


_OPERANDS = ("query", "key", "value", "mask", "scale", "key_scale", "value_scale")


def _operands(call: torch.fx.Node) -> dict[str, object]:
    """An ``etsdk::attention`` call's operands by name (positional or keyword; absent scales None)."""
    given = dict(zip(_OPERANDS, call.args))
    return {name: given.get(name, call.kwargs.get(name)) for name in _OPERANDS}


def _aten(node: object) -> object:
    """The ATen overload an FX node calls (an edge-dialect operator wraps one), or None."""
    target = getattr(node, "target", None)
    return target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", None)


def _row(node: object) -> tuple[torch.fx.Node, int] | None:
    """``(tensor, b)`` when ``node`` is ``tensor[b : b + 1]`` (one row along dimension 0), else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    if _aten(node) not in (torch.ops.aten.slice.Tensor, torch.ops.aten.slice_copy.Tensor):
        return None
    given = dict(zip(("self", "dim", "start", "end", "step"), node.args), **node.kwargs)
    source, start = given.get("self"), given.get("start", 0)
    if not isinstance(source, torch.fx.Node) or given.get("dim", 0) != 0 or given.get("step", 1) != 1:
        return None
    return (source, start) if isinstance(start, int) and given.get("end") == start + 1 else None


def _batch(node: object) -> int | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return int(value.shape[0]) if isinstance(value, torch.Tensor) and value.dim() > 0 else None


def _per_session(node: torch.fx.Node) -> tuple[list[dict[str, object]], torch.fx.Node, torch.fx.Node] | None:
    """``(each call's operands, query, mask)`` when ``node`` concatenates along dimension 0 one ``etsdk::attention``
    call per session ``b = 0 .. B-1`` (B >= 2 the query's batch), call ``b`` attending row ``b`` of one query over
    caches of batch 1 under row ``b`` of one mask (or every call under one mask of batch 1), all with one scale and
    all int8 or all float; else None."""
    from etsdk.backend import calls_attention

    if node.op != "call_function" or _aten(node) is not torch.ops.aten.cat.default:
        return None
    calls = node.args[0] if node.args else node.kwargs.get("tensors")
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if dim != 0 or not isinstance(calls, (list, tuple)) or len(calls) < 2:
        return None
    if not all(calls_attention(c) and len(c.users) == 1 for c in calls):
        return None
    each = [_operands(c) for c in calls]
    rows = [_row(o["query"]) for o in each]
    query = rows[0][0] if rows[0] is not None else None
    if query is None or _batch(query) != len(calls) or any(r != (query, b) for b, r in enumerate(rows)):
        return None
    masks = [_row(o["mask"]) for o in each]
    shared = each[0]["mask"]
    if masks[0] is not None and all(m == (masks[0][0], b) for b, m in enumerate(masks)):
        mask = masks[0][0]
    elif isinstance(shared, torch.fx.Node) and all(o["mask"] is shared for o in each) and _batch(shared) == 1:
        mask = shared
    else:
        return None
    first = each[0]
    same = all(o["scale"] == first["scale"] and (o["key_scale"] is None) == (first["key_scale"] is None) for o in each)
    caches = all(_batch(o[name]) == 1 for o in each for name in ("key", "value"))
    paired = all((o["key_scale"] is None) == (o["value_scale"] is None) for o in each)
    if not (same and caches and paired and isinstance(first["scale"], (int, float))):
        return None
    return each, query, mask


def fuse_slot_attention(graph: torch.fx.Graph) -> int:
    """Merge each concatenation of per-session ``etsdk::attention`` calls (a batched decode step, each session
    over its own caches: :func:`_per_session`) into one :func:`kernel_attention_slots` call; how many it merged."""
    merged = 0
    for node in list(graph.nodes):
        found = _per_session(node)
        if found is None:
            continue
        each, query, mask = found
        calls = list(node.args[0] if node.args else node.kwargs["tensors"])
        int8 = each[0]["key_scale"] is not None
        lists = [[o[name] for o in each] for name in ("key", "value")]
        scales = [[o[name] for o in each] if int8 else [] for name in ("key_scale", "value_scale")]
        with graph.inserting_before(node):
            fused = graph.call_function(
                kernel_attention_slots, (query, *lists, mask, float(each[0]["scale"]), *scales)  # type: ignore[arg-type]
            )
        fused.meta.update(node.meta)
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        for call, operands in zip(calls, each):
            graph.erase_node(call)
            for row in (operands["query"], operands["mask"]):  # a session's row slices, now read by nothing
                if isinstance(row, torch.fx.Node) and not row.users and _row(row) is not None:
                    graph.erase_node(row)
        merged += 1
    return merged


def rewrite_attention(module: torch.fx.GraphModule, device: str) -> bool:
    """Point every ``etsdk::attention`` call of ``module`` at the native kernel (``device`` cpu; a batched decode
    step's per-session calls merged first: :func:`fuse_slot_attention`) or at SDPA; whether a call now needs the
    kernels library."""
    from etsdk.backend import calls_attention

    fused = fuse_slot_attention(module.graph) if device == "cpu" else 0
    calls = [n for n in module.graph.nodes if calls_attention(n)]
    for node in calls:
        if device != "cpu":
            node.target = _sdpa
        else:
            node.target = kernel_attention_int8 if _int8(node) else kernel_attention
    if calls or fused:
        module.recompile()
    return bool(calls or fused) and device == "cpu"
