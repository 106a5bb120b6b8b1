"""The conformance kit: the behaviour every etsdk backend must show, run against any installed backend.

Run it with ``etsdk conformance BACKEND_ID`` or ``pytest --etsdk-backend BACKEND_ID``; in a plugin's own test
suite, import this module's tests and name the backend::

    # tests/test_conformance.py
    import pytest
    from etsdk.conformance.suite import *  # noqa: F401,F403 - the kit's tests

    @pytest.fixture(scope="session")
    def etsdk_backend_id() -> str:
        return "MyBackend"

Each test's first docstring line names the behaviour; a failure message starts with it. Behaviours that do
not apply are skipped with the reason: a capability the backend does not declare
(``Capability.CALLER_OWNED_STATE``), a behaviour that needs a second backend when the one under test is the
reference backend itself, quantized weights when the backend declares no weight format
(``BackendSpec.weight_formats``), filled attention when it does not declare ``Capability.FILLED_ATTENTION``, or, with a companion backend (``--etsdk-companion ID``, the
``etsdk_companion`` fixture), a model of which the backend under test claims no operator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import etsdk
from etsdk._plugins.specs import Capability
from etsdk.conformance.kit import PREFILL, REFERENCE, Kit

__all__ = [
    "kit",
    "test_aliased_output_beside_user_outputs",
    "test_bad_inputs_refused_before_execution",
    "test_bad_inputs_with_state_leave_it_unchanged",
    "test_exports_and_runs_like_eager",
    "test_filled_attention_like_eager",
    "test_fresh_load_starts_from_initial_state",
    "test_method_over_several_sessions",
    "test_mutated_payloads_never_crash",
    "test_persistence_check",
    "test_quantized_weights_like_eager",
    "test_repeated_calls_accumulate_state",
    "test_second_backend_in_the_same_method",
    "test_sessions_are_isolated",
    "test_state_shared_across_methods_and_backends",
    "test_state_updated_in_place",
    "test_unclaimed_operators_run_beside_the_backend",
    "test_unknown_required_feature_refused",
    "test_user_outputs_land_in_their_slots",
]

ATOL = RTOL = 1e-4
STEPS = [3, 9, 1, 7, 4]


@pytest.fixture(scope="session")
def kit(
    etsdk_backend_id: str, etsdk_backend_options: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Kit:
    try:
        etsdk.get_backend(etsdk_backend_id)
    except etsdk.EtsdkError as exc:
        pytest.fail(f"backend under test: {exc}")
    companion = _companion(request)
    if companion is not None:
        try:
            etsdk.get_backend(companion)
        except etsdk.EtsdkError as exc:
            pytest.fail(f"companion backend: {exc}")
        if companion == etsdk_backend_id:
            pytest.fail(f"companion backend: {companion} is the backend under test; name another backend")
    workdir = tmp_path_factory.mktemp(f"kit-{etsdk_backend_id}")
    made = Kit(etsdk_backend_id, dict(etsdk_backend_options), workdir, companion=companion)
    reason = made.unavailable_reason()
    if reason is not None:
        pytest.skip(f"backend {etsdk_backend_id} cannot run here: {reason}")
    return made


def _companion(request: pytest.FixtureRequest) -> str | None:
    """The ``etsdk_companion`` fixture's value (``--etsdk-companion``), or None where it is not defined."""
    try:
        value = request.getfixturevalue("etsdk_companion")
    except pytest.FixtureLookupError:
        return None
    return str(value) if value else None


def _stateful(kit: Kit) -> None:
    if not kit.has(Capability.CALLER_OWNED_STATE):
        pytest.skip(f"{kit.backend_id} does not declare Capability.CALLER_OWNED_STATE")


def _claims(kit: Kit, program: etsdk.Program, method: str, behaviour: str) -> None:
    if kit.companion is not None and kit.backend_id not in program.delegates(method):
        pytest.skip(
            f"{kit.backend_id} claims no operator of this model (method '{method}'; the companion "
            f"{kit.companion} computed it all)"
        )
    assert kit.backend_id in program.delegates(method), (
        f"{behaviour}: {kit.backend_id} claimed no operator of the kit's model in method '{method}' "
        f"(delegates: {list(program.delegates(method))})"
    )


