"""Caller-owned KV through TensorRT (the stand-in) in the real ExecuTorch runtime.

The engine's aliased outputs are bound to the session's own storage: after a
call the caller sees the update through the session's tensors, whose data
pointers never change; calls accumulate; a fresh load starts from the declared
initial state; two sessions over one program never see each other's state.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import etsdk
import torch
from etsdk_tensorrt import BACKEND_ID

T = 4
PROMPT = torch.tensor([[3, 5, 7, 9]])
STEPS = [(torch.tensor([[t]]), torch.tensor([T + i])) for i, t in enumerate([1, 4, 2, 8, 6])]
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def _eager(model: Any) -> Any:
    fresh = copy.deepcopy(model)
    fresh.reset_caches()
    return fresh


def _generate(program: etsdk.Program, session: etsdk.Session, prompt: torch.Tensor = PROMPT) -> list[torch.Tensor]:
    outs = [program.run("prefill", prompt, torch.arange(T), session=session)[0].clone()]
    outs += [program.run("decode", tok, pos, session=session)[0].clone() for tok, pos in STEPS]
    return outs


def test_both_methods_are_one_tensorrt_delegate_each(toy_export: tuple[Path, list[Any]]) -> None:
    program = etsdk.load(toy_export[0])
    assert program.delegates("prefill") == (BACKEND_ID,) and program.delegates("decode") == (BACKEND_ID,)


def test_caller_sees_the_update_in_place(toy_export: tuple[Path, list[Any]], toy_model: Any, standin: Any) -> None:
    program = etsdk.load(toy_export[0])
    session = program.new_session()
    pointers = {name: t.data_ptr() for name, t in session.state.items()}
    eager = _eager(toy_model)
    got = program.run("prefill", PROMPT, torch.arange(T), session=session)[0]
    with torch.no_grad():
        want = eager(PROMPT, torch.arange(T))
    torch.testing.assert_close(got, want, **TOLERANCE)
    assert standin.executions == 1
    for i in range(toy_model.layers):
        torch.testing.assert_close(session.state[f"k{i}"], getattr(eager, f"k_cache_{i}"), **TOLERANCE)
        torch.testing.assert_close(session.state[f"v{i}"], getattr(eager, f"v_cache_{i}"), **TOLERANCE)
    assert session.state["k0"][0, :, :T].abs().sum() > 0 and not session.state["k0"][0, :, T:].any()
    assert {name: t.data_ptr() for name, t in session.state.items()} == pointers


def test_repeated_calls_on_one_loaded_method_accumulate(toy_export: tuple[Path, list[Any]], toy_model: Any) -> None:
    program = etsdk.load(toy_export[0])
    session = program.new_session()
    eager = _eager(toy_model)
    got = _generate(program, session)
    with torch.no_grad():
        want = [eager(PROMPT, torch.arange(T))] + [eager(tok, pos) for tok, pos in STEPS]
    for step, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, **TOLERANCE, msg=f"step {step}")
    torch.testing.assert_close(session.state["v1"], eager.v_cache_1, **TOLERANCE)
    assert session.state["k0"][0, :, : T + len(STEPS)].abs().sum(-1).min() > 0  # every written row is there


def test_fresh_load_starts_from_the_declared_initial_state(toy_export: tuple[Path, list[Any]], toy_model: Any) -> None:
    first = etsdk.load(toy_export[0])
    _generate(first, first.new_session())
    again = etsdk.load(toy_export[0])
    session = again.new_session()
    assert all(not t.any() for t in session.state.values())
    tok, pos = STEPS[0]
    got = again.run("decode", tok, pos, session=session)[0]
    with torch.no_grad():
        want = _eager(toy_model)(tok, pos)
    torch.testing.assert_close(got, want, **TOLERANCE)
    chained = again.new_session()
    again.run("decode", torch.tensor([[2]]), pos - 1, session=chained)
    after = again.run("decode", tok, pos, session=chained)[0]
    assert (after - got).abs().max() > 1e-4  # the persistence check: what an earlier call wrote is read


def test_two_sessions_never_see_each_other(toy_export: tuple[Path, list[Any]]) -> None:
    program = etsdk.load(toy_export[0])
    other_prompt = torch.tensor([[8, 1, 1, 2]])
    alone_a = _generate(program, program.new_session())
    alone_b = _generate(program, program.new_session(), other_prompt)
    a, b = program.new_session(), program.new_session()
    interleaved_a = [program.run("prefill", PROMPT, torch.arange(T), session=a)[0].clone()]
    interleaved_b = [program.run("prefill", other_prompt, torch.arange(T), session=b)[0].clone()]
    for tok, pos in STEPS:
        interleaved_b.append(program.run("decode", tok, pos, session=b)[0].clone())
        interleaved_a.append(program.run("decode", tok, pos, session=a)[0].clone())
    for x, y in zip(interleaved_a + interleaved_b, alone_a + alone_b):
        torch.testing.assert_close(x, y, atol=0, rtol=0)
    assert not torch.equal(a.state["k0"], b.state["k0"])
    assert a.state["k0"].data_ptr() != b.state["k0"].data_ptr()
