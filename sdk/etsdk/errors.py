"""The etsdk exception hierarchy.

Every error etsdk raises on bad input derives from :class:`EtsdkError` and says
what was expected and what was found::

    EtsdkError
    ├── PluginError                  a plugin could not be loaded or used
    │   ├── PluginValidationError    hook implementations do not match the specs
    │   ├── PluginConflictError      two distributions claim one backend id / contract
    │   └── PluginLoadError          import or registration raised (strict mode)
    ├── BackendError
    │   ├── BackendNotFoundError     no installed plugin provides a backend id
    │   ├── BackendUnavailableError  installed but cannot run here (reason attached)
    │   ├── BridgeBuildError         the native bridge could not be compiled
    │   ├── BridgeRegistryError      the runtime's backend registry refused a name
    │   └── DelegateError            a runtime binding raised inside init / execute
    ├── ProgramError                 a .pte / .ptd is malformed, missing or refused
    │   └── IntegrityError           a named-data entry's bytes do not hash to its key
    ├── BlobFormatError              a delegate blob is malformed
    │   └── UnsupportedFeatureError  a blob requires a feature this reader lacks
    ├── ExportError                  lowering a model failed
    ├── ContractError                a contract is malformed or does not match a program
    ├── StateError                   state is missing, foreign, or bound where it cannot be used
    └── GenerationError              a generation request cannot run (ids, room left, sampling)

Plugins derive their own errors from these (``etsdk_aoti.AotiError`` is a
:class:`BackendError`), so one ``except etsdk.EtsdkError`` catches everything.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "BlobFormatError",
    "BridgeBuildError",
    "BridgeRegistryError",
    "ContractError",
    "DelegateError",
    "EtsdkError",
    "ExportError",
    "GenerationError",
    "IntegrityError",
    "PluginConflictError",
    "PluginError",
    "PluginLoadError",
    "PluginValidationError",
    "StateError",
    "ProgramError",
    "UnsupportedFeatureError",
]


class EtsdkError(Exception):
    """Root of every error etsdk raises on purpose."""


class PluginError(EtsdkError):
    """A plugin could not be loaded, validated or used."""

    def __init__(self, message: str, *, plugin: str | None = None) -> None:
        super().__init__(message)
        self.plugin = plugin


class PluginValidationError(PluginError):
    """A plugin's hook implementations do not match etsdk's hook specifications."""


class PluginConflictError(PluginError):
    """Two plugins claim the same backend id or contract name."""


class PluginLoadError(PluginError):
    """A plugin raised on import or registration (raised only in strict mode)."""


class BackendError(EtsdkError):
    """Something went wrong with a specific backend."""

    def __init__(self, message: str, *, backend_id: str | None = None) -> None:
        super().__init__(message)
        self.backend_id = backend_id


class BackendNotFoundError(BackendError):
    """No installed plugin provides the backend id a program or call asks for."""


class BackendUnavailableError(BackendError):
    """The backend is installed but cannot run on this machine."""


class BridgeBuildError(BackendError):
    """The native bridge extension could not be built or loaded."""


class BridgeRegistryError(BackendError):
    """The ExecuTorch runtime's backend registry refused a backend id."""


class DelegateError(BackendError):
    """A plugin runtime binding raised inside ``init`` or ``execute``.

    ``original_type``, ``original_message`` and ``original_traceback`` carry the
    binding's own exception; ``__cause__`` is that exception object.
    """

    def __init__(
        self,
        message: str,
        *,
        backend_id: str | None,
        method: str | None,
        phase: str,
        original_type: str,
        original_message: str,
        original_traceback: str,
    ) -> None:
        super().__init__(message, backend_id=backend_id)
        self.method = method
        self.phase = phase
        self.original_type = original_type
        self.original_message = original_message
        self.original_traceback = original_traceback


class ProgramError(EtsdkError):
    """A program file (.pte) or its data file (.ptd) is malformed, missing or refused."""


class IntegrityError(ProgramError):
    """A named-data entry's bytes do not hash to the digest its key records (``file``, ``key``)."""

    def __init__(self, message: str, *, file: str, key: str) -> None:
        super().__init__(message)
        self.file = file
        self.key = key


class BlobFormatError(EtsdkError):
    """A delegate blob does not follow the etsdk container format."""


class UnsupportedFeatureError(BlobFormatError):
    """A blob requires a feature, or a major version, this reader does not know."""

    def __init__(self, message: str, *, feature: str | None = None) -> None:
        super().__init__(message)
        self.feature = feature


class ExportError(EtsdkError):
    """Lowering or serialising a model failed."""


class ContractError(EtsdkError):
    """A contract specification or record is malformed or does not match a program."""


class StateError(EtsdkError):
    """State is missing, belongs to another program, or is bound where it cannot be used."""


class GenerationError(EtsdkError):
    """A generation request cannot run: bad token ids, no room left in the context, bad sampling options."""
