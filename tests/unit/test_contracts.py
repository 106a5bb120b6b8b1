"""Contract specifications and records: strict parsing, aliasing rules, version skew, load-time checks."""

from __future__ import annotations

import json
from typing import Any

import etsdk
import pytest
from etsdk._plugins.core_plugin import CONTRACTS_DIR
from etsdk._state.contract import AliasKind, Contract, ContractError, Ownership
from etsdk._state.signature import ProgramRecord
from etsdk.errors import EtsdkError, UnsupportedFeatureError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SPEC_PATH = CONTRACTS_DIR / "kv_decoder" / "1.json"
SIZES = {"T": 4, "S": 16, "H": 2, "D": 8, "V": 32, "L": 2}


def spec_json() -> dict[str, Any]:
    return json.loads(SPEC_PATH.read_text())


def record() -> Contract:
    return Contract.from_bytes(SPEC_PATH.read_bytes()).bind(**SIZES)


def test_spec_binds_into_a_concrete_record() -> None:
    r = record()
    assert r.is_bound
    decode = r.method("decode")
    assert [i.name for i in decode.engine_inputs] == ["tokens", "positions"]
    assert [o.name for o in decode.engine_outputs] == ["logits"]
    assert decode.states_read == ("k0", "k1", "v0", "v1")
    k0_out = next(o for o in decode.outputs if o.name == "k0_out")
    assert k0_out.alias is not None and k0_out.alias.kind is AliasKind.KV_CACHE_UPDATE
    assert k0_out.alias.ownership is Ownership.CALLER and k0_out.shape == (1, 2, 16, 8) and k0_out.layer == 0
    assert Contract.from_bytes(r.to_bytes()) == r
    r.check_conforms_to(Contract.from_bytes(SPEC_PATH.read_bytes()))


def test_binding_errors() -> None:
    spec = Contract.from_bytes(SPEC_PATH.read_bytes())
    with pytest.raises(ContractError, match="dims .* need sizes"):
        spec.bind(T=4)
    with pytest.raises(ContractError, match="has no dim 'Q'"):
        spec.bind(Q=3, **SIZES)
    with pytest.raises(ContractError, match="positive integer"):
        spec.bind(**{**SIZES, "S": 0})


