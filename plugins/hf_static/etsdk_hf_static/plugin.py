"""Registration of etsdk-hf-static (imports nothing heavy).

The ``hf_static`` v1 contract itself is data shipped with the core
(``contracts/hf_static/1.json``); this plugin provides its runner and its
exporter, and the command-line application over them: ``etsdk export``,
``etsdk generate`` and ``etsdk chat`` (:mod:`etsdk_hf_static.commands`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etsdk import CommandSpec, RunnerSpec, hookimpl

if TYPE_CHECKING:
    from pathlib import Path

    from etsdk import ExportRequest, Program

    from etsdk_hf_static.runner import HfStaticRunner

ETSDK_PLUGIN_API = ">=2,<3"


def _runner(program: Program, **options: Any) -> HfStaticRunner:
    from etsdk_hf_static.runner import HfStaticRunner

    return HfStaticRunner.from_program(program, **options)


def _exporter(request: ExportRequest) -> list[Path]:
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


@hookimpl
def etsdk_register_commands() -> list[CommandSpec]:
    from etsdk_hf_static.commands import COMMANDS

    return list(COMMANDS)
