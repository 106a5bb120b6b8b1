"""The etsdk blob container: layout, fail-closed versioning, streaming, and hostile input."""

from __future__ import annotations

import io
import json
import struct
import tracemalloc
from pathlib import Path

import etsdk._format.blob as blob_module
import pytest
from etsdk._format.blob import BLOB_MAGIC, BlobReader, BlobWriter
from etsdk.errors import BlobFormatError, EtsdkError, UnsupportedFeatureError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _blob(**kwargs: object) -> bytes:
    writer = BlobWriter(required_features=["a.v1"], optional_features=["nice.v1"], producer="test")
    writer.add_section("graph", b'{"x": 1}', alignment=16)
    writer.add_section("weights", bytes(range(200)), alignment=64)
    return writer.to_bytes()


def test_round_trip_and_alignment() -> None:
    data = _blob()
    reader = BlobReader(data, known_features={"a.v1"})
    assert reader.version == (1, 0)
    assert reader.required_features == ("a.v1",)
    assert bytes(reader.section("graph")) == b'{"x": 1}'
    assert bytes(reader.section("weights")) == bytes(range(200))
    by_name = {s.name: s for s in reader.sections}
    assert by_name["weights"].offset % 64 == 0 and by_name["graph"].offset % 16 == 0
    # zero-copy: sections are views of the buffer given
    assert isinstance(reader.section("weights"), memoryview)
    assert reader.section("weights").obj is memoryview(data).obj


def test_unknown_required_feature_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedFeatureError, match="requires feature\\(s\\) a.v1") as info:
        BlobReader(_blob(), known_features={"other"})
    assert info.value.feature == "a.v1"


def test_unknown_optional_feature_is_ignored() -> None:
    assert BlobReader(_blob(), known_features={"a.v1"}).optional_features == ("nice.v1",)


def test_newer_major_refused_older_blob_loads_in_newer_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytearray(_blob())
    struct.pack_into("<H", data, 8, 2)  # major 2
    with pytest.raises(UnsupportedFeatureError, match="format version 2.0 is newer than this reader"):
        BlobReader(bytes(data), known_features={"a.v1"})
    old = _blob()  # written as 1.0
    monkeypatch.setattr(blob_module, "MINOR_VERSION", 7)  # a newer reader of the same major
    assert bytes(BlobReader(old, known_features={"a.v1"}).section("graph")) == b'{"x": 1}'


def _with_header(header: object, *, total: int | None = None, extra: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    body = raw + extra
    length = 24 + len(body) if total is None else total
    return struct.pack("<8sHHIQ", BLOB_MAGIC, 1, 0, len(raw), length) + body


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "shorter than the 24-byte"),
        (b"NOTABLOB" + bytes(40), "expected magic"),
        (_blob()[:-3], "header says .* found"),
        (_blob() + b"xx", "header says .* found"),
        (_with_header([1, 2]), "must be a JSON object"),
        (_with_header({"sections": "nope"}), "'sections' must be list"),
        (_with_header({"required_features": [1]}), "must be a list of strings"),
        (_with_header({"sections": [{"name": "a", "offset": 24, "length": 999, "alignment": 1}]}), "outside the blob"),
        (_with_header({"sections": [{"name": "a", "offset": "24", "length": 1, "alignment": 1}]}), "'offset' must be int"),
        (_with_header({"sections": [{"name": "a", "offset": 0, "length": 1, "alignment": 3}]}), "power of two"),
        (_with_header({"sections": [7]}), "expected an object"),
        (struct.pack("<8sHHIQ", BLOB_MAGIC, 1, 0, 1 << 30, 30) + b"x" * 6, "does not fit"),
        (struct.pack("<8sHHIQ", BLOB_MAGIC, 1, 0, 3, 27) + b"\xff\xfe\x00", "not valid UTF-8 JSON"),
    ],
    ids=[
        "empty", "magic", "truncated", "padded", "header-list", "sections-type", "feature-type", "section-bounds",
        "offset-type", "alignment", "section-type", "header-length", "header-bytes",
    ],
)
def test_malformed_blobs_are_rejected_clearly(data: bytes, message: str) -> None:
    with pytest.raises(BlobFormatError, match=message):
        BlobReader(data)


def test_duplicate_and_missing_sections() -> None:
    writer = BlobWriter()
    writer.add_section("a", b"1")
    with pytest.raises(BlobFormatError, match="duplicate section name 'a'"):
        writer.add_section("a", b"2")
    with pytest.raises(BlobFormatError, match="has no section 'b' \\(sections: a\\)"):
        BlobReader(writer.to_bytes()).section("b")


def test_file_section_is_streamed_not_held(tmp_path: Path) -> None:
    big = tmp_path / "weights.bin"
    chunk = bytes(range(256)) * 4096  # 1 MiB
    with big.open("wb") as f:
        for _ in range(64):
            f.write(chunk)
    writer = BlobWriter(required_features=["w"])
    writer.add_section("meta", b"{}")
    writer.add_file_section("weights", big, alignment=4096)
    out = tmp_path / "blob.bin"
    tracemalloc.start()
    with out.open("wb") as f:
        written = writer.write_to(f)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert written == out.stat().st_size
    assert peak < 4 << 20, f"peak {peak} bytes while streaming a 64 MiB section"
    import mmap

    with out.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        reader = BlobReader(memoryview(mapped), known_features={"w"})
        section = reader.section("weights")
        assert section.nbytes == 64 << 20 and bytes(section[:256]) == bytes(range(256))
        del section, reader


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_random_bytes_raise_only_etsdk_errors(data: bytes) -> None:
    try:
        BlobReader(data, known_features={"a.v1"})
    except EtsdkError:
        pass


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_blobs_raise_only_etsdk_errors(data: st.DataObject) -> None:
    blob = bytearray(_blob())
    for _ in range(data.draw(st.integers(1, 6))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        position = data.draw(st.integers(0, max(len(blob) - 1, 0)))
        if kind == "flip" and blob:
            blob[position] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del blob[position : position + data.draw(st.integers(1, 16))]
        else:
            blob[position:position] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        reader = BlobReader(bytes(blob), known_features={"a.v1"})
        for section in reader.sections:
            reader.section(section.name)
    except EtsdkError:
        pass


def test_writer_streams_into_any_binary_file() -> None:
    buffer = io.BytesIO()
    writer = BlobWriter()
    writer.add_section("x", memoryview(b"abc"))
    n = writer.write_to(buffer)
    assert n == len(buffer.getvalue())
    assert bytes(BlobReader(buffer.getvalue()).section("x")) == b"abc"
