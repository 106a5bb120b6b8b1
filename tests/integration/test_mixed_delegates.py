"""Several backends inside one method, in any order, any of them claiming the state operators.

Two test backends built from the reference backend's parts: ``EtsdkChainA`` claims ``addmm`` (the two linear
layers), ``EtsdkChainB`` claims everything else (the cache update and the attention reading it). Lowered as
(A, B) the method is A -> B -> A; lowered as (B, A) the passes run the other way round. Both match eager with
the caller's cache updated in place, and a tensor crossing from one backend to the other is handed over in the
runtime's memory without a copy.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import etsdk
import pytest
import torch
from etsdk.backend import OperatorPartitioner, aten_name
from etsdk.reference_backend.runtime import ReferenceBinding

from tests.backends import make_backend_plugin

S, D = 8, 4
CONTRACT = Path(__file__).resolve().parent / "data" / "chain_cache.json"
POINTERS: dict[str, list[tuple[int, list[int], int]]] = {}  # backend -> [(handle id, arg pointers, num inputs)]


class Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.w1, self.b1 = torch.nn.Parameter(torch.randn(D, D)), torch.nn.Parameter(torch.randn(D))
        self.w2, self.b2 = torch.nn.Parameter(torch.randn(D, D)), torch.nn.Parameter(torch.randn(D))
        self.register_buffer("k", torch.zeros(S, D))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = torch.addmm(self.b1, x, self.w1)  # A
        self.k.index_copy_(0, positions, h)  # B: the cache update
        attention = torch.softmax(h @ self.k.t(), dim=-1) @ self.k  # B: reads the updated cache
        return torch.addmm(self.b2, attention, self.w2)  # A


class Recording(ReferenceBinding):
    def __init__(self, backend: str) -> None:
        self.backend = backend

    def init(self, context: Any) -> Any:
        handle = super().init(context)
        inner = handle.execute
        inputs = len(context.signature.inputs)

        def execute(args: Any, state: Any) -> None:
            POINTERS.setdefault(self.backend, []).append((id(handle), [a.data_ptr() for a in args], inputs))
            inner(args, state)

        handle.execute = execute
        return handle


def _not_addmm(backend: str) -> Any:
    def factory(**options: Any) -> Any:
        return OperatorPartitioner(backend, supports=lambda n: aten_name(n.target) not in (None, "aten::addmm"))

    return factory


@pytest.fixture(scope="module", autouse=True)
def backends() -> None:
    etsdk.register_plugin(make_backend_plugin("EtsdkChainA", lambda: Recording("A")), "chain-a")
    etsdk.register_plugin(make_backend_plugin("EtsdkChainB", lambda: Recording("B")), "chain-b")
    etsdk.register_plugin(make_backend_plugin("EtsdkChainBFirst", lambda: Recording("B"), partitioner=_not_addmm("EtsdkChainBFirst")), "chain-b-first")
    etsdk.register_contracts([etsdk.ContractSpec(name="test_chain_cache", version=1, path=CONTRACT)], "chain-contract")


def _contract() -> etsdk.Contract:
    return etsdk.Contract.from_bytes(CONTRACT.read_bytes()).bind(S=S, D=D)


def _export(tmp_path: Path, backends: tuple[str, ...], options: dict[str, Any], name: str) -> Path:
    model = Chain().eval()
    source = etsdk.MethodSource(
        model, (torch.randn(1, D), torch.tensor([0])), backends, options, state={"k": "k"}
    )
    path = tmp_path / f"{name}.pte"
    etsdk.lower({"step": source}, contract=_contract()).save(path)
    return path


ORDERS = {
    "A-B-A": (("EtsdkChainA", "EtsdkChainB"), {"EtsdkChainA": {"ops": ["aten::addmm"]}}, ("EtsdkChainA", "EtsdkChainB", "EtsdkChainA")),
    "B-first": (("EtsdkChainBFirst", "EtsdkChainA"), {"EtsdkChainA": {"ops": ["aten::addmm"]}}, ("EtsdkChainA", "EtsdkChainBFirst", "EtsdkChainA")),
}


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_one_method_over_three_delegates_matches_eager_with_state_in_place(order: str, tmp_path: Path) -> None:
    backends, options, expected = ORDERS[order]
    program = etsdk.load(_export(tmp_path, backends, options, order))
    assert program.delegates("step") == expected
    (b_delegate,) = [d for d in program.record.methods["step"] if d.backend != "EtsdkChainA"]
    assert [s.state for s in b_delegate.signature.states] == ["k"]
    assert "aten::index_put" in dict(b_delegate.signature.operators)
    eager = Chain().eval()
    session = program.new_session()
    cache = session.state["k"]
    pointer = cache.data_ptr()
    POINTERS.clear()
    for step in range(5):
        x, pos = torch.randn(1, D), torch.tensor([step])
        (got,) = program.run("step", x, pos, session=session)
        want = eager(x, pos)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache, eager.k)
    assert cache.data_ptr() == pointer and session.state["k"] is cache
    # A's first delegate writes h into memory that B's delegate reads as its input: no copy in between
    first_a = POINTERS["A"][0]
    b_call = POINTERS["B"][0]
    a_outputs = set(first_a[1][first_a[2]:])
    b_inputs = set(b_call[1][: b_call[2]])
    assert a_outputs & b_inputs, (first_a, b_call)


def test_two_sessions_over_a_mixed_method_stay_apart(tmp_path: Path) -> None:
    backends, options, _ = ORDERS["A-B-A"]
    program = etsdk.load(_export(tmp_path, backends, options, "iso"))
    one, two = program.new_session(), program.new_session()
    x = torch.randn(1, D)
    program.run("step", x, torch.tensor([0]), session=one)
    assert bool((two.state["k"] == 0).all()) and bool(one.state["k"][0].abs().sum() > 0)


class ReadsUpdatedCacheInA(torch.nn.Module):
    """The updated cache feeds an addmm that backend A claims: the update would leave its delegate."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(D, D))
        self.register_buffer("k", torch.zeros(S, D))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.k.index_copy_(0, positions, x)
        return torch.addmm(x, self.k[:1], self.w)


