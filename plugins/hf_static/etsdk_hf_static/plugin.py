"""Registration of etsdk-hf-static (imports nothing heavy).

The ``hf_static`` contracts (v1, v2 with sliding-window layers, v3 with int8 caches) are data shipped with the
core (``contracts/hf_static/<version>.json``); this plugin provides their runner and their
exporter, and the command-line application over them: ``etsdk export``,
``etsdk generate``, ``etsdk chat`` and ``etsdk serve`` (:mod:`etsdk_hf_static.apps.commands`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etsdk import CommandSpec, RunnerSpec, hookimpl

if TYPE_CHECKING:
    from pathlib import Path

    from etsdk import ExportRequest, Program

    from etsdk_hf_static.runtime.runner import HfStaticRunner

from etsdk_hf_static.metadata import SUPPORTED_VERSIONS  # noqa: E402  (imports only etsdk's contract types)

ETSDK_PLUGIN_API = ">=2,<3"


def _runner(program: Program, **options: Any) -> HfStaticRunner:
    from etsdk_hf_static.runtime.runner import HfStaticRunner

    return HfStaticRunner.from_program(program, **options)


def _exporter(request: ExportRequest) -> list[Path]:
    from etsdk_hf_static.exporting.exporter import export_request

    return export_request(request)


@hookimpl
def etsdk_register_runners() -> list[RunnerSpec]:
    return [
        RunnerSpec(
            contract="hf_static",
            factory=_runner,
            versions=SUPPORTED_VERSIONS,  # v1 full attention, v2 sliding windows, v3 int8 caches
            exporter=_exporter,
            description="Hugging Face static-cache causal LMs: export, prefill/decode IO manager, sampling",
        )
    ]


@hookimpl
def etsdk_register_commands() -> list[CommandSpec]:
    from etsdk_hf_static.apps.commands import COMMANDS

    return list(COMMANDS)