def _claims_any(kit: Kit, program: etsdk.Program) -> None:
    """With a companion, skip unless the backend under test claimed something in some method of ``program``
    (else the behaviour would pass on the companion alone)."""
    if kit.companion is None:
        return
    if not any(kit.backend_id in program.delegates(method) for method in program.methods):
        pytest.skip(
            f"{kit.backend_id} claims no operator of this model (the companion {kit.companion} computed it all)"
        )


def _close(got: torch.Tensor, want: torch.Tensor, behaviour: str) -> None:
    try:
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    except AssertionError as exc:
        raise AssertionError(f"{behaviour}: output differs from eager PyTorch: {exc}") from None


# ----------------------------------------------------------------------------- stateless behaviour


def test_exports_and_runs_like_eager(kit: Kit) -> None:
    """export and run vs eager"""
    from etsdk.conformance.models import Mlp

    model = Mlp().eval()
    program = etsdk.load(kit.one_method("mlp", model, (torch.randn(3, 8),), (kit.backend_id,)).path)
    _claims(kit, program, "forward", "export and run vs eager")
    for seed in range(3):
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(seed))
        _close(program.run("forward", x)[0], model(x), "export and run vs eager")


def test_unclaimed_operators_run_beside_the_backend(kit: Kit) -> None:
    """operators the backend does not claim"""
    from etsdk.conformance.models import WithUnclaimed

    model = WithUnclaimed().eval()
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
    for name, backends in (("unclaimed-alone", (kit.backend_id,)), ("unclaimed-then-reference", (kit.backend_id, REFERENCE))):
        program = etsdk.load(kit.one_method(name, model, (x,), backends).path)
        _claims(kit, program, "forward", "operators the backend does not claim")
        _close(program.run("forward", x)[0], model(x), f"operators the backend does not claim ({name})")


def test_second_backend_in_the_same_method(kit: Kit) -> None:
    """a second backend in the same method"""
    from etsdk.conformance.models import Mlp

    model = Mlp().eval()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
    orders = {
        "reference-first": ((REFERENCE, kit.backend_id), ["aten::relu"]),
        "reference-after": ((kit.backend_id, REFERENCE), None),
    }
    if kit.backend_id == REFERENCE:
        pytest.skip("the backend under test is the reference backend itself")
    for name, (backends, reference_ops) in orders.items():
        program = etsdk.load(kit.one_method(f"mlp-{name}", model, (x,), backends, reference_ops).path)
        _claims(kit, program, "forward", "a second backend in the same method")
        _close(program.run("forward", x)[0], model(x), f"a second backend in the same method ({name})")


def test_user_outputs_land_in_their_slots(kit: Kit) -> None:
    """binding order: user outputs in their slots"""
    from etsdk.conformance.models import D, TwoOutputs

    model = TwoOutputs().eval()
    x = torch.randn(1, D, generator=torch.Generator().manual_seed(3))
    program = etsdk.load(kit.one_method("two-outputs", model, (x,), (kit.backend_id,)).path)
    _claims(kit, program, "forward", "binding order")
    got = program.run("forward", x)
    want = model(x)
    for index, (g, w) in enumerate(zip(got, want)):
        _close(g, w, f"binding order: output {index} is not the model's output {index} (swapped outputs?)")


def test_filled_attention_like_eager(kit: Kit) -> None:
    """filled attention: etsdk::attention over float32 and over int8 rows computes the operator's reference"""
    from etsdk.conformance.models import FilledAttention

    if not kit.has(Capability.FILLED_ATTENTION):
        pytest.skip(f"{kit.backend_id} does not declare Capability.FILLED_ATTENTION")
    model = FilledAttention().eval()
    query = torch.randn(1, 4, 2, 64, generator=torch.Generator().manual_seed(17))
    mask = torch.zeros(1, 1, 2, 40, dtype=torch.bool)
    mask[0, 0, 0, :23], mask[0, 0, 1, 5:24] = True, True  # rows 24 .. 39 seen by no query
    program = etsdk.load(kit.one_method("filled-attention", model, (query, mask), (kit.backend_id,)).path)
    _claims(kit, program, "forward", "filled attention")
    for index, (got, want) in enumerate(zip(program.run("forward", query, mask), model(query, mask))):
        _close(got, want, f"filled attention ({'int8' if index else 'float32'} rows)")


