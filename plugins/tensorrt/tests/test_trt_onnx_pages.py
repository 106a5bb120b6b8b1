"""Writing a partition's ONNX hands back the pages of a memory-mapped checkpoint's weights as each is written:
the external data's writer reads every weight, and a mapped file's pages once read stay in the process."""

from __future__ import annotations

import mmap
from pathlib import Path

import onnx
import pytest
import torch
from etsdk.testing import resident_bytes
from etsdk_tensorrt.onnx_export import _save


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="reads /proc/self/smaps (Linux)")
def test_the_onnx_writer_hands_back_each_mapped_weight_once_written(tmp_path: Path) -> None:
    values = torch.randn(1024, 1024)
    (tmp_path / "checkpoint.bin").write_bytes(values.numpy().tobytes())
    with open(tmp_path / "checkpoint.bin", "r+b") as f:  # private and writable, as safetensors maps a checkpoint
        region = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
    weight = torch.frombuffer(region, dtype=torch.float32).view(1024, 1024)
    linear = torch.nn.Linear(1024, 1024, bias=False)
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    program = torch.onnx.export(linear, (torch.randn(1, 1024),), dynamo=True, optimize=False, verbose=False)
    assert program is not None
    _save(program.model, tmp_path / "model.onnx")
    assert resident_bytes(weight.data_ptr()) < 2 * mmap.PAGESIZE  # every page read by the writer went back
    model = onnx.load(str(tmp_path / "model.onnx"))  # external data read from model.onnx.data
    (initializer,) = model.graph.initializer
    assert torch.equal(torch.from_numpy(onnx.numpy_helper.to_array(initializer).copy()), values)
    assert torch.equal(weight, values)  # the mapping reads the file again
    del program, linear, weight
    region.close()
