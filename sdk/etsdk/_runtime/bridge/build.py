"""Build (once) and load the native bridge against the installed executorch wheel.

The extension is compiled on first use into a cache keyed by everything that
affects the binary (its source, the executorch version and library, the Python
ABI, the compiler), so upgrading executorch rebuilds it and an unchanged setup
never does. ``etsdk doctor`` builds it ahead of time; the README's set-up runs
that. Facts this relies on (checked with executorch 1.5.1): the wheel ships its
headers and ``libexecutorch.so``, which exports ``register_backend`` and is the
same library the pybindings link, so a backend registered here is seen by the
runtime's ``load_program``.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from etsdk.errors import BridgeBuildError

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("_bridge.cpp")
_MODULE_NAME = "_etsdk_bridge"
_lock = threading.Lock()
_module: ModuleType | None = None


def cache_dir() -> Path:
    """etsdk's per-user cache directory (``$ETSDK_CACHE_DIR``, else ``~/.cache/etsdk``): the bridge, compiled libraries."""
    root = os.environ.get("ETSDK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "etsdk"
    )
    return Path(root)


def _executorch_root() -> Path:
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise BridgeBuildError(
            "the executorch package is not installed; install it with `pip install executorch==1.5.1`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _compiler() -> list[str]:
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else []
    candidates += ["c++", "g++", "clang++"]
    for candidate in candidates:
        argv = shlex.split(candidate)
        if argv and shutil.which(argv[0]):
            return argv
    raise BridgeBuildError(
        "no C++ compiler found to build the etsdk native bridge (looked for "
        f"{', '.join(candidates)}). Install one, e.g. `apt-get install g++` on Debian/Ubuntu "
        "or `xcode-select --install` on macOS, or point CXX at a C++17 compiler"
    )


def _command(output: Path) -> list[str]:
    et = _executorch_root()
    include = et / "include"
    libdir = et / "lib"
    if not (include / "executorch" / "runtime" / "backend" / "interface.h").is_file():
        raise BridgeBuildError(f"the executorch wheel at {et} ships no runtime headers under {include}")
    if not (libdir / "libexecutorch.so").is_file():
        raise BridgeBuildError(f"the executorch wheel at {et} ships no lib/libexecutorch.so")
    return [
        *_compiler(),
        "-O2",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
        "-DC10_USING_CUSTOM_GENERATED_MACROS",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
        f"-I{include}",
        f"-I{include / 'executorch' / 'runtime' / 'core' / 'portable_type' / 'c10'}",
        f"-I{sysconfig.get_paths()['include']}",
        str(_SOURCE),
        f"-L{libdir}",
        "-lexecutorch",
        f"-Wl,-rpath,{libdir}",
        "-o",
        str(output),
    ]


def _cache_key(command: list[str]) -> str:
    from importlib import metadata

    lib = _executorch_root() / "lib" / "libexecutorch.so"
    stat = lib.stat()
    h = hashlib.sha256()
    h.update(_SOURCE.read_bytes())
    h.update(" ".join(command).encode())
    h.update(metadata.version("executorch").encode())
    h.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    h.update(sysconfig.get_config_var("EXT_SUFFIX").encode())
    return h.hexdigest()[:16]


def _compile(command: list[str], target: Path, what: str, *, verbose: bool = False) -> None:
    """Run ``command`` (whose last argument is the output path) into ``target`` atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build into a temporary file and rename: concurrent builders never see a
    # half-written library, and the last rename wins with identical content.
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=target.suffix)
    os.close(fd)
    command = [*command[:-1], tmp]
    print(f"etsdk: building {what} ({target.parent.name}) ...", file=sys.stderr, flush=True)
    if verbose:
        print(" ".join(shlex.quote(c) for c in command), file=sys.stderr)
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as exc:
        os.unlink(tmp)
        raise BridgeBuildError(f"could not run the C++ compiler {command[0]!r}: {exc}") from exc
    if result.returncode != 0:
        os.unlink(tmp)
        raise BridgeBuildError(
            f"compiling {what} failed (exit {result.returncode}):\n" + "\n".join(result.stderr.strip().splitlines()[-30:])
        )
    os.replace(tmp, target)


def build(*, force: bool = False, verbose: bool = False) -> Path:
    """Compile the bridge if the cache has no matching build; return the library path."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    placeholder = Path("OUTPUT")
    key = _cache_key(_command(placeholder))
    target = cache_dir() / "bridge" / key / f"{_MODULE_NAME}{suffix}"
    if target.is_file() and not force:
        return target
    _compile(_command(placeholder), target, "the native bridge", verbose=verbose)
    return target


def build_native_library(
    name: str, sources: list[Path], flags: list[str], *, headers: Sequence[Path] = (), verbose: bool = False
) -> Path:
    """Compile ``sources`` into the shared library ``lib<name>.so`` once, cached by content; return its path.

    For a plugin's own native code (etsdk-aoti's quantized kernels): the same compiler lookup as the native
    bridge (``$CXX``, else ``c++`` / ``g++`` / ``clang++``, with an install hint when there is none), ``-O3
    -shared -fPIC -std=c++17`` plus ``flags``, into ``<cache>/native/<name>/<key>/``, where the key covers
    the sources, the ``headers`` they include (not compiled, only hashed: a changed header rebuilds), the flags
    and the compiler. Raises :class:`etsdk.BridgeBuildError` with the compiler's last lines when it fails.
    """
    if not name.isidentifier():
        raise ValueError(f"a native library name is a Python identifier, found {name!r}")
    command = [*_compiler(), "-O3", "-std=c++17", "-shared", "-fPIC", *map(str, sources), *flags, "-o", "OUTPUT"]
    h = hashlib.sha256()
    for source in [*sources, *headers]:
        h.update(Path(source).read_bytes())
    h.update(" ".join(command).encode())
    target = cache_dir() / "native" / name / h.hexdigest()[:16] / f"lib{name}.so"
    if not target.is_file():
        _compile(command, target, f"native library {name}", verbose=verbose)
    return target


_PYBINDINGS = "executorch.extension.pybindings.portable_lib"
_EXIR = "executorch.exir"
_WARNINGS = "executorch.exir._warnings"


def import_pybindings() -> None:
    """Import ExecuTorch's pybindings without running ``executorch.exir``'s package ``__init__``.

    ``portable_lib`` needs only ``executorch.exir._warnings`` (a warning class), but importing it runs
    ``executorch/exir/__init__.py``, which imports the whole export stack (torch._dynamo, Inductor's pattern
    matcher, the edge dialect's operator YAML): 3.5 s of a 6 s program load on 2 cores, 15 s under load
    (benchmarks/README.md, first_token). Where ``executorch.exir`` is not imported yet, ``_warnings`` is loaded
    under a bare package module standing in for ``executorch.exir`` while the pybindings import, with the import
    lock held (no other thread imports meanwhile); afterwards the stand-in and ``_warnings`` are removed from
    ``sys.modules`` again, so a later ``import executorch.exir`` (an export in the same process) runs the real
    package as it always did. Where ExecuTorch's layout is not what this expects, it imports normally.
    """
    if _PYBINDINGS in sys.modules:
        return
    try:
        import _imp
        import types

        if _EXIR in sys.modules:
            raise LookupError
        spec = importlib.util.find_spec(_EXIR)  # imports the namespace package `executorch`, not exir itself
        locations = list(spec.submodule_search_locations or ()) if spec is not None else []
        if not any(os.path.isfile(os.path.join(location, "_warnings.py")) for location in locations):
            raise LookupError
    except (ImportError, LookupError, ValueError):
        importlib.import_module(_PYBINDINGS)
        return
    stand_in = types.ModuleType(_EXIR, "stands in for executorch.exir while ExecuTorch's pybindings import")
    stand_in.__path__ = locations
    _imp.acquire_lock()  # re-entrant: this thread's own imports below go on; other threads' wait
    try:
        installed = _EXIR not in sys.modules  # False: imported by another thread meanwhile
        if installed:
            sys.modules[_EXIR] = stand_in
        try:
            importlib.import_module(_PYBINDINGS)
        finally:
            if installed:
                if sys.modules.get(_EXIR) is stand_in:
                    del sys.modules[_EXIR]
                if getattr(sys.modules.get(_WARNINGS), "__name__", None) == _WARNINGS and _EXIR not in sys.modules:
                    del sys.modules[_WARNINGS]
                namespace = sys.modules.get("executorch")
                if getattr(namespace, "exir", None) is stand_in:
                    delattr(namespace, "exir")
    finally:
        _imp.release_lock()


def load_extension() -> ModuleType:
    """Build if needed and import the native bridge (once per process)."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            path = build()
            # The pybindings must be loaded first: they bring the kernels and the
            # backends the wheel registers, in the same libexecutorch.so.
            import_pybindings()

            loader = importlib.machinery.ExtensionFileLoader(_MODULE_NAME, str(path))
            spec = importlib.util.spec_from_file_location(_MODULE_NAME, path, loader=loader)
            if spec is None:
                raise BridgeBuildError(f"cannot load the native bridge from {path}")
            module = importlib.util.module_from_spec(spec)
            try:
                loader.exec_module(module)
            except ImportError as exc:
                raise BridgeBuildError(f"the native bridge at {path} failed to load: {exc}") from exc
            _module = module
        return _module
