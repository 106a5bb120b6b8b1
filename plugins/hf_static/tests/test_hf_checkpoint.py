"""Exporting from a model directory holds no copy of the checkpoint's weights in memory at load.

transformers (5.x) maps a safetensors file whose tensors already have the dtype asked for: the parameters are
views of the file's pages (page cache, reclaimable), not anonymous memory. The exporter's load path relies on it;
this test guards the fact (a change that upcasts, copies or re-initialises weights at load would double the
export's memory). The exporter loads a checkpoint in its own dtype, so a bfloat16 one is mapped too; only
``weights_dtype="float32"`` (an explicit upcast) copies it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from etsdk_hf_static.exporter import _load_model
from etsdk_hf_static.tiny import save_tiny_model


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
    upcast, _, _ = _load_model(half, quiet=True, weights_dtype="float32")
    assert all(p.dtype == torch.float32 for p in upcast.parameters())
    assert _anonymous_bytes() - before > 0.8 * size  # what the first checks would see if the load copied
