"""Peak host memory of exporting a model with about 1 GiB of weights, etsdk-aoti vs the stock path.

Each path runs in its own process (peak RSS is a per-process high-water mark):

* ``etsdk``: ``etsdk.lower(..., backend="EtsdkAotiBackend")`` with the weights in a
  ``.ptd``, then ``save``: weights are streamed tensor by tensor into a file and
  handed to ExecuTorch as file-backed named data;
* ``stock``: ExecuTorch's own ``AotiBackend`` mixin, subclassed for ``cpu`` with the
  same Inductor options and every fallback kernel allowed (the wheel's CPU-capable
  reference path), through ``to_edge_transform_and_lower`` / ``to_executorch`` /
  ``write_to_file`` and ``write_tensor_data_to_file``.

The model (a stack of square linear layers, random fp32 weights) is built before
the baseline is read, so ``peak - baseline`` is what export itself costs. The last
line is JSON: ``weights_bytes``, ``etsdk_peak_rss_bytes``, ``etsdk_baseline_rss_bytes``,
``stock_peak_rss_bytes``, ``stock_baseline_rss_bytes``, plus the ratios.

``--smoke``: 2 layers of 256 x 256 (512 KiB of weights), both paths, the same
processes and JSON keys: it checks that both exports still run, not their memory
(at this size the ratios measure allocator noise).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _model(width: int, layers: int):  # noqa: ANN202
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _child(path: str, width: int, layers: int, out: str) -> None:
    import torch

    model = _model(width, layers)
    example = (torch.randn(1, width),)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    baseline = _rss_now()
    started = time.perf_counter()
    directory = Path(out)
    if path == "etsdk":
        import etsdk

        lowered = etsdk.lower(
            module=model, example_inputs=example, backend="EtsdkAotiBackend",
            partitioner_options={"device": "cpu"}, external_data="weights",
        )
        lowered.save(directory / "model.pte")
    else:
        from executorch.backends.aoti.aoti_backend import AotiBackend
        from executorch.backends.aoti.aoti_partitioner import AotiPartitioner
        from executorch.exir import to_edge_transform_and_lower
        from executorch.exir.backend.backend_details import BackendDetails

        class _Everything(dict):
            def __contains__(self, key: object) -> bool:
                return True

        class StockCpuAotiBackend(AotiBackend, BackendDetails):
            @classmethod
            def get_device_name(cls) -> str:
                return "cpu"

            @classmethod
            def get_supported_fallback_kernels(cls):  # noqa: ANN206
                return _Everything()

            @classmethod
            def get_decomposition_table(cls):  # noqa: ANN206
                return {}

            @classmethod
            def get_aoti_compile_options(cls, compile_specs):  # noqa: ANN001, ANN206
                return {
                    "aot_inductor.package": True,
                    "aot_inductor.package_constants_in_so": False,
                    "aot_inductor.package_constants_on_disk_format": "binary_blob",
                    "max_autotune": False,
                }

            @classmethod
            def get_custom_passes(cls, compile_specs):  # noqa: ANN001, ANN206
                return []

            @classmethod
            def save_data_externally(cls) -> bool:
                return True

        exported = torch.export.export(model, example)
        spec = StockCpuAotiBackend.generate_method_name_compile_spec("forward")
        edge = to_edge_transform_and_lower(exported, partitioner=[AotiPartitioner("StockCpuAotiBackend", [spec])])
        program = edge.to_executorch()
        with (directory / "model.pte").open("wb") as f:
            program.write_to_file(f)
        program.write_tensor_data_to_file(str(directory))
    elapsed = time.perf_counter() - started
    written = sum(p.stat().st_size for p in directory.iterdir())
    print(json.dumps({"weights": weights, "baseline": baseline, "peak": _peak(), "seconds": elapsed, "written": written}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=16, help="16 x 4096^2 fp32 = 1 GiB")
    parser.add_argument("--child", choices=["etsdk", "stock"])
    parser.add_argument("--out")
    parser.add_argument("--smoke", action="store_true", help="2 layers of 256 x 256: checks both exports run")
    args = parser.parse_args()
    if args.smoke:
        args.width, args.layers = 256, 2
    if args.child:
        _child(args.child, args.width, args.layers, args.out)
        return
    results = {}
    for path in ("etsdk", "stock"):
        with tempfile.TemporaryDirectory() as out:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", path, "--out", out, "--width", str(args.width), "--layers", str(args.layers)],
                capture_output=True, text=True,
            )
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{path} export failed")
            results[path] = json.loads(proc.stdout.strip().splitlines()[-1])
            r = results[path]
            print(
                f"{path:6s} weights {r['weights'] / 2**30:.2f} GiB  baseline {r['baseline'] / 2**30:.2f} GiB  "
                f"peak {r['peak'] / 2**30:.2f} GiB  (peak - baseline {(r['peak'] - r['baseline']) / 2**30:.2f} GiB)  "
                f"{r['seconds']:.1f}s, wrote {r['written'] / 2**30:.2f} GiB"
            )
    weights = results["etsdk"]["weights"]
    print(
        json.dumps(
            {
                "weights_bytes": weights,
                "etsdk_peak_rss_bytes": results["etsdk"]["peak"],
                "etsdk_baseline_rss_bytes": results["etsdk"]["baseline"],
                "stock_peak_rss_bytes": results["stock"]["peak"],
                "stock_baseline_rss_bytes": results["stock"]["baseline"],
                "etsdk_export_over_weights": round((results["etsdk"]["peak"] - results["etsdk"]["baseline"]) / weights, 3),
                "stock_export_over_weights": round((results["stock"]["peak"] - results["stock"]["baseline"]) / weights, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
