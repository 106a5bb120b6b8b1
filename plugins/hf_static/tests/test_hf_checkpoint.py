"""Exporting from a model directory holds no copy of the checkpoint's weights in memory at load.

transformers (5.x) maps a safetensors file whose tensors already have the dtype asked for: the parameters are
views of the file's pages (page cache, reclaimable), not anonymous memory. The exporter's load path relies on it;
this test guards the fact (a change that upcasts, copies or re-initialises weights at load would double the
export's memory). The exporter loads a checkpoint in its own dtype, so a bfloat16 one is mapped too, also for
``weights_dtype="float32"``, whose upcast weights are made one at a time in an ``etsdk.WeightSpill``'s files.
"""

from __future__ import annotations

from pathlib import Path

import etsdk
import pytest
import torch
from etsdk_hf_static.exporting.exporter import _cast_weights, _load_model
from etsdk_hf_static.exporting.tiny import save_tiny_model


def _anonymous_bytes() -> int:
    """RssAnon of this process, after handing freed heap memory back to the system (memory an earlier test freed
    would otherwise be reused by a copy without RssAnon growing)."""
    import ctypes
    import ctypes.util

    libc = ctypes.util.find_library("c")
    if libc:
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)  # glibc
        if trim is not None:
            trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_the_export_load_maps_a_checkpoint_in_its_own_dtype_and_copies_only_an_upcast(tmp_path: Path) -> None:
    directory = save_tiny_model(tmp_path / "model", "llama", hidden=512, layers=4, vocab=4096)  # 52 MiB of float32
    size = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
    assert size > 48 * 2**20
    before = _anonymous_bytes()
    model, _, _ = _load_model(directory, quiet=True)
    with torch.no_grad():
        total = sum(float(p.sum()) for p in model.parameters())  # every byte read, no temporary the size of a weight
    added = _anonymous_bytes() - before
    assert total == total and sum(p.numel() * 4 for p in model.parameters()) > 0.95 * size
    assert added < 0.2 * size, f"loading added {added} bytes of anonymous memory for a {size}-byte checkpoint"
    del model

    model, _, _ = _load_model(directory, quiet=True)
    half = tmp_path / "bf16"
    model.to(torch.bfloat16).save_pretrained(half)
    del model
    before = _anonymous_bytes()
    kept, _, _ = _load_model(half, quiet=True)
    assert all(p.dtype == torch.bfloat16 for p in kept.parameters())
    with torch.no_grad():
        total = sum(float(p.sum(dtype=torch.float32)) for p in kept.parameters())  # no float32 temporary
    assert total == total and _anonymous_bytes() - before < 0.1 * size
    del kept
    before = _anonymous_bytes()
    loaded, _, _ = _load_model(half, quiet=True, weights_dtype="float32")  # loaded as stored; upcast weight by weight
    assert all(p.dtype == torch.bfloat16 for p in loaded.parameters()) and _anonymous_bytes() - before < 0.1 * size
    with etsdk.WeightSpill(tmp_path) as spill:
        _cast_weights(loaded, torch.float32, spill)
        layer = loaded.model.layers[0].mlp.up_proj.weight
        assert layer.dtype == torch.float32 and spill.bytes > 0.9 * size  # every weight upcast into a file
        assert _anonymous_bytes() - before < 0.1 * size  # the float32 weights are in the spill's files
    del loaded, layer
    before = _anonymous_bytes()
    from transformers import AutoModelForCausalLM

    upcast = AutoModelForCausalLM.from_pretrained(half, dtype=torch.float32)
    assert _anonymous_bytes() - before > 0.8 * size  # what the checks above would see if the load copied
    del upcast


