"""Quantized weight formats: what a weight's bytes mean, as one typed, versionless description.

A :class:`WeightFormat` says how a 2-D weight ``[N, K]`` (a linear layer's
``[out_features, in_features]``, an embedding's ``[num_embeddings, dim]``) is
stored: bits per value, the group of ``K`` values sharing one scale (or one
scale per row), whether groups carry a minimum, the scales' dtype, and the
layout of the bytes. It travels from export to run time as its :attr:`name`
(``int8``, ``int4:g32``, ``q4_0``, ...): in the quantized operators' arguments,
in every delegate's record (``etsdk inspect`` shows it), and in the formats a
backend declares it can run (``BackendSpec.weight_formats``).

Math, for value ``q`` of group ``g`` with scale ``s`` (and minimum ``m``):

* 8 bits, symmetric: ``w = q * s`` with ``q`` int8;
* 4 bits, symmetric: ``w = (q - 8) * s`` with ``q`` in 0..15 (llama.cpp's Q4_0);
* with a minimum: ``w = q * s + m`` (llama.cpp's Q4_1; a torchao-style integer
  zero point ``z`` is the minimum ``-z * s``).

Int8 activations (``:a8``, any planes format): the same stored weight, but a linear
layer first quantizes each row of its input in blocks of 32 values, as
llama.cpp's Q8_0 / Q8_1 activations: ``d = max|x| / 127``, ``q = round(x * (1 /
d))`` (half to even; ``q = 0`` when ``d == 0``), and computes with ``q * d``
(:func:`etsdk.backend.quantize_activations`). It changes the numerics (every
input rounded to 8 bits per block), so it is part of the format's name: a
backend declaring ``int4:g32:a8`` computes that math, one that declares only
``int4:g32`` refuses the weight. A kernel can then multiply integers (VNNI dot
products) instead of widening every weight to float: the formats that decode
fastest on CPUs (``int8:g32:f16:a8`` is llama.cpp's Q8_0 arithmetic).
Embeddings read rows of the weight, which the
activations do not touch.

Layouts:

* :attr:`WeightLayout.PLANES` (formats etsdk quantizes itself): three tensors,
  ``qdata`` (int8 ``[N, K]``; for 4 bits uint8 ``[N, K / 2]``, value ``2i`` in
  the low nibble of byte ``i`` and ``2i + 1`` in the high one, as ONNX packs
  ``uint4``), ``scales`` (``[N]`` per row, else ``[N, K / group]``) and, with a
  minimum, ``mins`` (the shape of ``scales``).
* The GGUF block layouts (``q8_0``, ``q4_0``, ``q4_1``): one uint8 tensor
  ``[N, K / 32 * block bytes]`` holding llama.cpp's blocks byte for byte (a
  half scale, a half minimum for Q4_1, then the values; Q4_0 / Q4_1 put value
  ``j`` in the low nibble of byte ``j`` and value ``j + 16`` in its high
  nibble). A backend derives the planes it needs at load
  (``etsdk.backend.weight_planes``), so the program stores exactly what the
  GGUF file did.

This module imports no torch: records, the command line and ``etsdk inspect``
read formats without it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["GGUF_BLOCK", "QuantizationPlan", "WeightFormat", "WeightLayout", "WeightUse"]

#: Values per GGUF block of the Q8_0 / Q4_0 / Q4_1 formats.
GGUF_BLOCK = 32

_SCALE_DTYPES = {"float32": "", "float16": ":f16", "bfloat16": ":bf16"}
_SCALE_SUFFIXES = {suffix[1:]: dtype for dtype, suffix in _SCALE_DTYPES.items() if suffix}
_GROUPS = (32, 64, 128, 256)


class WeightLayout(enum.Enum):
    """How a quantized weight's bytes are laid out (see the module docstring)."""

    #: ``qdata``, ``scales`` and (with a minimum) ``mins`` as separate tensors.
    PLANES = "planes"
    #: llama.cpp's Q8_0 blocks: a float16 scale and 32 int8 values (34 bytes).
    GGUF_Q8_0 = "q8_0"
    #: llama.cpp's Q4_0 blocks: a float16 scale and 32 4-bit values, offset 8 (18 bytes).
    GGUF_Q4_0 = "q4_0"
    #: llama.cpp's Q4_1 blocks: a float16 scale, a float16 minimum and 32 4-bit values (20 bytes).
    GGUF_Q4_1 = "q4_1"


class WeightUse(enum.Enum):
    """What reads a quantized weight: a linear layer (``x @ w.T``) or an embedding (rows of ``w``)."""

    #: ``x @ w.T`` (``etsdk::linear_q``).
    LINEAR = "linear"
    #: Rows of ``w`` picked by index (``etsdk::embedding_q``).
    EMBEDDING = "embedding"


