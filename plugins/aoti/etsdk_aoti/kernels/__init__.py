"""etsdk-aoti's native kernels: ``etsdk_aoti::etsdk_qmm`` (quantized weights; ``etsdk_qmm_a8`` for the int8-activation
``:a8`` formats, ``etsdk_qmm_a8_fused`` for several of their weights that read the same input), ``etsdk_aoti::etsdk_linear``
(float32 weights times a few rows: decode), ``etsdk_aoti::etsdk_attention``, ``etsdk_aoti::etsdk_attention_int8`` and
``etsdk_aoti::etsdk_attention_slots``.

``etsdk_linear`` (``gemv.cpp``) is ``x @ w.T + bias`` for float32 (or bfloat16 / float16, widened in registers)
weights, on every thread of torch's team:
the library GEMV Inductor calls for a decode step's products ran on one thread here, reading the weights at a
third of the memory's bandwidth. The exporter points only products of at most :data:`FEW_ROWS` rows at it.

``etsdk_attention`` (``attention.cpp``) stands for the core's ``etsdk::attention``: SDPA under a boolean mask
that reads only the key / value rows some query sees, so an LLM's decode step costs what its conversation
holds, not the cache's capacity; ``etsdk_attention_int8`` is its int8-cache form (int8 rows, a float32 scale
per row); ``etsdk_attention_slots`` attends each row of a batch of sessions over that session's own cache tensors
(a batched decode step: one call and one parallel region for every session of a layer, not one per session). Their
eager implementation is the core's reference.


The serializer rewrites every ``etsdk::linear_q`` of a partition into
``etsdk_aoti::etsdk_qmm`` on the weight's planes; AOTInductor then calls the C
function ``aoti_torch_cpu_etsdk_qmm`` (its C-shim convention for a custom
operator, declared in :data:`C_SHIM`) from the compiled library, which resolves
it against ``libetsdk_aoti_kernels.so`` (``entry.cpp``: operand checks and
outputs, built for the compiler's baseline target). The entry points call the
compute of one instruction-set level (``table.h``): the same sources (``vec.h``:
the vector operations of every level side by side) built per level into
``libetsdk_aoti_kernels_<level>.so`` (:mod:`etsdk_aoti.kernels.levels`:
portable, avx2, avx2vnni, avx512, avx512vnni, neon). :func:`load` builds the
entry library and the level this process uses (the host's best, or
``ETSDK_AOTI_ISA``'s) once per machine (cached by content: built where they
run) and loads the entry library with ``RTLD_GLOBAL`` before any library that
calls it is loaded; :func:`use_level` switches levels in a running process
(tests, A/B timing). A blob whose library calls a kernel requires the blob
feature :data:`KERNELS_FEATURE` (and its siblings in :mod:`etsdk_aoti.blob_format`).

Why not ATen's ``_weight_int8pack_mm`` / ``_weight_int4pack_mm_for_cpu``: on this
project's reference machine (AVX-512, 2 cores) both ran a decode-shaped product
(``[1, 576] x [1536, 576]``) 8 to 15 times slower than the float32 ``mm`` they
replace (benchmarks/README.md); this kernel reads every packed byte once and
keeps decode at the memory's speed.

The operator's eager implementation (tracing and shape propagation only) is the
format's reference math: dequantize, then ``linear``.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from etsdk import BackendError

from etsdk_aoti.blob_format import KERNELS_FEATURE
from etsdk_aoti.kernels.levels import ISA_VARIABLE, LEVELS, KernelLevel, level_named, requested_level, runnable_levels

__all__ = [
    "ISA_VARIABLE",
    "LEVELS",
    "KernelLevel",
    "current_level",
    "runnable_levels",
    "use_level",
    "ATTENTION_C_SHIM",
    "ATTENTION_INT8_C_SHIM",
    "C_SHIM",
    "QMM_A8_C_SHIM",
    "QMM_A8_FUSED",
    "QMM_A8_FUSED_C_SHIM",
    "KERNELS_FEATURE",
    "KERNEL_ATTENTION",
    "KERNEL_ATTENTION_INT8",
    "KERNEL_ATTENTION_SLOTS",
    "ATTENTION_SLOTS_C_SHIM",
    "attention_slots",
    "FEW_ROWS",
    "LINEAR",
    "LINEAR_C_SHIM",
    "QMM",
    "QMM_A8",
    "attention",
    "attention_queries_attended",
    "attention_rows_read",
    "linear",
    "load",
    "qmm",
    "qmm_a8_fused",
    "rows_multiplied",
]

#: The C declaration AOTInductor emits for the operator (``aot_inductor.custom_ops_to_c_shims``).
C_SHIM = (
    "AOTITorchError aoti_torch_cpu_etsdk_qmm(AtenTensorHandle x, AtenTensorHandle qdata, AtenTensorHandle scales, "
    "AtenTensorHandle* mins, AtenTensorHandle* bias, int64_t bits, int64_t group, AtenTensorHandle* ret0)"
)

#: The C declaration AOTInductor emits for ``etsdk_aoti::etsdk_qmm_a8`` (4-bit weights, int8 activations).
QMM_A8_C_SHIM = (
    "AOTITorchError aoti_torch_cpu_etsdk_qmm_a8(AtenTensorHandle x, AtenTensorHandle qdata, AtenTensorHandle scales, "
    "AtenTensorHandle* mins, AtenTensorHandle* bias, int64_t group, AtenTensorHandle* ret0)"
)

#: The C declaration AOTInductor emits for ``etsdk_aoti::etsdk_qmm_a8_fused`` (the ``:a8`` product of several
#: weights that read the same input, outputs side by side; a ``Tensor[]`` argument is a pointer and a length).
QMM_A8_FUSED_C_SHIM = (
    "AOTITorchError aoti_torch_cpu_etsdk_qmm_a8_fused(AtenTensorHandle x, const AtenTensorHandle* qdata, "
    "int64_t qdata_len_, const AtenTensorHandle* scales, int64_t scales_len_, const AtenTensorHandle* mins, "
    "int64_t mins_len_, const AtenTensorHandle* bias, int64_t bias_len_, int64_t group, AtenTensorHandle* ret0)"
)

#: The C declaration AOTInductor emits for ``etsdk_aoti::etsdk_linear``.
LINEAR_C_SHIM = (
    "AOTITorchError aoti_torch_cpu_etsdk_linear(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, "
    "AtenTensorHandle* ret0)"
)

#: The most rows of activations a product the exporter gives ``etsdk_linear`` has (a decode step has one per
#: token); larger products keep the library GEMM, which blocks for the caches.
FEW_ROWS = 4

#: The C declaration AOTInductor emits for ``etsdk_aoti::etsdk_attention``.
ATTENTION_C_SHIM = (
    "AOTITorchError aoti_torch_cpu_etsdk_attention(AtenTensorHandle query, AtenTensorHandle key, "
    "AtenTensorHandle value, AtenTensorHandle mask, double scale, AtenTensorHandle* ret0)"
)

#: The C declaration AOTInductor emits for ``etsdk_aoti::etsdk_attention_int8``.
ATTENTION_INT8_C_SHIM = (
    "AOTITorchError aoti_torch_cpu_etsdk_attention_int8(AtenTensorHandle query, AtenTensorHandle key, "
    "AtenTensorHandle key_scale, AtenTensorHandle value, AtenTensorHandle value_scale, AtenTensorHandle mask, "
    "double scale, AtenTensorHandle* ret0)"
)

#: The C declaration AOTInductor emits for ``etsdk_aoti::etsdk_attention_slots`` (a ``Tensor[]`` argument is a
#: pointer and a length; float32 caches pass empty scale lists).
ATTENTION_SLOTS_C_SHIM = (
    "AOTITorchError aoti_torch_cpu_etsdk_attention_slots(AtenTensorHandle query, const AtenTensorHandle* keys, "
    "int64_t keys_len_, const AtenTensorHandle* values, int64_t values_len_, AtenTensorHandle mask, double scale, "
    "const AtenTensorHandle* key_scales, int64_t key_scales_len_, const AtenTensorHandle* value_scales, "
    "int64_t value_scales_len_, AtenTensorHandle* ret0)"
)

_HERE = Path(__file__).parent
#: Built once per level (levels.py) into libetsdk_aoti_kernels_<level>.so: the compute, no torch.
_LEVEL_SOURCES = [_HERE / "qmm.cpp", _HERE / "attention.cpp", _HERE / "gemv.cpp", _HERE / "level.cpp"]
#: Built once into libetsdk_aoti_kernels.so, with the compiler's baseline target: the entry points compiled
#: libraries call (operand checks, outputs), forwarding to the selected level's table.
_ENTRY_SOURCES = [_HERE / "entry.cpp"]
_lock = threading.Lock()
_loaded: ctypes.CDLL | None = None
_path: Path | None = None
_level: KernelLevel | None = None
_tables: dict[str, tuple[ctypes.CDLL, int]] = {}  # level name -> (its library, its table's address), kept loaded
_function: Any = None
_function_a8: Any = None


@torch.library.custom_op("etsdk_aoti::etsdk_qmm", mutates_args=())
def etsdk_qmm(
    x: torch.Tensor,
    qdata: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor | None,
    bias: torch.Tensor | None,
    bits: int,
    group: int,
) -> torch.Tensor:
    rows = int(qdata.shape[0])
    if bits == 8:
        values = qdata.float()
    else:
        values = torch.stack([qdata & 0x0F, qdata >> 4], dim=-1).reshape(rows, -1).float()
        if mins is None:
            values = values - 8.0
    columns = values.shape[1]
    expand = (lambda t: t.float().unsqueeze(1)) if group == 0 else (lambda t: t.float().repeat_interleave(group, dim=1))
    weight = values * expand(scales)
    if mins is not None:
        weight = weight + expand(mins)
    assert weight.shape == (rows, columns)
    return torch.nn.functional.linear(x, weight, bias)


@etsdk_qmm.register_fake
def _(x: torch.Tensor, qdata: torch.Tensor, scales: torch.Tensor, mins: object, bias: object, bits: int, group: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], qdata.shape[0]))


QMM = torch.ops.etsdk_aoti.etsdk_qmm.default


@torch.library.custom_op("etsdk_aoti::etsdk_qmm_a8", mutates_args=())
def etsdk_qmm_a8(
    x: torch.Tensor, qdata: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None, bias: torch.Tensor | None, group: int
) -> torch.Tensor:
    from etsdk.backend import dequantize_activations, quantize_activations

    bits = 8 if qdata.dtype == torch.int8 else 4
    return etsdk_qmm(dequantize_activations(*quantize_activations(x)), qdata, scales, mins, bias, bits, group)


@etsdk_qmm_a8.register_fake
def _(x: torch.Tensor, qdata: torch.Tensor, scales: torch.Tensor, mins: object, bias: object, group: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], qdata.shape[0]))


QMM_A8 = torch.ops.etsdk_aoti.etsdk_qmm_a8.default


@torch.library.custom_op("etsdk_aoti::etsdk_qmm_a8_fused", mutates_args=())
def etsdk_qmm_a8_fused(
    x: torch.Tensor, qdata: list[torch.Tensor], scales: list[torch.Tensor], mins: list[torch.Tensor], bias: list[torch.Tensor],
    group: int,
) -> torch.Tensor:
    """``etsdk_qmm_a8`` of every weight (``mins`` / ``bias``: one per weight or empty), the outputs side by side."""
    parts = [
        etsdk_qmm_a8(x, q, s, mins[i] if mins else None, bias[i] if bias else None, group) for i, (q, s) in enumerate(zip(qdata, scales, strict=True))
    ]
    return torch.cat(parts, dim=1)


@etsdk_qmm_a8_fused.register_fake
def _(x: torch.Tensor, qdata: list[torch.Tensor], scales: object, mins: object, bias: object, group: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], sum(int(q.shape[0]) for q in qdata)))


QMM_A8_FUSED = torch.ops.etsdk_aoti.etsdk_qmm_a8_fused.default


@torch.library.custom_op("etsdk_aoti::etsdk_linear", mutates_args=())
def etsdk_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight.to(x.dtype), bias)  # a 16-bit weight is widened (exactly)


@etsdk_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: object) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


LINEAR = torch.ops.etsdk_aoti.etsdk_linear.default


@torch.library.custom_op("etsdk_aoti::etsdk_attention", mutates_args=())
def etsdk_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    from etsdk.backend import ATTENTION

    return ATTENTION(query, key, value, mask, scale)  # type: ignore[no-any-return]


@etsdk_attention.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


KERNEL_ATTENTION = torch.ops.etsdk_aoti.etsdk_attention.default


@torch.library.custom_op("etsdk_aoti::etsdk_attention_int8", mutates_args=())
def etsdk_attention_int8(
    query: torch.Tensor, key: torch.Tensor, key_scale: torch.Tensor, value: torch.Tensor, value_scale: torch.Tensor,
    mask: torch.Tensor, scale: float,
) -> torch.Tensor:
    from etsdk.backend import ATTENTION

    return ATTENTION(query, key, value, mask, scale, key_scale, value_scale)  # type: ignore[no-any-return]


@etsdk_attention_int8.register_fake
def _(
    query: torch.Tensor, key: torch.Tensor, key_scale: torch.Tensor, value: torch.Tensor, value_scale: torch.Tensor,
    mask: torch.Tensor, scale: float,
) -> torch.Tensor:
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


KERNEL_ATTENTION_INT8 = torch.ops.etsdk_aoti.etsdk_attention_int8.default


@torch.library.custom_op("etsdk_aoti::etsdk_attention_slots", mutates_args=())
def etsdk_attention_slots(
    query: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor, scale: float,
    key_scales: list[torch.Tensor], value_scales: list[torch.Tensor],
) -> torch.Tensor:
    """Row ``b`` of ``query`` [B, Hq, L, E] over session ``b``'s caches ``keys[b]`` / ``values[b]`` ([1, H, S, E] each;
    int8 with ``key_scales[b]`` / ``value_scales[b]``, float32 with empty lists) under mask row ``b`` (or the one mask
    row of a [1, 1, L, S] mask): the core's ``etsdk::attention`` per session, concatenated."""
    from etsdk.backend import ATTENTION

    out = []
    for b, (key, value) in enumerate(zip(keys, values)):
        scales = (key_scales[b], value_scales[b]) if key_scales else ()
        rows = mask if mask.shape[0] == 1 else mask[b : b + 1]
        out.append(ATTENTION(query[b : b + 1], key, value, rows, scale, *scales))
    return torch.cat(out, dim=0)


