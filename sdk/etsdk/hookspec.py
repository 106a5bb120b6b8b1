"""Hook specifications: the whole surface between etsdk and its plugins.

A plugin is a module named by an entry point in the ``etsdk.plugins`` group.
It declares the plugin-API versions it supports in a module attribute::

    ETSDK_PLUGIN_API = ">=1,<2"

and implements any of the hooks below, each marked with ``@etsdk.hookimpl``.
etsdk validates a plugin completely before registering anything from it:
an implementation whose name is not declared here, or whose arguments are not
among the declared ones, is rejected with the plugin named. Functions whose
names start with ``etsdk_`` but are not marked are rejected too, so a
misspelled or unmarked hook never passes silently.

Registration hooks must be cheap: return frozen records from
:mod:`etsdk.registration` and defer heavy imports to the factories inside them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pluggy

from etsdk.registration import BackendSpec, ContractSpec, RunnerSpec

PROJECT = "etsdk"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: The plugin-API version this etsdk provides. Bumped when a hook below
#: changes incompatibly; plugins declare the range they support.
PLUGIN_API_VERSION = 1


# --------------------------------------------------------------------------- registration


@hookspec
def etsdk_register_backends() -> Sequence[BackendSpec]:
    """Return the backends this plugin provides.

    Called once per process, when etsdk first discovers plugins. Each backend id
    may be claimed by one installed distribution only; a second claim is a
    conflict reported against both.
    """
    raise NotImplementedError


@hookspec
def etsdk_register_contracts() -> Sequence[ContractSpec]:
    """Return the I/O contracts (name, version, data file) this plugin provides.

    Called once per process, at discovery. A contract name and version may be
    provided by one distribution only.
    """
    raise NotImplementedError


@hookspec
def etsdk_register_runners() -> Sequence[RunnerSpec]:
    """Return runners / IO managers, each for one contract name.

    Called once per process, at discovery. A runner drives a loaded program that
    embeds its contract (for example the hf_static LLM runner).
    """
    raise NotImplementedError


# --------------------------------------------------------------------------- lowering


@hookspec
def etsdk_edge_transform_passes(backend_id: str) -> Sequence[Callable[..., Any]] | None:
    """Return edge-dialect transform passes to run before partitioning for ``backend_id``.

    Called by :func:`etsdk.lower` for each backend taking part in a lowering,
    on every plugin; a plugin returns ``None`` for backends it does not know.
    The passes are given to ``to_edge_transform_and_lower(transform_passes=...)``
    in plugin order, so they see (and change) every method of the program, not
    only the operators that backend will claim.
    """
    raise NotImplementedError


HOOK_NAMES = frozenset(
    name for name, obj in list(globals().items()) if name.startswith("etsdk_") and callable(obj)
)
