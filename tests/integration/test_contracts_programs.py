"""Contract records against a real program (the kv_decoder toy on the reference backend).

An unknown contract or version, a record drifting from its spec, engine I/O differing from the record:
each refused at load. (Specs and records alone: tests/unit/test_contracts.py.)
"""

from __future__ import annotations

from pathlib import Path

import etsdk
import pytest
from etsdk._plugins.core_plugin import CONTRACTS_DIR
from etsdk._state.contract import Contract, ContractError
from etsdk.errors import EtsdkError
from etsdk.reference_backend import BACKEND_ID
from etsdk.testing.toy_decoder import ToyDecoder, kv_decoder_contract, kv_decoder_methods

from tests.backends import patched_record

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


def test_unknown_contract_and_version_are_refused(toy_pte: Path, tmp_path: Path) -> None:
    unknown = patched_record(toy_pte, tmp_path / "unknown.pte", b'"name":"kv_decoder","version":1', b'"name":"kv_decodex","version":1')
    with pytest.raises(EtsdkError, match="no installed etsdk plugin provides contract 'kv_decodex'"):
        etsdk.load(unknown)
    newer = patched_record(toy_pte, tmp_path / "newer.pte", b'"name":"kv_decoder","version":1', b'"name":"kv_decoder","version":7')
    with pytest.raises(EtsdkError, match="contract 'kv_decoder' version 7 is not supported by this installation; supported versions: 1"):
        etsdk.load(newer)


def test_record_drifting_from_spec_is_refused_at_load(toy_pte: Path, tmp_path: Path) -> None:
    drift = patched_record(toy_pte, tmp_path / "drift.pte", b'"name":"tokens","role":"tokens","dtype":"int64"', b'"name":"tokens","role":"tokens","dtype":"int32"')
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
