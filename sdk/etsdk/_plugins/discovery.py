"""Finding, validating and isolating plugins.

Plugins are modules named by entry points in the ``etsdk.plugins`` group. Each
is loaded, checked against the plugin API and the hook specifications, and
asked for its registrations *in isolation*: a plugin that fails is reported
(distribution, version, the first lines of the error) and every other plugin
keeps working. Environment variables:

``ETSDK_PLUGINS=a,b``          load only these plugins (entry-point or distribution names)
``ETSDK_DISABLE_PLUGINS=a,b``  skip these plugins
``ETSDK_STRICT_PLUGINS=1``     turn any plugin failure or conflict into an error

Discovery imports only the plugin modules themselves, which by contract import
nothing heavy (see :mod:`etsdk._plugins.hookspec`).
"""

from __future__ import annotations

import enum
import inspect
import logging
import os
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from etsdk._plugins import hookspec
from etsdk._plugins.specs import Availability, BackendSpec, CommandSpec, ContractSpec, RunnerSpec
from etsdk.errors import PluginValidationError

__all__ = ["ENTRY_POINT_GROUP", "LoadedPlugin", "PluginStatus", "discover_plugins"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "etsdk.plugins"
_API_ATTRIBUTE = "ETSDK_PLUGIN_API"
_REGISTRATION_HOOKS = {
    "etsdk_register_backends": BackendSpec,
    "etsdk_register_contracts": ContractSpec,
    "etsdk_register_runners": RunnerSpec,
    "etsdk_register_commands": CommandSpec,
}


class PluginStatus(str, enum.Enum):
    """A plugin's status in ``etsdk plugins`` (:attr:`PluginInfo.status`); a failing plugin never stops the others."""

    #: Loaded and registered.
    OK = "ok"
    #: Installed and registered, but a backend's probe says it cannot run on this machine (exporting still works).
    UNAVAILABLE = "unavailable"
    #: Raised on import, validation or registration; or claims what another distribution claims.
    FAILED = "failed"
    #: Filtered out by ``ETSDK_PLUGINS`` / ``ETSDK_DISABLE_PLUGINS``, or supports a different plugin-API range.
    SKIPPED = "skipped"


@dataclass(slots=True)
class LoadedPlugin:
    """One installed plugin and what it registered (empty unless it loaded)."""

    name: str
    distribution: str
    version: str
    status: PluginStatus = PluginStatus.OK
    reason: str | None = None
    module: ModuleType | None = None
    backends: tuple[BackendSpec, ...] = ()
    contracts: tuple[ContractSpec, ...] = ()
    runners: tuple[RunnerSpec, ...] = ()
    commands: tuple[CommandSpec, ...] = ()
    availability: dict[str, Availability] = field(default_factory=dict)
    error: BaseException | None = None

    @property
    def label(self) -> str:
        return f"{self.distribution} {self.version} (plugin '{self.name}')"

    def fail(self, reason: str, error: BaseException | None = None) -> None:
        self.status = PluginStatus.FAILED
        self.reason = reason
        self.error = error


def _env_list(name: str) -> frozenset[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def strict_mode() -> bool:
    return os.environ.get("ETSDK_STRICT_PLUGINS", "").strip().lower() in {"1", "true", "yes", "on"}


def _first_lines(error: BaseException, limit: int = 3) -> str:
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    lines = text.splitlines()
    return " | ".join(lines[:limit]) + (" ..." if len(lines) > limit else "")


#: Where a plugin written for an older plugin API finds every change, old -> new (named in the skip reason).
MIGRATION_GUIDE = "docs/migrating.md"


def _api_mismatch(module: ModuleType) -> str | None:
    """Return why ``module``'s declared plugin-API range excludes this etsdk, or None."""
    from etsdk._version import __version__

    provided = hookspec.PLUGIN_API_VERSION
    declared = getattr(module, _API_ATTRIBUTE, None)
    if declared is None:
        return (
            f"does not declare {_API_ATTRIBUTE}; this etsdk ({__version__}) provides plugin API "
            f"{provided}: add {_API_ATTRIBUTE} = \">={provided},<{provided + 1}\" to the plugin module"
        )
    try:
        spec = SpecifierSet(str(declared))
    except InvalidSpecifier:
        return (
            f"declares an invalid {_API_ATTRIBUTE} {declared!r} (expected a range such as "
            f"\">={provided},<{provided + 1}\")"
        )
    if spec.contains(str(provided)):
        return None
    mismatch = f"supports etsdk plugin API {declared} but this etsdk ({__version__}) provides API {provided}"
    older = [version for version in range(provided) if spec.contains(str(version))]
    if older:  # written for an API this etsdk no longer provides: the guide says what changed
        return (
            f"{mismatch}; port it from API {older[-1]} to {provided} with {MIGRATION_GUIDE}, or install a "
            f"release of the plugin that supports API {provided}"
        )
    return (
        f"{mismatch}; upgrade etsdk to a release that provides an API in {declared}, or install a release of "
        f"the plugin that supports API {provided}"
    )


def validate_plugin_module(module: ModuleType, plugin: str) -> None:
    """Check every hook implementation in ``module`` before anything is registered.

    Raises :class:`PluginValidationError` naming the plugin, the hook and the
    offending signature.
    """
    marker_attr = f"{hookspec.PROJECT}_impl"
    for attr in sorted(dir(module)):
        obj = getattr(module, attr, None)
        if not callable(obj):
            continue
        marked = hasattr(obj, marker_attr)
        if not marked and attr.startswith("etsdk_"):
            raise PluginValidationError(
                f"plugin '{plugin}': function {attr}() looks like a hook but is not marked with "
                f"@etsdk.hookimpl; known hooks: {', '.join(sorted(hookspec.HOOK_NAMES))}",
                plugin=plugin,
            )
        if not marked:
            continue
        opts = getattr(obj, marker_attr) or {}
        hook_name = opts.get("specname") or attr
        if hook_name not in hookspec.HOOK_NAMES:
            raise PluginValidationError(
                f"plugin '{plugin}': unknown hook {hook_name}(); known hooks: "
                f"{', '.join(sorted(hookspec.HOOK_NAMES))}",
                plugin=plugin,
            )
        allowed = list(inspect.signature(getattr(hookspec, hook_name)).parameters)
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError) as exc:  # builtins without signatures
            raise PluginValidationError(
                f"plugin '{plugin}': cannot read the signature of {attr}: {exc}", plugin=plugin
            ) from exc
        unknown = [p for p in params if p not in allowed]
        if unknown:
            raise PluginValidationError(
                f"plugin '{plugin}': hook {hook_name}{inspect.signature(obj)} has argument(s) "
                f"{', '.join(unknown)} not in the specification {hook_name}({', '.join(allowed)})",
                plugin=plugin,
            )


def _registrations(pm: pluggy.PluginManager, plugin: LoadedPlugin) -> None:
    """Call the plugin's own registration hooks and check what they return."""
    collected: dict[str, tuple[Any, ...]] = {}
    for hook_name, record_type in _REGISTRATION_HOOKS.items():
        items: list[Any] = []
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            if impl.plugin_name != plugin.name:
                continue
            result = impl.function()
            if result is None:
                continue
            if isinstance(result, (str, bytes)) or not isinstance(result, Iterable):
                raise PluginValidationError(
                    f"plugin '{plugin.name}': {hook_name}() must return a sequence of "
                    f"{record_type.__name__}, got {type(result).__name__}",
                    plugin=plugin.name,
                )
            for item in result:
                if not isinstance(item, record_type):
                    raise PluginValidationError(
                        f"plugin '{plugin.name}': {hook_name}() returned a "
                        f"{type(item).__name__}, expected {record_type.__name__}",
                        plugin=plugin.name,
                    )
                items.append(item)
        collected[hook_name] = tuple(items)
    plugin.backends = collected["etsdk_register_backends"]
    plugin.contracts = collected["etsdk_register_contracts"]
    plugin.runners = collected["etsdk_register_runners"]
    plugin.commands = collected["etsdk_register_commands"]


def _probe(plugin: LoadedPlugin) -> None:
    for backend in plugin.backends:
        result = backend.probe()
        if not isinstance(result, Availability):
            raise PluginValidationError(
                f"plugin '{plugin.name}': probe of backend '{backend.id}' returned "
                f"{type(result).__name__}, expected Availability",
                plugin=plugin.name,
            )
        plugin.availability[backend.id] = result
    if plugin.backends and not any(a.available for a in plugin.availability.values()):
        plugin.status = PluginStatus.UNAVAILABLE
        plugin.reason = "; ".join(
            f"{bid}: {a.reason}" for bid, a in plugin.availability.items() if a.reason
        )


def _selected(name: str, distribution: str) -> str | None:
    """Return why the plugin is filtered out by the environment, or None."""
    names = {name, distribution, distribution.replace("_", "-")}
    only = _env_list("ETSDK_PLUGINS")
    if only is not None and not names & only:
        return f"not listed in ETSDK_PLUGINS={','.join(sorted(only))}"
    disabled = _env_list("ETSDK_DISABLE_PLUGINS")
    if disabled is not None and names & disabled:
        return "disabled by ETSDK_DISABLE_PLUGINS"
    return None


def _entry_points() -> list[metadata.EntryPoint]:
    eps = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    # The same distribution can be visible twice (e.g. an editable install and a
    # path entry); keep the first, as importlib does for imports.
    seen: set[tuple[str, str]] = set()
    unique = []
    for ep in eps:
        key = (ep.name, ep.value)
        if key not in seen:
            seen.add(key)
            unique.append(ep)
    return sorted(unique, key=lambda ep: ep.name)


def discover_plugins(pm: pluggy.PluginManager) -> list[LoadedPlugin]:
    """Load every installed plugin into ``pm``; never raises for one plugin's failure.

    Strict mode is applied by the caller (:mod:`etsdk._plugins.registry`), after
    conflicts are known, so that its error can name everything that failed.
    """
    plugins: list[LoadedPlugin] = []
    for ep in _entry_points():
        dist = ep.dist
        plugin = LoadedPlugin(
            name=ep.name,
            distribution=dist.name if dist is not None else "<unknown>",
            version=dist.version if dist is not None else "<unknown>",
        )
        plugins.append(plugin)
        why_not = _selected(plugin.name, plugin.distribution)
        if why_not is not None:
            plugin.status, plugin.reason = PluginStatus.SKIPPED, why_not
            continue
        if pm.has_plugin(plugin.name):
            plugin.fail(f"another installed plugin is already named '{plugin.name}'")
            continue
        try:
            module = ep.load()
        except BaseException as exc:  # noqa: BLE001 - isolate any import failure
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            plugin.fail(f"import of {ep.value} failed: {_first_lines(exc)}", exc)
            continue
        if not isinstance(module, ModuleType):
            plugin.fail(f"entry point {ep.value} must name a module, got {type(module).__name__}")
            continue
        plugin.module = module
        mismatch = _api_mismatch(module)
        if mismatch is not None:
            plugin.status, plugin.reason = PluginStatus.SKIPPED, mismatch
            continue
        try:
            validate_plugin_module(module, plugin.name)
            pm.register(module, name=plugin.name)
        except PluginValidationError as exc:
            plugin.fail(str(exc), exc)
            continue
        except pluggy.PluginValidationError as exc:  # belt and braces: pluggy's own checks
            plugin.fail(f"plugin '{plugin.name}': {exc}", exc)
            continue
        try:
            _registrations(pm, plugin)
            _probe(plugin)
        except Exception as exc:  # noqa: BLE001 - isolate registration failures
            pm.unregister(module)
            plugin.backends = plugin.contracts = plugin.runners = ()
            plugin.commands = ()
            reason = str(exc) if isinstance(exc, PluginValidationError) else (
                f"registration raised {_first_lines(exc)}"
            )
            plugin.fail(reason, exc)
            continue
        logger.debug("loaded plugin %s", plugin.label)
    return plugins
