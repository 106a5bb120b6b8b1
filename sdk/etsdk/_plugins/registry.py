"""The process-wide registry: backend ids, contracts, runners and commands, by plugin.

Built once, lazily, under a lock, from :func:`etsdk._plugins.discovery.discover_plugins`
plus any plugin registered in-process with :func:`register_plugin`. Keys are
explicit: backend id, contract (name, version), runner (contract name,
version), command (name). Conflicts are settled per *record*, never per plugin, so no plugin can
break another:

* the core's own registrations (distribution ``etsdk``) cannot be taken over: a
  plugin claiming one of its keys has that record refused, nothing else; the
  command line's own commands (:data:`CORE_COMMANDS`) are the core's too;
* two plugins claiming one key both have that record refused (no arbitrary
  winner), and looking the key up raises :class:`PluginConflictError` naming both;
* a refused record contributes nothing: a refused backend gets no edge passes
  from its plugin, a refused contract takes the plugin's runner for it along.

Every refusal is listed on the plugin (``etsdk plugins`` shows it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pluggy

from etsdk._plugins import hookspec
from etsdk._plugins.discovery import (
    LoadedPlugin,
    PluginStatus,
    _api_mismatch,
    _probe,
    _registrations,
    discover_plugins,
    strict_mode,
    validate_plugin_module,
)
from etsdk._plugins.specs import Availability, BackendSpec, CommandSpec, ContractSpec, RunnerSpec
from etsdk.errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    EtsdkError,
    PluginConflictError,
    PluginError,
    PluginLoadError,
)

__all__ = [
    "CORE_COMMANDS",
    "PluginInfo",
    "get_backend",
    "get_commands",
    "get_contract",
    "backend_availability",
    "get_runner",
    "list_plugins",
    "register_contracts",
    "register_plugin",
    "reset_registry",
    "resolve_backend_id",
]


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """What ``etsdk plugins`` reports for one plugin (:func:`etsdk.list_plugins` returns these)."""

    #: The entry-point name (``aoti``); ``ETSDK_PLUGINS`` / ``ETSDK_DISABLE_PLUGINS`` accept it.
    name: str
    #: The distribution that installs the plugin (``etsdk-aoti``), or ``etsdk`` for the core's own.
    distribution: str
    #: The distribution's version.
    version: str
    #: The backend ids it registered.
    backends: tuple[str, ...]
    #: The contracts it registered, as names.
    contracts: tuple[str, ...]
    #: ``ok``, ``unavailable``, ``failed`` or ``skipped`` (:class:`PluginStatus`).
    status: PluginStatus
    #: Why the status is not ``ok`` (None when it is); for ``unavailable``, what is missing.
    reason: str | None
    #: The contract names it provides a runner for.
    runners: tuple[str, ...] = ()
    #: Its records refused because another plugin (or the core) claims the same key; the rest of it still works.
    refused: tuple[str, ...] = ()
    #: The ``etsdk`` commands it registers (refused ones included).
    commands: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The object ``etsdk plugins --json`` prints for this plugin (every field; ``status`` as its string)."""
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "backends": list(self.backends),
            "contracts": list(self.contracts),
            "runners": list(self.runners),
            "commands": list(self.commands),
            "status": self.status.value,
            "reason": self.reason,
            "refused": list(self.refused),
        }


CORE_DISTRIBUTION = "etsdk"

#: The command line's own commands (:mod:`etsdk.cli.main`): no plugin may register a command of these names.
CORE_COMMANDS = frozenset({"plugins", "doctor", "demo", "new-backend", "inspect", "conformance", "verify"})


