"""The main job (``python3 dev.py demo``): etsdk-hf-static's tiny LLM through etsdk-aoti, checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_llm_main_job(tmp_path: Path) -> None:
    """``python3 dev.py demo`` runs this: embedded tiny LLM, etsdk export through AOTI, etsdk generate, checked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETSDK_") or k == "ETSDK_CACHE_DIR"}
    result = subprocess.run(
        [sys.executable, "-m", "etsdk_hf_static.apps.demo", "--out-dir", str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "matches transformers' eager generate" in result.stdout
    assert "decode" in result.stdout and "tokens/s" in result.stdout
    assert "compiling" in result.stderr  # export progress
    assert re.search(r"^\[\d+ prompt tokens, \d+ generated .*prefill", result.stderr, re.M)  # generate's statistics line
    # quiet: only etsdk's own lines (issue 15; generate's statistics line is etsdk's), no torchao / torch logging /
    # warnings / progress bars
    foreign = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(("etsdk", "["))]
    assert not foreign, "\n".join(foreign[:10])
    noise = re.compile(r"Warning|^[WEI]\d{4} |Failed to load|it/s\]")
    assert not [line for line in result.stdout.splitlines() if noise.search(line)], result.stdout
    assert (tmp_path / "tiny-llama.pte").is_file() and (tmp_path / "tiny-llama.tokenizer").is_dir()
    # the ending: where the files are (they stay), why the text is random, what to run next
    ending = result.stdout.split("== the demo kept its files", 1)[1]
    assert f"model directory: {tmp_path / 'tiny-llama'}" in ending and f"program:         {tmp_path / 'tiny-llama.pte'}" in ending
    assert "random because the model's weights are" in ending
    assert f"etsdk chat {tmp_path / 'tiny-llama.pte'}" in ending
    assert f"etsdk generate {tmp_path / 'tiny-llama.pte'} --prompt" in ending
