"""etsdk: pluggable ExecuTorch backends.

Importing etsdk is cheap: it imports neither torch nor executorch. The
functions that need them (:func:`load`, :func:`lower`) import them when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etsdk import _moved
from etsdk._apps.generation import ExportRequest, GenerationResult, Sampling, TextRunner
from etsdk._format.blob import BlobReader, BlobWriter
from etsdk._format.dtypes import dtype_name
from etsdk._format.weight_format import QuantizationPlan, WeightFormat
from etsdk._plugins.discovery import PluginStatus
from etsdk._plugins.hookspec import PLUGIN_API_VERSION, hookimpl
from etsdk._plugins.registry import (
    PluginInfo,
    get_backend,
    get_contract,
    get_runner,
    list_plugins,
    register_contracts,
    register_plugin,
    reset_registry,
    resolve_backend_id,
)
from etsdk._plugins.specs import Availability, BackendSpec, Capability, CommandSpec, ContractSpec, Option, RunnerSpec
from etsdk._state.contract import Contract
from etsdk._version import __version__
from etsdk.errors import (
    BackendError,
    BackendNotFoundError,
    BackendUnavailableError,
    BlobFormatError,
    BridgeBuildError,
    BridgeRegistryError,
    ContractError,
    DelegateError,
    EtsdkError,
    ExportError,
    GenerationError,
    IntegrityError,
    PluginConflictError,
    PluginError,
    PluginLoadError,
    PluginValidationError,
    ProgramError,
    StateError,
    UnsupportedFeatureError,
)

if TYPE_CHECKING:
    from etsdk._apps.quiet import quiet_command_line
    from etsdk._export.lower import MethodSource, lower
    from etsdk._export.output import Lowered, check_free_space, check_output_path, format_bytes, spool_size
    from etsdk._export.spill import WeightSpill
    from etsdk._quant.modules import QuantizationReport, QuantizedEmbedding, QuantizedLinear, quantize_model
    from etsdk._quant.planes import quantize_weight
    from etsdk._quant.widening import WidenedEmbedding, WidenedLinear, WideningReport, keep_16bit_weights
    from etsdk._runtime.bridge import InitContext, NamedData
    from etsdk._runtime.program import Method, MethodInfo, Program, TensorInfo, data_beside, load
    from etsdk._runtime.record import read_contract
    from etsdk._runtime.verification import VerifyReport, verify
    from etsdk._state.session import Session, StateView
    from etsdk._state.signature import StateSlot
    from etsdk._state.snapshot import Snapshot

_moved.install()
serve_moved_modules = _moved.serve_moved_modules

_LAZY = {
    "InitContext": "etsdk._runtime.bridge",
    "NamedData": "etsdk._runtime.bridge",
    "Session": "etsdk._state.session",
    "StateView": "etsdk._state.session",
    "StateSlot": "etsdk._state.signature",
    "Snapshot": "etsdk._state.snapshot",
    "quiet_command_line": "etsdk._apps.quiet",
    "data_beside": "etsdk._runtime.program",
    "Lowered": "etsdk._export.output",
    "MethodSource": "etsdk._export.lower",
    "lower": "etsdk._export.lower",
    "check_output_path": "etsdk._export.output",
    "check_free_space": "etsdk._export.output",
    "format_bytes": "etsdk._export.output",
    "spool_size": "etsdk._export.output",
    "WeightSpill": "etsdk._export.spill",
    "verify": "etsdk._runtime.verification",
    "VerifyReport": "etsdk._runtime.verification",
    "Method": "etsdk._runtime.program",
    "MethodInfo": "etsdk._runtime.program",
    "Program": "etsdk._runtime.program",
    "TensorInfo": "etsdk._runtime.program",
    "load": "etsdk._runtime.program",
    "read_contract": "etsdk._runtime.record",
    "QuantizationReport": "etsdk._quant.modules",
    "QuantizedEmbedding": "etsdk._quant.modules",
    "QuantizedLinear": "etsdk._quant.modules",
    "quantize_model": "etsdk._quant.modules",
    "quantize_weight": "etsdk._quant.planes",
    "WideningReport": "etsdk._quant.widening",
    "WidenedEmbedding": "etsdk._quant.widening",
    "WidenedLinear": "etsdk._quant.widening",
    "keep_16bit_weights": "etsdk._quant.widening",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'etsdk' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "PLUGIN_API_VERSION",
    "serve_moved_modules",
    "Availability",
    "BackendError",
    "BackendNotFoundError",
    "BackendSpec",
    "BackendUnavailableError",
    "BlobFormatError",
    "BlobReader",
    "BlobWriter",
    "BridgeBuildError",
    "BridgeRegistryError",
    "Capability",
    "CommandSpec",
    "Contract",
    "ContractError",
    "ContractSpec",
    "DelegateError",
    "EtsdkError",
    "ExportError",
    "InitContext",
    "IntegrityError",
    "Lowered",
    "Method",
    "MethodInfo",
    "MethodSource",
    "NamedData",
    "Option",
    "PluginConflictError",
    "PluginError",
    "PluginInfo",
    "PluginLoadError",
    "PluginStatus",
    "PluginValidationError",
    "Program",
    "ProgramError",
    "QuantizationPlan",
    "QuantizationReport",
    "QuantizedEmbedding",
    "QuantizedLinear",
    "RunnerSpec",
    "Session",
    "Snapshot",
    "StateError",
    "StateSlot",
    "StateView",
    "TensorInfo",
    "UnsupportedFeatureError",
    "VerifyReport",
    "WeightFormat",
    "WeightSpill",
    "WideningReport",
    "WidenedEmbedding",
    "WidenedLinear",
    "__version__",
    "check_free_space",
    "check_output_path",
    "format_bytes",
    "data_beside",
    "dtype_name",
    "get_backend",
    "get_contract",
    "get_runner",
    "resolve_backend_id",
    "spool_size",
    "verify",
    "ExportRequest",
    "GenerationError",
    "GenerationResult",
    "Sampling",
    "TextRunner",
    "hookimpl",
    "list_plugins",
    "load",
    "lower",
    "quantize_model",
    "quantize_weight",
    "keep_16bit_weights",
    "quiet_command_line",
    "read_contract",
    "register_contracts",
    "register_plugin",
    "reset_registry",
]
