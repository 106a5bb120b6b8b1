"""Old module paths of etsdk 0.x, kept importable with a DeprecationWarning.

The core used to be one flat folder (``etsdk.lowering``, ``etsdk.contract``,
``etsdk.backends.reference``, ...). Its layers now live in private subpackages
and every public name has one home (``etsdk``, ``etsdk.backend``,
``etsdk.testing``, ``etsdk.conformance``). Code that still imports an old path
gets the module at its new place, once, with a warning naming the public import
to use instead. Only the names in :data:`MOVED` are served; nothing else in the
import system is touched.

A few modules left the core for a plugin (``etsdk.chat``, the terminal chat, is
``etsdk_hf_static.apps.chat`` now). They are named here as strings: the core never
imports a plugin statically, and without the plugin installed the old path
fails with an ImportError saying which distribution to install.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Mapping, Sequence

__all__ = ["MOVED", "PLUGIN_DISTRIBUTIONS", "install", "serve_moved_modules"]

#: old module -> (new module, where its public names are imported from now)
MOVED: dict[str, tuple[str, str]] = {
    "etsdk.blob": ("etsdk._format.blob", "etsdk.backend"),
    "etsdk.dtypes": ("etsdk._format.dtypes", "etsdk.backend"),
    "etsdk.versioning": ("etsdk._format.versioning", "etsdk"),
    "etsdk.fingerprint": ("etsdk._format.fingerprint", "etsdk"),
    "etsdk.hookspec": ("etsdk._plugins.hookspec", "etsdk"),
    "etsdk.registration": ("etsdk._plugins.specs", "etsdk"),
    "etsdk.discovery": ("etsdk._plugins.discovery", "etsdk"),
    "etsdk.registry": ("etsdk._plugins.registry", "etsdk"),
    "etsdk.core_plugin": ("etsdk._plugins.core_plugin", "etsdk"),
    "etsdk.contract": ("etsdk._state.contract", "etsdk"),
    "etsdk.signature": ("etsdk._state.signature", "etsdk.backend"),
    "etsdk.state": ("etsdk._state.session", "etsdk"),
    "etsdk.snapshot": ("etsdk._state.snapshot", "etsdk"),
    "etsdk.lowering": ("etsdk._export.lower", "etsdk"),
    "etsdk.delegation": ("etsdk._export.core_partitioner", "etsdk.backend"),
    "etsdk.partition": ("etsdk._export.partition", "etsdk.backend"),
    "etsdk.partitioning": ("etsdk._export.operator_partitioner", "etsdk.backend"),
    "etsdk.tracing": ("etsdk._export.tracing", "etsdk"),
    "etsdk.program": ("etsdk._runtime.program", "etsdk"),
    "etsdk.integrity": ("etsdk._runtime.verification", "etsdk"),
    "etsdk.inspection": ("etsdk._runtime.inspection", "etsdk"),
    "etsdk.bridge": ("etsdk._runtime.bridge", "etsdk.backend"),
    "etsdk.bridge.build": ("etsdk._runtime.bridge.build", "etsdk.backend"),
    "etsdk.quiet": ("etsdk._apps.quiet", "etsdk"),
    "etsdk.generation": ("etsdk._apps.generation", "etsdk"),
    "etsdk.chat": ("etsdk_hf_static.apps.chat", "etsdk_hf_static.apps.chat"),
    "etsdk.demo": ("etsdk.cli.demo", "etsdk.cli"),
    "etsdk.backends": ("etsdk._moved", "etsdk.reference_backend"),
    "etsdk.backends.reference": ("etsdk.reference_backend", "etsdk.reference_backend"),
    "etsdk.backends.reference.graph_format": ("etsdk.reference_backend.graph_format", "etsdk.reference_backend"),
    "etsdk.backends.reference.partitioner": ("etsdk.reference_backend.partitioner", "etsdk.reference_backend"),
    "etsdk.backends.reference.plugin": ("etsdk.reference_backend.plugin", "etsdk.reference_backend"),
    "etsdk.backends.reference.runtime": ("etsdk.reference_backend.runtime", "etsdk.reference_backend"),
    "etsdk.backends.reference.serializer": ("etsdk.reference_backend.serializer", "etsdk.reference_backend"),
}


#: top-level package of a plugin that now holds a moved module -> the distribution that installs it
PLUGIN_DISTRIBUTIONS: dict[str, str] = {
    "etsdk_hf_static": "etsdk-hf-static",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str, public: str) -> None:
        self.old, self.new, self.public = old, new, public
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(
            f"{self.old} moved; import its public names from {self.public} (the old path will be removed)",
            DeprecationWarning,
            stacklevel=2,
        )
        if self.old == "etsdk.backends":  # a folder that held only the reference backend
            module = types.ModuleType(self.old)
            module.__path__ = []
            return module
        try:
            module = importlib.import_module(self.new)
        except ModuleNotFoundError as exc:
            package = self.new.partition(".")[0]
            distribution = PLUGIN_DISTRIBUTIONS.get(package)
            if distribution is None or exc.name not in (package, self.new):
                raise
            raise ImportError(
                f"{self.old} moved to {self.new}, in the {distribution} plugin, which is not installed here "
                f"(or predates the move): pip install {distribution}",
                name=self.old,
            ) from None
        self._spec = module.__spec__  # the import system stamps the alias's spec on it; put the real one back
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if self._spec is not None:
            module.__spec__ = self._spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        moved = MOVED.get(fullname)
        if moved is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, _Alias(fullname, *moved), is_package=fullname == "etsdk.backends"
        )


def serve_moved_modules(moves: Mapping[str, tuple[str, str]]) -> None:
    """Keep a plugin's old module paths importable: ``{old: (new, public)}``.

    ``import old`` then gives the module ``new``, once, with a DeprecationWarning saying to import its public
    names from ``public``. For a plugin that moved its own modules (call it from its package's ``__init__``, which
    runs before any of its submodules is imported). An old path that is also a module of its own is refused: the
    table would hide it.
    """
    for old, target in moves.items():
        if not (isinstance(old, str) and isinstance(target, tuple) and len(target) == 2 and all(isinstance(t, str) for t in target)):
            raise TypeError(f"serve_moved_modules takes {{old: (new, public)}} module names, found {old!r}: {target!r}")
        if old in MOVED and MOVED[old] != target:
            raise ValueError(f"{old} is already served as {MOVED[old][0]}, not {target[0]}")
    MOVED.update(moves)
    install()


def install() -> None:
    """Serve the old paths (idempotent; called by ``import etsdk``)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())  # first, so a submodule of an old package path is never loaded twice
