"""Sessions that can be snapshotted, restored, forked, saved and loaded, across backends; model identity.

The toy decoder (``kv_decoder`` contract) through the real runtime: the core's
reference backend, and etsdk-aoti for the cross-backend cases (one compile,
shared by the module).
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
from etsdk._state.signature import ProgramRecord
from etsdk._state.snapshot import Snapshot
from etsdk.errors import ProgramError
from etsdk.reference_backend import BACKEND_ID
from etsdk.testing.toy_decoder import ToyDecoder, kv_decoder_contract, kv_decoder_methods

T = 4
PROMPT = torch.tensor([[3, 5, 7, 9]])
STEPS = [(torch.tensor([[t]]), torch.tensor([T + i])) for i, t in enumerate([1, 4, 2, 8, 6])]


def _export(model: ToyDecoder, backend: str, path: Path) -> Path:
    options = {"partitioner_options": {backend: {"device": "cpu"}}} if backend == "EtsdkAotiBackend" else {}
    methods = kv_decoder_methods(model, T, prefill_backends=(backend,), decode_backends=(backend,), **options)
    etsdk.lower(methods, contract=kv_decoder_contract(model, T)).save(path)
    return path


@pytest.fixture(scope="module")
def toys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same toy model through the reference backend and AOTI, another model, and another S."""
    root = tmp_path_factory.mktemp("sessions")
    model = ToyDecoder(seed=1).eval()
    return {
        "reference": _export(model, BACKEND_ID, root / "ref.pte"),
        "aoti": _export(model, "EtsdkAotiBackend", root / "aoti.pte"),
        "other_model": _export(ToyDecoder(seed=2).eval(), BACKEND_ID, root / "other.pte"),
        "other_s": _export(ToyDecoder(seed=1, capacity=24).eval(), BACKEND_ID, root / "s24.pte"),
    }


@pytest.fixture
def program(toys: dict[str, Path]) -> etsdk.Program:
    return etsdk.load(toys["reference"])


def _decode(program: etsdk.Program, session: Session, steps: list[tuple[torch.Tensor, torch.Tensor]] = STEPS) -> list[torch.Tensor]:
    return [program.run("decode", tok, pos, session=session)[0] for tok, pos in steps]


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


# ----------------------------------------------------------------------------- snapshot / restore / fork


def test_restore_is_in_place_and_repeats_exactly(program: etsdk.Program) -> None:
    session = program.new_session()
    program.run("prefill", PROMPT, torch.arange(T), session=session)
    pointers = {name: t.data_ptr() for name, t in session.state.items()}
    snapshot = session.snapshot()
    first = _decode(program, session)
    session.restore(snapshot)
    second = _decode(program, session)
    session.restore(snapshot)  # a snapshot is immutable: it restores any number of times
    third = _decode(program, session)
    for a, b, c in zip(first, second, third):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert {name: t.data_ptr() for name, t in session.state.items()} == pointers
    assert snapshot.model == program.record.model and snapshot.nbytes == sum(t.nbytes for t in session.state.values())


def test_restore_equals_a_fresh_session_that_went_the_same_way(program: etsdk.Program) -> None:
    session = program.new_session()
    program.run("prefill", PROMPT, torch.arange(T), session=session)
    snapshot = session.snapshot()
    _decode(program, session, STEPS[:3])  # go elsewhere
    session.restore(snapshot)
    fresh = program.new_session()
    program.run("prefill", PROMPT, torch.arange(T), session=fresh)
    for a, b in zip(_decode(program, session), _decode(program, fresh)):
        assert torch.equal(a, b)


def test_fork_continues_like_the_original_with_its_own_storage(program: etsdk.Program) -> None:
    session = program.new_session()
    program.run("prefill", PROMPT, torch.arange(T), session=session)
    twin = session.fork()
    assert all(twin.state[n].data_ptr() != t.data_ptr() for n, t in session.state.items())
    assert all(torch.equal(twin.state[n], t) for n, t in session.state.items())
    ours, theirs = _decode(program, session), _decode(program, twin)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    other = [(tok + 3, pos) for tok, pos in STEPS]
    fork2 = twin.fork()
    diverged = _decode(program, fork2, other)
    assert not torch.equal(diverged[-1], theirs[-1])
    assert all(torch.equal(twin.state[n], t) for n, t in session.state.items())  # fork2 left twin alone