_BLOCK_BYTES = {WeightLayout.GGUF_Q8_0: 34, WeightLayout.GGUF_Q4_0: 18, WeightLayout.GGUF_Q4_1: 20}
#: (bits, group size, with a minimum, scale dtype) of each GGUF block layout.
_GGUF_FIELDS = {
    WeightLayout.GGUF_Q8_0: (8, GGUF_BLOCK, False, "float16"),
    WeightLayout.GGUF_Q4_0: (4, GGUF_BLOCK, False, "float16"),
    WeightLayout.GGUF_Q4_1: (4, GGUF_BLOCK, True, "float16"),
}


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """One quantized weight format (the module docstring gives the math and the layouts).

    Build one with :meth:`parse` (``WeightFormat.parse("int4:g32")``) or from its fields; the constructor
    refuses combinations no backend could agree on.
    """

    #: Bits per value: 8 or 4.
    bits: int
    #: Values of a row sharing one scale, or None for one scale per row (per output channel).
    group_size: int | None
    #: Groups carry a minimum (``w = q * s + m``); otherwise the format is symmetric.
    with_min: bool = False
    #: The scales' (and minimums') dtype: ``float32``, ``float16`` or ``bfloat16``.
    scale_dtype: str = "float32"
    #: How the bytes are laid out: etsdk's planes, or one of llama.cpp's GGUF block layouts.
    layout: WeightLayout = WeightLayout.PLANES
    #: A linear layer quantizes its input to int8 in blocks of 32 first (``:a8``; any planes format).
    int8_activations: bool = False

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"a weight format has 8 or 4 bits per value, found {self.bits!r}")
        if self.group_size is not None and self.group_size not in _GROUPS:
            raise ValueError(f"group size must be one of {', '.join(map(str, _GROUPS))} (or per row), found {self.group_size!r}")
        if self.bits == 4 and self.group_size is None:
            raise ValueError("4-bit weights need a group size (32, 64, 128 or 256)")
        if self.bits == 8 and self.with_min:
            raise ValueError("8-bit weights are symmetric (no minimum)")
        if self.scale_dtype not in _SCALE_DTYPES:
            raise ValueError(f"scale dtype must be one of {', '.join(_SCALE_DTYPES)}, found {self.scale_dtype!r}")
        if self.int8_activations and self.layout is not WeightLayout.PLANES:
            raise ValueError(
                "int8 activations (:a8) are an option of the planes formats (int8[:gGROUP]:a8, int4:gGROUP[:min]:a8), "
                f"not of llama.cpp's {self.layout.value} blocks"
            )
        if self.layout is not WeightLayout.PLANES:
            found = (self.bits, self.group_size, self.with_min, self.scale_dtype)
            if found != _GGUF_FIELDS[self.layout]:
                raise ValueError(f"layout {self.layout.value} is fixed by llama.cpp as {_GGUF_FIELDS[self.layout]}, found {found}")

    @property
    def name(self) -> str:
        """The format's one spelling: ``int8``, ``int8:g32``, ``int4:g32``, ``int4:g64:min``, ``int4:g32:f16``,
        ``int4:g32:a8``, ``int8:g64:a8``, ``q8_0``, ``q4_0``, ``q4_1``."""
        if self.layout is not WeightLayout.PLANES:
            return self.layout.value
        text = f"int{self.bits}"
        if self.group_size is not None:
            text += f":g{self.group_size}"
        if self.with_min:
            text += ":min"
        return text + _SCALE_DTYPES[self.scale_dtype] + (":a8" if self.int8_activations else "")

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str) -> WeightFormat:
        """The format named ``text``; ``int4:32`` is read as ``int4:g32`` and ``int4`` as ``int4:g32``.

        Raises ``ValueError`` naming what was expected.
        """
        if not isinstance(text, str) or not text:
            raise ValueError(f"a weight format is a name such as int8, int4:g32 or q4_0, found {text!r}")
        for layout in WeightLayout:
            if layout is not WeightLayout.PLANES and text == layout.value:
                return _gguf(layout)
        head, *rest = text.split(":")
        if head not in ("int8", "int4"):
            raise ValueError(
                f"unknown weight format {text!r}: expected int8[:gGROUP], int4[:gGROUP][:min][:a8], with :f16 or :bf16 "
                "scales, or a GGUF block format q8_0, q4_0, q4_1"
            )
        bits = int(head[3:])
        group: int | None = 32 if bits == 4 else None
        with_min = False
        int8_activations = False
        scale_dtype = "float32"
        for part in rest:
            digits = part[1:] if part.startswith("g") else part
            if digits.isdigit():
                group = int(digits)
            elif part == "min":
                with_min = True
            elif part == "a8":
                int8_activations = True
            elif part in _SCALE_SUFFIXES:
                scale_dtype = _SCALE_SUFFIXES[part]
            else:
                raise ValueError(f"weight format {text!r}: unknown part {part!r} (a group gGROUP, min, f16, bf16 or a8)")
        return cls(bits, group, with_min, scale_dtype, int8_activations=int8_activations)

    @classmethod
    def every(cls, *, int8_activations: bool = False) -> tuple[WeightFormat, ...]:
        """Every weight-only format etsdk describes (for a backend that computes them all, such as the reference
        backend); with ``int8_activations``, the ``:a8`` forms of the planes ones too (a backend that declares them
        quantizes a linear layer's input as the module docstring says)."""
        found: list[WeightFormat] = []
        for scale_dtype in _SCALE_DTYPES:
            found.append(cls(8, None, False, scale_dtype))
            if int8_activations:
                found.append(cls(8, None, False, scale_dtype, int8_activations=True))
            for group in _GROUPS:
                found.append(cls(8, group, False, scale_dtype))
                if int8_activations:
                    found.append(cls(8, group, False, scale_dtype, int8_activations=True))
                found.append(cls(4, group, False, scale_dtype))
                found.append(cls(4, group, True, scale_dtype))
                if int8_activations:
                    found.append(cls(4, group, False, scale_dtype, int8_activations=True))
                    found.append(cls(4, group, True, scale_dtype, int8_activations=True))
        return (*found, *(_gguf(layout) for layout in _GGUF_FIELDS))

    @property
    def block_bytes(self) -> int:
        """Bytes of one GGUF block (32 values); 0 for the planes layout."""
        return _BLOCK_BYTES.get(self.layout, 0)

    def check_shape(self, rows: int, columns: int) -> None:
        """Raise ``ValueError`` unless a ``[rows, columns]`` weight can be stored in this format."""
        if rows <= 0 or columns <= 0:
            raise ValueError(f"a quantized weight has a positive shape, found [{rows}, {columns}]")
        group = self.group_size
        if group is not None and columns % group:
            raise ValueError(
                f"format {self.name} groups {group} values of a row, but the weight's rows have {columns} values "
                f"(not a multiple of {group})"
            )

    def groups(self, columns: int) -> int:
        """Scales per row for rows of ``columns`` values."""
        return 1 if self.group_size is None else columns // self.group_size

    def planes(self, rows: int, columns: int) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The stored tensors of a ``[rows, columns]`` weight: name -> (dtype, shape), in argument order.

        ``{"qdata": ..., "scales": ..., "mins": ...}`` for the planes layout, ``{"blocks": ...}`` for GGUF.
        """
        self.check_shape(rows, columns)
        if self.layout is not WeightLayout.PLANES:
            return {"blocks": ("uint8", (rows, columns // GGUF_BLOCK * self.block_bytes))}
        qdata: tuple[str, tuple[int, ...]] = ("int8", (rows, columns)) if self.bits == 8 else ("uint8", (rows, columns // 2))
        scales: tuple[str, tuple[int, ...]] = (self.scale_dtype, (rows,) if self.group_size is None else (rows, self.groups(columns)))
        found: dict[str, tuple[str, tuple[int, ...]]] = {"qdata": qdata, "scales": scales}
        if self.with_min:
            found["mins"] = scales
        return found

    def nbytes(self, rows: int, columns: int) -> int:
        """Bytes a ``[rows, columns]`` weight takes in this format."""
        sizes = {"int8": 1, "uint8": 1, "float32": 4, "float16": 2, "bfloat16": 2}
        total = 0
        for dtype, shape in self.planes(rows, columns).values():
            count = 1
            for d in shape:
                count *= d
            total += count * sizes[dtype]
        return total

    @property
    def planes_format(self) -> WeightFormat:
        """The planes format that holds this one's values exactly (itself for the planes layout)."""
        if self.layout is WeightLayout.PLANES:
            return self
        return WeightFormat(self.bits, self.group_size, self.with_min, self.scale_dtype)


