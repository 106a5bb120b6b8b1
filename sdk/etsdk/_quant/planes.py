"""A quantized weight's values as planes: quantize a float weight, read GGUF blocks, dequantize.

:func:`weight_planes` is what a backend calls at load: the stored tensors of a
weight in any :class:`~etsdk._format.weight_format.WeightFormat` as the planes
``qdata`` / ``scales`` / ``mins`` (zero-copy for the planes layout; GGUF blocks
are unpacked once, exactly: the half scales and minimums are kept as float16).
:func:`dequantize` is the format's math in float32, the reference every
backend's kernels are checked against. :func:`quantize` turns a float weight
into a planes format (round to nearest; symmetric scales from each group's
largest magnitude, minimum formats from each group's range).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from etsdk._format.weight_format import GGUF_BLOCK, WeightFormat, WeightLayout

__all__ = ["Planes", "dequantize", "gguf_blocks", "pack_int4", "quantize", "quantize_weight", "unpack_int4", "weight_planes"]


@dataclass(frozen=True)
class Planes:
    """A weight's values: ``qdata`` (int8 ``[N, K]``, or uint8 ``[N, K/2]`` for 4 bits), ``scales``
    (``[N]`` or ``[N, K/group]``), ``mins`` (formats with a minimum, else None), and the planes format."""

    #: The planes format the values are in (a GGUF format's planes format for blocks).
    format: WeightFormat
    #: int8 ``[N, K]``, or uint8 ``[N, K / 2]`` with two 4-bit values per byte.
    qdata: torch.Tensor
    #: ``[N]`` (one per row) or ``[N, K / group]``, in the format's scale dtype.
    scales: torch.Tensor
    #: The groups' minimums (formats with a minimum), else None.
    mins: torch.Tensor | None

    @property
    def shape(self) -> tuple[int, int]:
        """The weight's logical ``[N, K]``."""
        rows, width = self.qdata.shape
        return int(rows), int(width) * (2 if self.format.bits == 4 else 1)


