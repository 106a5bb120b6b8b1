"""Every code block of the documentation is executed here or marked as not executed (``tests/docs/_blocks.py``
states the convention), the executed ones run, and ``etsdk demo`` works.

The LLM main job (``python3 dev.py demo``): tests/cross_plugin/test_llm_main_job.py. The tutorial's blocks:
test_tutorial.py; the sessions guide's: test_sessions_docs.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from etsdk.testing import PluginSite

from tests.docs._blocks import Block, blocks, commands, markdown_files, runnable
from tests.docs.test_sessions_docs import SESSIONS
from tests.docs.test_tutorial import LANGUAGES as TUTORIAL_LANGUAGES
from tests.docs.test_tutorial import TUTORIAL

ROOT = Path(__file__).resolve().parents[2]

#: Docs whose python blocks each run alone, in a fresh interpreter in a temporary directory.
ALONE = ["README.md", "docs/index.md", "plugins/aoti/README.md", "docs/hf_static.md"]

#: Guides whose python blocks build on each other: one script, in order, in a temporary directory; then their
#: bash / console commands, in order, in that directory. Those over a minute on two cores are slow.
GUIDES = [
    pytest.param("docs/integrity.md", id="integrity"),
    pytest.param("docs/quantization.md", id="quantization"),  # one AOTI export of a tiny model
    pytest.param("docs/serve.md", id="serve"),  # a tiny reference-backend export, the app in-process, openai's client
    pytest.param("docs/mixed-delegates.md", id="mixed-delegates", marks=pytest.mark.slow),  # etsdk-aoti compiles
    pytest.param("plugins/tensorrt/README.md", id="tensorrt", marks=pytest.mark.slow),  # ONNX export, ~1 min
]

#: Docs whose bash / console commands are cheap and self-contained: each runs in a temporary directory.
COMMANDS = ["README.md", "docs/index.md"]

#: ``(doc, language)``: every block of that language in that doc that is not marked is executed by a test here.
EXECUTED = {
    *((doc, "python") for doc in ALONE),
    *((param.values[0], language) for param in GUIDES for language in ("python", "bash", "console")),
    *((doc, language) for doc in COMMANDS for language in ("bash", "console")),
    ("docs/contracts.md", "python"),  # the contracts_guide fixture
    ("docs/backend-authors.md", "python"),  # test_the_plugin_command_of_the_guide_runs
    *((str(TUTORIAL.relative_to(ROOT)), language) for language in TUTORIAL_LANGUAGES),  # test_tutorial.py
    (str(SESSIONS.relative_to(ROOT)), "python"),  # test_sessions_docs.py
}


def _env() -> dict[str, str]:
    """The user's environment as a reader of the docs has it: no ETSDK_* settings of the test run."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ETSDK_") or k == "ETSDK_CACHE_DIR"}


def _run_script(doc: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = "\n".join(block.body for block in runnable(doc, "python"))
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, env=_env())


def _run_commands(found: list[Block], cwd: Path) -> None:
    """Each ``etsdk ...`` line of the blocks, in order; every one must exit with status 0."""
    for block in found:
        for line in commands(block):
            words = shlex.split(line, comments=True)
            assert words[:1] == ["etsdk"], f"{block.where}: only etsdk commands run here, found: {line}"
            result = subprocess.run(
                [sys.executable, "-m", "etsdk", *words[1:]], cwd=cwd, capture_output=True, text=True, env=_env()
            )
            assert result.returncode == 0, f"{block.where}: {line}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
            assert result.stdout.strip(), f"{block.where}: {line} printed nothing"


def test_every_code_block_is_executed_or_marked() -> None:
    """Each fenced block has a language and is ``text`` (output, synopsis), executed by a test, or marked with
    ``<!-- not executed: REASON -->`` right before its fence; a marked python block still compiles."""
    problems = []
    for doc in markdown_files():
        for block in blocks(doc):
            if not block.language:
                problems.append(f"{block.where}: give the fence a language (```text for output)")
            elif block.language == "text":
                continue
            elif block.not_executed is not None:
                if block.language == "python":
                    try:
                        compile(block.body, block.where, "exec")
                    except SyntaxError as exc:
                        problems.append(f"{block.where}: marked, but does not compile: {exc}")
            elif (doc, block.language) not in EXECUTED:
                problems.append(
                    f"{block.where}: neither executed by a test in tests/docs nor marked (```text for output, or "
                    "<!-- not executed: REASON --> on the line before the fence)"
                )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", ALONE)