@etsdk_attention_slots.register_fake
def _(
    query: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor, scale: float,
    key_scales: list[torch.Tensor], value_scales: list[torch.Tensor],
) -> torch.Tensor:
    return query.new_empty((*query.shape[:-1], values[0].shape[-1]))


KERNEL_ATTENTION_SLOTS = torch.ops.etsdk_aoti.etsdk_attention_slots.default


def _torch_lib() -> Path:
    return Path(torch.__file__).parent / "lib"


def _level_library(level: KernelLevel) -> Path:
    """Build (once per machine, cached by content) the kernels at ``level``: compute only, no torch; OpenMP from
    torch's directory (its libgomp, so the team size torch is given applies here too)."""
    from etsdk.backend import build_native_library

    flags = [*level.flags, "-fopenmp", "-fvisibility=hidden", f"-Wl,-rpath,{_torch_lib()}"]
    headers = [_HERE / "vec.h", _HERE / "table.h"]
    return build_native_library(f"etsdk_aoti_kernels_{level.name}", _LEVEL_SOURCES, flags, headers=headers)


def _entry_library() -> Path:
    from etsdk.backend import build_native_library

    torch_dir = Path(torch.__file__).parent
    lib = _torch_lib()
    flags = ["-fvisibility=hidden", f"-I{torch_dir / 'include'}", f"-L{lib}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}"]
    return build_native_library("etsdk_aoti_kernels", _ENTRY_SOURCES, flags, headers=[_HERE / "aoti_shim.h", _HERE / "table.h"])


