"""Weights memory-mapped from a file (a checkpoint loaded in its own dtype) are copied from that file into the
program, with no temporary copy, and checked again as they are copied: a file rewritten between ``etsdk.lower``
and ``Lowered.save`` fails the save with one error and leaves the previous program as it was."""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

import etsdk
import pytest
import torch
from etsdk.reference_backend import BACKEND_ID


class Projection(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight)


@pytest.fixture
def mapped(tmp_path: Path) -> Iterator[tuple[Projection, torch.Tensor, Path]]:
    values = torch.randn(512, 1024)  # 2 MiB: above the size held in memory
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 4096 + values.numpy().tobytes())
    with open(path, "r+b") as f:
        region = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
    model = Projection(torch.frombuffer(region, dtype=torch.float32, offset=4096).view(512, 1024))
    yield model, values, path
    del model
    import gc

    gc.collect()
    region.close()


def test_a_program_of_mapped_weights_runs_as_eager(mapped: tuple[Projection, torch.Tensor, Path], tmp_path: Path) -> None:
    model, values, _ = mapped
    x = torch.randn(3, 1024)
    etsdk.lower(module=model, example_inputs=(x,), backend=BACKEND_ID).save(tmp_path / "m.pte")
    (got,) = etsdk.load(tmp_path / "m.pte").run("forward", x)
    torch.testing.assert_close(got, x @ values.T, rtol=1e-4, atol=1e-3)  # the same weights (a float32 sum of 1024)


def test_a_checkpoint_rewritten_before_the_save_fails_it_and_keeps_the_previous_program(
    mapped: tuple[Projection, torch.Tensor, Path], tmp_path: Path
) -> None:
    model, _, path = mapped
    x = torch.randn(3, 1024)
    previous = tmp_path / "m.pte"
    previous.write_bytes(b"the previous program")
    lowered = etsdk.lower(module=model, example_inputs=(x,), backend=BACKEND_ID)
    with open(path, "r+b") as f:  # rewritten in place: one weight byte differs
        f.seek(4096 + 999)
        f.write(bytes([f.read(1)[0] ^ 1]))
    with pytest.raises(etsdk.ExportError, match=rf"of {path} changed since the export read them"):
        lowered.save(previous)
    assert previous.read_bytes() == b"the previous program"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pte", "weights.bin"]


def test_a_checkpoint_deleted_before_the_save_is_still_copied(mapped: tuple[Projection, torch.Tensor, Path], tmp_path: Path) -> None:
    """The file is held open from the moment its weight is stored: removing (or replacing) its name changes nothing."""
    model, values, path = mapped
    x = torch.randn(3, 1024)
    lowered = etsdk.lower(module=model, example_inputs=(x,), backend=BACKEND_ID)
    path.unlink()
    lowered.save(tmp_path / "m.pte")
    (got,) = etsdk.load(tmp_path / "m.pte").run("forward", x)
    torch.testing.assert_close(got, x @ values.T, rtol=1e-4, atol=1e-3)


def test_a_mapped_weight_is_read_once_by_lower_for_the_fingerprint_and_its_entry(
    mapped: tuple[Projection, torch.Tensor, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model fingerprint reads every weight; storing a mapped one reuses that read's SHA-256 and BLAKE3 instead
    of reading it again (the program writer still checks the bytes as it copies them from the file)."""
    import etsdk._format.fingerprint as fingerprint
    import etsdk._format.mapped_pages as pages

    model, values, _ = mapped
    read: list[int] = []
    real = pages.read_through

    def counted(view: memoryview, address: int, consume: object, *rest: object) -> None:
        read.append(view.nbytes)
        real(view, address, consume, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(pages, "read_through", counted)
    monkeypatch.setattr(fingerprint, "read_through", counted)  # imported by name there
    x = torch.randn(3, 1024)
    lowered = etsdk.lower(module=model, example_inputs=(x,), backend=BACKEND_ID)
    assert read == [values.numel() * 4], f"the weight was read {len(read)} times while lowering: {read}"
    lowered.save(tmp_path / "m.pte")
    (got,) = etsdk.load(tmp_path / "m.pte").run("forward", x)
    torch.testing.assert_close(got, x @ values.T, rtol=1e-4, atol=1e-3)
    # the entry's key is the bytes' SHA-256 (etsdk verify checks it); etsdk.load above checked its BLAKE3
    import hashlib

    key = f"weights/{hashlib.sha256(values.numpy().tobytes()).hexdigest()}"
    statuses = {e.key: e.status for e in etsdk.verify(tmp_path / "m.pte").entries}
    assert statuses.get(key) == "ok", statuses


@pytest.mark.parametrize("quiet", [False, True])
def test_writing_a_program_says_how_much_it_has_written_unless_quiet(
    mapped: tuple[Projection, torch.Tensor, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], quiet: bool
) -> None:
    import re

    import etsdk._export.output as output

    model, _, _ = mapped
    lowered = etsdk.lower(module=model, example_inputs=(torch.randn(3, 1024),), backend=BACKEND_ID, quiet=quiet)
    monkeypatch.setattr(output, "WRITE_PROGRESS_S", 0.0)  # a line at every write
    capsys.readouterr()
    lowered.save(tmp_path / "m.pte")
    lines = re.findall(r"etsdk: writing m\.pte: ([\d.]+ [KMG]?i?B) written, [\d.]+ [KMG]?i?B/s", capsys.readouterr().err)
    if quiet:
        assert lines == []
    else:  # the weight (2 MiB) is among what was written, and the count only grows
        assert len(lines) >= 2 and "MiB" in lines[-1], lines
