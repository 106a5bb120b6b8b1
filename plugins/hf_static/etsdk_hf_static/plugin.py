"""Registration of etsdk-hf-static (imports nothing heavy).

The ``hf_static`` v1 contract itself is data shipped with the core
(``contracts/hf_static/1.json``); this plugin provides its runner and its
exporter (``etsdk generate`` / ``etsdk export``).
"""

from __future__ import annotations

from typing import Any

from etsdk import RunnerSpec, hookimpl

ETSDK_PLUGIN_API = ">=2,<3"


def _runner(program: Any, **options: Any) -> Any:
    from etsdk_hf_static.runner import HfStaticRunner

    return HfStaticRunner.from_program(program, **options)


def _exporter(request: Any) -> Any:
    from etsdk_hf_static.exporter import export_request

    return export_request(request)


@hookimpl
def etsdk_register_runners() -> list[RunnerSpec]:
    return [
        RunnerSpec(
            contract="hf_static",
            factory=_runner,
            versions=(1,),
            exporter=_exporter,
            description="Hugging Face static-cache causal LMs: export, prefill/decode IO manager, sampling",
        )
    ]