class _TableHead(ctypes.Structure):
    """The first fields of table.h's KernelTable."""

    _fields_ = [("abi", ctypes.c_int32), ("level", ctypes.c_char_p)]


def _select(level: KernelLevel) -> None:
    """Point the entry points at ``level``'s table (building and loading its library the first time). Holds _lock."""
    global _level
    assert _loaded is not None
    if level.name not in _tables:
        path = _level_library(level)
        library = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)  # its symbols stay its own: one table per level
        function = library.etsdk_kernels_table
        function.restype = ctypes.POINTER(_TableHead)
        head = function()
        built = head.contents.level
        if built is None or built.decode() != level.name:
            raise BackendError(
                f"{path.name} was built for level {level.name} ({' '.join(level.flags)}) but its code is level "
                f"{(built or b'?').decode()}: the compiler ignored the flags"
            )
        _tables[level.name] = (library, ctypes.cast(head, ctypes.c_void_p).value or 0)
    select = _loaded.etsdk_aoti_select
    select.argtypes = [ctypes.c_void_p]
    select.restype = ctypes.c_int32
    if select(_tables[level.name][1]) != 0:
        raise BackendError(f"the kernels of level {level.name} were built for another table ABI; remove {cache_dir_hint()}")
    _level = level


def cache_dir_hint() -> str:
    from etsdk.backend import cache_dir

    return str(cache_dir() / "native")