def _mutate(path: list[Any], value: Any) -> dict[str, Any]:
    obj = spec_json()
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (["methods", "decode", "inputs", 0, "role"], "tokenz", "methods.decode.inputs\\[0\\].role: unknown role 'tokenz' \\(known: tokens"),
        (["methods", "decode", "outputs", 0, "alias", "kind"], "magic", "unknown aliaskind 'magic' \\(known: kv_cache_update, user\\)"),
        (["methods", "decode", "outputs", 0, "alias", "ownership"], "delegate", "unknown ownership 'delegate'"),
        (["methods", "decode", "inputs", 1, "dtype"], "int63", "unknown dtype 'int63'"),
        (["methods", "decode", "inputs", 1, "shape"], [1, -2], "expected a non-negative integer or a dim name, found -2"),
        (["methods", "decode", "inputs", 1, "shape"], "1", "expected a list, found '1'"),
        (["version"], "1", "version: expected an integer, found '1'"),
        (["format"], "other", "has format 'other', expected 'etsdk.contract'"),
        (["methods"], {}, "at least one method"),
        (["states", 0, "initial"], "zero", "initial: expected a number"),
        (["name"], _DELETE, "name: expected a non-empty string, found None"),
        (["methods", "decode", "inputs", 0, "alias"], {"input": "x", "kind": "user", "ownership": "caller", "state": "k0"}, "only outputs may alias"),
    ],
)
def test_malformed_specs_are_rejected_precisely(path: list[Any], value: Any, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        Contract.from_json(_mutate(path, value))


def test_required_feature_and_format_skew() -> None:
    with pytest.raises(UnsupportedFeatureError, match="requires feature\\(s\\) state.teleported") as info:
        Contract.from_json(_mutate(["required_features"], ["state.caller_owned", "state.teleported"]))
    assert info.value.feature == "state.teleported"
    with pytest.raises(UnsupportedFeatureError, match="contract format 2.0 is newer"):
        Contract.from_json(_mutate(["format_version"], [2, 0]))
    # an older-or-equal major with a newer minor still reads
    assert Contract.from_json(_mutate(["format_version"], [1, 9])).name == "kv_decoder"


def _record_json() -> dict[str, Any]:
    return record().to_json()


def test_alias_rules_on_records() -> None:
    obj = _record_json()
    k0_out = next(o for o in obj["methods"]["decode"]["outputs"] if o["name"] == "k0_out")
    k0_out["shape"] = [1, 2, 16, 4]
    with pytest.raises(ContractError, match="alias sides differ: input 'k0_in' is float32 \\[1, 2, 16, 8\\], output is float32 \\[1, 2, 16, 4\\]"):
        Contract.from_json(obj)
    obj = _record_json()
    next(o for o in obj["methods"]["decode"]["outputs"] if o["name"] == "k0_out")["alias"]["input"] = "nothing"
    with pytest.raises(ContractError, match="aliases input 'nothing', which method 'decode' lacks"):
        Contract.from_json(obj)
    obj = _record_json()
    next(o for o in obj["methods"]["decode"]["outputs"] if o["name"] == "k0_out")["alias"]["ownership"] = "runtime"
    with pytest.raises(ContractError, match="alias.ownership: unknown ownership 'runtime' \\(known: caller\\)"):
        Contract.from_json(obj)
    obj = _record_json()
    obj["states"] = [s for s in obj["states"] if s["name"] != "v1"]
    with pytest.raises(ContractError, match="undeclared state 'v1'"):
        Contract.from_json(obj)


def test_record_must_conform_to_the_registered_spec() -> None:
    spec = Contract.from_bytes(SPEC_PATH.read_bytes())
    obj = _record_json()
    obj["dims"]["S"] = None
    with pytest.raises(ContractError, match="leaves dim\\(s\\) S unbound"):
        Contract.from_json(obj).check_conforms_to(spec)
    obj = _record_json()
    obj["methods"]["decode"]["inputs"][1]["role"] = "mask"
    with pytest.raises(ContractError, match="method 'decode' input 1: expected 'positions' \\(positions, int64 \\[1\\]\\), found 'positions' \\(mask"):
        Contract.from_json(obj).check_conforms_to(spec)
    obj = _record_json()
    del obj["methods"]["prefill"]
    with pytest.raises(ContractError, match="program lacks method 'prefill'"):
        Contract.from_json(obj).check_conforms_to(spec)


def test_program_record_rejects_bad_bytes() -> None:
    with pytest.raises(etsdk.ProgramError, match="not valid JSON"):
        ProgramRecord.from_bytes(b"\xff", "x.pte")
    with pytest.raises(etsdk.ProgramError, match="expected 'etsdk.program'"):
        ProgramRecord.from_bytes(b'{"format":"nope"}', "x.pte")
    with pytest.raises(UnsupportedFeatureError, match="format 3.0 is newer"):
        ProgramRecord.from_bytes(b'{"format":"etsdk.program","format_version":[3,0],"methods":{}}', "x.pte")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_contract_records_raise_only_etsdk_errors(data: st.DataObject) -> None:
    raw = bytearray(record().to_bytes())
    for _ in range(data.draw(st.integers(1, 5))):
        position = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if kind == "flip":
            raw[position] = data.draw(st.sampled_from(list(b'{}[]",:0123456789-abcxyz \x00\xff')))
        elif kind == "cut":
            del raw[position : position + data.draw(st.integers(1, 12))]
        else:
            raw[position:position] = data.draw(st.binary(min_size=1, max_size=6))
    spec = Contract.from_bytes(SPEC_PATH.read_bytes())
    try:
        Contract.from_bytes(bytes(raw)).check_conforms_to(spec)
    except EtsdkError:
        pass
    try:
        ProgramRecord.from_bytes(bytes(raw), "fuzz")
    except EtsdkError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=6),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(
            ["name", "role", "dtype", "shape", "state", "alias", "inputs", "outputs", "methods", "states", "format",
             "format_version", "version", "dims", "kind", "ownership", "input", "initial", "repeat", "layer"]
        ), children, max_size=6),
        max_leaves=25,
    )
)
def test_structured_garbage_raises_only_etsdk_errors(obj: Any) -> None:
    spec = Contract.from_bytes(SPEC_PATH.read_bytes())
    for candidate in (obj, {**spec_json(), "methods": obj}, {**spec_json(), "states": obj}, {**_record_json(), "dims": obj}):
        try:
            Contract.from_json(candidate).check_conforms_to(spec)
        except EtsdkError:
            pass


def test_a_dim_that_only_counts_repeated_entries_may_be_zero() -> None:
    """hf_static v2 counts full and sliding-window layers apart; a model may have none of one kind."""
    spec = Contract.from_bytes((CONTRACTS_DIR / "hf_static" / "2.json").read_bytes())
    assert spec.sized_dims == {"T", "S", "R", "H", "D", "V", "B"}  # B: the optional decode_batch's slots and rows
    bound = spec.bind(T=4, S=16, R=9, H=2, D=8, V=32, L=0, LW=2)
    assert [s.name for s in bound.states] == ["kw0", "kw1", "vw0", "vw1"]
    again = Contract.from_bytes(bound.to_bytes())  # a record with L=0 reads back and conforms
    again.check_conforms_to(spec)
    with pytest.raises(ContractError, match=r"dim 'R' must be a positive integer, found 0"):
        spec.bind(T=4, S=16, R=0, H=2, D=8, V=32, L=1, LW=0)
    with pytest.raises(ContractError, match=r"dim 'L' must be a non-negative integer \(it only counts repeated entries\), found -1"):
        spec.bind(T=4, S=16, R=9, H=2, D=8, V=32, L=-1, LW=0)
    obj = spec_json()
    obj["dims"]["S"] = 0
    with pytest.raises(ContractError, match=r"dims.S: expected a positive integer or null, found 0 \(only a dim that counts"):
        Contract.from_json(obj)
