"""etsdk-aoti's kernels at every instruction-set level, including those this host cannot run.

* Every level's sources compile (``-fsyntax-only``, seconds: in the fast lane), with the flags levels.py builds
  them with, and the entry points with the compiler's baseline; the aarch64 levels with Debian's cross compiler
  (``g++-aarch64-linux-gnu``, which ``python3 dev.py setup`` installs where it can).
* The aarch64 levels run: kernels/check.cpp is cross-compiled with each level's sources and run under
  ``qemu-aarch64`` (NEON and dotprod emulated: correct results, meaningless timings) on cases whose expected
  outputs come from the same torch references the Python kernel tests use. The portable level runs natively too,
  which checks the check program against the x86 Python tests.

The x86 levels this host runs are tested through the entry points by the other kernel tests (the ``kernel_level``
fixture of conftest.py); levels it cannot run are skipped there with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import etsdk
import pytest
import torch
from etsdk import WeightFormat
from etsdk.backend import (
    ATTENTION,
    dequantize,
    dequantize_activations,
    quantize_activations,
    quantize_rows,
    weight_planes,
)
from etsdk_aoti import kernels
from etsdk_aoti.kernels.levels import LEVELS, KernelLevel

KERNELS = Path(kernels.__file__).parent
LEVEL_SOURCES = ["qmm.cpp", "attention.cpp", "gemv.cpp", "level.cpp"]
CROSS = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"
# fail fast on the host compiler: the fast lane runs these on every change
X86 = [lv for lv in LEVELS if lv.machine == "x86_64"]
ARM = [lv for lv in LEVELS if lv.machine == "aarch64"]


def _compiler_for(level: KernelLevel) -> str:
    if level.machine == "aarch64":
        found = shutil.which(CROSS)
        if found is None:
            pytest.skip(f"{CROSS} is not installed (apt-get install g++-aarch64-linux-gnu; python3 dev.py setup does it as root)")
        return found
    found = shutil.which("g++") or shutil.which("c++")
    if found is None:
        pytest.skip("no C++ compiler")
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the x86 levels are compile-checked on x86 hosts (this one is {platform.machine()})")
    return found


@pytest.mark.parametrize("level", X86 + ARM, ids=lambda lv: f"{lv.machine}-{lv.name}")
def test_every_level_compiles(level: KernelLevel) -> None:
    compiler = _compiler_for(level)
    for source in LEVEL_SOURCES:
        command = [compiler, "-std=c++17", "-fsyntax-only", "-fopenmp", "-Wall", "-Werror=return-type", *level.flags, str(KERNELS / source)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"{source} at level {level.name} ({' '.join(level.flags)}):\n{result.stderr[-3000:]}"


def test_the_entry_points_compile_for_the_baseline() -> None:
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    include = Path(torch.__file__).parent / "include"
    result = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", f"-I{include}", str(KERNELS / "entry.cpp")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


# ------------------------------------------------------------------ cases with expected outputs (torch references)


def _write(directory: Path, name: str, tensor: torch.Tensor) -> None:
    (directory / name).write_bytes(tensor.contiguous().numpy().tobytes())


def _as_u16(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.int16)


def write_cases(directory: Path) -> int:
    """The cases check.cpp runs: quantized products (float and int8 activations), float GEMV, attention; their
    expected outputs from the formats' reference math. Returns how many."""
    lines: list[str] = []
    g = torch.Generator().manual_seed(3)
    for fmt_name, n, k, m in [("int8", 37, 83, 1), ("int8:g64", 40, 128, 3), ("int8:g32", 21, 64, 7), ("int4:g32", 37, 256, 1),
                              ("int4:g64:min", 19, 128, 5), ("int4:g128", 33, 256, 2)]:
        fmt = WeightFormat.parse(fmt_name)
        weight = torch.randn(n, k, generator=g)
        stored = etsdk.quantize_weight(weight, fmt)
        x, bias = torch.randn(m, k, generator=g), torch.randn(n, generator=g)
        want = x @ dequantize(weight_planes(fmt, stored, (n, k))).t() + bias
        name = f"qmm_{fmt_name.replace(':', '_')}_{m}"
        for part, tensor in [("x", x), ("q", stored["qdata"]), ("scales", stored["scales"]), ("bias", bias), ("want", want)]:
            _write(directory, f"{name}.{part}", tensor)
        if "mins" in stored:
            _write(directory, f"{name}.mins", stored["mins"])
        lines.append(f"qmm {name} {fmt.bits} {fmt.group_size or 0} {n} {k} {m} {int('mins' in stored)} 1")
    for fmt_name, ns, k, m in [("int4:g32:a8", [37], 256, 1), ("int4:g64:min:f16:a8", [16, 24], 128, 1),
                               ("int4:g32:min:f16:a8", [9, 33, 17], 160, 5), ("int4:g128:a8", [20], 256, 3),
                               ("int8:a8", [37], 160, 1), ("int8:a8", [37, 5], 160, 9), ("int8:g32:a8", [21, 16], 96, 2), ("int8:g64:a8", [40, 9], 128, 1),
                               ("int8:g128:a8", [12], 256, 6)]:
        fmt = WeightFormat.parse(fmt_name)
        x = 3 * torch.randn(m, k, generator=g)
        x[0, :32] = 0.0  # a block of zeros: scale 0
        name = f"a8_{fmt_name.replace(':', '_')}_{m}"
        wants = []
        with_mins = fmt.with_min
        for p, n in enumerate(ns):
            stored = etsdk.quantize_weight(torch.randn(n, k, generator=g), fmt)
            bias = torch.randn(n, generator=g)
            rounded = dequantize_activations(*quantize_activations(x))  # the :a8 formats' input, per block of 32
            wants.append(rounded @ dequantize(weight_planes(fmt, stored, (n, k))).t() + bias)
            _write(directory, f"{name}.{p}.q", stored["qdata"])
            halves = stored["scales"].dtype == torch.float16
            _write(directory, f"{name}.{p}.scales", _as_u16(stored["scales"]) if halves else stored["scales"])
            if with_mins:
                _write(directory, f"{name}.{p}.mins", _as_u16(stored["mins"]) if halves else stored["mins"])
            _write(directory, f"{name}.{p}.bias", bias)
        _write(directory, f"{name}.x", x)
        _write(directory, f"{name}.want", torch.cat(wants, dim=1))
        lines.append(f"a8 {name} {fmt.bits} {len(ns)} {fmt.group_size or 0} {k} {m} {int(halves)} {int(with_mins)} 1 {' '.join(map(str, ns))}")
    for dtype, code in [(torch.float32, 0), (torch.bfloat16, 1), (torch.float16, 2)]:
        for n, k, m in [(37, 83, 1), (100, 576, 3), (16, 16, 6)]:
            w, x, bias = torch.randn(n, k, generator=g).to(dtype), torch.randn(m, k, generator=g), torch.randn(n, generator=g)
            name = f"linear_{code}_{n}_{k}_{m}"
            _write(directory, f"{name}.x", x)
            _write(directory, f"{name}.w", w if dtype == torch.float32 else _as_u16(w))
            _write(directory, f"{name}.bias", bias)
            _write(directory, f"{name}.want", torch.nn.functional.linear(x, w.float(), bias))
            lines.append(f"linear {name} {code} {n} {k} {m} 1")
    for int8 in (False, True):
        # (batches, hq, h, rows, s, e, each batch's last visible column per row); the batch of three: sessions of
        # different lengths in one call (a batched decode step), each reading its own rows (two chunks for the longest)
        for b, hq, h, rows, s, e, visible in [
            (1, 9, 3, 1, 600, 64, [[530]]), (1, 4, 4, 5, 64, 128, [[5, 6, 7, 7, 7]]), (1, 2, 1, 1, 13, 48, [[12]]),
            (3, 9, 3, 1, 300, 64, [[10], [290], [4]]),
        ]:
            q, k, v = (torch.randn(b, hh, rr, e, generator=g) for hh, rr in [(hq, rows), (h, s), (h, s)])
            mask = torch.zeros(b, 1, rows, s, dtype=torch.bool)
            for batch, lasts in enumerate(visible):
                for i, last in enumerate(lasts):
                    mask[batch, 0, i, : last + 1] = True
            mask[:, 0, 0, 3] = False  # a gap
            if rows > 1:  # a padded chunk's rows: zeros (either sign) under equal mask rows, copied, not computed
                q[:, :, 2:] = 0.0
                q[:, 1, 4] = -0.0
            name = f"attention_{int(int8)}_{b}_{hq}_{e}_{rows}"
            if int8:
                kq, ks = quantize_rows(k)
                vq, vs = quantize_rows(v)
                want = ATTENTION(q, kq, vq, mask, 0.2, ks, vs)
                for part, tensor in [("k", kq), ("v", vq), ("kscale", ks), ("vscale", vs)]:
                    _write(directory, f"{name}.{part}", tensor)
            else:
                want = ATTENTION(q, k, v, mask, 0.2)
                _write(directory, f"{name}.k", k)
                _write(directory, f"{name}.v", v)
            _write(directory, f"{name}.q", q)
            _write(directory, f"{name}.mask", mask.to(torch.uint8))
            _write(directory, f"{name}.want", want)
            lines.append(f"attention {name} {int(int8)} {b} {hq} {rows} {e} {h} {s} {e} {b} 0.2")
    (directory / "cases.txt").write_text("\n".join(lines) + "\n")
    return len(lines)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    directory = tmp_path_factory.mktemp("kernel-cases")
    return directory, write_cases(directory)


