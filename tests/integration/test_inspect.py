"""``etsdk inspect``: delegates per method with their operators and state, named data, contract, model identity;
readable at many layers (ranges, aligned metadata). ``etsdk verify`` on a fresh export: every entry is verifiable,
the program record included."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import etsdk
import pytest
import torch
from etsdk.testing import ToyDecoder, kv_decoder_contract, kv_decoder_methods


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = ToyDecoder(seed=2).eval()
    methods = kv_decoder_methods(model, 4, prefill_backends=("reference",), decode_backends=("reference",))
    path = tmp_path_factory.mktemp("inspect") / "toy.pte"
    etsdk.lower(methods, contract=kv_decoder_contract(model, 4), external_data="toy").save(path)
    return path


#: layers of the many-layer program (the text must not grow with them)
DEEP = 12


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A many-layer toy with nested contract metadata, weights inside the .pte."""
    model = ToyDecoder(layers=DEEP, heads=1, head_dim=4, capacity=8, seed=3).eval()
    methods = kv_decoder_methods(model, 4, prefill_backends=("reference",), decode_backends=("reference",))
    metadata = {"app": {"layers": DEEP, "eos_ids": [2], "name": "deep toy"}, "note": "x"}
    contract = dataclasses.replace(kv_decoder_contract(model, 4), metadata=metadata)
    path = tmp_path_factory.mktemp("deep") / "deep.pte"
    etsdk.lower(methods, contract=contract).save(path)
    return path