def test_save_and_load_continue_exactly_in_a_fresh_load(program: etsdk.Program, toys: dict[str, Path], tmp_path: Path) -> None:
    session = program.new_session()
    program.run("prefill", PROMPT, torch.arange(T), session=session)
    path = session.save(tmp_path / "s.safetensors", metadata={"note": "after prefill", "ids": [3, 5, 7, 9]})
    expected = _decode(program, session)
    again = etsdk.load(toys["reference"])
    loaded = Session.load(path, again)
    for a, b in zip(expected, _decode(again, loaded)):
        assert torch.equal(a, b)
    assert dict(Snapshot.load(path).metadata) == {"note": "after prefill", "ids": [3, 5, 7, 9]}
    assert not list(tmp_path.glob(".*.tmp"))  # written beside, then renamed


def test_snapshot_from_reference_restores_into_aoti_of_the_same_model(toys: dict[str, Path]) -> None:
    reference, aoti = etsdk.load(toys["reference"]), etsdk.load(toys["aoti"])
    assert reference.fingerprint is not None and reference.fingerprint == aoti.fingerprint
    assert reference.delegates("decode") != aoti.delegates("decode")
    session = reference.new_session()
    reference.run("prefill", PROMPT, torch.arange(T), session=session)
    snapshot = session.snapshot()
    moved = aoti.new_session()
    moved.restore(snapshot)
    want = _decode(reference, session)
    got = _decode(aoti, moved)
    for a, b in zip(want, got):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("other_model", r"another model \(weights fingerprint"),
        ("other_s", r"state 'k0' shape: the snapshot has \[1, 2, 16, 8\], the program \[1, 2, 24, 8\]"),
    ],
)
def test_restore_into_another_model_or_another_s_is_refused(target: str, message: str, toys: dict[str, Path], tmp_path: Path) -> None:
    source = etsdk.load(toys["reference"])
    session = source.new_session()
    source.run("prefill", PROMPT, torch.arange(T), session=session)
    path = session.save(tmp_path / "s.safetensors")
    other = etsdk.load(toys[target])
    assert other.fingerprint != source.fingerprint
    victim = other.new_session()
    before = {n: t.clone() for n, t in victim.state.items()}
    for attempt in (lambda: victim.restore(session.snapshot()), lambda: Session.load(path, other)):
        with pytest.raises(StateError, match=message):
            attempt()
    assert all(torch.equal(victim.state[n], t) for n, t in before.items())  # nothing changed


def test_a_program_without_a_fingerprint_refuses_snapshots_but_forks(program: etsdk.Program, tmp_path: Path) -> None:
    program._record = dataclasses.replace(program.record, model=None)  # as if exported before format 1.1
    assert program.fingerprint is None
    session = program.new_session()
    with pytest.raises(StateError, match="no model fingerprint.*re-export"):
        session.snapshot()
    with pytest.raises(StateError, match="re-export"):
        session.save(tmp_path / "never.safetensors")
    assert not list(tmp_path.iterdir())
    session.fork()  # same program by construction: no identity needed


def test_program_record_fingerprint_is_read_strictly(program: etsdk.Program) -> None:
    record = json.loads(program.record.to_bytes())
    assert record["format_version"] == [2, 1] and set(record["model"]) == {"weights", "states"}
    old = dict(record, format_version=[2, 0])
    del old["model"]
    assert ProgramRecord.from_bytes(json.dumps(old).encode(), "old.pte").model is None
    for bad in ({"weights": "xyz", "states": record["model"]["states"]}, {"weights": record["model"]["weights"]}, "abc", 7):
        with pytest.raises(ProgramError, match="model fingerprint"):
            ProgramRecord.from_bytes(json.dumps(dict(record, model=bad)).encode(), "bad.pte")


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
