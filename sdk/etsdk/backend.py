"""The public API for writing an etsdk backend: everything a plugin receives and returns.

A backend is three factories in an :class:`BackendSpec` (registered by the
plugin's ``etsdk_register_backends`` hook, documented in the hook specifications,
``sdk/etsdk/_plugins/hookspec.py``):

**Partitioner** ``partitioner(**options) -> Partitioner``
    Usually an :class:`OperatorPartitioner` naming the operators the backend
    computes. Options are declared with :class:`Option` and checked by the core
    (backend and method named on a mistake). The core wraps every partitioner:
    it tags declared state into the delegate that uses it, checks the backend id
    of every tag, and keeps operators whole for every backend of a method.

**Preprocess** ``preprocess(partition: Partition) -> bytes | BlobWriter``
    Compile one partition. :class:`Partition` gives the partition's graph, its
    :class:`DelegateSignature` (engine inputs / outputs in binding order, state
    bindings, claimed operators), its constants (never state), the state
    updates, and a :class:`NamedDataWriter` for weights. Return only the
    payload: the core wraps it with the delegate's uid and records the signature
    and the payload's SHA-256 in the program.

**Runtime** ``runtime() -> RuntimeBinding``
    ``binding.init(context: InitContext) -> handle`` once per delegate per
    method load (``context.blob`` is the payload, ``context.named_data`` the
    weights, ``context.states`` the state bindings); then per call
    ``handle.execute(args, state)``: ``args`` are the delegate's inputs then
    outputs (tensors sharing the runtime's memory: write outputs in place),
    ``state`` the calling session's storage for each state binding, in order
    (update it in place). ``handle.destroy()`` (optional) when the method is
    freed.

Payloads should use the etsdk container (:class:`BlobWriter` /
:class:`BlobReader`) so a reader that lacks a required feature refuses the blob.
Check a backend with the conformance kit: ``etsdk conformance BACKEND_ID`` (or
``pytest --etsdk-backend BACKEND_ID``); start one with ``etsdk new-backend``.

Quantized weights: a call of ``etsdk::linear_q`` / ``etsdk::embedding_q`` carries
its weight's :class:`WeightFormat`; :func:`quantized_call` reads it from a node,
a backend declares the formats it runs (``BackendSpec.weight_formats``) and
derives the planes it needs at load with :func:`weight_planes`. The ``:a8`` formats
(``int4:g32:a8``) round a linear layer's input to int8 per block of 32 first
(:func:`quantize_activations`): a backend declares them only if it computes that.

Attention over the filled rows: ``etsdk::attention`` (:data:`ATTENTION`) is SDPA under a boolean mask that reads
only the key / value rows some query sees (:func:`filled_rows`); a backend that claims it declares
``Capability.FILLED_ATTENTION`` and computes its int8 form too (int8 key / value caches with one scale per row,
:func:`quantize_rows` / :func:`dequantize_rows`).

Importing this module is cheap; :class:`OperatorPartitioner`, :func:`aten_name`
and the quantized-weight helpers import torch (and executorch) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etsdk._export.partition import (
    WEIGHTS_NAMESPACE,
    Constant,
    NamedDataWriter,
    Partition,
    StateUpdate,
    release_mapped_weights,
)
from etsdk._format.blob import BlobReader, BlobWriter
from etsdk._format.dtypes import dtype_name, torch_dtype
from etsdk._format.weight_format import WeightFormat, WeightLayout, WeightUse
from etsdk._host_cpu import CpuTarget, HostCpu, cpu_target, cpu_target_names, host_cpu
from etsdk._plugins.specs import Availability, BackendSpec, Capability, Option
from etsdk._runtime.bridge import DelegateHandle, InitContext, NamedData, RuntimeBinding, readonly_tensor
from etsdk._runtime.bridge.build import build_native_library, cache_dir
from etsdk._state.signature import ArgSpec, DelegateSignature, StateBinding

if TYPE_CHECKING:
    from etsdk._export.operator_partitioner import OperatorPartitioner, aten_name
    from etsdk._ops.attention import (
        ATTENTION,
        attention_rows_read,
        calls_attention,
        dequantize_rows,
        filled_rows,
        quantize_rows,
    )
    from etsdk._quant.activations import dequantize_activations, quantize_activations
    from etsdk._quant.ops import QuantizedCall, call_arguments, quantized_call
    from etsdk._quant.planes import Planes, dequantize, weight_planes

__all__ = [
    "ATTENTION",
    "ArgSpec",
    "Availability",
    "BackendSpec",
    "BlobReader",
    "BlobWriter",
    "Capability",
    "Constant",
    "CpuTarget",
    "DelegateHandle",
    "DelegateSignature",
    "HostCpu",
    "InitContext",
    "NamedData",
    "NamedDataWriter",
    "OperatorPartitioner",
    "Option",
    "Partition",
    "Planes",
    "QuantizedCall",
    "RuntimeBinding",
    "StateBinding",
    "StateUpdate",
    "WEIGHTS_NAMESPACE",
    "WeightFormat",
    "WeightLayout",
    "WeightUse",
    "aten_name",
    "attention_rows_read",
    "build_native_library",
    "call_arguments",
    "cpu_target",
    "cpu_target_names",
    "calls_attention",
    "cache_dir",
    "dequantize",
    "dequantize_activations",
    "dequantize_rows",
    "dtype_name",
    "filled_rows",
    "host_cpu",
    "quantize_activations",
    "quantize_rows",
    "quantized_call",
    "readonly_tensor",
    "release_mapped_weights",
    "torch_dtype",
    "weight_planes",
]

_LAZY = {
    "ATTENTION": "etsdk._ops.attention",
    "attention_rows_read": "etsdk._ops.attention",
    "calls_attention": "etsdk._ops.attention",
    "filled_rows": "etsdk._ops.attention",
    "quantize_rows": "etsdk._ops.attention",
    "dequantize_rows": "etsdk._ops.attention",
    "OperatorPartitioner": "etsdk._export.operator_partitioner",
    "aten_name": "etsdk._export.operator_partitioner",
    "QuantizedCall": "etsdk._quant.ops",
    "quantized_call": "etsdk._quant.ops",
    "call_arguments": "etsdk._quant.ops",
    "Planes": "etsdk._quant.planes",
    "dequantize": "etsdk._quant.planes",
    "weight_planes": "etsdk._quant.planes",
    "quantize_activations": "etsdk._quant.activations",
    "dequantize_activations": "etsdk._quant.activations",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'etsdk.backend' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
