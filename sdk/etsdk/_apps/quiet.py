"""A quiet command line: other libraries' import-time noise silenced in a CLI process only.

Importing torch, torchao, executorch and transformers prints lines that are not
etsdk's: torchao's "Failed to load ... .so" warnings, torch's ``W1203 ...``
log lines and ``FutureWarning`` / ``UserWarning`` from pytree and Dynamo,
transformers' "Loading weights" progress bars. ``etsdk export``, ``generate``
and ``chat`` call :func:`quiet_command_line` before importing any of them, so
they show only etsdk's own progress, results and errors; ``--verbose`` shows
everything.

This is for command-line processes only: the library itself never configures
logging or warnings for the programs that import it.
"""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["quiet_command_line"]

#: environment read by libraries at import time (set only where the user did not set them)
_ENVIRONMENT = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # huggingface_hub / transformers tqdm bars ("Loading weights")
    "TRANSFORMERS_VERBOSITY": "error",
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # c10 warnings printed from C++
}


def quiet_command_line(verbose: bool = False) -> None:
    """Silence other libraries' warnings, log records below ERROR and progress bars in this process.

    Call it in a command-line entry point before the heavy imports; ``verbose=True`` leaves everything
    as it is. etsdk's own output is printed, not logged, and is unaffected; errors still show.
    """
    if verbose:
        return
    for name, value in _ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    # Libraries log warnings at import (torchao through logging's last-resort handler, torch through its
    # own handlers): drop every record below ERROR, whatever logger or handler it goes to.
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")  # etsdk itself issues none: its messages are errors or printed progress
