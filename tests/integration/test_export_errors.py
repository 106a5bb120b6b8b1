"""Export refuses what it cannot make correct, before writing anything."""

from __future__ import annotations

import etsdk
import pytest
import torch
from etsdk._export.lower import MethodSource
from etsdk.reference_backend import BACKEND_ID
from etsdk.testing.toy_decoder import ToyDecoder, kv_decoder_contract, kv_decoder_methods


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x + self.count


def _lower(model: ToyDecoder, contract: object = None, **kw: object) -> None:
    methods = kv_decoder_methods(model, 4, prefill_backends=(BACKEND_ID,), decode_backends=(BACKEND_ID,))
    etsdk.lower(methods, contract=contract if contract is not None else kv_decoder_contract(model, 4), **kw)  # type: ignore[arg-type]


def test_undeclared_mutated_buffer() -> None:
    with pytest.raises(etsdk.ExportError, match="mutates buffer\\(s\\) count that are not declared as state"):
        etsdk.lower(module=Counter(), example_inputs=(torch.randn(1),), backend=BACKEND_ID)


def test_state_without_contract() -> None:
    model = ToyDecoder()
    methods = kv_decoder_methods(model, 4, prefill_backends=(BACKEND_ID,), decode_backends=(BACKEND_ID,))
    with pytest.raises(etsdk.ExportError, match="declares state but no contract was given"):
        etsdk.lower(methods)


def test_buffer_shape_must_match_declared_state() -> None:
    model = ToyDecoder(capacity=16)
    contract = kv_decoder_contract(ToyDecoder(capacity=32), 4)
    with pytest.raises(etsdk.ExportError, match="buffer 'k_cache_0' is float32 \\[1, 2, 16, 8\\] but state 'k0' is declared float32 \\[1, 2, 32, 8\\]"):
        _lower(model, contract)


def test_stale_buffer_contents_are_refused() -> None:
    model = ToyDecoder()
    model.k_cache_1[0, 0, 0, 0] = 3.0
    with pytest.raises(etsdk.ExportError, match="buffer 'k_cache_1' holds values other than state 'k1''s declared initial value 0.0"):
        _lower(model)


def test_engine_inputs_must_follow_the_contract() -> None:
    model = ToyDecoder()
    contract = kv_decoder_contract(model, 5)  # the contract says T=5, the example says 4
    with pytest.raises(etsdk.ExportError, match="method 'prefill' input 0 \\('tokens', role tokens\\): expected int64 \\[1, 5\\], found int64 \\[1, 4\\]"):
        _lower(model, contract)


def test_missing_method_and_unmapped_state() -> None:
    model = ToyDecoder()
    contract = kv_decoder_contract(model, 4)
    methods = kv_decoder_methods(model, 4, prefill_backends=(BACKEND_ID,), decode_backends=(BACKEND_ID,))
    with pytest.raises(etsdk.ExportError, match="needs method\\(s\\) decode that were not given"):
        etsdk.lower({"prefill": methods["prefill"]}, contract=contract)
    partial = {k: v for k, v in model.state_fqns().items() if k != "v_cache_1"}
    src = methods["decode"]
    methods["decode"] = MethodSource(src.module, src.example_inputs, src.backends, state=partial)
    with pytest.raises(etsdk.ExportError, match="method 'decode' uses state\\(s\\) v1 per contract 'kv_decoder' but maps no buffer"):
        etsdk.lower(methods, contract=contract)


def test_state_used_outside_the_delegate() -> None:
    model = ToyDecoder()
    methods = kv_decoder_methods(model, 4, prefill_backends=(BACKEND_ID,), decode_backends=(BACKEND_ID,))
    options = {BACKEND_ID: {"ops": ["aten::linear", "aten::embedding"]}}  # claims no op touching the caches
    methods = {k: MethodSource(v.module, v.example_inputs, v.backends, options, state=v.state) for k, v in methods.items()}
    with pytest.raises(etsdk.ExportError, match="state buffer\\(s\\) .* stayed in the top-level program"):
        etsdk.lower(methods, contract=kv_decoder_contract(model, 4))


def test_unbound_contract_is_refused() -> None:
    from etsdk._plugins.core_plugin import CONTRACTS_DIR
    from etsdk._state.contract import Contract

    spec = Contract.from_bytes((CONTRACTS_DIR / "kv_decoder" / "1.json").read_bytes())
    with pytest.raises(etsdk.ExportError, match="must be bound to sizes"):
        _lower(ToyDecoder(), spec)