def test_python_examples_run(doc: str, tmp_path: Path) -> None:
    found = runnable(doc, "python")
    assert found, f"{doc} has no python example"
    for index, block in enumerate(found):
        cwd = tmp_path / str(index)
        cwd.mkdir()
        result = subprocess.run([sys.executable, "-c", block.body], cwd=cwd, capture_output=True, text=True, env=_env())
        assert result.returncode == 0, f"{block.where}\n{result.stderr[-2000:]}"


@pytest.mark.parametrize("doc", GUIDES)
def test_every_example_of_a_guide_runs(doc: str, tmp_path: Path) -> None:
    """Guides whose examples build on each other: all python blocks, in order, in one process; then the commands."""
    assert runnable(doc, "python"), f"{doc} has no python example"
    result = _run_script(doc, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    _run_commands(runnable(doc, "bash", "console"), tmp_path)


@pytest.mark.parametrize("doc", COMMANDS)
def test_cheap_commands_run(doc: str, tmp_path: Path) -> None:
    found = runnable(doc, "bash", "console")
    assert found, f"{doc} has no command to run"
    _run_commands(found, tmp_path)


@pytest.fixture(scope="module")
def contracts_guide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/contracts.md's examples, in order, as one script (they export and run ``toy.pte``): their directory."""
    cwd = tmp_path_factory.mktemp("contracts")
    result = _run_script("docs/contracts.md", cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return cwd


def test_the_contracts_guide_runs(contracts_guide: Path) -> None:
    assert (contracts_guide / "toy.pte").is_file()


def test_the_plugin_command_of_the_guide_runs(contracts_guide: Path, tmp_path: Path) -> None:
    """docs/backend-authors.md's command plugin, installed as a real distribution, prints a program's contract."""
    (module,) = runnable("docs/backend-authors.md", "python")
    site = PluginSite(tmp_path / "site")
    site.add("etsdk-contract-of", module.body, plugin="contract_of")
    listed = site.run_etsdk(["--help"])
    assert "contract-of" in listed.stdout, listed.stdout + listed.stderr
    result = site.run_etsdk(["contract-of", str(contracts_guide / "toy.pte")])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "kv_decoder"


def test_demo_main_job(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETSDK_") or k == "ETSDK_CACHE_DIR"}
    result = subprocess.run(
        [sys.executable, "-m", "etsdk", "demo", "--out-dir", str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "matches eager PyTorch" in result.stdout
    assert (tmp_path / "mlp.pte").is_file() and (tmp_path / "weights.ptd").is_file()


def test_the_migration_guide_covers_every_plugin_api_bump_and_every_moved_module() -> None:
    """docs/migrating.md, named by the skip reason of a plugin for an older plugin API, stays complete."""
    import etsdk
    from etsdk._moved import MOVED
    from etsdk._plugins.discovery import MIGRATION_GUIDE

    guide = ROOT / MIGRATION_GUIDE
    assert guide.is_file(), f"the skip reason names {MIGRATION_GUIDE}, which does not exist"
    text = guide.read_text()
    for old in range(1, etsdk.PLUGIN_API_VERSION):
        assert f"## Plugin API {old} -> {old + 1}" in text, f"{MIGRATION_GUIDE} has no section for plugin API {old}"
    listed = set(re.findall(r"`(etsdk\w*(?:\.\w+)+)`", text))
    import etsdk_hf_static  # noqa: F401  (serves its own moved paths: they must be listed too)

    missing = sorted(set(MOVED) - listed)
    assert not missing, f"{MIGRATION_GUIDE} does not list the old module path(s) {missing} with their replacement"
    for doc in ("index.md", "backend-authors.md"):
        assert "(migrating.md" in (ROOT / "docs" / doc).read_text(), f"docs/{doc} does not link the migration guide"