@dataclass(frozen=True, slots=True)
class QuantizationPlan:
    """Which layers of a model to quantize, in which format (None: keep that kind of layer in float).

    ``linear``: every linear layer but the output head; ``embedding``: the input embedding; ``head``: the
    output head (tied to the embedding in many LLMs: the same format stores them once).
    """

    linear: WeightFormat | None = None
    embedding: WeightFormat | None = None
    head: WeightFormat | None = None

    @classmethod
    def for_format(
        cls, linear: str | WeightFormat, *, embedding: str | WeightFormat | None = None, head: str | WeightFormat | None = None
    ) -> QuantizationPlan:
        """``linear`` for the linear layers; the embedding and the head in ``int8`` unless given (``"float"`` keeps
        one in float): 8 bits per weight where a 4-bit format costs the most quality (the first and last layer)."""

        def parse(value: str | WeightFormat | None) -> WeightFormat | None:
            if value is None:
                return WeightFormat.parse("int8")
            if isinstance(value, WeightFormat):
                return value
            return None if value == "float" else WeightFormat.parse(value)

        first = linear if isinstance(linear, WeightFormat) else WeightFormat.parse(linear)
        return cls(first, parse(embedding), parse(head))

    def describe(self) -> str:
        """``linear int4:g32, embedding int8, head int8``."""
        return ", ".join(f"{name} {fmt.name if fmt else 'float'}" for name, fmt in (("linear", self.linear), ("embedding", self.embedding), ("head", self.head)))


def _gguf(layout: WeightLayout) -> WeightFormat:
    bits, group, with_min, scale_dtype = _GGUF_FIELDS[layout]
    return WeightFormat(bits, group, with_min, scale_dtype, layout)
