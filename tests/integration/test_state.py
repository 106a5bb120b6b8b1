"""Caller-owned state through the real runtime: pinned behaviour, not serialisation round trips.

Every test runs for each stateful backend installed here: the core's reference
backend and etsdk-aoti (AOTInductor on CPU; one compile per backend, shared).
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import etsdk
import pytest
import torch
from etsdk._state.session import Session, StateError, current_session
from etsdk.errors import ExportError
from etsdk.reference_backend import BACKEND_ID
from etsdk.testing.toy_decoder import ToyDecoder, kv_decoder_contract, kv_decoder_methods

T = 4
PROMPT = torch.tensor([[3, 5, 7, 9]])
STEPS = [(torch.tensor([[t]]), torch.tensor([T + i])) for i, t in enumerate([1, 4, 2, 8, 6])]


@pytest.fixture(scope="module")
def model() -> ToyDecoder:
    return ToyDecoder(seed=1).eval()


STATEFUL_BACKENDS = [BACKEND_ID, "EtsdkAotiBackend"]


@pytest.fixture(scope="module", params=STATEFUL_BACKENDS)
def toy_pte(request: pytest.FixtureRequest, model: ToyDecoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    backend = request.param
    path = tmp_path_factory.mktemp(f"toy-{backend}") / "toy.pte"
    methods = kv_decoder_methods(model, T, prefill_backends=(backend,), decode_backends=(backend,))
    etsdk.lower(methods, contract=kv_decoder_contract(model, T)).save(path)
    program = etsdk.load(path)
    assert set(program.delegates("decode")) == {backend}
    return path


@pytest.fixture
def program(toy_pte: Path) -> etsdk.Program:
    return etsdk.load(toy_pte)


def _eager(model: ToyDecoder) -> ToyDecoder:
    fresh = copy.deepcopy(model)
    fresh.reset_caches()
    return fresh


def _generate(program: etsdk.Program, session: Session) -> list[torch.Tensor]:
    outs = [program.run("prefill", PROMPT, torch.arange(T), session=session)[0]]
    outs += [program.run("decode", tok, pos, session=session)[0] for tok, pos in STEPS]
    return outs


def test_program_carries_contract_and_state_leaves_the_engine(program: etsdk.Program) -> None:
    assert program.contract is not None and program.contract.name == "kv_decoder"
    assert {s.name for s in program.contract.states} == {"k0", "v0", "k1", "v1"}
    # only tokens and positions go through the engine; caches are bound by the core
    assert [t.shape for t in program.method_info("decode").inputs if t] == [(1, 1), (1,)]
    assert [t.shape for t in program.method_info("decode").outputs if t] == [(1, 1, 32)]
    for method in ("prefill", "decode"):
        (delegate,) = program.record.methods[method]
        assert [s.state for s in delegate.signature.states] == ["k0", "v0", "k1", "v1"]


def test_caller_sees_mutation_in_place(program: etsdk.Program) -> None:
    session = program.new_session()
    pointers = {name: t.data_ptr() for name, t in session.state.items()}
    assert all(bool((t == 0).all()) for t in session.state.values())
    program.run("prefill", PROMPT, torch.arange(T), session=session)
    k0 = session.state["k0"]
    assert k0[:, :, :T].abs().sum() > 0  # the prefill rows were written
    assert bool((k0[:, :, T:] == 0).all())  # nothing else was
    tok, pos = STEPS[0]
    program.run("decode", tok, pos, session=session)
    assert k0[:, :, T].abs().sum() > 0
    assert {name: t.data_ptr() for name, t in session.state.items()} == pointers


def test_state_accumulates_over_steps_like_eager(program: etsdk.Program, model: ToyDecoder) -> None:
    eager = _eager(model)
    session = program.new_session()
    got = _generate(program, session)
    want = [eager(PROMPT, torch.arange(T))] + [eager(tok, pos) for tok, pos in STEPS]
    assert len(got) >= 5
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    for i in range(model.layers):
        torch.testing.assert_close(session.state[f"k{i}"], getattr(eager, f"k_cache_{i}"), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(session.state[f"v{i}"], getattr(eager, f"v_cache_{i}"), atol=1e-6, rtol=1e-6)


def test_fresh_load_starts_from_initial_state_and_reset_restores_it(toy_pte: Path) -> None:
    first = etsdk.load(toy_pte)
    session = first.new_session()
    baseline = _generate(first, session)
    second = etsdk.load(toy_pte)  # a fresh load: nothing carried over from the first program
    again = _generate(second, second.new_session())
    for a, b in zip(baseline, again):
        assert torch.equal(a, b)
    pointer = session.state["k0"].data_ptr()
    session.reset()
    assert all(bool((t == 0).all()) for t in session.state.values())
    assert session.state["k0"].data_ptr() == pointer
    after_reset = _generate(first, session)
    for a, b in zip(baseline, after_reset):
        assert torch.equal(a, b)


def test_default_session_is_used_without_one(program: etsdk.Program) -> None:
    out = program.run("prefill", PROMPT, torch.arange(T))
    assert program.default_session.state["k0"][:, :, :T].abs().sum() > 0
    assert out[0].shape == (1, T, 32)


def test_two_sessions_interleaved_equal_each_alone(program: etsdk.Program) -> None:
    alone_a = _generate(program, program.new_session())
    other_prompt = torch.tensor([[11, 2, 30, 4]])
    b_alone_session = program.new_session()
    alone_b = [program.run("prefill", other_prompt, torch.arange(T), session=b_alone_session)[0]]
    alone_b += [program.run("decode", tok + 1, pos, session=b_alone_session)[0] for tok, pos in STEPS]
    a, b = program.new_session(), program.new_session()
    inter_a = [program.run("prefill", PROMPT, torch.arange(T), session=a)[0]]
    inter_b = [program.run("prefill", other_prompt, torch.arange(T), session=b)[0]]
    for tok, pos in STEPS:
        inter_b.append(program.run("decode", tok + 1, pos, session=b)[0])
        inter_a.append(program.run("decode", tok, pos, session=a)[0])
    for x, y in zip(alone_a, inter_a):
        assert torch.equal(x, y)
    for x, y in zip(alone_b, inter_b):
        assert torch.equal(x, y)
    assert not torch.equal(inter_a[-1], inter_b[-1])


def test_decode_reads_what_prefill_wrote(program: etsdk.Program) -> None:
    tok, pos = STEPS[0]
    after_prefill = program.new_session()
    program.run("prefill", PROMPT, torch.arange(T), session=after_prefill)
    with_prefill = program.run("decode", tok, pos, session=after_prefill)[0]
    without_prefill = program.run("decode", tok, pos, session=program.new_session())[0]
    assert (with_prefill - without_prefill).abs().max() > 1e-3


def test_session_from_another_program_is_refused(toy_pte: Path) -> None:
    a, b = etsdk.load(toy_pte), etsdk.load(toy_pte)
    with pytest.raises(StateError, match="belongs to another program"):
        a.run("prefill", PROMPT, torch.arange(T), session=b.new_session())


def test_session_passed_explicitly_from_another_thread(program: etsdk.Program, model: ToyDecoder) -> None:
    session = program.new_session()
    results: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.extend(_generate(program, session))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not errors
    eager = _eager(model)
    torch.testing.assert_close(results[0], eager(PROMPT, torch.arange(T)), atol=1e-5, rtol=1e-5)
    with pytest.raises(StateError, match="no session is active on this thread"):
        current_session()


def test_reference_backend_updates_caches_in_place_not_by_copy(model: ToyDecoder, tmp_path: Path) -> None:
    """The functional index_put of each cache runs as index_put_ on the session storage: no copy per step."""
    from etsdk.reference_backend.runtime import ReferenceBinding

    from tests.backends import make_backend_plugin

    handles: list[object] = []

    class Recording(ReferenceBinding):
        def init(self, context: object) -> object:
            handle = super().init(context)  # type: ignore[arg-type]
            handles.append(handle)
            return handle

    etsdk.register_plugin(make_backend_plugin("EtsdkInPlaceProbeBackend", Recording), "in-place-probe")
    backend = "EtsdkInPlaceProbeBackend"
    methods = kv_decoder_methods(model, T, prefill_backends=(backend,), decode_backends=(backend,))
    etsdk.lower(methods, contract=kv_decoder_contract(model, T)).save(tmp_path / "p.pte")
    program = etsdk.load(tmp_path / "p.pte")
    program.load_method("decode")
    (handle,) = handles
    assert handle._program.in_place == {0, 1, 2, 3}  # type: ignore[attr-defined]  # every state binding
    assert handle._copy_updates == ()  # type: ignore[attr-defined]


def test_lower_records_the_state_device_its_backends_ask_for(model: ToyDecoder, tmp_path: Path) -> None:
    from etsdk.reference_backend.runtime import ReferenceBinding

    from tests.backends import make_backend_plugin

    etsdk.register_plugin(make_backend_plugin("EtsdkCudaStateBackend", ReferenceBinding, state_device="cuda"), "cuda-state")
    methods = kv_decoder_methods(model, T, prefill_backends=("EtsdkCudaStateBackend",), decode_backends=("EtsdkCudaStateBackend",))
    etsdk.lower(methods, contract=kv_decoder_contract(model, T)).save(tmp_path / "cuda_state.pte")
    program = etsdk.load(tmp_path / "cuda_state.pte")
    assert program.contract is not None and {s.device for s in program.contract.states} == {"cuda"}
    if not torch.cuda.is_available():
        with pytest.raises(StateError, match="must live on cuda"):
            program.new_session()


def test_backends_disagreeing_on_the_state_device_fail_export(model: ToyDecoder) -> None:
    from etsdk.reference_backend.runtime import ReferenceBinding

    from tests.backends import make_backend_plugin

    etsdk.register_plugin(make_backend_plugin("EtsdkCudaStateBackend2", ReferenceBinding, state_device="cuda"), "cuda-state-2")
    methods = kv_decoder_methods(model, T, prefill_backends=("EtsdkCudaStateBackend2",), decode_backends=("EtsdkReferenceBackend",))
    with pytest.raises(ExportError, match="different devices"):
        etsdk.lower(methods, contract=kv_decoder_contract(model, T))


class _Counter(torch.nn.Module):
    """Output and update depend on the state and constants only: the pattern a compiler may fold."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x * self.scale + self.count