_EXPORT_IN_A_CHILD = """
import json, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM  # loaded before the baseline, as the export needs it
import etsdk
from etsdk_hf_static import export

def rss():
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096

import threading, time
spilled = [0]  # the most bytes mapped from an etsdk.WeightSpill's files at once
resident = [0]  # the most bytes of the checkpoint's mapping resident at once

def watch():
    while True:
        total = held = 0
        inside = False
        for line in open("/proc/self/smaps"):
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = line.rstrip().endswith(".safetensors")
                if "/etsdk-spill-" in line:
                    low, high = head.split("-")
                    total += int(high, 16) - int(low, 16)
            elif inside and head == "Rss:":
                held += int(line.split()[1]) * 1024
        spilled[0], resident[0] = max(spilled[0], total), max(resident[0], held)
        time.sleep(0.02)

threading.Thread(target=watch, daemon=True).start()
baseline = rss()
source = sys.argv[1] if sys.argv[3] == "directory" else AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
if sys.argv[3] == "copy":  # the same weights in anonymous memory: what a model object's export stores
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.data = parameter.data.clone()
plan = etsdk.QuantizationPlan.for_format(sys.argv[4]) if len(sys.argv) > 4 else None
export(source, sys.argv[2], backend="reference", prefill_length=8, context_length=32, quantization=plan, quiet=True)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent that forked this process
peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"baseline": baseline, "peak": peak, "spilled": spilled[0], "resident": resident[0]}))
"""


def _export_in_a_child(checkpoint: Path, output: Path, source: str, *quantize: str) -> dict[str, int]:
    import json
    import os
    import subprocess
    import sys

    temporary = output.parent / "tmp"  # the child's TMPDIR, to see what it leaves
    temporary.mkdir(exist_ok=True)
    result = subprocess.run([sys.executable, "-c", _EXPORT_IN_A_CHILD, str(checkpoint), str(output), source, *quantize],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "TMPDIR": str(temporary)})
    assert result.returncode == 0, result.stderr[-3000:]
    figures: dict[str, int] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 172 MiB bfloat16 checkpoint (90M parameters)."""
    directory = save_tiny_model(tmp_path_factory.mktemp("large") / "model", "llama", hidden=1024, layers=6, vocab=16384)
    model, _, _ = _load_model(directory, quiet=True)
    model.to(torch.bfloat16).save_pretrained(directory.parent / "bf16")
    return directory.parent / "bf16"


def test_an_export_from_a_checkpoint_keeps_at_most_a_window_of_it_resident_and_writes_the_bytes_a_copy_would(
    bf16_checkpoint: Path, tmp_path: Path
) -> None:
    """Every weight of a memory-mapped checkpoint is read (fingerprinted, stored) and its pages dropped from the
    process as it goes. The program equals, byte for byte, the export of the same weights copied into anonymous
    memory (spooled through temporary files instead of copied from the checkpoint)."""
    import etsdk

    checkpoint = bf16_checkpoint
    size = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
    assert size > 100 * 2**20

    mapped = _export_in_a_child(checkpoint, tmp_path / "mapped.pte", "directory")
    # every weight was read, yet never more than one window (64 MiB, plus a chunk and the kernel's read-around) of
    # the checkpoint was resident at once (sampled every 20 ms; before, all of it stayed once read)
    assert 0 < mapped["resident"] <= 80 * 2**20 < 0.5 * size, (mapped, size)
    _export_in_a_child(checkpoint, tmp_path / "copied.pte", "copy")  # spooled through temporary files

    assert (tmp_path / "mapped.pte").read_bytes() == (tmp_path / "copied.pte").read_bytes()
    assert etsdk.verify(tmp_path / "mapped.pte").ok


def test_a_quantized_export_keeps_its_quantized_weights_in_files_and_writes_what_a_model_object_would(
    bf16_checkpoint: Path, tmp_path: Path
) -> None:
    """``--quantize`` of a checkpoint the export loads: each layer's quantized weights go to a file as they are made
    (:class:`etsdk.WeightSpill`) and are read mapped (their pages dropped once read, as a checkpoint's), where the
    export of a model object keeps them in memory; the programs are byte-identical."""
    size = sum(p.stat().st_size for p in bf16_checkpoint.glob("*.safetensors"))
    spilled = _export_in_a_child(bf16_checkpoint, tmp_path / "spilled.pte", "directory", "int8")
    held = _export_in_a_child(bf16_checkpoint, tmp_path / "held.pte", "object", "int8")  # quantized in memory
    # int8 halves bfloat16: the weights mapped from the spill's files are about half the checkpoint
    assert 0.4 * size < spilled["spilled"] < 0.7 * size and held["spilled"] == 0, (spilled, held, size)
    assert (tmp_path / "spilled.pte").read_bytes() == (tmp_path / "held.pte").read_bytes()
    assert list((tmp_path / "tmp").iterdir()) == []  # the spill's files are gone with the export
