"""Hook specifications: the whole surface between etsdk and its plugins.

A plugin is a module named by an entry point in the ``etsdk.plugins`` group.
It declares the plugin-API versions it supports in a module attribute::

    ETSDK_PLUGIN_API = ">=2,<3"

and implements any of the hooks below, each marked with ``@etsdk.hookimpl``.
etsdk validates a plugin completely before registering anything from it:
an implementation whose name is not declared here, or whose arguments are not
among the declared ones, is rejected with the plugin named. Functions whose
names start with ``etsdk_`` but are not marked are rejected too, so a
misspelled or unmarked hook never passes silently.

Registration hooks must be cheap: return frozen records from
:mod:`etsdk._plugins.specs` and defer heavy imports to the factories inside them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pluggy

from etsdk._plugins.specs import BackendSpec, CommandSpec, ContractSpec, RunnerSpec

PROJECT = "etsdk"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Marks a plugin module's ``etsdk_*`` functions as hook implementations (``@etsdk.hookimpl``). An ``etsdk_*``
#: function without it makes the plugin fail validation rather than be silently ignored.
hookimpl = pluggy.HookimplMarker(PROJECT)

#: The plugin-API version this etsdk provides. Bumped when a hook, or
#: what a backend's factories receive and return (:mod:`etsdk.backend`),
#: changes incompatibly; plugins declare the range they support.
#: Version 2: ``preprocess(partition)``, ``execute(args, state)``, declared options.
#: Every bump adds its old -> new rows to docs/migrating.md, which the skip
#: reason of a plugin declaring an older range names.
PLUGIN_API_VERSION = 2


# --------------------------------------------------------------------------- registration


@hookspec
def etsdk_register_backends() -> Sequence[BackendSpec]:
    """Return the backends this plugin provides (:class:`etsdk.BackendSpec` records).

    Called once per process, when etsdk first discovers plugins. What the
    record's factories receive and return is typed in :mod:`etsdk.backend`.
    A backend id belongs to one distribution: a record claiming the core's id is
    refused; two plugins claiming one id both have that record refused (their
    other records stay), and the refusal is listed by ``etsdk plugins``.
    """
    raise NotImplementedError


@hookspec
def etsdk_register_contracts() -> Sequence[ContractSpec]:
    """Return the I/O contracts (name, version, data file) this plugin provides.

    Called once per process, at discovery. Contracts are keyed by (name,
    version): a plugin may ship ``kv_decoder`` v2 beside the core's v1, but a
    record claiming a (name, version) someone else provides is refused.
    """
    raise NotImplementedError


@hookspec
def etsdk_register_runners() -> Sequence[RunnerSpec]:
    """Return runners / IO managers, each for one contract name and the versions it drives.

    Called once per process, at discovery. A runner drives a loaded program that
    embeds its contract (for example the hf_static LLM runner). Keyed by
    (contract, version); a runner for a contract record of the same plugin that
    was refused is refused with it.
    """
    raise NotImplementedError


@hookspec
def etsdk_register_commands() -> Sequence[CommandSpec]:
    """Return the ``etsdk`` commands this plugin adds (:class:`etsdk.CommandSpec` records).

    Called once per process, at discovery. The command line adds one subparser
    per command (``configure(parser)``) and calls ``run(args)`` for it; it reads
    these records only when it builds its parser with plugin commands, so
    ``etsdk --version`` and the core's own commands never wait for them. Keyed by
    command name: a record naming one of the core's commands (``plugins``,
    ``doctor``, ``demo``, ``new-backend``, ``inspect``, ``conformance``,
    ``verify``) is refused, two plugins naming one command both have that record
    refused, and ``etsdk plugins`` lists the refusal. etsdk-hf-static provides
    ``export``, ``generate`` and ``chat`` this way.
    """
    raise NotImplementedError


# --------------------------------------------------------------------------- lowering


@hookspec
def etsdk_edge_transform_passes(backend_id: str) -> Sequence[Callable[..., Any]] | None:
    """Return edge-dialect transform passes to run before partitioning for ``backend_id``.

    Called by :func:`etsdk.lower` for each backend taking part in a lowering,
    on every loaded plugin except those whose claim on ``backend_id`` was
    refused; a plugin returns ``None`` for backends it does not know.
    The passes are given to ``to_edge_transform_and_lower(transform_passes=...)``
    in plugin order, so they see (and change) every method of the program, not
    only the operators that backend will claim.
    """
    raise NotImplementedError


HOOK_NAMES = frozenset(
    name for name, obj in list(globals().items()) if name.startswith("etsdk_") and callable(obj)
)
