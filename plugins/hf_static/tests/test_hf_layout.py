"""etsdk-hf-static's layers: exporting/, runtime/ and apps/ import only downwards, and the old flat paths still import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "etsdk_hf_static"
#: what each layer may import from the plugin (besides its own folder and the shared top-level modules)
ALLOWED = {"exporting": set(), "runtime": set(), "apps": {"runtime", "exporting"}}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_layers_import_only_downwards() -> None:
    wrong = []
    for layer, allowed in ALLOWED.items():
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            for module in _imports(path):
                parts = module.split(".")
                if parts[0] != "etsdk_hf_static" or len(parts) < 2 or parts[1] not in ALLOWED or parts[1] == layer:
                    continue
                if parts[1] not in allowed:
                    wrong.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not wrong, wrong
    assert _imports(PACKAGE / "runtime" / "conversation.py").isdisjoint({"etsdk_hf_static.runtime.runner"})  # no circle


def test_the_flat_layouts_paths_still_import_with_a_warning() -> None:
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    import etsdk_hf_static.chat\nexcept DeprecationWarning as w:\n    print('WARNED', w)\n"
        "warnings.simplefilter('ignore')\n"
        "import etsdk_hf_static.tiny, etsdk_hf_static.exporting.tiny as new\n"
        "print('SAME', etsdk_hf_static.tiny is new)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "WARNED etsdk_hf_static.chat moved; import its public names from etsdk_hf_static.apps.chat" in out.stdout
    assert "SAME True" in out.stdout
