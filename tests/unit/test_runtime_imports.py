"""Running a program does not import ExecuTorch's export stack, and exporting afterwards still can.

``portable_lib`` imports ``executorch.exir._warnings``, whose package ``__init__`` imports torch._dynamo,
Inductor and the edge dialect (seconds of a program's load); ``etsdk._runtime.bridge.build.import_pybindings``
imports the pybindings without it (benchmarks/README.md, first_token).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    from etsdk._runtime.bridge.build import load_extension
    load_extension()
    from executorch.runtime import Runtime, Verification
    assert Runtime.get() is not None and Verification.InternalConsistency is not None
    loaded = sorted(m for m in sys.modules if m == "executorch.exir" or m.startswith("executorch.exir."))
    assert not loaded, loaded
    import executorch.exir
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir._warnings import ExperimentalWarning
    assert executorch.exir.__file__.endswith("__init__.py") and callable(to_edge_transform_and_lower)
    assert sys.modules["executorch.exir._warnings"].ExperimentalWarning is ExperimentalWarning
    print("ok")
    """
)


def test_loading_the_runtime_leaves_executorch_exir_unimported() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