class _Registry:
    def __init__(self, plugins: list[LoadedPlugin], pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.plugins = plugins
        self.backends: dict[str, tuple[LoadedPlugin, BackendSpec]] = {}
        self.contracts: dict[tuple[str, int], tuple[LoadedPlugin, ContractSpec]] = {}
        self.runners: dict[tuple[str, int], tuple[LoadedPlugin, RunnerSpec]] = {}
        self.commands: dict[str, tuple[LoadedPlugin, CommandSpec]] = {}
        self.conflicts: dict[str, str] = {}  # key description -> message (the key is refused for everyone)
        self.refused: dict[str, list[str]] = {}  # plugin name -> refusal messages
        self.lost_backends: dict[str, set[str]] = {}  # plugin name -> backend ids it may not contribute to
        # the core first, so its registrations are never taken over whatever the plugin order
        for plugin in sorted(plugins, key=lambda p: p.distribution != CORE_DISTRIBUTION):
            self._index(plugin)
        self.settle()

    def _refuse(self, plugin: LoadedPlugin, message: str) -> None:
        self.refused.setdefault(plugin.name, []).append(message)

    def _claim(self, table: dict[Any, Any], key: Any, what: str, plugin: LoadedPlugin, record: Any) -> bool:
        """Register ``record`` under ``key`` unless someone else holds it; settle a conflict per record."""
        if what in self.conflicts:
            self._refuse(plugin, f"{what} refused: {self.conflicts[what]}")
            return False
        held = table.get(key)
        if held is None:
            table[key] = (plugin, record)
            return True
        other = held[0]
        if other is plugin:
            self._refuse(plugin, f"{what} is registered twice by {plugin.label}; the second record is refused")
            return False
        if other.distribution == CORE_DISTRIBUTION:
            self._refuse(plugin, f"{what} belongs to the etsdk core ({other.label}); {plugin.label}'s record is refused")
            return False
        message = f"{what} is claimed by both {other.label} and {plugin.label}; both records are refused"
        self.conflicts[what] = message
        del table[key]
        self._refuse(other, message)
        self._refuse(plugin, message)
        return False

    def _index(self, plugin: LoadedPlugin) -> None:
        if plugin.status not in (PluginStatus.OK, PluginStatus.UNAVAILABLE):
            return
        lost: set[str] = self.lost_backends.setdefault(plugin.name, set())
        for b in plugin.backends:
            if not self._claim(self.backends, b.id, f"backend id '{b.id}'", plugin, b):
                lost.add(b.id)
        lost_contracts: set[tuple[str, int]] = set()
        for c in plugin.contracts:
            if not self._claim(self.contracts, (c.name, c.version), f"contract '{c.name}' v{c.version}", plugin, c):
                lost_contracts.add((c.name, c.version))
        for r in plugin.runners:
            for version in r.versions:
                what = f"runner for contract '{r.contract}' v{version}"
                if (r.contract, version) in lost_contracts:
                    self._refuse(plugin, f"{what} refused: the plugin's own contract record was refused")
                    continue
                self._claim(self.runners, (r.contract, version), what, plugin, r)
        for command in plugin.commands:
            what = f"command '{command.name}'"
            if command.name in CORE_COMMANDS and plugin.distribution != CORE_DISTRIBUTION:
                self._refuse(plugin, f"{what} belongs to the etsdk core (etsdk {command.name}); {plugin.label}'s record is refused")
                continue
            self._claim(self.commands, command.name, what, plugin, command)

    def settle(self) -> None:
        """A plugin that registered records and kept none has failed; one that kept some stays usable."""
        held = [*self.backends.values(), *self.contracts.values(), *self.runners.values(), *self.commands.values()]
        owners = {id(owner) for owner, _ in held}
        for plugin in self.plugins:
            if plugin.status not in (PluginStatus.OK, PluginStatus.UNAVAILABLE):
                continue
            claimed = plugin.backends or plugin.contracts or plugin.runners or plugin.commands
            if claimed and id(plugin) not in owners:
                plugin.status = PluginStatus.FAILED
                plugin.reason = "; ".join(self.refused.get(plugin.name, [])) or "every record was refused"

    def conflict_for(self, what: str) -> str | None:
        return self.conflicts.get(what)

    def check_strict(self) -> None:
        if not strict_mode():
            return
        failed = [p for p in self.plugins if p.status == PluginStatus.FAILED]
        refusals = [f"{name}: {m}" for name, messages in self.refused.items() for m in messages]
        if failed or refusals:
            lines = "; ".join([*(f"{p.label}: {p.reason}" for p in failed), *refusals])
            first = next((p.error for p in failed if p.error is not None), None)
            raise PluginLoadError(
                f"ETSDK_STRICT_PLUGINS is set and {len(failed) + len(refusals)} plugin problem(s) were found: {lines}",
                plugin=failed[0].name if failed else next(iter(self.refused)),
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
        clashes = _clashes(reg, plugin)
        if clashes:
            reg.pm.unregister(module)
            raise PluginConflictError(
                f"in-process plugin '{name}' was not registered: {'; '.join(clashes)}", plugin=name
            )
        reg.plugins.append(plugin)
        reg._index(plugin)
        reg.settle()
        _extra.append((module, name))


def _clashes(reg: _Registry, plugin: LoadedPlugin) -> list[str]:
    """The keys ``plugin`` would claim that someone already holds (checked before anything is registered)."""
    out = []
    for b in plugin.backends:
        if b.id in reg.backends or f"backend id '{b.id}'" in reg.conflicts:
            out.append(f"backend id '{b.id}' is already provided")
    for c in plugin.contracts:
        if (c.name, c.version) in reg.contracts:
            out.append(f"contract '{c.name}' v{c.version} is already provided")
    for r in plugin.runners:
        out += [f"a runner for contract '{r.contract}' v{v} is already provided" for v in r.versions if (r.contract, v) in reg.runners]
    for command in plugin.commands:
        if command.name in CORE_COMMANDS or command.name in reg.commands or f"command '{command.name}'" in reg.conflicts:
            out.append(f"command '{command.name}' is already provided")
    return out


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
    """Every installed plugin with its status and any refused records, in name order."""
    reg = _get()
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
            commands=tuple(c.name for c in p.commands),
            refused=tuple(reg.refused.get(p.name, ())),
        )
        for p in reg.plugins
    ]