def load() -> Path:
    """Build (once per machine) and load the kernels into the process's global scope, with the level this process
    uses (:func:`etsdk_aoti.kernels.levels.requested_level`) selected; the entry library's path. Raises
    :class:`etsdk.BackendUnavailableError` where ``ETSDK_AOTI_ISA`` names a level the host cannot run."""
    global _loaded, _path
    with _lock:
        if _path is None:  # once per process: the builds check the cache by hashing the sources
            level = requested_level()
            path = _entry_library()
            _loaded = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            _select(level)
            _path = path
        return _path


def current_level() -> KernelLevel:
    """The level the kernels run at in this process (loading them if needed)."""
    load()
    assert _level is not None
    return _level


def use_level(name: str) -> KernelLevel:
    """Run the kernels at level ``name`` from now on (tests and A/B timing; a level the host cannot run is refused
    with :class:`etsdk.BackendUnavailableError`). Not while a kernel runs on another thread."""
    load()
    chosen = level_named(name)
    with _lock:
        _select(chosen)
    return chosen


def attention_rows_read() -> int:
    """Key / value rows the native attention kernel has read in this process (the sum of ``n`` over its calls)."""
    load()
    assert _loaded is not None
    function = _loaded.etsdk_attention_rows_read
    function.restype = ctypes.c_int64
    return int(function())