@pytest.mark.parametrize("backend", STATEFUL_BACKENDS)
def test_state_is_read_at_run_time_never_folded_at_compile_time(backend: str, tmp_path: Path) -> None:
    """AOTInductor treats state buffers as constants; folding ``count + 1`` baked the example value (0) into the
    library, so every call returned 1 whatever the session held. Fixed by turning Inductor's constant folding off."""
    import json

    from etsdk._export.lower import MethodSource
    from etsdk._state.contract import Contract

    spec = {
        "format": "etsdk.contract", "format_version": [1, 0], "name": "test_counter", "version": 1,
        "required_features": ["state.caller_owned", "alias.user"], "dims": {},
        "states": [{"name": "n", "role": "counter", "dtype": "int64", "shape": []}],
        "methods": {"forward": {
            "inputs": [{"name": "x", "role": "user", "dtype": "float32", "shape": [4]},
                       {"name": "n_in", "role": "counter", "dtype": "int64", "shape": [], "state": "n"}],
            "outputs": [{"name": "n_out", "role": "counter", "dtype": "int64", "shape": [],
                         "alias": {"input": "n_in", "kind": "user", "ownership": "caller", "state": "n"}},
                        {"name": "y", "role": "user", "dtype": "float32", "shape": [4]}]}},
    }
    (tmp_path / "counter.json").write_text(json.dumps(spec))
    etsdk.register_contracts([etsdk.ContractSpec("test_counter", 1, tmp_path / "counter.json")], "counter-test")
    options = {backend: {"device": "cpu"}} if backend == "EtsdkAotiBackend" else {}
    source = MethodSource(_Counter(), (torch.zeros(4),), (backend,), options, state={"count": "n"})
    etsdk.lower({"forward": source}, contract=Contract.from_json(spec).bind()).save(tmp_path / "counter.pte")
    program = etsdk.load(tmp_path / "counter.pte")
    session = program.new_session()
    session.state["n"].fill_(5)
    (y,) = program.run("forward", torch.zeros(4), session=session)
    assert int(session.state["n"]) == 6
    torch.testing.assert_close(y, torch.full((4,), 6.0))
