"""Exporting a checkpoint never holds a copy of its weights: ``etsdk export`` runs inside a memory cgroup capped
below the checkpoint's size.

A bfloat16 checkpoint of 779 MiB (408M parameters, written by another process: this one never holds the model)
is exported through the reference backend by ``etsdk export --model DIR`` moved into a cgroup whose memory limit is
600 MiB. The export loads the checkpoint in its own dtype, memory-mapped (page cache, which the kernel reclaims at
the limit), and streams every weight once into the program, so it fits; the program then generates what
transformers generates from the upcast weights. So does the same export with ``--weights-dtype float32``: each
weight is upcast into a temporary file, one at a time (1.6 GB of float32 weights, never in memory). The control:
exporting the model object transformers loads upcast (a float32 copy of every weight in memory) is killed by
the same limit, so the limit does bite.

Needs root and a writable memory cgroup (v1 ``memory.limit_in_bytes`` or v2 ``memory.max``); skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from etsdk.testing import MemoryCgroup, memory_cgroup

CAP = 600 * 2**20


@pytest.fixture
def cgroup(request: pytest.FixtureRequest) -> Iterator[MemoryCgroup]:
    """A fresh cgroup per test: page cache stays charged to the cgroup that first read or wrote it, and a program
    an earlier test wrote there and this process still maps could not be reclaimed (152 MB seen)."""
    made = memory_cgroup(f"etsdk-test-{os.getpid()}-{abs(hash(request.node.nodeid)) % 10**8}", CAP)
    if made is None:
        pytest.skip("needs root and a writable memory cgroup (v1 memory.limit_in_bytes or v2 memory.max)")
    yield made
    made.remove()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("capped") / "bf16"
    code = (
        "import sys, torch\n"
        "from etsdk_hf_static.exporting.tiny import tiny_model\n"
        "model = tiny_model('llama', hidden=2048, layers=8, vocab=32000, heads=16, kv_heads=2, positions=128)\n"
        "model.to(torch.bfloat16).save_pretrained(sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", code, str(directory)], check=True, capture_output=True, timeout=600)
    return directory


def _capped_export(cgroup: MemoryCgroup, model: Path, output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "etsdk", "export", "--model", str(model), "-o", str(output), "--backend", "reference",
               "--context-length", "64", "--prefill-length", "8", *extra]
    # the child moves itself into the cgroup before it imports anything, then execs the export
    return subprocess.run(cgroup.command(command), capture_output=True, text=True, timeout=900)


PROMPT = [1, 17, 400, 9000, 31000]


@pytest.fixture(scope="module")
def reference_tokens(checkpoint: Path) -> list[int]:
    """What transformers generates from the upcast weights, in another process (1.6 GB that this one's later tests
    should not inherit)."""
    prompt = PROMPT
    code = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()\n"
        f"ids = torch.tensor([{prompt!r}])\n"
        "with torch.no_grad():\n"
        "    out = model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)\n"
        "print(','.join(map(str, out[0, ids.shape[1]:].tolist())))\n"
    )
    reference = subprocess.run([sys.executable, "-c", code, str(checkpoint)], capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr[-2000:]
    return [int(t) for t in reference.stdout.strip().splitlines()[-1].split(",")]


@pytest.mark.parametrize("weights_dtype", ["auto", "float32", "auto-meta-trace"])
def test_a_checkpoint_larger_than_the_memory_limit_exports_and_generates(
    cgroup: MemoryCgroup, checkpoint: Path, reference_tokens: list[int], tmp_path: Path, weights_dtype: str
) -> None:
    """``auto-meta-trace``: the model built on the meta device, its weights bound from the checkpoint after tracing
    (``--meta-trace``)."""
    size = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
    assert size > 1.25 * CAP, f"the checkpoint ({size} bytes) must be well above the limit ({CAP})"
    meta = weights_dtype.endswith("-meta-trace")
    flags = ("--weights-dtype", weights_dtype.removesuffix("-meta-trace"), *(("--meta-trace",) if meta else ()))
    result = _capped_export(cgroup, checkpoint, tmp_path / "model.pte", *flags)
    assert result.returncode == 0, f"exit {result.returncode} under a {CAP}-byte limit\n{result.stderr[-3000:]}"
    assert ("on the meta device (bfloat16 weights" if meta else "loading") in result.stderr
    assert "(bfloat16 weights" in result.stderr
    if weights_dtype == "float32":  # every linear / embedding weight upcast: twice the checkpoint's bytes
        assert "converted to float32" in result.stderr
        assert (tmp_path / "model.pte").stat().st_size > 1.9 * size

    from etsdk_hf_static.runtime.runner import HfStaticRunner

    got = HfStaticRunner.from_file(tmp_path / "model.pte").generate(PROMPT, max_new_tokens=4, stop_at_eos=False).token_ids
    assert list(got) == reference_tokens


def test_the_limit_bites_an_export_that_copies_the_weights(cgroup: MemoryCgroup, checkpoint: Path, tmp_path: Path) -> None:
    """The control: the model object transformers loads upcast (every weight copied to float32 in memory)."""
    code = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "from etsdk_hf_static import export\n"
        "model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()\n"
        "export(model, sys.argv[2], backend='reference', prefill_length=8, context_length=64)\n"
    )
    result = subprocess.run(cgroup.command([sys.executable, "-c", code, str(checkpoint), str(tmp_path / "upcast.pte")]),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode in (-9, 137), f"an upcast export fit under {CAP} bytes (exit {result.returncode})\n{result.stderr[-2000:]}"
    assert not (tmp_path / "upcast.pte").exists()
