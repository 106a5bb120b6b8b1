"""The README's main job on an embedded default: no download, no manual step.

Lists plugins, exports a small MLP with its weights in a ``.ptd`` through a
backend, runs it in the ExecuTorch runtime via the bridge, and compares with
eager PyTorch.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path


def run_demo(out_dir: str | None = None, backend: str = "EtsdkReferenceBackend") -> int:
    import torch

    import etsdk
    from etsdk.cli.listing import print_plugins

    print_plugins()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.SiLU(), torch.nn.Linear(32, 4)
    ).eval()
    x = torch.randn(3, 16)
    directory = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="etsdk-demo-"))
    lowered = etsdk.lower(
        module=model,
        example_inputs=(x,),
        backend=backend,
        external_data="weights",
        quiet=False,
    )
    written = lowered.save(directory / "mlp.pte")
    for path in written:
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    program = etsdk.load(directory / "mlp.pte", data=directory / "weights.ptd")
    print(f"loaded {program}; forward delegates to {list(program.delegates('forward'))}")
    started = time.perf_counter()
    (y,) = program.run("forward", x)
    elapsed_ms = (time.perf_counter() - started) * 1e3
    expected = model(x)
    error = (y - expected).abs().max().item()
    print(f"forward ran in {elapsed_ms:.2f} ms; max |etsdk - eager| = {error:.2e}")
    if not torch.allclose(y, expected, atol=1e-5, rtol=1e-5):
        print("MISMATCH against eager PyTorch")
        return 1
    print("matches eager PyTorch")
    return 0
