"""``etsdk.WeightSpill``: converted weights kept in files, memory-mapped, instead of in memory."""

from __future__ import annotations

from pathlib import Path

import etsdk
import pytest
import torch
from etsdk._export.partition import SPOOL_BYTES
from etsdk._format.mapped_pages import file_range


def test_a_spilled_tensor_has_the_same_values_and_lives_in_a_file_until_the_spill_closes(tmp_path: Path) -> None:
    weight = torch.randn(512, SPOOL_BYTES // 2048 + 3)
    with etsdk.WeightSpill(tmp_path) as spill:
        kept = spill(weight)
        assert torch.equal(kept, weight) and kept.shape == weight.shape and kept.dtype == weight.dtype
        where = file_range(kept.data_ptr(), kept.numel() * 4)
        assert where is not None and Path(where.path).parent == spill.path and spill.bytes == kept.numel() * 4
        small = torch.randn(16)
        assert torch.equal(spill(small), small) and spill(small).data_ptr() == small.data_ptr()  # small: no file
        assert len(list(spill.path.iterdir())) == 1
    assert not spill.path.exists()
    assert torch.equal(kept, weight)  # the mapping outlives the file


def test_a_spill_that_cannot_write_is_an_export_error_naming_the_folder(tmp_path: Path) -> None:
    spill = etsdk.WeightSpill(tmp_path)
    spill.path.rmdir()  # the folder vanished (or the disk is full): the write fails
    with pytest.raises(etsdk.ExportError, match=rf"converted weight under {tmp_path} failed: .*nothing was written"):
        spill(torch.randn(SPOOL_BYTES))


def test_quantize_model_hands_each_stored_tensor_to_the_spill(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.Linear(2048, 1024))
    held = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.Linear(2048, 1024))
    held.load_state_dict(model.state_dict())
    etsdk.quantize_model(held, "int8")
    with etsdk.WeightSpill(tmp_path) as spill:
        etsdk.quantize_model(model, "int8", spill=spill)
        qdata = [module.qdata for module in model if isinstance(module, etsdk.QuantizedLinear)]
        assert len(qdata) == 2 and all(file_range(q.data_ptr(), q.numel()) is not None for q in qdata)
        x = torch.randn(3, 1024)
        assert torch.equal(model(x), held(x))


def test_a_spill_without_a_folder_to_make_is_an_export_error(tmp_path: Path) -> None:
    with pytest.raises(etsdk.ExportError, match=rf"cannot make a folder for converted weights under {tmp_path / 'missing'}"):
        etsdk.WeightSpill(tmp_path / "missing")


def test_a_spill_never_closed_removes_its_files_when_dropped(tmp_path: Path) -> None:
    spill = etsdk.WeightSpill(tmp_path)
    kept = spill(torch.randn(SPOOL_BYTES))
    folder = spill.path
    assert folder.is_dir()
    del spill
    assert not folder.exists() and float(kept.sum()) == float(kept.sum())