def _check(fmt: WeightFormat, name: str, tensor: torch.Tensor, dtype: str, shape: tuple[int, ...]) -> None:
    found = (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
    if found != (dtype, shape):
        raise ValueError(f"format {fmt.name}: {name} must be {dtype} {list(shape)}, found {found[0]} {list(found[1])}")


def weight_planes(fmt: WeightFormat, stored: Mapping[str, torch.Tensor], shape: tuple[int, int]) -> Planes:
    """The planes of a ``shape`` (``[N, K]``) weight stored as ``stored`` (:meth:`WeightFormat.planes` names).

    Every stored tensor's dtype and shape is checked first (``ValueError`` naming the tensor).
    """
    rows, columns = shape
    expected = fmt.planes(rows, columns)
    if set(stored) != set(expected):
        raise ValueError(f"format {fmt.name} stores {', '.join(expected)}, found {', '.join(sorted(stored)) or 'nothing'}")
    for name, (dtype, want) in expected.items():
        _check(fmt, name, stored[name], dtype, want)
    if fmt.layout is WeightLayout.PLANES:
        return Planes(fmt, stored["qdata"], stored["scales"], stored.get("mins"))
    blocks = stored["blocks"].reshape(rows, columns // GGUF_BLOCK, fmt.block_bytes)
    halves = blocks[..., : 4 if fmt.with_min else 2].contiguous().view(torch.float16)
    scales = halves[..., 0].contiguous()
    mins = halves[..., 1].contiguous() if fmt.with_min else None
    values = blocks[..., 4 if fmt.with_min else 2 :]
    if fmt.bits == 8:
        qdata = values.contiguous().view(torch.int8).reshape(rows, columns)
    else:  # GGUF: value j low nibble of byte j, value j + 16 high nibble -> planes: 2i low, 2i + 1 high
        low, high = values & 0x0F, values >> 4
        ordered = torch.cat([low, high], dim=-1).reshape(rows, columns)
        qdata = pack_int4(ordered)
    return Planes(fmt.planes_format, qdata, scales, mins)


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, K]`` of values 0..15 -> uint8 ``[N, K / 2]``, value ``2i`` in the low nibble of byte ``i``."""
    values = values.to(torch.uint8)
    return (values[:, 0::2] | (values[:, 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, K / 2]`` -> uint8 ``[N, K]`` of values 0..15 (inverse of :func:`pack_int4`)."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def _expand(per_group: torch.Tensor, columns: int) -> torch.Tensor:
    if per_group.dim() == 1:
        return per_group.float().unsqueeze(1)
    return per_group.float().repeat_interleave(columns // per_group.shape[1], dim=1)


def dequantize(planes: Planes, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 weight (or only its ``rows``, an index tensor) by the format's math."""
    fmt = planes.format
    qdata, scales, mins = planes.qdata, planes.scales, planes.mins
    if rows is not None:
        qdata, scales = qdata[rows], scales[rows]
        mins = mins[rows] if mins is not None else None
    columns = planes.shape[1]
    lead = qdata.shape[:-1]
    qdata = qdata.reshape(-1, qdata.shape[-1])
    scales = scales.reshape(qdata.shape[0], *scales.shape[len(lead):])
    if fmt.bits == 8:
        values = qdata.float()
    else:
        values = unpack_int4(qdata).float() - (0.0 if fmt.with_min else 8.0)
    weight = values * _expand(scales, columns)
    if mins is not None:
        weight = weight + _expand(mins.reshape(scales.shape), columns)
    return weight.reshape(*lead, columns)


#: Values quantized at a time: each float32 temporary of the arithmetic is at most 16 MB, whatever the weight
#: (a 128k-token embedding is 0.26-0.5 G values, and the arithmetic holds several float32 copies).
_ROW_CHUNK_VALUES = 4 << 20


def quantize(
    weight: torch.Tensor, fmt: WeightFormat, empty: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Quantize a float ``[N, K]`` ``weight`` to the planes format ``fmt``: ``{"qdata", "scales"[, "mins"]}``.

    Rows are quantized a slice at a time into the planes (every group lies within one row, so slicing changes no
    value): the temporaries are bounded, not the weight's size in float32 several times over, and the pages of a
    memory-mapped ``weight`` (a checkpoint's) are dropped from the process as each slice is read. ``empty(shape,
    dtype)`` makes each plane (default ``torch.empty``; :meth:`etsdk.WeightSpill.empty` makes it in a file, whose
    written pages are dropped from the process as each slice is written). The C heap's free pages are given back
    once the weight is done."""
    from etsdk._format.mapped_pages import release_file_pages, trim_heap

    if fmt.layout is not WeightLayout.PLANES:
        raise ValueError(f"etsdk quantizes to planes formats; {fmt.name} blocks come from a GGUF file")
    if weight.dim() != 2:
        raise ValueError(f"a quantized weight is 2-D [N, K], found shape {list(weight.shape)}")
    rows, columns = (int(d) for d in weight.shape)
    fmt.check_shape(rows, columns)
    step = max(1, _ROW_CHUNK_VALUES // max(1, columns))
    out: dict[str, torch.Tensor] = {}
    for start in range(0, rows, step):
        part = weight.detach()[start : start + step]
        planes = _quantize_rows(part, fmt)
        if not out:
            make = empty if empty is not None and part.device.type == "cpu" else _empty
            out = {k: make((rows, *v.shape[1:]), v.dtype) for k, v in planes.items()}
        for key, value in planes.items():
            written = out[key][start : start + step]
            written.copy_(value)
            if empty is not None:  # planes made in files: their written pages go (torch.empty's are the result)
                release_file_pages(written.data_ptr(), written.numel() * written.element_size())
        if part.device.type == "cpu" and part.is_contiguous():
            release_file_pages(part.data_ptr(), part.numel() * part.element_size())
    trim_heap()  # the slices' temporaries were freed, but the kept planes would pin the heap at its largest
    return out


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def _quantize_rows(weight: torch.Tensor, fmt: WeightFormat) -> dict[str, torch.Tensor]:
    rows, columns = (int(d) for d in weight.shape)
    group = fmt.group_size or columns
    grouped = weight.detach().float().reshape(rows, columns // group, group)
    scale_dtype = getattr(torch, fmt.scale_dtype)
    tiny = torch.finfo(torch.float32).tiny
    if fmt.with_min:
        low, high = grouped.amin(-1), grouped.amax(-1)
        scales = ((high - low) / 15).clamp_min(tiny).to(scale_dtype)
        mins = low.to(scale_dtype)
        q = torch.round((grouped - mins.float().unsqueeze(-1)) / scales.float().unsqueeze(-1)).clamp(0, 15)
    else:
        top = 127 if fmt.bits == 8 else 7
        scales = (grouped.abs().amax(-1) / top).clamp_min(tiny).to(scale_dtype)
        mins = None
        q = torch.round(grouped / scales.float().unsqueeze(-1)).clamp(-top - 1, top)
        if fmt.bits == 4:
            q = q + 8
    q = q.reshape(rows, columns)
    out = {"qdata": q.to(torch.int8) if fmt.bits == 8 else pack_int4(q), "scales": scales.reshape(rows, -1)}
    if fmt.group_size is None:
        out["scales"] = out["scales"].reshape(rows)
    if mins is not None:
        out["mins"] = mins.reshape(out["scales"].shape)
    return {k: v.contiguous() for k, v in out.items()}


def quantize_weight(weight: torch.Tensor, fmt: WeightFormat | str) -> dict[str, torch.Tensor]:
    """``weight`` (float ``[N, K]``) in the planes format ``fmt``: ``{"qdata", "scales"[, "mins"]}`` (what
    ``etsdk.quantize_model`` stores for a layer). Raises ``ValueError`` naming what the format cannot hold."""
    return quantize(weight, fmt if isinstance(fmt, WeightFormat) else WeightFormat.parse(fmt))


def gguf_blocks(planes: Planes, layout: WeightLayout) -> torch.Tensor:
    """The GGUF blocks holding ``planes`` (which must be exactly representable: group 32, float16 scales)."""
    fmt = WeightFormat.parse(layout.value)
    if planes.format != fmt.planes_format:
        raise ValueError(f"{layout.value} blocks hold {fmt.planes_format.name} values, found {planes.format.name}")
    rows, columns = planes.shape
    count = columns // GGUF_BLOCK
    halves = [planes.scales.reshape(rows, count, 1)]
    if planes.mins is not None:
        halves.append(planes.mins.reshape(rows, count, 1))
    head = torch.cat(halves, -1).contiguous().view(torch.uint8)
    if fmt.bits == 8:
        values = planes.qdata.reshape(rows, count, GGUF_BLOCK).view(torch.uint8)
    else:
        grouped = unpack_int4(planes.qdata).reshape(rows, count, GGUF_BLOCK)
        values = grouped[..., :16] | (grouped[..., 16:] << 4)
    return torch.cat([head, values], -1).reshape(rows, -1).contiguous()
