"""etsdk: pluggable ExecuTorch backends.

Importing etsdk is cheap: it imports neither torch nor executorch. The
functions that need them (:func:`load`, :func:`lower`) import them when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etsdk._version import __version__
from etsdk.blob import BlobReader, BlobWriter
from etsdk.contract import Contract, ContractError
from etsdk.discovery import PluginStatus
from etsdk.dtypes import dtype_name
from etsdk.errors import (
    BackendError,
    BackendNotFoundError,
    BackendUnavailableError,
    BlobFormatError,
    BridgeBuildError,
    BridgeRegistryError,
    DelegateError,
    EtsdkError,
    ExportError,
    IntegrityError,
    PluginConflictError,
    PluginError,
    PluginLoadError,
    PluginValidationError,
    ProgramError,
    UnsupportedFeatureError,
)
from etsdk.generation import ExportRequest, GenerationError, GenerationResult, Sampling
from etsdk.hookspec import PLUGIN_API_VERSION, hookimpl
from etsdk.registration import Availability, BackendSpec, Capability, ContractSpec, Option, RunnerSpec
from etsdk.registry import (
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

if TYPE_CHECKING:
    from etsdk.bridge import InitContext, NamedData
    from etsdk.integrity import VerifyReport, verify
    from etsdk.lowering import Lowered, MethodSource, check_output_path, lower
    from etsdk.program import Method, MethodInfo, Program, TensorInfo, data_beside, load
    from etsdk.quiet import quiet_command_line
    from etsdk.snapshot import Snapshot
    from etsdk.state import Session, StateError, StateView

_LAZY = {
    "InitContext": "etsdk.bridge",
    "NamedData": "etsdk.bridge",
    "Session": "etsdk.state",
    "StateError": "etsdk.state",
    "StateView": "etsdk.state",
    "Snapshot": "etsdk.snapshot",
    "quiet_command_line": "etsdk.quiet",
    "data_beside": "etsdk.program",
    "Lowered": "etsdk.lowering",
    "MethodSource": "etsdk.lowering",
    "lower": "etsdk.lowering",
    "check_output_path": "etsdk.lowering",
    "verify": "etsdk.integrity",
    "VerifyReport": "etsdk.integrity",
    "Method": "etsdk.program",
    "MethodInfo": "etsdk.program",
    "Program": "etsdk.program",
    "TensorInfo": "etsdk.program",
    "load": "etsdk.program",
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
    "RunnerSpec",
    "Session",
    "Snapshot",
    "StateError",
    "StateView",
    "TensorInfo",
    "UnsupportedFeatureError",
    "VerifyReport",
    "__version__",
    "check_output_path",
    "data_beside",
    "dtype_name",
    "get_backend",
    "get_contract",
    "get_runner",
    "resolve_backend_id",
    "verify",
    "ExportRequest",
    "GenerationError",
    "GenerationResult",
    "Sampling",
    "hookimpl",
    "list_plugins",
    "load",
    "lower",
    "quiet_command_line",
    "register_contracts",
    "register_plugin",
    "reset_registry",
]
