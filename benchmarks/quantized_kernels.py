"""Quantized matrix products on the CPU: etsdk-aoti's kernels vs ATen's weight-only kernels vs the float32 ``mm``.

For each weight shape of SmolLM2-135M (``[1536, 576]`` up / gate, ``[576, 1536]`` down, ``[49152, 576]`` the
head) and for decode (M=1) and prefill (M=``--prefill``), times ``x @ w.T``:

* ``fp32``: ``torch.mm`` on the float32 weight (MKL);
* ``etsdk_int8`` / ``etsdk_int8_g32`` / ``etsdk_int4_g32``: :func:`etsdk_aoti.kernels.qmm` on the planes
  ``etsdk.quantize_model`` writes (int8 one scale per row, int8 in groups of 32, 4-bit in groups of 32);
* ``etsdk_int4_g32_a8``: the same 4-bit planes as ``int4:g32:a8`` (the input rounded to int8 per block of 32,
  VNNI integer products at M=1);
* ``aten_int8`` / ``aten_int4_g32``: ``torch._weight_int8pack_mm`` and ``torch._weight_int4pack_mm_for_cpu`` on
  the same weights (what AOTInductor would call for torchao-style weight-only int8 / int4).

* ``etsdk_int8_g64_a8`` / ``etsdk_int4_g32_min_f16_a8``: the formats ``etsdk export --quantize int8`` / ``int4`` mean
  (``etsdk_int8_g64``: the same int8 planes times float activations).

``--levels L1,L2`` (or ``all``: every level this host runs) times etsdk's kernels at each instruction-set level
(``etsdk_aoti.kernels.use_level``), interleaved, as ``<kernel>_<level>`` (``etsdk_int8_g64_avx2``); without it they
run at the process's level (the host's best, or ``ETSDK_AOTI_ISA``'s), named as they are. ``cpu`` (the host's CPU
and features) and ``kernel_levels`` (the levels timed) are in the JSON, and on stderr before the figures.

Rounds interleave the kernels; medians reported, in microseconds, and each kernel's speed-up over ``fp32``
(``<kernel>_over_fp32_<shape>_m<M>``, > 1 is faster). ``--threads N`` sets torch's (and the kernels') team.
Last line: JSON with every median and ratio.

``--smoke``: one small shape, M in {1, 8}, one round: the same code and keys' form, figures meaningless.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from etsdk import WeightFormat, quantize_weight
from etsdk._quant.planes import unpack_int4
from etsdk_aoti import kernels

SHAPES = {"up": (1536, 576), "down": (576, 1536), "head": (49152, 576)}


def _timed(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats * 1e6


def _at(level: str | None, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run with the kernels at ``level`` (None: as they are)."""
    if level is None:
        return fn

    def run() -> Any:
        if kernels.current_level().name != level:
            kernels.use_level(level)
        return fn()

    return run


