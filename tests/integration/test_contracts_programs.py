"""Contract records against a real program (the kv_decoder toy on the reference backend).

An unknown contract or version, a record drifting from its spec, engine I/O differing from the record:
each refused at load. (Specs and records alone: tests/unit/test_contracts.py.)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import etsdk
import pytest
from etsdk._plugins.core_plugin import CONTRACTS_DIR
from etsdk._state.contract import Contract, ContractError
from etsdk.errors import EtsdkError
from etsdk.reference_backend import BACKEND_ID
from etsdk.testing.toy_decoder import ToyDecoder, kv_decoder_contract, kv_decoder_methods

SPEC_PATH = CONTRACTS_DIR / "kv_decoder" / "1.json"
SIZES = {"T": 4, "S": 16, "H": 2, "D": 8, "V": 32, "L": 2}


# ----------------------------------------------------------------------------- through real programs


@pytest.fixture(scope="module")
def toy_pte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = ToyDecoder(seed=2).eval()
    path = tmp_path_factory.mktemp("contract") / "toy.pte"
    methods = kv_decoder_methods(model, 4, prefill_backends=(BACKEND_ID,), decode_backends=(BACKEND_ID,))
    etsdk.lower(methods, contract=kv_decoder_contract(model, 4)).save(path)
    return path


def _patched(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    """The program with ``old`` replaced by ``new`` inside its record, and the record's content key resealed
    (an edited record under its old key is refused as damaged before its contract is read)."""
    assert len(old) == len(new)
    data = src.read_bytes()
    start = data.index(b'{"format":"etsdk.program"')
    _, length = json.JSONDecoder().raw_decode(data[start:].decode("latin-1"))
    at = data.index(old, start)
    data = data[:at] + new + data[at + len(old) :]
    before = hashlib.sha256(src.read_bytes()[start : start + length]).hexdigest().encode()
    after = hashlib.sha256(data[start : start + length]).hexdigest().encode()
    assert data.count(b"etsdk/program/" + before) == 1
    dst.write_bytes(data.replace(b"etsdk/program/" + before, b"etsdk/program/" + after))
    return dst


def test_unknown_contract_and_version_are_refused(toy_pte: Path, tmp_path: Path) -> None:
    unknown = _patched(toy_pte, tmp_path / "unknown.pte", b'"name":"kv_decoder","version":1', b'"name":"kv_decodex","version":1')
    with pytest.raises(EtsdkError, match="no installed etsdk plugin provides contract 'kv_decodex'"):
        etsdk.load(unknown)
    newer = _patched(toy_pte, tmp_path / "newer.pte", b'"name":"kv_decoder","version":1', b'"name":"kv_decoder","version":7')
    with pytest.raises(EtsdkError, match="contract 'kv_decoder' version 7 is not supported by this installation; supported versions: 1"):
        etsdk.load(newer)


def test_record_drifting_from_spec_is_refused_at_load(toy_pte: Path, tmp_path: Path) -> None:
    drift = _patched(toy_pte, tmp_path / "drift.pte", b'"name":"tokens","role":"tokens","dtype":"int64"', b'"name":"tokens","role":"tokens","dtype":"int32"')
    with pytest.raises(ContractError, match="drift.pte: method 'prefill' input 0: expected 'tokens' \\(tokens, int64 \\[1, 4\\]\\), found 'tokens' \\(tokens, int32"):
        etsdk.load(drift)


def test_engine_io_is_checked_against_the_record(toy_pte: Path) -> None:
    from etsdk._runtime.program import _check_engine_io

    program = etsdk.load(toy_pte)
    other = Contract.from_bytes(SPEC_PATH.read_bytes()).bind(**{**SIZES, "T": 5})
    with pytest.raises(ContractError, match="method 'prefill' input 0 \\('tokens', role tokens\\): expected int64 \\[1, 5\\], found int64 \\[1, 4\\]"):
        _check_engine_io(program, other)
    wider = Contract.from_bytes(SPEC_PATH.read_bytes()).bind(**{**SIZES, "V": 33})
    with pytest.raises(ContractError, match="method 'prefill' output 0 \\('logits', role logits\\): expected float32 \\[1, 4, 33\\], found float32 \\[1, 4, 32\\]"):
        _check_engine_io(program, wider)
