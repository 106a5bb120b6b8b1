"""``python run_etsdk.py ARGS`` = ``etsdk ARGS`` on a machine whose TensorRT is the stand-in (CLI tests).

The etsdk CLI offers no per-backend options yet, so the stand-in's engines (host-located) get ``device="cpu"``
as etsdk-tensorrt's default here. Engines built at load go to ``$ETSDK_TENSORRT_TEST_CACHE``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402  (its MonkeyPatch)
import trt_seams  # noqa: E402

if __name__ == "__main__":
    patch = pytest.MonkeyPatch()
    trt_seams.install(patch, Path(os.environ["ETSDK_TENSORRT_TEST_CACHE"]), default_device="cpu")
    from etsdk.cli.main import main

    sys.exit(main(sys.argv[1:]))