#: The formats the quantized-weights behaviour tries, each one the backend declares (int8 first: the commonest).
QUANTIZED_FORMATS = ("int8", "int4:g32", "int4:g32:min", "int8:g32", "int4:g32:a8", "q8_0", "q4_0", "q4_1")


def test_quantized_weights_like_eager(kit: Kit) -> None:
    """quantized weights: each declared format computes the format's math (etsdk::linear_q / embedding_q)"""
    from etsdk._format.weight_format import WeightLayout
    from etsdk.conformance.models import QuantizedMlp

    declared = kit.spec.weight_formats
    if not declared:
        pytest.skip(f"{kit.backend_id} declares no weight formats (BackendSpec.weight_formats)")
    tried = [name for name in QUANTIZED_FORMATS if name in declared] or [declared[0]]
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    for name in tried:
        fmt = etsdk.WeightFormat.parse(name)
        model = QuantizedMlp().eval()
        if fmt.layout is WeightLayout.PLANES:
            etsdk.quantize_model(model, fmt, embedding=fmt, head=fmt)
        else:
            _gguf_layers(model, fmt)
        program = etsdk.load(kit.one_method(f"quantized-{name.replace(':', '-')}", model, (ids,), (kit.backend_id,)).path)
        _claims(kit, program, "forward", f"quantized weights ({name})")
        record = program.record
        assert record is not None, f"quantized weights ({name}): the program has no etsdk record"
        formats = {w.format for d in record.methods["forward"] if d.backend == kit.backend_id for w in d.signature.weights}
        assert name in formats, f"quantized weights ({name}): {kit.backend_id} claimed no weight in {name} (it claimed {sorted(formats)})"
        with torch.no_grad():
            want = model(ids)
        _close(program.run("forward", ids)[0], want, f"quantized weights ({name})")


def _gguf_layers(model: Any, fmt: Any) -> None:
    """The model's layers as ``fmt``'s blocks (GGUF formats), made from the planes etsdk quantizes."""
    from etsdk._quant.planes import Planes, gguf_blocks, quantize

    for name in ("embed", "up", "down", "head"):
        layer = getattr(model, name)
        planes_format = fmt.planes_format
        stored = quantize(layer.weight, planes_format)
        planes = Planes(planes_format, stored["qdata"], stored["scales"], stored.get("mins"))
        blocks = {"blocks": gguf_blocks(planes, fmt.layout)}
        if isinstance(layer, torch.nn.Embedding):
            setattr(model, name, etsdk.QuantizedEmbedding(fmt, blocks))
        else:
            setattr(model, name, etsdk.QuantizedLinear(fmt, blocks, layer.bias))


# ----------------------------------------------------------------------------- caller-owned state


def _toy_steps(program: etsdk.Program, session: etsdk.Session) -> list[torch.Tensor]:
    prompt = torch.tensor([[2, 7, 1, 8]])
    outs = [program.run("prefill", prompt, torch.arange(PREFILL), session=session)[0]]
    for i, token in enumerate(STEPS):
        outs.append(program.run("decode", torch.tensor([[token]]), torch.tensor([PREFILL + i]), session=session)[0])
    return outs


def _eager_steps(model: Any) -> list[torch.Tensor]:
    prompt = torch.tensor([[2, 7, 1, 8]])
    with torch.no_grad():
        outs = [model(prompt, torch.arange(PREFILL))]
        for i, token in enumerate(STEPS):
            outs.append(model(torch.tensor([[token]]), torch.tensor([PREFILL + i])))
    return outs


