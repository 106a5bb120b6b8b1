"""The process-wide registry: backend ids, contracts and runners, by plugin.

Built once, lazily, under a lock, from :func:`etsdk.discovery.discover_plugins`
plus any plugin registered in-process with :func:`register_plugin`. Keys are
explicit (backend id, contract name); two plugins claiming one key is a
conflict: both are marked failed with a reason naming both distributions, and
looking the key up raises :class:`PluginConflictError`, so no arbitrary winner
is ever picked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pluggy

from etsdk import hookspec
from etsdk.discovery import (
    LoadedPlugin,
    PluginStatus,
    _api_mismatch,
    _probe,
    _registrations,
    discover_plugins,
    strict_mode,
    validate_plugin_module,
)
from etsdk.errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    EtsdkError,
    PluginConflictError,
    PluginError,
    PluginLoadError,
)
from etsdk.registration import BackendSpec, ContractSpec, RunnerSpec

__all__ = [
    "PluginInfo",
    "get_backend",
    "get_contract",
    "get_runner",
    "list_plugins",
    "register_contracts",
    "register_plugin",
    "reset_registry",
    "resolve_backend_id",
]


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """What ``etsdk plugins`` reports for one plugin."""

    name: str
    distribution: str
    version: str
    backends: tuple[str, ...]
    contracts: tuple[str, ...]
    status: PluginStatus
    reason: str | None
    runners: tuple[str, ...] = ()  # contract names this plugin provides a runner for

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "backends": list(self.backends),
            "contracts": list(self.contracts),
            "runners": list(self.runners),
            "status": self.status.value,
            "reason": self.reason,
        }


class _Registry:
    def __init__(self, plugins: list[LoadedPlugin], pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.plugins = plugins
        self.backends: dict[str, tuple[LoadedPlugin, BackendSpec]] = {}
        self.contracts: dict[tuple[str, int], tuple[LoadedPlugin, ContractSpec]] = {}
        self.runners: dict[str, tuple[LoadedPlugin, RunnerSpec]] = {}
        self.conflicts: dict[str, str] = {}  # key description -> message
        for plugin in plugins:
            self._index(plugin)

    def _index(self, plugin: LoadedPlugin) -> None:
        if plugin.status not in (PluginStatus.OK, PluginStatus.UNAVAILABLE):
            return
        contract_owner = {
            spec.name: owner for owner, spec in self.contracts.values()
        }
        claims: list[tuple[str, LoadedPlugin | None]] = []
        claims += [(f"backend id '{b.id}'", self.backends.get(b.id, (None,))[0]) for b in plugin.backends]
        claims += [(f"contract '{c.name}'", contract_owner.get(c.name)) for c in plugin.contracts]
        claims += [(f"runner for contract '{r.contract}'", self.runners.get(r.contract, (None,))[0]) for r in plugin.runners]
        clashes = [(what, other) for what, other in claims if other is not None and other is not plugin]
        # (a conflicted key stays refused by lookups; see get_backend)
        if clashes:
            for what, other in clashes:
                message = f"{what} is claimed by both {other.label} and {plugin.label}"
                self.conflicts[what] = message
                for p in (other, plugin):
                    p.status = PluginStatus.FAILED
                    p.reason = message
            return
        for b in plugin.backends:
            self.backends[b.id] = (plugin, b)
        for c in plugin.contracts:
            self.contracts[(c.name, c.version)] = (plugin, c)
        for r in plugin.runners:
            self.runners[r.contract] = (plugin, r)

    def check_strict(self) -> None:
        if not strict_mode():
            return
        failed = [p for p in self.plugins if p.status == PluginStatus.FAILED]
        if failed:
            lines = "; ".join(f"{p.label}: {p.reason}" for p in failed)
            first = next((p.error for p in failed if p.error is not None), None)
            raise PluginLoadError(
                f"ETSDK_STRICT_PLUGINS is set and {len(failed)} plugin(s) failed: {lines}",
                plugin=failed[0].name,
            ) from first


_lock = threading.Lock()
_registry: _Registry | None = None
_extra: list[tuple[ModuleType, str]] = []  # in-process plugins, re-applied on reset
_generation = 0


def registry_generation() -> int:
    """Incremented by :func:`reset_registry`; lets caches of lookups notice a rebuild."""
    return _generation


def _new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspec.PROJECT)
    pm.add_hookspecs(hookspec)
    return pm


def _load_inline(pm: pluggy.PluginManager, module: ModuleType, name: str) -> LoadedPlugin:
    plugin = LoadedPlugin(name=name, distribution="<in-process>", version="-", module=module)
    mismatch = _api_mismatch(module)
    if mismatch is not None:
        raise PluginError(f"plugin '{name}' {mismatch}", plugin=name)
    validate_plugin_module(module, name)
    pm.register(module, name=name)
    _registrations(pm, plugin)
    _probe(plugin)
    return plugin


def _get() -> _Registry:
    global _registry
    reg = _registry
    if reg is not None:
        return reg
    with _lock:
        if _registry is None:
            pm = _new_plugin_manager()
            plugins = discover_plugins(pm)
            plugins += [_load_inline(pm, module, name) for module, name in _extra]
            reg = _Registry(plugins, pm)
            reg.check_strict()
            _registry = reg
        return _registry


def reset_registry() -> None:
    """Forget discovered plugins; the next lookup discovers again (tests, notebooks)."""
    global _registry, _generation
    with _lock:
        _registry = None
        _generation += 1


def register_plugin(module: ModuleType, name: str | None = None) -> None:
    """Register an in-process plugin module (no distribution needed).

    Validated exactly like an installed plugin; conflicts with installed
    plugins are reported the same way. Useful for backends written in a script
    or a notebook.
    """
    name = name or module.__name__
    reg = _get()
    with _lock:
        plugin = _load_inline(reg.pm, module, name)
        reg.plugins.append(plugin)
        reg._index(plugin)
        if plugin.status == PluginStatus.FAILED:
            raise PluginConflictError(plugin.reason or "conflict", plugin=name)
        _extra.append((module, name))


def register_contracts(specs: Sequence[ContractSpec], name: str) -> None:
    """Register contract specifications in-process, as a plugin named ``name`` (once per name).

    For contracts that ship outside a distribution (a script, a test, a benchmark);
    conflicts with installed plugins are reported as for any plugin.
    """
    if any(p.name == name for p in _get().plugins):
        return
    module = ModuleType(name)
    module.ETSDK_PLUGIN_API = f">={hookspec.PLUGIN_API_VERSION}"  # type: ignore[attr-defined]
    records = tuple(specs)

    @hookspec.hookimpl
    def etsdk_register_contracts() -> Sequence[ContractSpec]:
        return records

    module.etsdk_register_contracts = etsdk_register_contracts  # type: ignore[attr-defined]
    register_plugin(module, name)


def list_plugins() -> list[PluginInfo]:
    """Every installed plugin with its status, in name order."""
    return [
        PluginInfo(
            name=p.name,
            distribution=p.distribution,
            version=p.version,
            backends=tuple(b.id for b in p.backends),
            contracts=tuple(sorted({c.name for c in p.contracts})),
            status=p.status,
            reason=p.reason,
            runners=tuple(sorted({r.contract for r in p.runners})),
        )
        for p in _get().plugins
    ]


def _not_found(what: str, key: str, known: Sequence[str]) -> str:
    reg = _get()
    problems = [
        f"{p.label} is {p.status.value}: {p.reason}"
        for p in reg.plugins
        if p.status in (PluginStatus.FAILED, PluginStatus.SKIPPED)
    ]
    hint = (
        f"no installed etsdk plugin provides {what} '{key}' (known: {', '.join(sorted(known)) or 'none'}). "
        f"Install a plugin that provides it (pip install <plugin>, see `etsdk plugins`)"
    )
    if problems:
        hint += "; plugins not loaded: " + "; ".join(problems)
    return hint


def get_backend(backend_id: str, *, require_available: bool = False) -> BackendSpec:
    """The registered backend ``backend_id``.

    Raises :class:`BackendNotFoundError` (with how to install one),
    :class:`PluginConflictError` when two plugins claim it, and, with
    ``require_available``, :class:`BackendUnavailableError` with the probe's reason.
    """
    reg = _get()
    key = f"backend id '{backend_id}'"
    if key in reg.conflicts:
        raise PluginConflictError(reg.conflicts[key])
    found = reg.backends.get(backend_id)
    if found is None:
        raise BackendNotFoundError(
            _not_found("backend id", backend_id, list(reg.backends)), backend_id=backend_id
        )
    plugin, spec = found
    if require_available:
        availability = plugin.availability.get(backend_id)
        if availability is not None and not availability.available:
            raise BackendUnavailableError(
                f"backend '{backend_id}' from {plugin.label} cannot run here: {availability.reason}",
                backend_id=backend_id,
            )
    return spec


def get_contract(name: str, version: int) -> ContractSpec:
    reg = _get()
    key = f"contract '{name}'"
    if key in reg.conflicts:
        raise PluginConflictError(reg.conflicts[key])
    found = reg.contracts.get((name, version))
    if found is None:
        versions = sorted(v for (n, v) in reg.contracts if n == name)
        if versions:
            raise EtsdkError(
                f"contract '{name}' version {version} is not supported by this installation; "
                f"supported versions: {', '.join(map(str, versions))}"
            )
        raise EtsdkError(_not_found("contract", name, sorted({n for n, _ in reg.contracts})))
    return found[1]


def get_runner(contract: str) -> RunnerSpec:
    reg = _get()
    found = reg.runners.get(contract)
    if found is None:
        raise EtsdkError(_not_found("a runner for contract", contract, list(reg.runners)))
    return found[1]


def resolve_backend_id(name: str) -> str:
    """A backend id from what a user types: the id itself, or its short name (``aoti`` for ``EtsdkAotiBackend``)."""
    reg = _get()
    if name in reg.backends:
        return name
    wanted = name.lower().replace("-", "").replace("_", "")
    matches = [b for b in reg.backends if b.lower() in (wanted, f"etsdk{wanted}backend", f"{wanted}backend")]
    if len(matches) == 1:
        return matches[0]
    raise BackendNotFoundError(_not_found("backend", name, sorted(reg.backends)), backend_id=name)


def edge_transform_passes(backend_id: str) -> list[Callable[..., Any]]:
    """Passes every plugin contributes for ``backend_id``, in plugin order."""
    results = _get().pm.hook.etsdk_edge_transform_passes(backend_id=backend_id)
    return [p for group in results if group for p in group]
