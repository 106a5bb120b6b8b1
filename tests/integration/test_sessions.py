"""Sessions that can be snapshotted, restored, forked, saved and loaded, across backends; model identity.

The toy decoder (``kv_decoder`` contract) through the real runtime: the core's
reference backend, and etsdk-aoti for the cross-backend cases (one compile,
shared by the module).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import etsdk
import pytest
import torch
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
    assert record["format_version"] == [2, 3] and set(record["model"]) == {"weights", "states"}
    old = dict(record, format_version=[2, 0])
    del old["model"]
    assert ProgramRecord.from_bytes(json.dumps(old).encode(), "old.pte").model is None
    for bad in ({"weights": "xyz", "states": record["model"]["states"]}, {"weights": record["model"]["weights"]}, "abc", 7):
        with pytest.raises(ProgramError, match="model fingerprint"):
            ProgramRecord.from_bytes(json.dumps(dict(record, model=bad)).encode(), "bad.pte")
