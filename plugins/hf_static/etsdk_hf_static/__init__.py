"""etsdk-hf-static: Hugging Face causal LMs as hf_static v1 programs, and their runner.

``export(model_or_dir, "model.pte", backend="aoti")`` writes a program;
``HfStaticRunner.from_file("model.pte").generate(ids, max_new_tokens=16)`` runs it.
Layers: :mod:`~etsdk_hf_static.exporting` (model to program), :mod:`~etsdk_hf_static.runtime` (conversations, their
step-by-step generation, sampling), :mod:`~etsdk_hf_static.apps` (the commands: export, generate, chat, serve).
Heavy modules load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etsdk import serve_moved_modules

#: the modules of the flat layout before exporting/, runtime/ and apps/ (etsdk-hf-static 0.1 previews)
_MOVED = {
    **{f"etsdk_hf_static.{m}": f"etsdk_hf_static.exporting.{m}" for m in ("exporter", "module", "attention", "meta_build", "gguf_import", "tiny")},
    **{f"etsdk_hf_static.{m}": f"etsdk_hf_static.runtime.{m}" for m in ("runner", "conversation", "planning", "fitting", "sampling", "startup")},
    **{f"etsdk_hf_static.{m}": f"etsdk_hf_static.apps.{m}" for m in ("commands", "chat", "streaming", "demo")},
}
serve_moved_modules({old: (new, new) for old, new in _MOVED.items()})

if TYPE_CHECKING:
    from etsdk_hf_static.exporting.exporter import export
    from etsdk_hf_static.metadata import HfStaticMetadata, MetadataError
    from etsdk_hf_static.runtime.conversation import Generation
    from etsdk_hf_static.runtime.model import LoadedModel
    from etsdk_hf_static.runtime.runner import Conversation, HfStaticRunner, ProgramMismatchError

__all__ = [
    "Conversation",
    "Generation",
    "HfStaticMetadata",
    "HfStaticRunner",
    "LoadedModel",
    "MetadataError",
    "ProgramMismatchError",
    "export",
]

_LAZY = {
    "export": "etsdk_hf_static.exporting.exporter",
    "HfStaticMetadata": "etsdk_hf_static.metadata",
    "MetadataError": "etsdk_hf_static.metadata",
    "Conversation": "etsdk_hf_static.runtime.runner",
    "Generation": "etsdk_hf_static.runtime.conversation",
    "LoadedModel": "etsdk_hf_static.runtime.model",
    "HfStaticRunner": "etsdk_hf_static.runtime.runner",
    "ProgramMismatchError": "etsdk_hf_static.runtime.runner",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'etsdk_hf_static' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