def attention_queries_attended() -> int:
    """Query rows (one per head and position) the native attention kernel has computed in this process: a row
    bitwise equal to the one before it under an equal mask row (a padded prefill chunk's) is copied, not computed."""
    load()
    assert _loaded is not None
    function = _loaded.etsdk_attention_queries_attended
    function.restype = ctypes.c_int64
    return int(function())


def rows_multiplied() -> int:
    """Rows of ``x`` the native linear products have multiplied in this process: a product skips ``x``'s trailing
    zero rows (a padded prefill chunk's) and gives them the bias instead."""
    load()
    assert _loaded is not None
    function = _loaded.etsdk_rows_multiplied
    function.restype = ctypes.c_int64
    return int(function())


def _listed(handles: Sequence[int], lists: Sequence[Sequence[torch.Tensor]]) -> list[tuple[Any, int]]:
    """The ``Tensor[]`` arguments of a C-shim call: for each of ``lists`` in turn, an array of its tensors' handles
    (taken from ``handles`` in order; None for an empty list) and its length."""
    out, at = [], 0
    for tensors in lists:
        out.append(((ctypes.c_void_p * len(tensors))(*handles[at : at + len(tensors)]) if tensors else None, len(tensors)))
        at += len(tensors)
    return out


def _stolen(out: ctypes.c_void_p) -> torch.Tensor:
    """The output tensor a kernel entry point allocated (its handle in ``out``), owning that handle."""
    from etsdk_aoti.library import _new_capsule

    result: torch.Tensor = torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs([_new_capsule(out.value, None, None)])[0]
    return result


