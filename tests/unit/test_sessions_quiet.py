"""A quiet command line: other libraries' noise is silenced in CLI processes only, and ``--verbose`` shows it."""

from __future__ import annotations

import subprocess
import sys

NOISY = """
import logging, sys, warnings
from etsdk._apps.quiet import quiet_command_line
quiet_command_line(verbose=VERBOSE)
logging.getLogger("torchao").warning("Failed to load _C.so")    # a library without handlers: logging's last resort
handler = logging.StreamHandler(sys.stderr)                      # a library with its own handler, like torch's W1203
logging.getLogger("torch.utils._pytree").addHandler(handler)
logging.getLogger("torch.utils._pytree").warning("W1203 register_constant is deprecated")
warnings.warn("isinstance(treespec, LeafSpec) is deprecated", FutureWarning)
logging.getLogger("torch").error("an error still shows")
print("etsdk: own output")
"""


def _run(verbose: bool) -> subprocess.CompletedProcess[str]:
    code = NOISY.replace("VERBOSE", str(verbose))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_quiet_command_line_silences_warnings_and_logs_below_error() -> None:
    quiet = _run(False)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "etsdk: own output\n"
    assert quiet.stderr.splitlines() == ["an error still shows"]
    loud = _run(True)
    for text in ("Failed to load", "W1203", "FutureWarning", "an error still shows"):
        assert text in loud.stderr


def test_importing_etsdk_configures_nothing() -> None:
    code = (
        "import os; before = dict(os.environ)\n"
        "import logging, warnings, etsdk, etsdk._state.session, etsdk._state.snapshot, etsdk._apps.generation, etsdk._apps.quiet\n"
        "assert logging.root.manager.disable == 0, 'logging disabled on import'\n"
        "assert not any(f[0] == 'ignore' and f[2] is Warning for f in warnings.filters), 'warnings silenced on import'\n"
        "assert dict(os.environ) == before, 'environment changed on import'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
