"""``NamedDataWriter.add_weight``: content-addressed keys whatever the size; a spool that cannot be written is an ExportError."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import pytest
import torch
from etsdk import ExportError
from etsdk._export.partition import SPOOL_BYTES, NamedDataWriter


def _sha(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("numel", [0, 16, SPOOL_BYTES // 4 + 1])  # empty, held as bytes, spooled through a file
def test_a_weight_key_is_the_sha256_of_its_bytes(numel: int) -> None:
    writer = NamedDataWriter("EtsdkTestBackend")
    weight = torch.arange(numel, dtype=torch.float32)
    key = writer.add_weight(weight)
    assert key == f"weights/{_sha(weight)}"
    assert writer.add_weight(weight.clone()) == key  # equal bytes: one entry
    assert key in writer.output().pte_data


def test_a_spool_that_cannot_be_written_names_the_folder_and_leaves_no_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    monkeypatch.setattr(tempfile, "tempdir", str(missing))
    writer = NamedDataWriter("EtsdkTestBackend")
    with pytest.raises(ExportError, match=rf"temporary file under {missing}.*nothing was written to the output"):
        writer.add_weight(torch.zeros(SPOOL_BYTES // 4))
    assert writer.add_weight(torch.zeros(4)).startswith("weights/")  # small weights never touch the disk
    assert not missing.exists()
