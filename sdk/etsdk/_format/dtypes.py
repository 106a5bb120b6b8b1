"""ExecuTorch ``ScalarType`` codes and their torch dtypes, in one place."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["SCALAR_TYPE_NAMES", "dtype_name", "torch_dtype"]

#: ExecuTorch ScalarType code -> torch dtype attribute name (runtime/core/portable_type/scalar_type.h).
SCALAR_TYPE_NAMES: dict[int, str] = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    11: "bool",
    15: "bfloat16",
}


@functools.cache
def _table() -> dict[int, torch.dtype]:
    import torch

    return {code: getattr(torch, name) for code, name in SCALAR_TYPE_NAMES.items()}


def torch_dtype(code: int) -> torch.dtype:
    """The torch dtype of an ExecuTorch ``ScalarType`` code (``6`` -> ``torch.float32``)."""
    try:
        return _table()[code]
    except KeyError:
        raise ValueError(f"unsupported ExecuTorch scalar type code {code}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``: the spelling contracts and signatures use."""
    return str(dtype).removeprefix("torch.")