def test_state_updated_in_place(kit: Kit) -> None:
    """in-place caller-owned state: updated with an unchanged data pointer"""
    _stateful(kit)
    exported, _ = kit.toy(kit.backend_id, kit.backend_id)
    program = etsdk.load(exported.path)
    _claims(kit, program, "decode", "in-place caller-owned state")
    session = program.new_session()
    tensors = dict(session.state)
    pointers = {name: t.data_ptr() for name, t in tensors.items()}
    program.run("prefill", torch.tensor([[2, 7, 1, 8]]), torch.arange(PREFILL), session=session)
    program.run("decode", torch.tensor([[5]]), torch.tensor([PREFILL]), session=session)
    for name, tensor in tensors.items():
        assert session.state[name] is tensor and tensor.data_ptr() == pointers[name], (
            f"in-place caller-owned state: state '{name}' was replaced instead of updated in place"
        )
        rows = tensor[..., : PREFILL + 1, :]
        assert bool(rows.abs().sum() > 0), (
            f"in-place caller-owned state: the session's '{name}' shows no update after prefill and decode "
            "(did the backend update a copy?)"
        )


def test_repeated_calls_accumulate_state(kit: Kit) -> None:
    """repeated calls accumulate state: one loaded method, prefill then decode steps"""
    _stateful(kit)
    exported, eager = kit.toy(kit.backend_id, kit.backend_id)
    program = etsdk.load(exported.path)
    _claims_any(kit, program)
    for step, (got, want) in enumerate(zip(_toy_steps(program, program.new_session()), _eager_steps(eager))):
        _close(got, want, f"repeated calls accumulate state (step {step})")


def test_fresh_load_starts_from_initial_state(kit: Kit) -> None:
    """a fresh load starts from the declared initial state"""
    _stateful(kit)
    exported, _ = kit.toy(kit.backend_id, kit.backend_id)
    first = etsdk.load(exported.path)
    _claims_any(kit, first)
    outs = _toy_steps(first, first.new_session())
    again = etsdk.load(exported.path)
    session = again.new_session()
    assert all(bool((t == 0).all()) for t in session.state.values()), "a fresh load starts from the declared initial state: the state does not start at its initial value"
    for step, (got, want) in enumerate(zip(_toy_steps(again, session), outs)):
        _close(got, want, f"a fresh load starts from the declared initial state (step {step})")


def test_sessions_are_isolated(kit: Kit) -> None:
    """session isolation"""
    _stateful(kit)
    exported, _ = kit.toy(kit.backend_id, kit.backend_id)
    program = etsdk.load(exported.path)
    _claims_any(kit, program)
    alone = _toy_steps(program, program.new_session())
    one, two = program.new_session(), program.new_session()
    prompt = torch.tensor([[2, 7, 1, 8]])
    interleaved = {0: [], 1: []}  # type: dict[int, list[torch.Tensor]]
    for index, session in enumerate((one, two)):
        interleaved[index].append(program.run("prefill", prompt, torch.arange(PREFILL), session=session)[0])
    for i, token in enumerate(STEPS):
        for index, session in enumerate((one, two)):
            out = program.run("decode", torch.tensor([[token]]), torch.tensor([PREFILL + i]), session=session)[0]
            interleaved[index].append(out)
    for index in (0, 1):
        for step, (got, want) in enumerate(zip(interleaved[index], alone)):
            _close(got, want, f"session isolation (session {index}, step {step}: another session's state leaked in?)")


def test_state_shared_across_methods_and_backends(kit: Kit) -> None:
    """one cache shared across methods and backends"""
    _stateful(kit)
    if kit.backend_id == REFERENCE:
        pytest.skip("the backend under test is the reference backend itself")
    for prefill, decode in ((REFERENCE, kit.backend_id), (kit.backend_id, REFERENCE)):
        exported, eager = kit.toy(prefill, decode)
        program = etsdk.load(exported.path)
        _claims_any(kit, program)
        outs = _toy_steps(program, program.new_session())
        for step, (got, want) in enumerate(zip(outs, _eager_steps(eager))):
            _close(got, want, f"one cache shared across methods and backends (prefill {prefill}, decode {decode}, step {step})")


