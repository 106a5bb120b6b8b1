"""etsdk-hf-static: Hugging Face causal LMs as hf_static v1 programs, and their runner.

``export(model_or_dir, "model.pte", backend="aoti")`` writes a program;
``HfStaticRunner.from_file("model.pte").generate(ids, max_new_tokens=16)`` runs it.
Heavy modules load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etsdk_hf_static.exporter import export
    from etsdk_hf_static.metadata import HfStaticMetadata, MetadataError
    from etsdk_hf_static.runner import Conversation, HfStaticRunner, ProgramMismatchError

__all__ = ["Conversation", "HfStaticMetadata", "HfStaticRunner", "MetadataError", "ProgramMismatchError", "export"]

_LAZY = {
    "export": "etsdk_hf_static.exporter",
    "HfStaticMetadata": "etsdk_hf_static.metadata",
    "MetadataError": "etsdk_hf_static.metadata",
    "Conversation": "etsdk_hf_static.runner",
    "HfStaticRunner": "etsdk_hf_static.runner",
    "ProgramMismatchError": "etsdk_hf_static.runner",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'etsdk_hf_static' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
