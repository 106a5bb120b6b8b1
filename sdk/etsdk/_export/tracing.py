"""Strict ``torch.export`` without a transient copy of the weights.

In export mode Dynamo keeps a "real value" of every tensor that exists before
tracing, cloned (torch 2.13: ``torch._dynamo.variables.builder._clone_input``,
called twice per tensor). For a module's parameters that is a second copy of
the model for the whole trace, and a third for a moment: strict export of an
805 MB model raised peak RSS by 1.05 GB here, non-strict by 0.1 GB. Parameters
are never written while tracing, so the real-value cache can share them (a
quantized layer's stored tensors are parameters too, :mod:`etsdk._quant.modules`).

:func:`weights_shared_while_tracing` does that for the calling thread only: the
replacement is installed while at least one thread uses it, does its own work
only on threads inside the block, and is removed when the last one leaves
(docs/architecture.md, idea 7: scoped, thread-local, restored). If a torch release no longer
has the hook, tracing simply runs unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from etsdk._channels import TRACING

__all__ = ["weights_shared_while_tracing"]

_lock = threading.Lock()
_installed: dict[str, Any] = {"users": 0, "original": None}


def _sharing(original: Callable[..., Any]) -> Callable[..., Any]:
    import torch

    def clone_input(value: Any, *args: Any, **kwargs: Any) -> Any:
        if TRACING.get() and isinstance(value, torch.nn.Parameter):
            return value
        return original(value, *args, **kwargs)

    clone_input.__wrapped__ = original  # type: ignore[attr-defined]
    return clone_input


@contextmanager
def weights_shared_while_tracing() -> Iterator[None]:
    """Within the block, on this thread, Dynamo's export tracing shares parameters instead of cloning them."""
    try:
        import torch._dynamo.variables.builder as builder
    except ImportError:
        yield
        return
    if not callable(getattr(builder, "_clone_input", None)):
        yield
        return
    with _lock:
        if _installed["users"] == 0:
            _installed["original"] = builder._clone_input
            builder._clone_input = _sharing(builder._clone_input)
        _installed["users"] += 1
    try:
        with TRACING.bound((TRACING.get() or 0) + 1):
            yield
    finally:
        with _lock:
            _installed["users"] -= 1
            if _installed["users"] == 0:
                builder._clone_input = _installed["original"]
                _installed["original"] = None