def test_method_over_several_sessions(kit: Kit) -> None:
    """a method over several sessions: slot j's state is the j-th session's, updated in place"""
    _stateful(kit)
    behaviour = "a method over several sessions"
    if kit.backend_id == REFERENCE:
        pytest.skip("the backend under test is the reference backend itself (tests/integration/test_slots.py)")
    program = etsdk.load(kit.batched(2).path)
    _claims(kit, program, "decode_batch", behaviour)
    sessions = [program.new_session(), program.new_session()]
    for session, prompt in zip(sessions, ([[2, 7, 1, 8]], [[5, 0, 3, 3]])):
        program.run("prefill", torch.tensor(prompt), torch.arange(PREFILL), session=session)
    program.run("decode", torch.tensor([[4]]), torch.tensor([PREFILL]), session=sessions[1])  # lengths differ
    alone = [session.fork() for session in sessions]
    pointers = [{name: t.data_ptr() for name, t in s.state.items()} for s in sessions]
    tokens, positions = torch.tensor([[6], [9]]), torch.tensor([PREFILL, PREFILL + 1])
    for step in range(2):
        rows = program.run("decode_batch", tokens, positions, sessions=sessions)[0]
        for j in range(2):
            want = program.run("decode", tokens[j : j + 1], positions[j : j + 1], session=alone[j])[0]
            _close(rows[j : j + 1], want, f"{behaviour} (step {step}, slot {j}: row {j} is not session {j}'s decode step)")
            for name, tensor in sessions[j].state.items():
                assert tensor.data_ptr() == pointers[j][name], f"{behaviour}: session {j}'s '{name}' was replaced"
                try:
                    torch.testing.assert_close(tensor, alone[j].state[name], atol=ATOL, rtol=RTOL)
                except AssertionError as exc:
                    raise AssertionError(f"{behaviour}: slot {j} left session {j}'s '{name}' unlike its own decode: {exc}") from None
        tokens, positions = tokens.flip(0), positions + 1


def test_persistence_check(kit: Kit) -> None:
    """persistence: decode at position 1 on a fresh cache differs from position 0 then 1"""
    _stateful(kit)
    exported, _ = kit.toy(kit.backend_id, kit.backend_id)
    program = etsdk.load(exported.path)
    _claims_any(kit, program)
    fresh = program.run("decode", torch.tensor([[6]]), torch.tensor([1]), session=program.new_session())[0]
    session = program.new_session()
    program.run("decode", torch.tensor([[4]]), torch.tensor([0]), session=session)
    continued = program.run("decode", torch.tensor([[6]]), torch.tensor([1]), session=session)[0]
    assert torch.isfinite(fresh).all() and torch.isfinite(continued).all(), "persistence: NaN or infinity in the logits"
    assert not torch.allclose(fresh, continued), (
        "persistence: decode at position 1 gave the same logits on a fresh cache as after position 0 "
        "(the cache written by the first call was not read by the second)"
    )


def test_aliased_output_beside_user_outputs(kit: Kit) -> None:
    """binding order with an aliased output: user outputs beside a cache update"""
    _stateful(kit)
    from etsdk.conformance.models import D

    exported, eager = kit.pair()
    program = etsdk.load(exported.path)
    _claims(kit, program, "step", "binding order with an aliased output")
    session = program.new_session()
    for step in range(3):
        x = torch.randn(1, D, generator=torch.Generator().manual_seed(20 + step))
        got = program.run("step", x, torch.tensor([step]), session=session)
        with torch.no_grad():
            want = eager(x, torch.tensor([step]))
        for index, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"binding order with an aliased output: user output {index} (step {step})")
        _close(session.state["k"], eager.k, f"binding order with an aliased output: the cache (step {step})")


# ----------------------------------------------------------------------------- refusals


def _mlp_delegate(kit: Kit) -> Any:
    from etsdk.conformance.models import Mlp

    exported = kit.one_method("mlp", Mlp().eval(), (torch.randn(3, 8),), (kit.backend_id,))
    delegates = exported.of(kit.backend_id)
    if kit.companion is not None and not delegates:
        pytest.skip(f"{kit.backend_id} claims no operator of this model (the kit's MLP)")
    assert delegates, f"{kit.backend_id} claimed no operator of the kit's MLP"
    return delegates[0]


