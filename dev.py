#!/usr/bin/env python3
"""Set up everything and run the main job, the linters or the test suite, on a machine with only Python.

    python3 dev.py demo          # set up, then export the embedded tiny LLM through etsdk-aoti and generate with it
    python3 dev.py test          # set up, lint (ruff + mypy), then run the whole test suite (what CI runs)
    python3 dev.py test --fast   # while working: ruff, then the unit and contract layers (under 3 minutes)
    python3 dev.py lint          # set up, then ruff and mypy only
    python3 dev.py apidoc        # set up, then regenerate the API reference (docs/api.md, docs/backend-api.md)
    python3 dev.py setup         # set up only

Set-up creates ``.venv`` beside this file, installs the pinned torch and
executorch, the core and every plugin under ``plugins/`` (editable), and builds
the native bridge. It is skipped when nothing it depends on has changed.

The tests are in layers: ``tests/unit`` (no export, no compile), ``tests/integration`` (export and run through
the core and the reference backend), ``tests/cross_plugin`` (imports or runs a plugin package),
``tests/hostile`` (hostile-input and leak suites), ``tests/docs`` (runs the docs and the tutorial),
``tests/benchmarks``, and each plugin's own ``plugins/<name>/tests``. ``test --fast`` runs :data:`FAST` (the unit
layer, the contract-level tests and the plugins' unit tests) without the tests marked ``slow``.

``test`` lints first and runs pytest whatever the lint said; it exits non-zero when either fails, and a summary
line is the last line it prints. The whole suite runs as several pytest processes (:data:`LANES`): the core's
tests in three, each plugin's in its own, two at a time where there are two cores (``ETSDK_TEST_JOBS`` sets how
many); each process's output is printed whole when it ends, and the last line adds them up. Separate processes
also keep each one's backend registrations apart: the ExecuTorch runtime's backend registry has 16 slots and no
unregister, and the whole suite registers more distinct test backends than that. Extra arguments after ``test``
go to pytest (after the fast lane's paths with ``--fast``): ``python3 dev.py test --fast -x -k blob``; with a path
among them (``python3 dev.py test tests/hostile``) one pytest process runs just that.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("ETSDK_VENV", ROOT / ".venv"))
PINNED = ["torch==2.13.0", "executorch==1.5.1"]
TOOLS = ["setuptools>=68", "wheel", "pytest>=8", "hypothesis>=6", "pluggy>=1.5", "packaging>=23", "transformers==5.23.0", "onnx==1.23.2", "onnxscript==0.7.2", "onnxruntime==1.32.0", "gguf==0.19.0", "blake3==1.0.11", "openai==3.63.0", "ruff", "mypy"]
#: each plugin's extras dev.py installs (etsdk-hf-static[serve]: etsdk serve's Starlette and uvicorn)
EXTRAS = {"hf_static": "[serve]"}


# What `lint` checks (it ran inside the test suite before, as tests/test_lint.py).
RUFF_TARGETS = ["sdk", "tests", "plugins", "benchmarks", "dev.py"]
MYPY_TARGETS = ["sdk/etsdk", "plugins/aoti/etsdk_aoti", "plugins/hf_static/etsdk_hf_static", "plugins/tensorrt/etsdk_tensorrt"]
MYPY_FLAGS = ["--ignore-missing-imports", "--follow-imports=silent"]

# The fast lane (test --fast): the unit layer; the contract-level tests, which check contract records and the
# binding order against small reference-backend programs (seconds each); the plugins' own unit tests (no export,
# no compile). Tests marked slow are left out too. tests/integration/test_export_errors.py (the export-time
# contract checks, ~30 s) is left to the full run: with it the lane took 3 min 4 s on two busy cores.
FAST = [
    "tests/unit",
    "tests/integration/test_contracts_programs.py",
    "tests/integration/test_order.py",
    "plugins/aoti/tests/test_threads.py",
    "plugins/aoti/tests/test_kernel_check.py",  # every kernel level compiles (syntax only, seconds); qemu runs are slow
    "plugins/tensorrt/tests/test_trt_units.py",
    "plugins/hf_static/tests/test_hf_serve_protocol.py",  # etsdk serve's request checks, no server
    "plugins/hf_static/tests/test_hf_layout.py",  # the plugin's layers import only downwards
]


# The whole suite as pytest processes: (name, pytest arguments), longest first; two at a time, each lane starts when
# one ends, so no lane may be much longer than the rest (the suite's wall time is at least its longest lane). The
# core's tests are in three: together they register more distinct backends than the runtime's 16 slots, and the
# files that register the most throwaway test backends (the bridge's failure cases, the kit's broken backends) get a
# process of their own; the benchmarks' smoke runs (subprocesses, each exporting its own programs) are a fourth.
# etsdk-hf-static's tests are in two: the files that share the session's exported programs (conftest.py: the Llama
# through AOTI, the chat program), and the files that export programs of their own (about as long).
_OWN = ["tests/integration/test_bridge.py", "tests/integration/test_conformance.py", "tests/integration/test_edge_passes.py"]
_HF = "plugins/hf_static/tests/test_hf_"
_HF_SHARED = [
    f"{_HF}{name}.py" for name in (
        "generation", "sessions", "sampling", "corpus", "detokenize", "generate_cli", "windows", "chat", "chat_context",
        "cli", "serve", "serve_protocol", "layout", "quantized",
    )
]
LANES = [
    ("etsdk-hf-static", ["plugins/hf_static/tests", *(f"--ignore={path}" for path in _HF_SHARED)]),
    ("core", ["tests/unit", "tests/cross_plugin", "tests/hostile", "tests/docs"]),
    ("etsdk-hf-static-shared", _HF_SHARED),
    ("benchmarks-smoke", ["tests/benchmarks"]),
    ("core-integration", ["tests/integration", *(f"--ignore={path}" for path in _OWN)]),
    ("etsdk-aoti", ["plugins/aoti/tests", "-rs"]),  # -rs: which kernel levels this host skipped, and why
    ("etsdk-tensorrt", ["plugins/tensorrt/tests"]),
    ("core-registrations", _OWN),
]


def _bin(name: str) -> Path:
    return VENV / ("Scripts" if os.name == "nt" else "bin") / name


def _run(*cmd: object, **kwargs: object) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kwargs)  # type: ignore[arg-type]


def _plugins() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))


def _fingerprint() -> str:
    h = hashlib.sha256()
    h.update(" ".join(PINNED + TOOLS).encode())
    for path in [ROOT / "pyproject.toml", *(p / "pyproject.toml" for p in _plugins())]:
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def setup() -> None:
    stamp = VENV / ".etsdk-setup"
    fingerprint = _fingerprint()
    if stamp.is_file() and stamp.read_text() == fingerprint and _bin("python").exists():
        print(f"etsdk dev: {VENV} is up to date", flush=True)
    else:
        if not _bin("python").exists():
            print(f"etsdk dev: creating {VENV}", flush=True)
            venv.create(VENV, with_pip=True)
        pip = [_bin("python"), "-m", "pip", "--disable-pip-version-check", "install", "--progress-bar", "off"]
        _run(*pip, *PINNED, *TOOLS)
        editable = [arg for p in [ROOT, *_plugins()] for arg in ("-e", f"{p}{EXTRAS.get(p.name, '')}")]
        _run(*pip, "--no-build-isolation", *editable)
        stamp.write_text(fingerprint)
    _cross_tools()
    # versions, this host's CPU, the native bridge and each backend's native code (etsdk-aoti's kernel level):
    # what a CI log needs to explain a failure; a backend that cannot build here is reported, not fatal
    print("+ etsdk doctor", flush=True)
    if subprocess.run([str(_bin("etsdk")), "doctor"]).returncode != 0:
        print("etsdk dev: etsdk doctor reported an error (above); going on", flush=True)


#: Debian packages the aarch64 kernel tests use (plugins/aoti/tests/test_kernel_check.py): a cross compiler and
#: qemu's user-mode emulator, so the Arm kernels are built and run on x86 hosts too.
CROSS_TOOLS = {"aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu", "qemu-aarch64": "qemu-user"}


def _cross_tools() -> None:
    """Install :data:`CROSS_TOOLS` with apt-get where they are missing and this runs as root on Debian / Ubuntu
    (CI does); elsewhere say what the tests will skip."""
    import platform
    import shutil

    missing = [package for tool, package in CROSS_TOOLS.items() if shutil.which(tool) is None]
    if not missing or platform.machine() not in ("x86_64", "AMD64"):
        return
    if os.name != "posix" or os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(f"etsdk dev: {' '.join(missing)} not installed (apt-get install {' '.join(missing)} as root): the aarch64 kernel tests will be skipped", flush=True)
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        _run("apt-get", "update", "-qq", env=env)
        _run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, env=env)
    except subprocess.CalledProcessError as exc:
        print(f"etsdk dev: installing {' '.join(missing)} failed ({exc}): the aarch64 kernel tests will be skipped", flush=True)


def lint(*, mypy: bool = True) -> int:
    """ruff over the sources, tests, plugins, benchmarks and this file; mypy over the core and the plugins."""
    checks = [["ruff", "check", *RUFF_TARGETS]]
    if mypy:
        checks.append(["mypy", *MYPY_TARGETS, *MYPY_FLAGS])
    failed = []
    for check in checks:
        print("+", " ".join(check), flush=True)
        if subprocess.run([str(_bin("python")), "-m", *check], cwd=ROOT).returncode != 0:
            failed.append(check[0])
    scope = "" if mypy else " (ruff only)"
    print(f"etsdk dev: lint failed: {', '.join(failed)}{scope}" if failed else f"etsdk dev: lint passed{scope}", flush=True)
    return 1 if failed else 0


def test(args: list[str]) -> int:
    fast = "--fast" in args
    args = [arg for arg in args if arg != "--fast"]
    linted = lint(mypy=not fast)
    if linted:
        print("etsdk dev: running the tests anyway; the exit status will be non-zero", flush=True)
    if fast or any(not arg.startswith("-") and (ROOT / arg.split("::")[0]).exists() for arg in args):
        lane = [*FAST, "-m", "not slow"] if fast else []  # a -m of the caller's comes later and wins
        tested = subprocess.run([str(_bin("python")), "-m", "pytest", *lane, *args], cwd=ROOT).returncode
    else:
        tested = _lanes(args)
    return tested or linted


_SUMMARY = re.compile(r"^=+ (.+) in ([0-9.]+)s")
_COUNT = re.compile(r"(\d+) (\w+)")


def _lanes(args: list[str]) -> int:
    """Run :data:`LANES` as pytest processes, ``ETSDK_TEST_JOBS`` (default: up to 2) at a time; sum up."""
    jobs = max(1, int(os.environ.get("ETSDK_TEST_JOBS") or min(2, os.cpu_count() or 1)))
    logs = Path(tempfile.mkdtemp(prefix="etsdk-test-lanes-"))
    waiting = list(LANES)
    running: list[tuple[str, subprocess.Popen[bytes], Path, float]] = []
    totals: dict[str, int] = {}
    failed: list[str] = []
    started = time.perf_counter()
    print(f"etsdk dev: {len(LANES)} pytest processes, {jobs} at a time (logs in {logs})", flush=True)
    while waiting or running:
        while waiting and len(running) < jobs:
            name, paths = waiting.pop(0)
            log = logs / f"{name}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [str(_bin("python")), "-m", "pytest", *paths, *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
                )
            running.append((name, process, log, time.perf_counter()))
            print(f"etsdk dev: started {name} ({' '.join(paths)})", flush=True)
        time.sleep(0.5)
        for entry in list(running):
            name, process, log, began = entry
            code = process.poll()
            if code is None:
                continue
            running.remove(entry)
            text = log.read_text(errors="replace")
            print(f"\n{'=' * 30} {name}: pytest {' '.join(LANES[[n for n, _ in LANES].index(name)][1])} {'=' * 30}")
            print(text.rstrip(), flush=True)
            summary = next((m for line in reversed(text.splitlines()) if (m := _SUMMARY.match(line.strip()))), None)
            if summary:
                for count, word in _COUNT.findall(summary.group(1)):
                    totals[word] = totals.get(word, 0) + int(count)
            if code not in (0, 5):  # 5: nothing collected (a -k that selects nothing in this lane)
                failed.append(f"{name} (exit {code})")
            print(f"etsdk dev: {name} ended with exit {code} after {time.perf_counter() - began:.0f}s", flush=True)
    counts = ", ".join(f"{n} {w}" for w, n in sorted(totals.items(), key=lambda kv: (kv[0] not in ("failed", "errors", "error"), kv[0])))
    verdict = f"; failed: {', '.join(failed)}" if failed else ""
    print(f"etsdk dev: {counts or 'no tests ran'} in {time.perf_counter() - started:.0f}s over {len(LANES)} pytest processes{verdict}", flush=True)
    return 1 if failed else 0


def apidoc() -> int:
    """Regenerate docs/api.md and docs/backend-api.md from the docstrings; non-zero naming any undocumented name."""
    return subprocess.run([str(_bin("python")), str(ROOT / "tools" / "apidoc.py")], cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "demo"
    if command not in {"setup", "demo", "test", "lint", "apidoc"}:
        print(__doc__)
        return 2
    setup()
    if command == "demo":
        return subprocess.run([str(_bin("python")), "-m", "etsdk_hf_static.apps.demo", *argv[1:]]).returncode
    if command == "test":
        return test(argv[1:])
    if command == "lint":
        return lint()
    if command == "apidoc":
        return apidoc()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