def _build_check(compiler: str, level: KernelLevel, out: Path) -> Path:
    binary = out / f"check-{level.machine}-{level.name}"
    sources = [str(KERNELS / s) for s in ["check.cpp", *LEVEL_SOURCES]]
    command = [compiler, "-std=c++17", "-O2", "-fopenmp", *level.flags, f"-I{KERNELS}", *sources, "-o", str(binary)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"building the check at {level.name}:\n{result.stderr[-3000:]}"
    return binary


def _assert_all_match(result: subprocess.CompletedProcess[str], level: KernelLevel, count: int) -> None:
    lines = result.stdout.splitlines()
    assert lines and lines[0] == f"level {level.name}", result.stdout[:500] + result.stderr[-2000:]
    failed = [line for line in lines if line.startswith("FAIL")]
    assert result.returncode == 0 and not failed, "\n".join(failed) or result.stderr[-2000:]
    assert lines[-1] == f"cases: {count} match, 0 do not", lines[-1]


@pytest.mark.slow
def test_the_portable_level_passes_the_check_natively(cases: tuple[Path, int], tmp_path: Path) -> None:
    import platform

    level = next((lv for lv in LEVELS if lv.name == "portable" and lv.machine == {"AMD64": "x86_64", "arm64": "aarch64"}.get(platform.machine(), platform.machine())), None)
    if level is None:
        pytest.skip(f"no portable level is listed for {platform.machine()}")
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler is not None
    binary = _build_check(compiler, level, tmp_path)
    directory, count = cases
    result = subprocess.run([str(binary), str(directory)], capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "2"})
    _assert_all_match(result, level, count)


@pytest.mark.slow
@pytest.mark.parametrize("level", ARM, ids=lambda lv: lv.name)
def test_the_aarch64_levels_pass_the_check_under_qemu(level: KernelLevel, cases: tuple[Path, int], tmp_path: Path) -> None:
    compiler = _compiler_for(level)
    if shutil.which(QEMU) is None:
        pytest.skip(f"{QEMU} is not installed (apt-get install qemu-user; python3 dev.py setup does it as root)")
    binary = _build_check(compiler, level, tmp_path)
    directory, count = cases
    result = subprocess.run(
        [QEMU, "-cpu", "max", "-L", SYSROOT, str(binary), str(directory)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "2"},
    )
    _assert_all_match(result, level, count)