#: The two fixes the "read outside its delegate" error names: claim the readers, or leave the state's write.
BOTH_FIXES = (
    "Either claim those readers in this backend too, or do not claim the state's write here "
    '(a partial backend: OperatorPartitioner(..., state_claims="all_or_none")'
)


def test_an_updated_cache_read_by_another_backend_is_a_clear_export_error_naming_both_fixes() -> None:
    source = etsdk.MethodSource(
        ReadsUpdatedCacheInA().eval(), (torch.randn(1, D), torch.tensor([0])), ("EtsdkChainA", "EtsdkChainB"),
        {"EtsdkChainA": {"ops": ["aten::addmm", "aten::slice_copy"]}}, state={"k": "k"},
    )
    with pytest.raises(etsdk.ExportError, match="new value of state 'k' \\(buffer 'k'\\) is read outside its delegate") as raised:
        etsdk.lower({"step": source}, contract=_contract())
    assert BOTH_FIXES in str(raised.value)


def _partial_backend(backend: str, state_claims: Any) -> None:
    """A partial backend: claims the operators named by its ``ops`` option, with ``state_claims``."""

    def factory(**options: Any) -> Any:
        return OperatorPartitioner(backend, ops=options.get("ops"), state_claims=state_claims)

    etsdk.register_plugin(make_backend_plugin(backend, ReferenceBinding, partitioner=factory), backend.lower())


