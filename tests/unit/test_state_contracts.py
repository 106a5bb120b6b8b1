"""State declarations without a program: caller-owned only, and a device this machine lacks is refused.

Through real programs (the reference backend and etsdk-aoti): tests/integration/test_state.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from etsdk._state.session import Session, StateError
from etsdk.errors import ContractError
from etsdk.testing.toy_decoder import ToyDecoder, kv_decoder_contract

T = 4


def test_runtime_owned_state_is_refused_with_the_state_named() -> None:
    """All state is caller-owned: a contract declaring storage kept below a delegate is refused when read."""
    from etsdk._plugins.core_plugin import CONTRACTS_DIR
    from etsdk._state.contract import Contract

    obj = json.loads((CONTRACTS_DIR / "kv_decoder" / "1.json").read_text())
    obj["states"][0]["ownership"] = "runtime"
    with pytest.raises(ContractError, match=r"states\[0\]\.ownership: unknown ownership 'runtime' \(known: caller\)"):
        Contract.from_json(obj)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is absent")
def test_record_for_a_cuda_export_conforms_but_needs_a_device() -> None:
    from etsdk._plugins.core_plugin import CONTRACTS_DIR
    from etsdk._state.contract import Contract

    spec = Contract.from_bytes((CONTRACTS_DIR / "kv_decoder" / "1.json").read_bytes())
    record = kv_decoder_contract(ToyDecoder(), T).with_state_device("cuda")
    assert {s.device for s in record.states} == {"cuda"}
    record.check_conforms_to(spec)  # where storage lives is not part of the contract
    with pytest.raises(StateError, match="must live on cuda"):
        Session(record)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is absent")
def test_state_on_a_missing_device_is_refused() -> None:
    from etsdk._state.contract import Contract, MethodSpec, Role, StateSpec

    contract = Contract(
        "dev", 1, methods=(MethodSpec("m", (), ()),), states=(StateSpec("k", Role.KV_CACHE_KEY, "float32", (2,), device="cuda"),)
    )
    with pytest.raises(StateError, match="must live on cuda, but no CUDA device is available"):
        Session(contract)
