"""``etsdk serve``: an OpenAI-compatible HTTP server over an hf_static program (Starlette on uvicorn).

:func:`create_app` (:mod:`~.app`) is the ASGI app; :mod:`~.engine` the slots, queue and step interleaving;
:mod:`~.protocol` the OpenAI request and reply bodies; :mod:`~.metrics` the Prometheus counters;
:mod:`~.command` the command line. Needs ``pip install 'etsdk-hf-static[serve]'``. Importing this package is
cheap (the command line's parser imports :mod:`~.command`); the app loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etsdk_hf_static.apps.serve.app import ServeConfig, create_app

__all__ = ["ServeConfig", "create_app"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'etsdk_hf_static.apps.serve' has no attribute {name!r}")
    from etsdk_hf_static.apps.serve import app

    return getattr(app, name)