def test_a_partial_backend_claiming_the_cache_write_but_not_the_attention(tmp_path: Path) -> None:
    """Without state_claims the cache write would leave the attention reading it outside its delegate; with
    "all_or_none" the partial backend keeps its linear layers and leaves the cache's operators to the reference."""
    _partial_backend("EtsdkPartialPerOp", "per_operator")
    _partial_backend("EtsdkPartialWhole", "all_or_none")
    linear_and_write = {"ops": ["aten::addmm", "aten::index_put"]}

    def source(backend: str) -> etsdk.MethodSource:
        inputs = (torch.randn(1, D), torch.tensor([0]))
        return etsdk.MethodSource(Chain().eval(), inputs, (backend, "EtsdkReferenceBackend"), {backend: linear_and_write}, state={"k": "k"})

    with pytest.raises(etsdk.ExportError, match="backend 'EtsdkPartialPerOp': the new value of state 'k' \\(buffer 'k'\\) is read outside its delegate") as raised:
        etsdk.lower({"step": source("EtsdkPartialPerOp")}, contract=_contract())
    assert BOTH_FIXES in str(raised.value)

    lowered = etsdk.lower({"step": source("EtsdkPartialWhole")}, contract=_contract())
    delegates = lowered.delegates("step")
    assert [d.backend for d in delegates] == ["EtsdkPartialWhole", "EtsdkReferenceBackend", "EtsdkPartialWhole"]
    for delegate in delegates:
        operators = dict(delegate.signature.operators)
        states = [s.state for s in delegate.signature.states]
        if delegate.backend == "EtsdkPartialWhole":
            assert (operators, states) == ({"aten::addmm": 1}, [])
        else:
            assert "aten::index_put" in operators and "aten::mm" in operators and states == ["k"]
    lowered.save(tmp_path / "partial.pte")
    program = etsdk.load(tmp_path / "partial.pte")
    eager, session = Chain().eval(), program.new_session()
    for step in range(3):
        x, pos = torch.randn(1, D), torch.tensor([step])
        (got,) = program.run("step", x, pos, session=session)
        torch.testing.assert_close(got, eager(x, pos), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(session.state["k"], eager.k)


class ReadsOldCacheInA(torch.nn.Module):
    """A reads the cache as it was, B updates it: the state would be bound by two delegates."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(D, D))
        self.register_buffer("k", torch.zeros(S, D))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        y = torch.addmm(x, self.k[:1], self.w)
        self.k.index_copy_(0, positions, x)
        return y


def test_a_state_split_across_two_delegates_is_a_clear_export_error() -> None:
    source = etsdk.MethodSource(
        ReadsOldCacheInA().eval(), (torch.randn(1, D), torch.tensor([0])), ("EtsdkChainA", "EtsdkChainB"),
        {"EtsdkChainA": {"ops": ["aten::addmm", "aten::slice_copy"]}}, state={"k": "k"},
    )
    with pytest.raises(etsdk.ExportError, match="method 'step', backend 'EtsdkChainA': state 'k' \\(buffer 'k'\\) must be read and written by one delegate"):
        etsdk.lower({"step": source}, contract=_contract())


def test_a_partitioner_tagging_another_backend_id_is_named() -> None:
    def wrong(**options: Any) -> Any:
        return OperatorPartitioner("SomeoneElse")

    etsdk.register_plugin(make_backend_plugin("EtsdkWrongTagger", ReferenceBinding, partitioner=wrong), "wrong-tagger")
    with pytest.raises(etsdk.ExportError, match="method 'forward', backend 'EtsdkWrongTagger': the partitioner tagged partitions for backend id\\(s\\) SomeoneElse"):
        etsdk.lower(module=torch.nn.ReLU(), example_inputs=(torch.randn(3),), backend="EtsdkWrongTagger")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"opps": ["aten::relu"]}, "method 'forward', backend 'EtsdkReferenceBackend': unknown partitioner option 'opps'; the backend takes ops"),
        ({"ops": "aten::relu"}, "method 'forward', backend 'EtsdkReferenceBackend': partitioner option 'ops': expected ops \\(list \\| tuple"),
    ],
)
def test_partitioner_option_mistakes_name_the_backend_and_method(options: dict[str, Any], message: str) -> None:
    with pytest.raises(etsdk.ExportError, match=message):
        etsdk.lower(module=torch.nn.ReLU(), example_inputs=(torch.randn(3),), backend="reference", partitioner_options=options)


class Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v) * 2 + 1


def test_an_operator_kept_whole_for_one_backend_survives_the_next_backends_decompositions(tmp_path: Path) -> None:
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    etsdk.register_plugin(make_backend_plugin("EtsdkKeepsSdpa", ReferenceBinding, keep_whole=(sdpa,)), "keeps-sdpa")
    q = torch.randn(1, 2, 4, 8)
    source = etsdk.MethodSource(
        Attention(), (q, q, q), ("EtsdkKeepsSdpa", "EtsdkReferenceBackend"),
        {"EtsdkKeepsSdpa": {"ops": ["aten::scaled_dot_product_attention"]}},
    )
    lowered = etsdk.lower({"forward": source})
    first, *_ = lowered.delegates("forward")
    assert first.backend == "EtsdkKeepsSdpa"
    assert dict(first.signature.operators) == {"aten::scaled_dot_product_attention": 1}
    lowered.save(tmp_path / "sdpa.pte")
    got = etsdk.load(tmp_path / "sdpa.pte").run("forward", q, q, q)[0]
    torch.testing.assert_close(got, Attention()(q, q, q))


def test_an_operator_kept_whole_that_nobody_claims_is_a_clear_export_error() -> None:
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    etsdk.register_plugin(make_backend_plugin("EtsdkKeepsButSkips", ReferenceBinding, keep_whole=(sdpa,)), "keeps-skips")
    q = torch.randn(1, 2, 4, 8)
    source = etsdk.MethodSource(Attention(), (q, q, q), ("EtsdkKeepsButSkips",), {"EtsdkKeepsButSkips": {"ops": ["aten::mul"]}})
    with pytest.raises(etsdk.ExportError, match="aten::scaled_dot_product_attention were kept whole .* no backend claimed them"):
        etsdk.lower({"forward": source})


def test_demo_resolves_short_backend_names(tmp_path: Path) -> None:
    from etsdk.cli.main import main

    assert main(["demo", "--backend", "reference", "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "weights.ptd").is_file()


def test_eager_model_is_not_changed_by_export() -> None:
    model = Chain().eval()
    before = copy.deepcopy(model.state_dict())
    etsdk.lower(
        {"step": etsdk.MethodSource(model, (torch.randn(1, D), torch.tensor([0])), ("EtsdkChainA", "EtsdkChainB"),
                                    {"EtsdkChainA": {"ops": ["aten::addmm"]}}, state={"k": "k"})},
        contract=_contract(),
    )
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key])