def _kernels(weight: torch.Tensor, x: torch.Tensor, levels: list[str | None]) -> dict[str, Callable[[], Any]]:
    int8 = quantize_weight(weight, WeightFormat.parse("int8"))
    int8_g = quantize_weight(weight, WeightFormat.parse("int8:g32"))
    int8_g64 = quantize_weight(weight, WeightFormat.parse("int8:g64"))
    int4 = quantize_weight(weight, WeightFormat.parse("int4:g32"))
    int4_min = quantize_weight(weight, WeightFormat.parse("int4:g32:min:f16:a8"))
    packed = torch._convert_weight_to_int4pack_for_cpu(unpack_int4(int4["qdata"]).to(torch.int32), 1)
    scales_zeros = torch.stack([int4["scales"].t(), torch.zeros_like(int4["scales"].t())], -1).contiguous()
    etsdk = {
        "etsdk_int8": lambda: kernels.qmm(x, int8["qdata"], int8["scales"], bits=8, group=0),
        "etsdk_int8_g32": lambda: kernels.qmm(x, int8_g["qdata"], int8_g["scales"], bits=8, group=32),
        "etsdk_int8_g64": lambda: kernels.qmm(x, int8_g64["qdata"], int8_g64["scales"], bits=8, group=64),
        "etsdk_int8_g64_a8": lambda: kernels.qmm(x, int8_g64["qdata"], int8_g64["scales"], bits=8, group=64, int8_activations=True),
        "etsdk_int4_g32": lambda: kernels.qmm(x, int4["qdata"], int4["scales"], bits=4, group=32),
        "etsdk_int4_g32_a8": lambda: kernels.qmm(x, int4["qdata"], int4["scales"], bits=4, group=32, int8_activations=True),
        "etsdk_int4_g32_min_f16_a8": lambda: kernels.qmm(
            x, int4_min["qdata"], int4_min["scales"], int4_min["mins"], bits=4, group=32, int8_activations=True
        ),
    }
    found: dict[str, Callable[[], Any]] = {"fp32": lambda: torch.mm(x, weight.t())}
    for level in levels:
        found.update({name if level is None else f"{name}_{level}": _at(level, fn) for name, fn in etsdk.items()})
    found["aten_int8"] = lambda: torch._weight_int8pack_mm(x, int8["qdata"], int8["scales"])
    found["aten_int4_g32"] = lambda: torch._weight_int4pack_mm_for_cpu(x, packed, 32, scales_zeros)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", type=int, default=64, help="M of the prefill product")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--levels", default=None, help="kernel levels to time, comma-separated, or all (default: the process's)")
    parser.add_argument("--smoke", action="store_true", help="one small shape, M in (1, 8), one round")
    args = parser.parse_args()
    from etsdk.backend import host_cpu
    from etsdk_aoti.kernels import runnable_levels

    if args.levels is None:
        levels: list[str | None] = [None]
    elif args.levels == "all":
        levels = [lv.name for lv in runnable_levels()]
    else:
        levels = [name.strip() for name in args.levels.split(",") if name.strip()]
        from etsdk import BackendUnavailableError

        for name in levels:
            try:
                kernels.use_level(name)  # refuses a level this host cannot run, before any timing
            except BackendUnavailableError as exc:
                parser.error(f"--levels: {exc}")
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = {"small": (64, 128)} if args.smoke else SHAPES
    rows_list = (1, 8) if args.smoke else (1, args.prefill)
    rounds = 1 if args.smoke else args.rounds
    generator = torch.Generator().manual_seed(0)
    cases = {}
    for name, (n, k) in shapes.items():
        weight = torch.randn(n, k, generator=generator)
        for m in rows_list:
            x = torch.randn(m, k, generator=generator)
            cases[(name, m)] = _kernels(weight, x, levels)
    times: dict[tuple[str, int, str], list[float]] = {}
    for r in range(rounds):
        for (name, m), found in cases.items():
            order = list(found) if r % 2 == 0 else list(reversed(found))
            repeats = 3 if args.smoke else max(3, int(2e5 / (shapes[name][0] * shapes[name][1] / 1e3 * m)) + 3)
            for kernel in order:
                times.setdefault((name, m, kernel), []).append(_timed(found[kernel], repeats))
    timed_levels = [level or kernels.current_level().name for level in levels]
    out: dict[str, Any] = {
        "threads": torch.get_num_threads(), "rounds": rounds, "shapes": {k: list(v) for k, v in shapes.items()},
        "cpu": host_cpu().describe(), "kernel_levels": timed_levels,
    }
    print(f"cpu: {out['cpu']}; kernel levels: {', '.join(timed_levels)}", file=sys.stderr, flush=True)
    for (name, m, kernel), values in times.items():
        out[f"{kernel}_us_{name}_m{m}"] = statistics.median(values)
    for (name, m, kernel) in times:
        if kernel != "fp32":
            out[f"{kernel}_over_fp32_{name}_m{m}"] = out[f"fp32_us_{name}_m{m}"] / out[f"{kernel}_us_{name}_m{m}"]
    for (name, m) in cases:
        line = ", ".join(f"{kernel} {out[f'{kernel}_us_{name}_m{m}']:.0f}" for kernel in cases[(name, m)])
        print(f"{name} {list(shapes[name])} M={m} (us): {line}", flush=True, file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