def qmm(
    x: torch.Tensor,
    qdata: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    bits: int,
    group: int,
    int8_activations: bool = False,
) -> torch.Tensor:
    """Call the native kernel directly (tests and benchmarks): ``x [M, K] @ w.T (+ bias)`` for ``w`` in the planes
    ``qdata`` / ``scales`` / ``mins`` (float32 scales; ``group`` 0: one scale per row); with ``int8_activations``
    the ``:a8`` product (``etsdk_qmm_a8``; ``bits`` then follows ``qdata``'s dtype: int8 8-bit, uint8 4-bit).
    Raises ``ValueError`` when the kernel refuses the tensors
    (wrong dtype, shape or layout)."""
    global _function, _function_a8
    from etsdk_aoti.library import free_handles, tensor_handles

    path = load()
    pointer = ctypes.c_void_p
    assert _loaded is not None
    if _function is None:
        _function = _loaded.aoti_torch_cpu_etsdk_qmm
        _function.argtypes = [pointer, pointer, pointer, ctypes.POINTER(pointer), ctypes.POINTER(pointer), ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(pointer)]
    if _function_a8 is None:
        _function_a8 = _loaded.aoti_torch_cpu_etsdk_qmm_a8
        _function_a8.argtypes = [pointer, pointer, pointer, ctypes.POINTER(pointer), ctypes.POINTER(pointer), ctypes.c_int64, ctypes.POINTER(pointer)]
    given = [x, qdata, scales, *(t for t in (mins, bias) if t is not None)]
    handles = tensor_handles(given)
    try:
        mins_handle = pointer(handles[3]) if mins is not None else None
        bias_handle = pointer(handles[-1]) if bias is not None else None
        out = pointer()
        optional = (
            ctypes.byref(mins_handle) if mins_handle is not None else None,
            ctypes.byref(bias_handle) if bias_handle is not None else None,
        )
        if int8_activations:
            code = _function_a8(handles[0], handles[1], handles[2], *optional, group, ctypes.byref(out))
        else:
            code = _function(handles[0], handles[1], handles[2], *optional, bits, group, ctypes.byref(out))
    finally:
        free_handles(handles)
    if code != 0:
        raise ValueError(f"{path.name} refused the tensors (x {list(x.shape)} {x.dtype}, qdata {list(qdata.shape)} {qdata.dtype}, bits {bits}, group {group})")
    return _stolen(out)


def qmm_a8_fused(
    x: torch.Tensor,
    qdata: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    mins: Sequence[torch.Tensor] = (),
    bias: Sequence[torch.Tensor] = (),
    *,
    group: int,
) -> torch.Tensor:
    """Call the fused ``:a8`` kernel directly (tests and benchmarks): ``x [M, K]`` times each weight (4-bit or int8 planes;
    ``mins`` / ``bias`` one per weight or empty), the outputs side by side in one ``[M, sum of N]`` tensor.
    Raises ``ValueError`` when the kernel refuses the tensors."""
    from etsdk_aoti.library import free_handles, tensor_handles

    path = load()
    assert _loaded is not None
    pointer = ctypes.c_void_p
    function = _loaded.aoti_torch_cpu_etsdk_qmm_a8_fused
    function.argtypes = [pointer, *[ctypes.POINTER(pointer), ctypes.c_int64] * 4, ctypes.c_int64, ctypes.POINTER(pointer)]  # type: ignore[list-item]
    lists = [list(qdata), list(scales), list(mins), list(bias)]
    handles = tensor_handles([x, *(t for tensors in lists for t in tensors)])
    try:
        arrays = [part for listed in _listed(handles[1:], lists) for part in listed]
        out = pointer()
        code = function(handles[0], *arrays, group, ctypes.byref(out))
    finally:
        free_handles(handles)
    if code != 0:
        shapes = ", ".join(f"{list(t.shape)} {t.dtype}" for t in [x, *lists[0]])
        raise ValueError(f"{path.name} refused the tensors ({shapes}, {[len(t) for t in lists]} tensors, group {group})")
    return _stolen(out)


