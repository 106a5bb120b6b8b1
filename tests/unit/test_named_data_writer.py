"""``NamedDataWriter.add_weight``: content-addressed keys whatever the size; a spool that cannot be written is an
ExportError; a weight stored by an earlier writer of the same lowering is not read again; a memory-mapped weight's
pages are handed back once stored, anonymous memory never, and its bytes are copied from its file when the program is
written (checked again: a file changed in between fails the write)."""

from __future__ import annotations

import gc
import hashlib
import io
import mmap
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from etsdk import ExportError
from etsdk._export.partition import SPOOL_BYTES, NamedDataWriter, StoredWeights
from etsdk._format.mapped_pages import release_file_pages
from etsdk.backend import release_mapped_weights
from etsdk.testing import resident_bytes


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


@pytest.mark.parametrize("numel", [16, SPOOL_BYTES // 4 + 1])
def test_weight_key_is_add_weights_key_and_stores_nothing(numel: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend holding a weight in another form asks ``weight_key`` whether the model's tensor has its bytes; a
    memory-mapped one is then stored without being read again."""
    values = torch.arange(numel, dtype=torch.float32)
    (tmp_path / "w.bin").write_bytes(values.numpy().tobytes())
    with open(tmp_path / "w.bin", "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
    weight = torch.frombuffer(mapped, dtype=torch.float32)
    writer = NamedDataWriter("A", stored=StoredWeights())
    assert writer.weight_key(weight) == f"weights/{_sha(values)}"
    assert not writer.output().pte_data  # nothing stored
    assert NamedDataWriter("B").weight_key(values) == f"weights/{_sha(values)}"  # without a lowering's memory too
    if numel * 4 >= SPOOL_BYTES:  # remembered: storing it now reads nothing
        import etsdk._export.partition as partition

        reads: list[int] = []
        original = partition.hash_through
        monkeypatch.setattr(partition, "hash_through", lambda *a, **k: reads.append(1) or original(*a, **k))
        assert writer.add_weight(weight) == f"weights/{_sha(values)}"
        assert reads == []
    del weight
    mapped.close()


def test_a_spool_that_cannot_be_written_names_the_folder_and_leaves_no_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    monkeypatch.setattr(tempfile, "tempdir", str(missing))
    writer = NamedDataWriter("EtsdkTestBackend")
    with pytest.raises(ExportError, match=rf"temporary file under {missing}.*nothing was written to the output"):
        writer.add_weight(torch.zeros(SPOOL_BYTES // 4))
    assert writer.add_weight(torch.zeros(4)).startswith("weights/")  # small weights never touch the disk
    assert not missing.exists()


def _spools(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    spool = NamedDataWriter._spool_weight

    def counted(self: NamedDataWriter, view: memoryview, address: int, alignment: int) -> tuple[str, object]:
        calls.append(view.nbytes)
        return spool(self, view, address, alignment)

    monkeypatch.setattr(NamedDataWriter, "_spool_weight", counted)
    return calls


def test_a_weight_stored_by_an_earlier_writer_of_the_lowering_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spools(monkeypatch)
    stored = StoredWeights()
    weight = torch.randn(SPOOL_BYTES // 4 + 8)
    prefill, decode = NamedDataWriter("A", stored=stored), NamedDataWriter("B", stored=stored)
    key = prefill.add_weight(weight)
    assert decode.add_weight(weight) == key and decode.add_weight(weight.detach()) == key  # same memory: no read
    assert len(calls) == 1
    assert key in prefill.output().pte_data and key in decode.output().pte_data
    assert decode.fast_digests == prefill.fast_digests  # the load check knows the entry from either writer
    # a tensor at another address, or of another shape over the same memory, is read
    assert decode.add_weight(weight.clone()) == key and len(calls) == 2
    assert decode.add_weight(weight[: SPOOL_BYTES // 4]) != key and len(calls) == 3


def test_a_tensor_written_in_place_since_it_was_stored_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend that packs several weights through one scratch tensor stores each one's bytes."""
    calls = _spools(monkeypatch)
    stored = StoredWeights()
    scratch = torch.zeros(SPOOL_BYTES // 4 + 8)
    first = NamedDataWriter("A", stored=stored).add_weight(scratch)
    scratch.copy_(torch.ones_like(scratch))
    second = NamedDataWriter("B", stored=stored).add_weight(scratch)
    assert second == f"weights/{_sha(scratch)}" != first and len(calls) == 2


def test_a_parameter_given_new_storage_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """``parameter.data = other`` keeps the object alive but not its memory, which another tensor may then take."""
    calls = _spools(monkeypatch)
    stored = StoredWeights()
    parameter = torch.nn.Parameter(torch.zeros(SPOOL_BYTES // 4 + 8), requires_grad=False)
    NamedDataWriter("A", stored=stored).add_weight(parameter)
    parameter.data = torch.ones_like(parameter)
    gc.collect()
    again = torch.full_like(parameter, 2.0)  # may land where the zeros were
    assert NamedDataWriter("B", stored=stored).add_weight(again) == f"weights/{_sha(again)}"
    assert len(calls) == 2


def test_a_remembered_weight_whose_tensor_died_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the first tensor is gone its memory may hold other bytes: the entry is not trusted."""
    calls = _spools(monkeypatch)
    stored = StoredWeights()
    writer = NamedDataWriter("A", stored=stored)
    first = torch.full((SPOOL_BYTES // 4 + 8,), 1.0)
    first_key = writer.add_weight(first)
    address = first.data_ptr()
    del first
    gc.collect()
    second = torch.full((SPOOL_BYTES // 4 + 8,), 2.0)  # the allocator may well give it the same address
    second_key = writer.add_weight(second)
    assert second_key == f"weights/{_sha(second)}" != first_key
    assert len(calls) == 2, f"reused address: {second.data_ptr() == address}"


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="reads /proc/self/smaps (Linux)")
def test_a_memory_mapped_weight_gives_its_pages_back_once_stored(tmp_path: Path) -> None:
    values = torch.randn(4 * SPOOL_BYTES // 4)
    (tmp_path / "weights.bin").write_bytes(values.numpy().tobytes())
    with open(tmp_path / "weights.bin", "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
    weight = torch.frombuffer(mapped, dtype=torch.float32)
    assert float(weight.sum()) == pytest.approx(float(values.sum()), rel=1e-4)  # every page read: resident
    assert resident_bytes(weight.data_ptr()) >= values.numel() * 4
    key = NamedDataWriter("A").add_weight(weight)
    assert key == f"weights/{_sha(values)}"
    assert resident_bytes(weight.data_ptr()) < SPOOL_BYTES  # handed back (at most a partial page at each end)
    assert torch.equal(weight, values)  # and the mapping still reads the file's bytes
    del weight
    mapped.close()


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="reads /proc/self/smaps (Linux)")
def test_release_mapped_weights_hands_back_what_a_converter_read(mapped: tuple[torch.Tensor, torch.Tensor, Path]) -> None:
    weight, values, _ = mapped
    anonymous = torch.randn(SPOOL_BYTES // 4)
    assert float(weight.sum()) == pytest.approx(float(values.sum()), rel=1e-4)  # read as torch.onnx.export would
    assert resident_bytes(weight.data_ptr()) >= values.numel() * 4
    # the anonymous tensor is left alone, the mapped one counted once however often it is given
    assert release_mapped_weights([weight, anonymous, weight, weight[::2]]) == values.numel() * 4
    assert resident_bytes(weight.data_ptr()) < 3 * mmap.PAGESIZE  # the header's page and the partial last one at most
    assert resident_bytes(anonymous.data_ptr()) >= anonymous.numel() * 4
    assert torch.equal(weight, values)  # the mapping reads the file again
    with pytest.raises(ExportError, match="release_mapped_weights takes tensors, found ndarray"):
        release_mapped_weights([weight, values.numpy()])


def test_anonymous_memory_is_never_advised() -> None:
    weight = torch.randn(4 * SPOOL_BYTES // 4)
    assert not release_file_pages(weight.data_ptr(), weight.numel() * 4)
    NamedDataWriter("A").add_weight(weight)
    assert resident_bytes(weight.data_ptr()) >= weight.numel() * 4


@pytest.fixture
def mapped(tmp_path: Path) -> Iterator[tuple[torch.Tensor, torch.Tensor, Path]]:
    """A float32 weight memory-mapped (private, writable: as safetensors maps a checkpoint) after a 4 KiB header."""
    values = torch.randn(SPOOL_BYTES // 4 + 1000)
    path = tmp_path / "checkpoint.bin"
    path.write_bytes(b"h" * 4096 + values.numpy().tobytes())
    with open(path, "r+b") as f:
        region = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
    weight = torch.frombuffer(region, dtype=torch.float32, offset=4096)
    yield weight, values, path
    del weight
    gc.collect()
    region.close()


def _written(writer: NamedDataWriter, key: str) -> bytes:
    output = writer.output()
    buffer = output.buffers[output.pte_data[key].buffer_index]
    out = io.BytesIO()
    buffer.write_to_file(out)
    return out.getvalue()


def test_a_mapped_weight_is_copied_from_its_file_without_a_temporary_copy(
    monkeypatch: pytest.MonkeyPatch, mapped: tuple[torch.Tensor, torch.Tensor, Path]
) -> None:
    calls = _spools(monkeypatch)
    weight, values, _ = mapped
    writer = NamedDataWriter("A")
    key = writer.add_weight(weight)
    assert key == f"weights/{_sha(values)}"
    assert calls == []  # no temporary file
    assert _written(writer, key) == values.numpy().tobytes()


def test_a_checkpoint_rewritten_before_the_program_is_written_fails_the_write(mapped: tuple[torch.Tensor, torch.Tensor, Path]) -> None:
    weight, values, path = mapped
    writer = NamedDataWriter("A")
    key = writer.add_weight(weight)
    with open(path, "r+b") as f:  # one byte of the weight changed in place on disk
        f.seek(4096 + 12345)
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    with pytest.raises(ExportError, match=rf"at offset 4096 of {path} changed since the export read them"):
        _written(writer, key)


def test_a_mapped_weight_changed_in_memory_is_stored_as_it_is_in_memory(
    monkeypatch: pytest.MonkeyPatch, mapped: tuple[torch.Tensor, torch.Tensor, Path]
) -> None:
    """The file no longer has the bytes the model holds (a copy-on-write page): they are spooled from memory."""
    calls = _spools(monkeypatch)
    weight, values, _ = mapped
    weight[70000] += 1.0  # one page of the mapping becomes anonymous
    writer = NamedDataWriter("A")
    key = writer.add_weight(weight)
    assert key == f"weights/{_sha(weight)}" != f"weights/{_sha(values)}"
    assert len(calls) == 1
    assert _written(writer, key) == weight.numpy().tobytes()


def test_a_mapped_tensor_read_through_is_never_resident_beyond_a_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1 GB embedding is hashed (and stored) without all of its pages resident at once: at most one window."""
    from etsdk._format import mapped_pages

    monkeypatch.setattr(mapped_pages, "WINDOW", 4 << 20)
    payload = torch.randint(0, 256, (48 << 20,), dtype=torch.uint8).numpy().tobytes()
    (tmp_path / "big.bin").write_bytes(payload)
    with open(tmp_path / "big.bin", "r+b") as f:
        region = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
    tensor = torch.frombuffer(region, dtype=torch.uint8)
    address = tensor.data_ptr()
    digest, resident = hashlib.sha256(), []

    def consume(chunk: memoryview) -> None:
        digest.update(chunk)
        resident.append(resident_bytes(address))

    mapped_pages.read_through(memoryview(region), address, consume, chunk=1 << 20)
    assert digest.digest() == hashlib.sha256(payload).digest()
    # a window, a chunk, and the kernel's read-around (it maps a file's pages up to 2 MiB at a time) at either end
    assert len(resident) == 48 and max(resident) <= (4 << 20) + (1 << 20) + (4 << 20), resident
    assert resident_bytes(address) <= 4 << 20
    del tensor
    region.close()
