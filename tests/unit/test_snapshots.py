"""Sessions without a program: the state view, snapshots, session files from elsewhere, fingerprints.

Through real programs (the reference backend and etsdk-aoti): tests/integration/test_sessions.py.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import etsdk
import pytest
import torch
from etsdk._format.fingerprint import ModelFingerprint, states_fingerprint, weights_fingerprint
from etsdk._state.contract import Contract, MethodSpec, Role, StateSpec
from etsdk._state.session import Session, StateError
from etsdk._state.snapshot import Snapshot
from etsdk.testing.toy_decoder import ToyDecoder, kv_decoder_contract

T = 4


def _bare_contract(shape: tuple[int, ...] = (2, 3)) -> Contract:
    states = [StateSpec("k", Role.KV_CACHE_KEY, "float32", shape), StateSpec("n", Role.COUNTER, "int64", ())]
    return Contract("bare", 1, methods=(MethodSpec("m", (), ()),), states=tuple(states))


def _bare_session(contract: Contract, weights: str = "a" * 64) -> Session:
    return Session(contract, model=ModelFingerprint(weights, states_fingerprint(contract.states)))


# ----------------------------------------------------------------------------- the state view


def test_state_cannot_be_replaced_only_written_in_place() -> None:
    session = _bare_session(_bare_contract())
    with pytest.raises(StateError, match="cannot be replaced"):
        session.state["k"] = torch.ones(2, 3)  # type: ignore[index]
    with pytest.raises(StateError, match="cannot be removed"):
        del session.state["k"]  # type: ignore[attr-defined]
    pointer = session.state["k"].data_ptr()
    session.state["k"].fill_(2.0)  # in place is the way
    assert session.state["k"].data_ptr() == pointer and float(session.state["k"].sum()) == 12.0
    assert set(session.state) == {"k", "n"} and "k" in session.state and len(session.state) == 2


def test_snapshot_metadata_must_be_json() -> None:
    session = _bare_session(_bare_contract())
    with pytest.raises(StateError, match="must be JSON"):
        session.snapshot({"x": object()})
    with pytest.raises(StateError, match="must be JSON"):
        session.snapshot({"x": float("nan")})


def test_restore_names_every_difference() -> None:
    session = _bare_session(_bare_contract((2, 3)))
    other = _bare_session(_bare_contract((2, 5)), weights="b" * 64)
    with pytest.raises(StateError) as info:
        other.restore(session.snapshot())
    text = str(info.value)
    assert "state 'k' shape: the snapshot has [2, 3], the program [2, 5]" in text and "another model" in text
    with pytest.raises(StateError, match="takes an etsdk Snapshot"):
        session.restore({"k": torch.zeros(2, 3)})  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- files from elsewhere


def _saved(tmp_path: Path) -> Path:
    session = _bare_session(_bare_contract())
    session.state["k"].copy_(torch.arange(6.0).reshape(2, 3))
    return session.save(tmp_path / "good.safetensors")


def _flip(data: bytes, index: int) -> bytes:
    out = bytearray(data)
    out[index] ^= 0x41
    return bytes(out)


def _edit_header(data: bytes, edit: object) -> bytes:
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + size])
    inner = json.loads(header["__metadata__"]["etsdk.session"])
    edit(inner)  # type: ignore[operator]
    header["__metadata__"]["etsdk.session"] = json.dumps(inner)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded + data[8 + size :]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: b"", "not a readable safetensors file"),
        (lambda d: d[: len(d) // 2], "not a readable safetensors file"),
        (lambda d: d[:-4], "not a readable safetensors file"),
        (lambda d: b"\x00" * 64, "not a readable safetensors file"),
        (lambda d: b"PK\x03\x04 this is a zip, not a session" * 4, "not a readable safetensors file"),
        (lambda d: _flip(d, 20), "not a readable safetensors file|etsdk metadata|etsdk session"),
        (lambda d: _flip(d, len(d) - 1), "do not match their recorded SHA-256"),
        (lambda d: _edit_header(d, lambda h: h.update(format="other")), "has format 'other'"),
        (lambda d: _edit_header(d, lambda h: h.update(format_version=[9, 0])), "newer than this etsdk reads"),
        (lambda d: _edit_header(d, lambda h: h.pop("sha256")), "etsdk session fields"),
        (lambda d: _edit_header(d, lambda h: h["states"][0].update(shape=[3, 2])), "tensor 'k' is float32 \\[2, 3\\]"),
        (lambda d: _edit_header(d, lambda h: h["states"][0].update(initial=1.5)), "state fingerprint"),
        (lambda d: _edit_header(d, lambda h: h["states"][0].update(dtype="complex64")), "dtype: expected one of"),
        (lambda d: _edit_header(d, lambda h: h["model"].update(weights="0" * 63)), "must be 64 hex digits"),
        (lambda d: _edit_header(d, lambda h: h.update(metadata=[1])), "metadata: expected an object"),
    ],
)
def test_damaged_session_files_are_clear_etsdk_errors(damage: object, message: str, tmp_path: Path) -> None:
    good = _saved(tmp_path).read_bytes()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(damage(good))  # type: ignore[operator]
    with pytest.raises(etsdk.EtsdkError, match=message):
        Snapshot.load(bad)


def test_foreign_files_and_paths_are_clear_errors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(3)}, str(tmp_path / "weights.safetensors"))
    with pytest.raises(StateError, match="not an etsdk session"):
        Snapshot.load(tmp_path / "weights.safetensors")
    with pytest.raises(StateError, match="not found"):
        Snapshot.load(tmp_path / "missing.safetensors")
    with pytest.raises(StateError, match="is not a file"):
        Snapshot.load(tmp_path)
    session = _bare_session(_bare_contract())
    with pytest.raises(StateError, match="it is a directory"):
        session.save(tmp_path)
    with pytest.raises(StateError, match="no directory"):
        session.save(tmp_path / "nowhere" / "s.safetensors")


# ----------------------------------------------------------------------------- fingerprints


def test_weights_fingerprint_is_by_name_and_content_not_by_method() -> None:
    model = ToyDecoder(seed=1).eval()
    state = set(model.state_fqns())
    prefill = torch.export.export(model, (torch.zeros(1, T, dtype=torch.long), torch.arange(T)))
    decode = torch.export.export(model, (torch.zeros(1, 1, dtype=torch.long), torch.tensor([0])))
    both = weights_fingerprint([prefill, decode], state)
    assert both == weights_fingerprint([decode], state) == weights_fingerprint([prefill, prefill], state)
    assert weights_fingerprint([prefill], ()) != both  # state buffers are not weights
    other = ToyDecoder(seed=1).eval()
    with torch.no_grad():
        other.head.bias[0] += 1e-3
    changed = torch.export.export(other, (torch.zeros(1, 1, dtype=torch.long), torch.tensor([0])))
    assert weights_fingerprint([changed], state) != both


def test_states_fingerprint_ignores_the_device_only() -> None:
    contract = kv_decoder_contract(ToyDecoder(), T)
    base = states_fingerprint(contract.states)
    assert states_fingerprint(contract.with_state_device("cuda").states) == base
    changed = dataclasses.replace(contract.states[0], initial=1.0)
    assert states_fingerprint((changed, *contract.states[1:])) != base
    assert states_fingerprint(kv_decoder_contract(ToyDecoder(capacity=24), T).states) != base