def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
    key_scale: torch.Tensor | None = None, value_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Call the native attention kernel directly (tests and benchmarks): the int8 one when ``key_scale`` and
    ``value_scale`` are given; ``ValueError`` when it refuses the tensors (dtype, rank, sizes or layout)."""
    from etsdk_aoti.library import free_handles, tensor_handles

    path = load()
    assert _loaded is not None
    pointer = ctypes.c_void_p
    quantized = key_scale is not None or value_scale is not None
    operands = [query, key, key_scale, value, value_scale, mask] if quantized else [query, key, value, mask]
    if any(t is None for t in operands):
        raise ValueError("the int8 attention kernel takes key_scale and value_scale both")
    function = _loaded.aoti_torch_cpu_etsdk_attention_int8 if quantized else _loaded.aoti_torch_cpu_etsdk_attention
    function.argtypes = [pointer] * len(operands) + [ctypes.c_double, ctypes.POINTER(pointer)]
    handles = tensor_handles(operands)
    try:
        out = pointer()
        code = function(*handles, scale, ctypes.byref(out))
    finally:
        free_handles(handles)
    if code != 0:
        shapes = ", ".join(f"{list(t.shape)} {t.dtype}" for t in operands if t is not None)
        raise ValueError(f"{path.name} refused the tensors ({shapes})")
    return _stolen(out)


def attention_slots(
    query: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], mask: torch.Tensor, scale: float,
    key_scales: Sequence[torch.Tensor] = (), value_scales: Sequence[torch.Tensor] = (),
) -> torch.Tensor:
    """Call the native attention kernel's slots form directly (tests and benchmarks): row ``b`` of ``query`` over
    ``keys[b]`` / ``values[b]`` (int8 ones with ``key_scales`` / ``value_scales``); ``ValueError`` when it refuses
    the tensors."""
    from etsdk_aoti.library import free_handles, tensor_handles

    path = load()
    assert _loaded is not None
    pointer = ctypes.c_void_p
    function = _loaded.aoti_torch_cpu_etsdk_attention_slots
    listed = ctypes.POINTER(pointer), ctypes.c_int64
    function.argtypes = [pointer, *listed, *listed, pointer, ctypes.c_double, *listed, *listed, ctypes.POINTER(pointer)]
    lists = [list(keys), list(values), list(key_scales), list(value_scales)]
    handles = tensor_handles([query, mask, *(t for tensors in lists for t in tensors)])
    try:
        arrays = _listed(handles[2:], lists)
        out = pointer()
        code = function(handles[0], *arrays[0], *arrays[1], handles[1], scale, *arrays[2], *arrays[3], ctypes.byref(out))
    finally:
        free_handles(handles)
    if code != 0:
        shapes = ", ".join(f"{list(t.shape)} {t.dtype}" for t in [query, *lists[0], mask])
        raise ValueError(f"{path.name} refused the tensors ({shapes}; {[len(t) for t in lists]} tensors per list)")
    return _stolen(out)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Call the native GEMV directly (tests and benchmarks): ``x [M, K] @ weight.float().T (+ bias)``, ``weight``
    float32, bfloat16 or float16;
    ``ValueError`` when it refuses the tensors (dtype, rank, sizes or layout)."""
    from etsdk_aoti.library import free_handles, tensor_handles

    path = load()
    assert _loaded is not None
    pointer = ctypes.c_void_p
    function = _loaded.aoti_torch_cpu_etsdk_linear
    function.argtypes = [pointer, pointer, ctypes.POINTER(pointer), ctypes.POINTER(pointer)]
    given = [x, weight] + ([bias] if bias is not None else [])
    handles = tensor_handles(given)
    try:
        bias_handle = pointer(handles[2]) if bias is not None else None
        out = pointer()
        code = function(handles[0], handles[1], ctypes.byref(bias_handle) if bias_handle is not None else None, ctypes.byref(out))
    finally:
        free_handles(handles)
    if code != 0:
        shapes = ", ".join(f"{list(t.shape)} {t.dtype}" for t in given)
        raise ValueError(f"{path.name} refused the tensors ({shapes})")
    return _stolen(out)