def _etsdk(command: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ETSDK_") or k == "ETSDK_CACHE_DIR"}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "etsdk", command, *args], capture_output=True, text=True, env=full)


def _inspect(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return _etsdk("inspect", *args, env=env)


def test_json_lists_delegates_operators_state_and_named_data(toy: Path) -> None:
    result = _inspect(str(toy), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["contract"]["name"] == "kv_decoder" and report["model"]["weights"]
    (decode,) = report["methods"]["decode"]
    assert decode["backend"] == "EtsdkReferenceBackend" and decode["provider"].startswith("etsdk plugin reference")
    assert {s["state"] for s in decode["states"]} == {"k0", "v0", "k1", "v1"}
    assert all(s["written"] for s in decode["states"])
    assert dict(decode["operators"])["aten::index_put"] == 4
    assert decode["payload_features"] == ["reference.graph.v2"]
    files = {e["file"] for e in report["named_data"]}
    assert files == {"toy.pte", "toy.ptd"}  # the program record in the .pte, weights in the .ptd
    weights = [e for e in report["named_data"] if e["file"] == "toy.ptd"]
    assert weights and all(e["key"].startswith("weights/") for e in weights)  # canonical entries, shared by backends
    assert sum(e["size"] for e in weights) >= sum(p.numel() * 4 for p in ToyDecoder().parameters())


def test_text_names_what_each_delegate_binds(toy: Path) -> None:
    result = _inspect(str(toy))
    assert result.returncode == 0, result.stderr
    assert "contract: kv_decoder v1" in result.stdout
    assert "method prefill: 1 delegate(s)" in result.stdout
    assert "state k0..k1: reads and writes float32 [1, 2, 16, 8] (buffers k_cache_0..k_cache_1)" in result.stdout
    assert "payload: etsdk blob requiring reference.graph.v2" in result.stdout


def test_a_missing_backend_is_shown_not_refused(toy: Path) -> None:
    result = _inspect(str(toy), "--json", env={"ETSDK_DISABLE_PLUGINS": "reference"})
    assert result.returncode == 0, result.stderr
    (decode,) = json.loads(result.stdout)["methods"]["decode"]
    assert decode["provider"].startswith("not installed")
    assert decode["operators"]  # read from the program record, no backend needed


def test_a_damaged_file_is_a_one_line_error(toy: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.pte"
    bad.write_bytes(toy.read_bytes()[:200])
    result = _inspect(str(bad))
    assert result.returncode == 2 and result.stderr.startswith("etsdk: error:") and result.stderr.count("\n") == 1
    assert torch is not None


def test_layers_fold_into_ranges_and_the_text_does_not_grow_with_them(deep: Path, toy: Path) -> None:
    result = _inspect(str(deep))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    last = DEEP - 1
    assert text.startswith(f"{deep} (") and text.splitlines()[1] == f"  contract: kv_decoder v1; {2 * DEEP} state(s)"
    assert text.splitlines()[2] == f"    sizes: T=4, S=8, H=1, D=4, V=32, L={DEEP}"  # the contract and its sizes first
    assert f"    state k0..k{last}: float32 [1, 1, 8, 4] (kv_cache_key)" in text
    assert f"    state v0..v{last}: float32 [1, 1, 8, 4] (kv_cache_value)" in text
    assert f"state k0..k{last}: reads and writes float32 [1, 1, 8, 4] (buffers k_cache_0..k_cache_{last})" in text
    assert f"state: the same {2 * DEEP} bindings as method decode [0]" in text  # prefill binds the same
    assert not re.search(r"state [kv]\d+:", text), "a per-layer state line"
    assert re.search(r"weights/<sha256>  \d+ entries, \d+ bytes  \(deep.pte\)", text)
    shallow = _inspect(str(toy)).stdout  # two layers, no metadata
    assert len(text.splitlines()) <= len(shallow.splitlines()) + len(metadata_lines(text)) <= 32, text
    # --json keeps every detail
    report = json.loads(_inspect(str(deep), "--json").stdout)
    assert len(report["contract"]["states"]) == 2 * DEEP
    assert all(len(d["states"]) == 2 * DEEP for m in report["methods"].values() for d in m)
    assert len(report["named_data"]) > DEEP and all("/" in e["key"] for e in report["named_data"])


def metadata_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("    metadata:") + 1
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("      "))
    return lines[start:end]


def test_metadata_is_aligned_key_value_lines(deep: Path) -> None:
    text = _inspect(str(deep)).stdout
    assert "{'" not in text and "{\"" not in text  # not a dict repr
    lines = metadata_lines(text)
    assert [line.split(":")[0].strip() for line in lines] == ["app.eos_ids", "app.layers", "app.name", "note"]
    assert lines[1].split() == ["app.layers:", str(DEEP)] and lines[2].endswith(" deep toy")
    assert len({len(line) - len(line.split(":", 1)[1].lstrip()) for line in lines}) == 1, lines  # values aligned


def test_verify_finds_nothing_unverifiable_in_a_fresh_export(toy: Path) -> None:
    result = _etsdk("verify", str(toy))
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith(", 0 damaged, 0 unverifiable (key is not a content hash)"), result.stdout
    report = json.loads(_etsdk("verify", str(toy), "--json", "--no-methods").stdout)
    (record,) = [e for e in report["entries"] if e["key"].startswith("etsdk/program")]
    assert re.fullmatch(r"etsdk/program/[0-9a-f]{64}", record["key"]) and record["file"] == "toy.pte"
    assert {e["status"] for e in report["entries"]} == {"ok"}


def _flipped_record(toy: Path, tmp_path: Path, where: str) -> tuple[Path, str]:
    """A copy of the toy pair with one byte of its program record changed: inside a string, or its first byte."""
    from etsdk._format.program_file import read_program_file

    fd = os.open(toy, os.O_RDONLY)
    try:
        (entry,) = [e for e in read_program_file(fd).entries if e.key.startswith("etsdk/program")]
    finally:
        os.close(fd)
    data = bytearray(toy.read_bytes())
    record = bytes(data[entry.offset : entry.offset + entry.size])
    at = entry.offset + (record.index(b'"producer":"etsdk') + len(b'"producer":"') if where == "string" else 0)
    data[at] ^= 0x01 if where == "string" else 0x20  # 'e' -> 'd'; '{' -> '['
    out = tmp_path / "flipped.pte"
    out.write_bytes(bytes(data))
    (tmp_path / "flipped.ptd").write_bytes(toy.with_suffix(".ptd").read_bytes())
    return out, entry.key


@pytest.mark.parametrize("where", ["string", "first byte"])
def test_verify_reports_a_flipped_byte_in_the_program_record(toy: Path, tmp_path: Path, where: str) -> None:
    flipped, key = _flipped_record(toy, tmp_path, where)
    result = _etsdk("verify", str(flipped))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"DAMAGED  flipped.pte: '{key}' (" in result.stdout
    assert ", 1 damaged, 0 unverifiable" in result.stdout
    if where == "first byte":  # a record that no longer parses: inspect and load say it is damaged, in one line
        refused = _inspect(str(flipped))
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1
        assert f"named data '{key}'" in refused.stderr and "is damaged" in refused.stderr


def test_an_old_program_record_still_loads_and_stays_unverifiable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Programs written before records were content-addressed keep the key ``etsdk/program``."""
    import etsdk._state.signature as signature

    monkeypatch.setattr(signature, "program_record_key", lambda data: signature.PROGRAM_RECORD_KEY)
    model = ToyDecoder(layers=1, seed=4).eval()
    methods = kv_decoder_methods(model, 4, prefill_backends=("reference",), decode_backends=("reference",))
    old = tmp_path / "old.pte"
    etsdk.lower(methods, contract=kv_decoder_contract(model, 4)).save(old)
    monkeypatch.undo()
    result = _etsdk("verify", str(old))
    assert result.returncode == 0, result.stderr
    assert "method decode: loaded" in result.stdout
    assert "1 unverifiable (key is not a content hash: 'etsdk/program')" in result.stdout
    assert "re-export to make it verifiable" in result.stdout
    assert "etsdk/program  " in _inspect(str(old)).stdout


def _describing(monkeypatch: pytest.MonkeyPatch, describe: object) -> None:
    """The reference backend's spec as if its plugin declared ``describe_payload=describe``."""
    from etsdk._plugins import registry
    from etsdk.reference_backend import BACKEND_ID

    real = registry.get_backend

    def get_backend(backend_id: str, **kwargs: object) -> object:
        spec = real(backend_id, **kwargs)  # type: ignore[arg-type]
        return dataclasses.replace(spec, describe_payload=describe) if backend_id == BACKEND_ID else spec

    monkeypatch.setattr(registry, "get_backend", get_backend)


def test_a_plugin_describes_its_payloads_under_its_delegates(toy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    from etsdk._runtime.inspection import inspect_program

    seen: list[bytes] = []

    def describe(payload: memoryview) -> list[str]:
        seen.append(bytes(payload))
        return ["built for: a toy", f"{payload.nbytes} bytes"]

    _describing(monkeypatch, describe)
    report = inspect_program(toy)
    delegates = {m.name: m.delegates[0] for m in report.methods}
    # the payload the plugin wrote (out of the core's envelope), checked against the program record first
    sizes = {hashlib.sha256(p).hexdigest(): len(p) for p in seen}
    assert len(seen) == 2 and set(sizes) == {d.signature.payload_sha256 for d in delegates.values()}
    for delegate in delegates.values():
        assert delegate.details == ("built for: a toy", f"{sizes[delegate.signature.payload_sha256]} bytes")
    text = report.render()
    assert "        payload: etsdk blob requiring reference.graph.v2" in text and "        built for: a toy" in text
    assert report.to_json()["methods"]["decode"][0]["details"][0] == "built for: a toy"

    def broken(payload: memoryview) -> list[str]:
        raise ValueError("cannot read\nthis")

    _describing(monkeypatch, broken)
    (decode,) = next(m for m in inspect_program(toy).methods if m.name == "decode").delegates
    assert decode.details == ("payload not described: ValueError: cannot read this",)


def test_a_damaged_payload_is_not_handed_to_the_plugin(toy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from etsdk._format.program_file import read_program_file
    from etsdk._runtime.inspection import inspect_program

    fd = os.open(toy, os.O_RDONLY)
    try:
        place = next(p for p in read_program_file(fd).delegates if p.method == "decode")
    finally:
        os.close(fd)
    data = bytearray(toy.read_bytes())
    data[place.offset + place.size * 3 // 4] ^= 0x40
    bad = tmp_path / "toy.pte"
    bad.write_bytes(bytes(data))
    (tmp_path / "toy.ptd").write_bytes((toy.parent / "toy.ptd").read_bytes())
    called: list[int] = []
    _describing(monkeypatch, lambda payload: called.append(1) or ["x"])
    report = inspect_program(bad)
    (decode,) = next(m for m in report.methods if m.name == "decode").delegates
    assert decode.details == ("payload not described: it differs from the program record's (damaged, or another delegate's)",)
    (prefill,) = next(m for m in report.methods if m.name == "prefill").delegates
    assert prefill.details == ("x",) and called == [1]
