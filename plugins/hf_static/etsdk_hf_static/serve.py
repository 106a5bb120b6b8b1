"""``etsdk_hf_static.serve.create_app(program, ServeConfig(...))``: the ASGI app of ``etsdk serve``, to mount in any
ASGI host (its code: :mod:`etsdk_hf_static.apps.serve`)."""

from etsdk_hf_static.apps.serve import ServeConfig, create_app

__all__ = ["ServeConfig", "create_app"]