def test_unknown_required_feature_refused(kit: Kit) -> None:
    """refusal of an unknown required feature: in the backend's own blob"""
    from etsdk._runtime.bridge import InitContext
    from etsdk.testing import NamedDataStub, with_required_feature

    delegate = _mlp_delegate(kit)
    try:
        payload = with_required_feature(delegate.payload, "etsdk.conformance.unknown-feature")
    except etsdk.BlobFormatError as exc:
        pytest.fail(f"refusal of an unknown required feature: the payload is not an etsdk blob container ({exc})")
    named = NamedDataStub({k: memoryview(v) for k, v in delegate.named_data.items()})
    context = InitContext(kit.backend_id, delegate.method, memoryview(payload), delegate.compile_specs, named, delegate.signature)  # type: ignore[arg-type]
    try:
        kit.binding().init(context)
    except etsdk.EtsdkError as exc:
        assert "etsdk.conformance.unknown-feature" in str(exc), (
            f"refusal of an unknown required feature: refused, but without naming the feature: {exc}"
        )
        return
    pytest.fail("refusal of an unknown required feature: init accepted a blob requiring a feature it cannot know")


class _CountExecutes:
    """Counts every delegate execution in this process while installed (any backend, any method)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from etsdk._runtime.bridge import _Stateless, _StatePush

        self.calls = 0
        for cls in (_Stateless, _StatePush):
            inner = cls.execute

            def counted(handle: Any, args: tuple[Any, ...], _inner: Any = inner) -> None:
                self.calls += 1
                _inner(handle, args)

            monkeypatch.setattr(cls, "execute", counted)


def test_bad_inputs_refused_before_execution(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """bad inputs: refused before execution"""
    from etsdk.conformance.models import Mlp

    exported = kit.one_method("mlp", Mlp().eval(), (torch.randn(3, 8),), (kit.backend_id,))
    executes = _CountExecutes(monkeypatch)  # before the load: the runtime keeps each delegate's execute
    program = etsdk.load(exported.path)
    _claims(kit, program, "forward", "bad inputs")
    bad = {
        "wrong dtype": (torch.zeros(3, 8, dtype=torch.int64),),
        "wrong shape": (torch.zeros(4, 8),),
        "missing input": (),
        "input too many": (torch.zeros(3, 8), torch.zeros(3, 8)),
        "not a tensor": ("x",),
    }
    for what, inputs in bad.items():
        try:
            program.run("forward", *inputs)
        except etsdk.ProgramError:
            assert executes.calls == 0, f"bad inputs: a call with a {what} was refused, but only after a delegate ran"
            continue
        except etsdk.EtsdkError as exc:
            pytest.fail(f"bad inputs: a call with a {what} was refused by the backend, not before execution: {exc}")
        pytest.fail(f"bad inputs: a call with a {what} ran instead of being refused")
    _close(program.run("forward", torch.ones(3, 8))[0], Mlp().eval()(torch.ones(3, 8)), "bad inputs: the method still works after refusals")
    assert executes.calls > 0, "bad inputs: the good call ran no delegate (the kit could not watch execution)"


def test_bad_inputs_with_state_leave_it_unchanged(kit: Kit) -> None:
    """bad inputs with state: refused, the session's state unchanged"""
    _stateful(kit)
    exported, _ = kit.toy(kit.backend_id, kit.backend_id)
    stateful = etsdk.load(exported.path)
    _claims_any(kit, stateful)
    session = stateful.new_session()
    try:
        stateful.run("decode", torch.zeros(1, 1), torch.tensor([0]), session=session)  # float tokens
        pytest.fail("bad inputs with state: float tokens were not refused")
    except etsdk.EtsdkError:
        pass
    assert all(bool((t == 0).all()) for t in session.state.values()), "bad inputs with state: a refused call changed the state"


def test_mutated_payloads_never_crash(kit: Kit, tmp_path: Path) -> None:
    """mutated blobs never crash: damaged payloads handed to the binding"""
    from etsdk.conformance.mutations import make_cases, run_cases

    delegate = _mlp_delegate(kit)
    job = {
        "backend_id": kit.backend_id,
        "method": delegate.method,
        "payload": delegate.payload,
        "named_data": delegate.named_data,
        "compile_specs": delegate.compile_specs,
        "signature": delegate.signature.to_json(),
        "cases": make_cases(len(delegate.payload), seed=7),
    }
    outcomes = run_cases(job, tmp_path)
    bad = [o for o in outcomes if o.result.startswith(("crash", "hung", "not run"))]
    assert not bad, "mutated blobs never crash: " + "; ".join(
        f"case {o.index} ({o.case.kind} at byte {o.case.offset}): {o.result}" for o in bad
    )
