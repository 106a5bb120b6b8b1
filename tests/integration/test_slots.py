"""A method over several sessions: ``kv_decoder`` v2's ``decode_batch`` binds slot j to the j-th session.

The toy decoder through the real runtime and the core's reference backend: each row of one batched step computes
what a decode step computes on that session alone, each session's storage is updated in place and no other; the
calls and exports that would mix sessions up are refused before anything runs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import etsdk
import pytest
import torch
from etsdk import StateSlot
from etsdk._state.contract import Contract
from etsdk.errors import ContractError, ExportError, StateError, UnsupportedFeatureError
from etsdk.reference_backend import BACKEND_ID
from etsdk.testing.toy_decoder import BatchedToyDecoder, ToyDecoder, kv_decoder_contract, kv_decoder_methods

T = 4
B = 3
PROMPTS = ([[3, 5, 7, 9]], [[1, 2, 3, 4]], [[9, 9, 2, 0]])


def _methods(model: ToyDecoder, *, batch: BatchedToyDecoder | None = None, state: dict | None = None) -> dict[str, etsdk.MethodSource]:
    methods = kv_decoder_methods(model, T, prefill_backends=(BACKEND_ID,), decode_backends=(BACKEND_ID,))
    if batch is not None:
        example = (torch.zeros(batch.slots, 1, dtype=torch.long), torch.zeros(batch.slots, dtype=torch.long))
        methods["decode_batch"] = etsdk.MethodSource(batch, example, (BACKEND_ID,), state=state if state is not None else batch.state_slots())
    return methods


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("slots")
    model = ToyDecoder(seed=3).eval()
    batched = root / "batched.pte"
    etsdk.lower(_methods(model, batch=BatchedToyDecoder(model, B)), contract=kv_decoder_contract(model, T, slots=B)).save(batched)
    plain = root / "plain.pte"  # v2 without its optional method
    etsdk.lower(_methods(model), contract=kv_decoder_contract(model, T, slots=B)).save(plain)
    return {"batched": batched, "plain": plain}


@pytest.fixture
def program(programs: dict[str, Path]) -> etsdk.Program:
    return etsdk.load(programs["batched"])


def _prefilled(program: etsdk.Program) -> list[etsdk.Session]:
    sessions = []
    for index, prompt in enumerate(PROMPTS):
        session = program.new_session()
        program.run("prefill", torch.tensor(prompt), torch.arange(T), session=session)
        for step in range(index):  # conversations of different lengths
            program.run("decode", torch.tensor([[step + 1]]), torch.tensor([T + step]), session=session)
        sessions.append(session)
    return sessions


def test_each_row_computes_its_sessions_decode_step_in_place(program: etsdk.Program) -> None:
    sessions = _prefilled(program)
    alone = [s.fork() for s in sessions]
    pointers = [{n: t.data_ptr() for n, t in s.state.items()} for s in sessions]
    tokens = torch.tensor([[6], [2], [8]])
    positions = torch.tensor([T + i for i in range(B)])
    for _ in range(3):  # several steps: each writes its own row of each session
        batched = program.run("decode_batch", tokens, positions, sessions=sessions)[0]
        assert batched.shape == (B, 1, 32)
        for j in range(B):
            want = program.run("decode", tokens[j : j + 1], positions[j : j + 1], session=alone[j])[0]
            torch.testing.assert_close(batched[j : j + 1], want, atol=1e-5, rtol=1e-5)
            for name, tensor in sessions[j].state.items():
                # within float rounding: a product of B rows may sum in another order than one of 1 (it did on an
                # AVX-512 / AMX host); a row written to the wrong position or slot differs by the values themselves
                torch.testing.assert_close(tensor, alone[j].state[name], atol=1e-5, rtol=1e-5,
                                           msg=lambda m, j=j, name=name: f"slot {j}: state '{name}' differs from its own decode: {m}")
                assert tensor.data_ptr() == pointers[j][name], f"slot {j}: state '{name}' was replaced, not updated"
        tokens, positions = tokens.flip(0), positions + 1


def test_order_of_sessions_is_the_order_of_rows(program: etsdk.Program) -> None:
    sessions = _prefilled(program)
    swapped = [s.fork() for s in sessions]
    swapped[0], swapped[2] = swapped[2], swapped[0]
    tokens, positions = torch.tensor([[6], [2], [8]]), torch.tensor([T, T + 1, T + 2])
    out = program.run("decode_batch", tokens, positions, sessions=sessions)[0]
    flipped = program.run("decode_batch", tokens.flip(0), positions.flip(0), sessions=swapped)[0]
    torch.testing.assert_close(out, flipped.flip(0), atol=1e-5, rtol=1e-5)


def test_calls_that_mix_sessions_up_are_refused_before_running(program: etsdk.Program, programs: dict[str, Path]) -> None:
    sessions = _prefilled(program)
    before = [{n: t.clone() for n, t in s.state.items()} for s in sessions]
    tokens, positions = torch.tensor([[6], [2], [8]]), torch.tensor([T, T, T])
    other = etsdk.load(programs["batched"]).new_session()
    cases = [
        ({}, "runs over 3 sessions: pass sessions="),
        ({"session": sessions[0]}, "runs over 3 sessions: pass sessions="),
        ({"sessions": sessions[:2]}, "runs over 3 session(s), one per slot; 2 given"),
        ({"sessions": [sessions[0], sessions[1], sessions[0]]}, "one session is given for slots 0 and 2"),
        ({"sessions": [sessions[0], sessions[1], other]}, "belongs to another program"),
        ({"sessions": [sessions[0], sessions[1], "s"]}, "session 2 is str"),
        ({"sessions": sessions[0]}, "sessions= takes a sequence of sessions"),
        ({"sessions": sessions, "session": sessions[0]}, "pass session= or sessions=, not both"),
    ]
    for kwargs, message in cases:
        with pytest.raises(StateError, match=message.replace("(", r"\(").replace(")", r"\)")):
            program.run("decode_batch", tokens, positions, **kwargs)
    for session, saved in zip(sessions, before):
        assert all(torch.equal(session.state[n], t) for n, t in saved.items())
    # an ordinary method takes sessions= with its one session, and nothing more
    program.run("decode", tokens[:1], positions[:1], sessions=[sessions[0]])
    with pytest.raises(StateError, match="runs over 1 session"):
        program.run("decode", tokens[:1], positions[:1], sessions=sessions[:2])


def test_optional_method_left_out_and_slots_recorded(programs: dict[str, Path]) -> None:
    plain = etsdk.load(programs["plain"])
    assert "decode_batch" not in plain.methods and [m.name for m in plain.contract.methods] == ["prefill", "decode"]
    batched = etsdk.load(programs["batched"])
    spec = batched.contract.method("decode_batch")
    assert (spec.slots, spec.optional) == (B, True) and batched.load_method("decode_batch").slots == B
    slots = sorted({s.slot for d in batched.record.methods["decode_batch"] for s in d.signature.states})
    assert slots == list(range(B))
    assert all(s.slot == 0 for d in batched.record.methods["decode"] for s in d.signature.states)


def test_exports_that_leave_a_slot_unbound_are_refused(tmp_path: Path) -> None:
    model = ToyDecoder(seed=3).eval()
    batch = BatchedToyDecoder(model, B)
    full = batch.state_slots()
    contract = kv_decoder_contract(model, T, slots=B)
    missing = {k: v for k, v in full.items() if k != "k_cache_1_s2"}
    with pytest.raises(ExportError, match="k1 of slot 2"):
        etsdk.lower(_methods(model, batch=batch, state=missing), contract=contract)
    beyond = {**full, "k_cache_1_s2": StateSlot("k1", 3)}
    with pytest.raises(ExportError, match=r"'k_cache_1_s2' \(slot 3\) name a slot the method lacks"):
        etsdk.lower(_methods(model, batch=batch, state=beyond), contract=contract)
    twice = {**full, "k_cache_1_s2": StateSlot("k1", 1)}
    with pytest.raises(ExportError, match="both hold state 'k1 of slot 1'"):
        etsdk.lower(_methods(model, batch=batch, state=twice), contract=contract)
    with pytest.raises(ExportError, match="must be a state identity or an etsdk.StateSlot"):
        etsdk.lower(_methods(model, batch=batch, state={**full, "k_cache_1_s2": ("k1", 2)}), contract=contract)
    with pytest.raises(ExportError, match="needs method\\(s\\) decode"):
        etsdk.lower({"prefill": _methods(model)["prefill"]}, contract=contract)


def _spec(method: dict, features: list[str]) -> dict:
    return {
        "format": "etsdk.contract", "format_version": [1, 0], "name": "c", "version": 1, "required_features": features,
        "dims": {"B": None}, "methods": {"step": method},
    }


def test_contract_slots_and_optional_need_their_features() -> None:
    method = {"slots": "B", "inputs": [{"name": "x", "role": "tokens", "dtype": "int64", "shape": ["B", 1]}], "outputs": []}
    with pytest.raises(ContractError, match="must require feature method.slots"):
        Contract.from_json(_spec(method, []))
    with pytest.raises(ContractError, match="must require feature method.optional"):
        Contract.from_json(_spec({**method, "optional": True}, ["method.slots"]))
    with pytest.raises(ContractError, match="optional: expected true or false"):
        Contract.from_json(_spec({**method, "optional": "yes"}, ["method.slots", "method.optional"]))
    spec = Contract.from_json(_spec({**method, "optional": True}, ["method.slots", "method.optional"]))
    record = spec.bind(B=4)
    assert (record.method("step").slots, record.method("step").optional) == (4, True)
    assert Contract.from_bytes(record.to_bytes()) == record
    with pytest.raises(ContractError, match="dim 'B' must be a positive integer"):
        spec.bind(B=0)
    # a reader that lacks the feature refuses the record (fail closed) rather than binding one session
    import etsdk._state.contract as contract_module

    known = contract_module.KNOWN_CONTRACT_FEATURES
    try:
        contract_module.KNOWN_CONTRACT_FEATURES = known - {"method.slots"}
        with pytest.raises(UnsupportedFeatureError, match="method.slots"):
            Contract.from_bytes(record.to_bytes())
    finally:
        contract_module.KNOWN_CONTRACT_FEATURES = known


def test_an_optional_method_sized_by_an_unbound_dim_is_left_out() -> None:
    step = {"slots": "B", "optional": True, "inputs": [{"name": "x", "role": "tokens", "dtype": "int64", "shape": ["B", 1]}], "outputs": []}
    plain = {"inputs": [{"name": "x", "role": "tokens", "dtype": "int64", "shape": ["N", 1]}], "outputs": []}
    obj = _spec(step, ["method.slots", "method.optional"])
    obj["dims"]["N"] = None
    obj["methods"]["plain"] = plain
    spec = Contract.from_json(obj)
    record = spec.bind(N=2)  # no B: the record of a program without the optional method, as an older reader knows it
    assert [m.name for m in record.methods] == ["plain"] and record.required_features == () and "B" not in record.dims
    both = spec.bind(N=2, B=3)
    assert both.required_features == ("method.slots", "method.optional")
    assert both.for_methods(["plain"]) == replace(record, dims={"N": 2, "B": 3})
    with pytest.raises(ContractError, match="dims N need sizes"):
        spec.bind(B=3)


def test_a_record_whose_slots_or_optional_differ_from_the_specification_is_refused() -> None:
    step = {"slots": "B", "optional": True, "inputs": [{"name": "x", "role": "tokens", "dtype": "int64", "shape": ["B", 1]}], "outputs": []}
    spec = Contract.from_json(_spec(step, ["method.slots", "method.optional"]))
    record = spec.bind(B=2)
    for changed, found in (({"slots": 3}, "over 3 session"), ({"optional": False}, "a required method")):
        altered = replace(record, methods=(replace(record.methods[0], **changed),), dims={"B": 2})
        with pytest.raises(ContractError, match=found):
            altered.check_conforms_to(spec)
    assert spec.bind(B=1).required_features == ("method.optional",)  # one slot: an ordinary method, no slots feature