def get_commands() -> list[tuple[CommandSpec, str]]:
    """Every plugin command the registry kept, with the label of the plugin providing it, in registration order.

    The command line calls this only when it builds its parser with plugin commands.
    """
    return [(spec, plugin.label) for plugin, spec in _get().commands.values()]


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


def backend_availability(backend_id: str) -> Availability | None:
    """What the backend's probe said (None when the id is not registered)."""
    found = _get().backends.get(backend_id)
    return found[0].availability.get(backend_id) if found is not None else None


def get_contract(name: str, version: int) -> ContractSpec:
    """The registered specification of contract ``name`` version ``version``.

    Raises :class:`EtsdkError` naming the supported versions when only the version is unknown (or what is
    registered, and how to install a plugin, when the name is), and :class:`PluginConflictError` when two
    plugins claim the pair.
    """
    reg = _get()
    key = f"contract '{name}' v{version}"
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


def get_runner(contract: str, version: int | None = None) -> RunnerSpec:
    """The runner registered for ``contract`` (and ``version``; without it, the only runner for the name)."""
    reg = _get()
    if version is not None:
        key = f"runner for contract '{contract}' v{version}"
        if key in reg.conflicts:
            raise PluginConflictError(reg.conflicts[key])
        found = reg.runners.get((contract, version))
        if found is not None:
            return found[1]
        versions = sorted(v for (n, v) in reg.runners if n == contract)
        if versions:
            raise EtsdkError(
                f"no installed runner drives contract '{contract}' v{version}; installed runners drive "
                f"version(s) {', '.join(map(str, versions))}"
            )
        conflicted = [m for k, m in reg.conflicts.items() if k.startswith(f"runner for contract '{contract}' ")]
        if conflicted:
            raise PluginConflictError(conflicted[0])
        raise EtsdkError(_not_found("a runner for contract", contract, sorted({n for n, _ in reg.runners})))
    specs = {id(spec): spec for (n, _), (_, spec) in reg.runners.items() if n == contract}
    if len(specs) == 1:
        return next(iter(specs.values()))
    if specs:
        raise EtsdkError(f"several runners drive contract '{contract}'; name the version: get_runner('{contract}', version)")
    conflicted = [m for k, m in reg.conflicts.items() if k.startswith(f"runner for contract '{contract}' ")]
    if conflicted:
        raise PluginConflictError(conflicted[0])
    raise EtsdkError(_not_found("a runner for contract", contract, sorted({n for n, _ in reg.runners})))


def resolve_backend_id(name: str) -> str:
    """A backend id from what a user types: the id itself, or its short name (``aoti`` for ``EtsdkAotiBackend``)."""
    reg = _get()
    if name in reg.backends:
        return name
    if f"backend id '{name}'" in reg.conflicts:
        raise PluginConflictError(reg.conflicts[f"backend id '{name}'"])
    wanted = name.lower().replace("-", "").replace("_", "")
    matches = [b for b in reg.backends if b.lower() in (wanted, f"etsdk{wanted}backend", f"{wanted}backend")]
    if len(matches) == 1:
        return matches[0]
    raise BackendNotFoundError(_not_found("backend", name, sorted(reg.backends)), backend_id=name)


def edge_transform_passes(backend_id: str) -> list[Callable[..., Any]]:
    """Passes for ``backend_id`` from every loaded plugin that did not lose a claim on it, in plugin order."""
    reg = _get()
    excluded = [
        p.module
        for p in reg.plugins
        if p.module is not None
        and reg.pm.is_registered(p.module)
        and (p.status == PluginStatus.FAILED or backend_id in reg.lost_backends.get(p.name, set()))
    ]
    caller = reg.pm.subset_hook_caller("etsdk_edge_transform_passes", remove_plugins=excluded)
    results = caller(backend_id=backend_id)
    return [p for group in results if group for p in group]
