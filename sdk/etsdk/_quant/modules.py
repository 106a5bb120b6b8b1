"""Quantize a model's weights in place: linear layers, the input embedding and the output head.

:func:`quantize_model` swaps each ``torch.nn.Linear`` / ``torch.nn.Embedding``
for a :class:`QuantizedLinear` / :class:`QuantizedEmbedding` whose stored
tensors are parameters (constants of the exported program, content-addressed in
named data like every weight) and whose forward calls ``etsdk::linear_q`` /
``etsdk::embedding_q``. The float weight is dropped as soon as its layer is
quantized, so a model never holds both. The quantized model runs eagerly
(the operators' reference math) and exports like any module.

Why etsdk's own operators rather than torchao's tensor subclasses: torchao's
export form is ``dequantize_affine`` feeding a float ``linear``, which
AOTInductor either folds back into float32 constants (constant folding) or
dequantizes on every call; a partitioner cannot see the format either. The
quantization math (:func:`etsdk._quant.planes.quantize`) is the usual
round-to-nearest affine scheme; tests compare it with torchao's primitives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from etsdk._format.weight_format import QuantizationPlan, WeightFormat, WeightLayout
from etsdk._quant.ops import columns_of
from etsdk._quant.planes import quantize

__all__ = ["QuantizationReport", "QuantizedEmbedding", "QuantizedLinear", "quantize_model"]


class _Stored(torch.nn.Module):
    """The stored tensors of one quantized weight as parameters ``qdata``, ``scales``, ``mins`` (absent ones None).

    Parameters, not buffers, although nothing trains them: they are weights that nothing writes, and both
    strict export's tracing (:mod:`etsdk._export.tracing`) and AOTInductor treat parameters that way, where
    AOTInductor clones every buffer of the graph it compiles (a second copy of every quantized weight).
    """

    def __init__(self, fmt: WeightFormat, stored: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        self.format = fmt.name
        blocks = fmt.layout is not WeightLayout.PLANES
        qdata = stored["blocks"] if blocks else stored["qdata"]
        for name, tensor in (("qdata", qdata), ("scales", None if blocks else stored["scales"]), ("mins", None if blocks else stored.get("mins"))):
            if tensor is not None and not isinstance(tensor, torch.nn.Parameter):  # one given is shared (tied layers)
                tensor = torch.nn.Parameter(tensor, requires_grad=False)
            self.register_parameter(name, tensor)
        self.rows = int(qdata.shape[0])
        self.columns = columns_of(fmt, tuple(qdata.shape))


class QuantizedLinear(_Stored):
    """``y = x @ dequantize(w).T + bias`` through ``etsdk::linear_q``; built by :meth:`from_linear` or from stored
    tensors (a GGUF file's blocks)."""

    def __init__(self, fmt: WeightFormat, stored: Mapping[str, torch.Tensor], bias: torch.Tensor | None = None) -> None:
        super().__init__(fmt, stored)
        self.bias = torch.nn.Parameter(bias.detach(), requires_grad=False) if bias is not None else None
        self.in_features, self.out_features = self.columns, self.rows

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, fmt: WeightFormat, empty: Any = None) -> QuantizedLinear:
        """``linear``'s weight quantized to ``fmt`` (a planes format), its bias kept in float; ``empty(shape,
        dtype)`` makes each stored tensor (:func:`etsdk._quant.planes.quantize`)."""
        return cls(fmt, quantize(linear.weight, fmt, empty), linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ w.T + bias`` by ``etsdk::linear_q``."""
        return torch.ops.etsdk.linear_q(x, self.qdata, self.scales, self.mins, self.bias, self.format)

    def extra_repr(self) -> str:
        """``in_features=..., out_features=..., format=...`` (what ``print(model)`` shows)."""
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}"


class QuantizedEmbedding(_Stored):
    """Rows of ``dequantize(w)`` through ``etsdk::embedding_q``, times ``scale`` (Gemma scales its embeddings)."""

    def __init__(
        self, fmt: WeightFormat, stored: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32, scale: Any = None
    ) -> None:
        super().__init__(fmt, stored)
        self.dtype = dtype
        self.scale = scale
        self.num_embeddings, self.embedding_dim = self.rows, self.columns

    @classmethod
    def from_embedding(cls, embedding: torch.nn.Embedding, fmt: WeightFormat, empty: Any = None) -> QuantizedEmbedding:
        """``embedding``'s table quantized to ``fmt`` (a planes format), one group of scales per row; ``empty`` as
        in :meth:`QuantizedLinear.from_linear`."""
        return cls(
            fmt, quantize(embedding.weight, fmt, empty), embedding.weight.dtype, getattr(embedding, "embed_scale", None)
        )

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        """The rows ``indices`` picks, dequantized (times ``scale`` when there is one)."""
        out = torch.ops.etsdk.embedding_q(self.qdata, self.scales, self.mins, indices, self.format, self.dtype)
        return out * self.scale.to(out.dtype) if isinstance(self.scale, torch.Tensor) else (out * self.scale if self.scale is not None else out)

    def extra_repr(self) -> str:
        """``num_embeddings, embedding_dim, format=...``."""
        return f"{self.num_embeddings}, {self.embedding_dim}, format={self.format}"


@dataclass
class QuantizationReport:
    """What :func:`quantize_model` did: module name -> format, the float modules it left, the bytes before / after."""

    #: Module name -> the format it was quantized to.
    quantized: dict[str, str] = field(default_factory=dict)
    #: Module name -> why it stays in float.
    kept: dict[str, str] = field(default_factory=dict)
    #: Bytes of the float weights that were quantized (a tied weight counted once).
    float_bytes: int = 0
    #: Bytes of their quantized form (a tied weight in one format counted once: it is stored once).
    quantized_bytes: int = 0

    def summary(self) -> str:
        """One line: how many layers in which formats, and the weights' size before and after."""
        counts: dict[str, int] = {}
        for fmt in self.quantized.values():
            counts[fmt] = counts.get(fmt, 0) + 1
        parts = ", ".join(f"{n} x {fmt}" for fmt, n in sorted(counts.items()))
        kept = f"; kept in float: {len(self.kept)}" if self.kept else ""
        return (
            f"quantized {parts or 'nothing'}{kept}: {self.float_bytes / 2**20:.1f} MiB -> "
            f"{self.quantized_bytes / 2**20:.1f} MiB"
        )


def _parse(fmt: WeightFormat | str | None) -> WeightFormat | None:
    if fmt is None or isinstance(fmt, WeightFormat):
        return fmt
    return WeightFormat.parse(fmt)


def _set(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    setattr(owner, leaf, module)


def quantize_model(
    model: torch.nn.Module,
    linear: QuantizationPlan | WeightFormat | str | None,
    *,
    embedding: WeightFormat | str | None = None,
    head: WeightFormat | str | None = None,
    head_module: str | None = None,
    spill: Any = None,
) -> QuantizationReport:
    """Quantize ``model`` in place; returns what changed.

    ``linear``: the format of every ``torch.nn.Linear`` but the output head (None: keep them float), or a
    whole :class:`etsdk.QuantizationPlan`; ``embedding``: of every ``torch.nn.Embedding`` (or one with an
    ``embed_scale``, as Gemma's); ``head``: of the output head, the linear named ``head_module`` (for a
    transformers model, ``get_output_embeddings()``). A layer whose shape the format cannot hold (rows not a
    multiple of the group) is refused with ``ValueError`` naming it and the fix; nothing is changed then.
    ``spill``: an :class:`etsdk.WeightSpill` that makes every stored tensor in a file, memory-mapped, instead of in
    memory (an export of a large model then holds a slice of one layer at a time). A weight is quantized a slice
    of rows at a time, and its memory-mapped pages (a checkpoint's) are dropped from the process as they are read.
    """
    if isinstance(linear, QuantizationPlan):
        formats = {"linear": linear.linear, "embedding": linear.embedding, "head": linear.head}
    else:
        formats = {"linear": _parse(linear), "embedding": _parse(embedding), "head": _parse(head)}
    getter = getattr(model, "get_output_embeddings", None)
    if head_module is None and callable(getter):
        found = getter()
        head_module = next((n for n, m in model.named_modules() if m is found), None) if found is not None else None
    plan: list[tuple[str, torch.nn.Linear | torch.nn.Embedding, WeightFormat]] = []
    report = QuantizationReport()
    for name, module in model.named_modules():
        role = "head" if name == head_module else "linear" if isinstance(module, torch.nn.Linear) else None
        if isinstance(module, torch.nn.Embedding):
            role = "embedding"
        if role is None:
            continue
        if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            report.kept[name] = f"{type(module).__name__} is not a torch.nn.Linear or torch.nn.Embedding"
            continue
        weight = module.weight
        fmt = formats[role]
        if fmt is None:
            report.kept[name] = f"no format given for the {role}"
            continue
        if type(module) not in (torch.nn.Linear, torch.nn.Embedding) and not hasattr(module, "embed_scale"):
            report.kept[name] = f"{type(module).__name__} overrides {type(module).__mro__[1].__name__}; its forward is kept"
            continue
        rows, columns = (int(d) for d in weight.shape)
        try:
            fmt.check_shape(rows, columns)
        except ValueError as exc:
            raise ValueError(f"{role} '{name}' [{rows}, {columns}]: {exc}; pick a group that divides {columns}, or keep the {role} in float") from None
        plan.append((name, module, fmt))
    seen: set[int] = set()
    # a tied weight (embedding and head) in one format is quantized once: both layers share the stored tensors
    stored: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    empty = spill.empty if spill is not None else None
    for name, module, fmt in plan:
        weight = module.weight
        if id(weight) not in seen:
            report.float_bytes += weight.numel() * weight.element_size()
        seen.add(id(weight))
        key = (id(weight), fmt.name)
        if key not in stored:
            report.quantized_bytes += fmt.nbytes(int(weight.shape[0]), int(weight.shape[1]))
            stored[key] = {k: torch.nn.Parameter(v, requires_grad=False) for k, v in quantize(weight, fmt, empty).items()}
        if isinstance(module, torch.nn.Embedding):
            replacement: torch.nn.Module = QuantizedEmbedding(fmt, stored[key], weight.dtype, getattr(module, "embed_scale", None))
        else:
            replacement = QuantizedLinear(fmt, stored[key], module.bias)
        report.quantized[name] = fmt.name
        _set(model, name, replacement)
    return report
