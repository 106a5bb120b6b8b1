"""Helpers for testing etsdk and etsdk plugins (ours and third parties').

:class:`PluginSite` writes real, importable plugin distributions (a module and
a ``.dist-info`` with real entry points) into a directory, and runs etsdk in a
subprocess with that directory on ``sys.path``. Discovery then goes through
``importlib.metadata`` exactly as for a pip-installed plugin.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PluginSite"]


@dataclass
class PluginSite:
    """A directory of real plugin distributions, and etsdk run in a subprocess that discovers them.

    Discovery goes through ``importlib.metadata`` entry points exactly as for a pip-installed plugin, so a test
    sees what a user would (ordering, failures, conflicts), without installing anything into the environment.
    """

    #: The directory the distributions are written to (created if missing); put on ``PYTHONPATH`` by :meth:`env`.
    root: Path

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def add(
        self,
        distribution: str,
        source: str,
        *,
        plugin: str | None = None,
        module: str | None = None,
        version: str = "1.0",
    ) -> str:
        """Write a distribution whose entry point ``plugin`` names a module with ``source``."""
        module = module or distribution.replace("-", "_") + "_plugin"
        plugin = plugin or distribution
        (self.root / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.root / f"{distribution.replace('-', '_')}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[etsdk.plugins]\n{plugin} = {module}\n")
        (info / "RECORD").write_text("")
        return module

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a subprocess: this one without ``ETSDK_*`` settings (``ETSDK_CACHE_DIR`` kept, so
        the bridge is not rebuilt), :attr:`root` first on ``PYTHONPATH``, then ``extra``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETSDK_") or k == "ETSDK_CACHE_DIR"}
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.update(extra or {})
        return env

    def run_python(self, code: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``code`` (dedented) in a fresh interpreter with :meth:`env`; output captured as text."""
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=self.env(env)
        )

    def run_etsdk(self, args: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``etsdk ARGS`` (``python -m etsdk``) in a fresh interpreter with :meth:`env`; output captured."""
        return subprocess.run(
            [sys.executable, "-m", "etsdk", *args], capture_output=True, text=True, env=self.env(env)
        )
