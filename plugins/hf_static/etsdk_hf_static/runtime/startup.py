"""Start-up of ``etsdk generate`` / ``etsdk chat``: the progress line, and an opt-in timing report.

``ETSDK_TIMING=1`` in the environment makes the commands print one line per start-up stage on stderr::

    etsdk-timing: {"stage": "program", "t": 1764790000.123456}

``t`` is the wall clock (``time.time()``), so a parent process can subtract the moment it started the command
(``benchmarks/first_token.py`` does). Stages, in order: ``start`` (the command's code runs: interpreter, etsdk
and plugin discovery done), ``program`` (``etsdk.load`` returned: torch and ExecuTorch imported, files checked),
``tokenizer`` (the runner is being made: the tokenizer saved beside the program is loaded), ``methods``
(prefill and decode loaded: libraries opened, weights bound), ``prompt`` (prompt ids ready), ``first_token``
(the first generated token chosen). Without the variable nothing is printed.
"""

from __future__ import annotations

import json
import os
import sys
import time

__all__ = ["ENV", "mark", "say_loading"]

ENV = "ETSDK_TIMING"


_done: set[str] = set()  # stages marked and programs announced in this process: each once, where it first happens


def mark(stage: str) -> None:
    """Print ``stage``'s timing line on stderr when ``ETSDK_TIMING`` is set (else nothing); once per stage."""
    if os.environ.get(ENV, "") not in ("", "0") and stage not in _done:
        _done.add(stage)
        print(f"etsdk-timing: {json.dumps({'stage': stage, 't': time.time()})}", file=sys.stderr, flush=True)


def say_loading(program: str) -> None:
    """The first thing the user sees, before the seconds of imports and loading (once per program)."""
    if f"loading {program}" not in _done:
        _done.add(f"loading {program}")
        print(f"etsdk: loading {os.path.basename(program)} ...", file=sys.stderr, flush=True)
