"""hf_static programs through AOTInductor generate exactly what transformers' eager ``generate`` gives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import etsdk
import pytest
import torch
from conftest import MARGIN, NEW, PROMPT_LENGTHS, S, T, hf_generate, prompt_of
from etsdk import Sampling
from etsdk_hf_static.masks import causal_mask
from etsdk_hf_static.runtime.runner import HfStaticRunner, Step, plan_prompt


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("length", PROMPT_LENGTHS)
def test_greedy_tokens_equal_transformers_generate(arch: str, length: int, models: dict[str, Any], exported: Callable[..., Path]) -> None:
    runner = HfStaticRunner.from_file(exported(arch))
    prompt = prompt_of(length)
    expected, margin = hf_generate(models[arch], prompt, NEW)
    assert margin > MARGIN, f"eager top-2 margin {margin:.2e} too small for a token comparison"
    conversation = runner.new_conversation()
    result = conversation.generate(prompt, max_new_tokens=NEW, stop_at_eos=False)
    assert list(result.token_ids) == expected
    assert result.prompt_ids == tuple(prompt) and result.stopped == "length"
    assert conversation.position == length + NEW - 1  # the last token is pending, not yet in the cache


def test_prompt_plans_cover_every_route() -> None:
    from etsdk_hf_static.metadata import HfStaticMetadata

    meta = HfStaticMetadata(context_length=S, prefill_length=T, vocab_size=100, layers=2, kv_heads=2, head_dim=16, eos_ids=())
    methods = {n: [(s.method, s.start, len(s.tokens)) for s in plan_prompt(0, list(range(n)), meta)] for n in PROMPT_LENGTHS}
    assert methods[1] == [("decode", 0, 1)]
    assert methods[T - 1] == [("prefill", 0, T - 1)]  # padded to T rows
    assert methods[T + 1] == [("prefill", 0, T), ("decode", T, 1)]
    assert methods[2 * T + 3] == [("prefill", 0, T), ("prefill", T, T), ("prefill", 2 * T, 3)]
    # 26 tokens: a 2-token tail at 24 would need rows 24..31 padded, past S=31: it goes through decode
    assert methods[S - 1 - NEW][-2:] == [("decode", 24, 1), ("decode", 25, 1)]


def test_multi_turn_continues_positions(runner: HfStaticRunner, models: dict[str, Any]) -> None:
    first, second = prompt_of(5, seed=1), prompt_of(4, seed=2)
    conversation = runner.new_conversation()
    a = conversation.generate(first, max_new_tokens=3, stop_at_eos=False)
    b = conversation.generate(second, max_new_tokens=NEW, stop_at_eos=False)
    expected, margin = hf_generate(models["llama"], first + list(a.token_ids) + second, NEW)
    assert margin > MARGIN
    assert list(b.token_ids) == expected


def test_generate_reset_generate_is_identical(runner: HfStaticRunner) -> None:
    prompt = prompt_of(T + 2)
    conversation = runner.new_conversation()
    first = conversation.generate(prompt, max_new_tokens=6, stop_at_eos=False)
    pointers = {k: t.data_ptr() for k, t in conversation.session.state.items()}
    conversation.reset()
    assert conversation.position == 0 and not conversation.pending
    again = conversation.generate(prompt, max_new_tokens=6, stop_at_eos=False)
    assert again.token_ids == first.token_ids
    assert pointers == {k: t.data_ptr() for k, t in conversation.session.state.items()}  # in place, no realloc


def test_two_interleaved_conversations_equal_each_alone(runner: HfStaticRunner) -> None:
    p1, p2 = prompt_of(9, seed=3), prompt_of(3, seed=4)
    alone1 = runner.new_conversation().generate(p1, max_new_tokens=5, stop_at_eos=False).token_ids
    alone2 = runner.new_conversation().generate(p2, max_new_tokens=5, stop_at_eos=False).token_ids
    c1, c2 = runner.new_conversation(), runner.new_conversation()
    got1, got2 = [], []
    # interleave by hand, step by step, through the same loaded program
    logits1 = [c1.run_step(s) for s in plan_prompt(0, p1, runner.metadata)][-1]
    logits2 = [c2.run_step(s) for s in plan_prompt(0, p2, runner.metadata)][-1]
    for _ in range(5):
        got1.append(int(logits1.argmax()))
        got2.append(int(logits2.argmax()))
        logits1 = c1.run_step(Step("decode", c1.position, (got1[-1],), 1))
        logits2 = c2.run_step(Step("decode", c2.position, (got2[-1],), 1))
    assert tuple(got1) == alone1 and tuple(got2) == alone2


def test_persistence_pos1_depends_on_pos0(runner: HfStaticRunner) -> None:
    """The Torch-TensorRT runner's check: position 1 on a fresh cache differs from position 0 then 1; no NaN."""
    fresh = runner.new_conversation()
    alone = fresh.run_step(Step("decode", 1, (7,), 1)).clone()
    seq = runner.new_conversation()
    seq.run_step(Step("decode", 0, (5,), 1))
    after = seq.run_step(Step("decode", 1, (7,), 1)).clone()
    assert torch.isfinite(alone).all() and torch.isfinite(after).all()
    assert not torch.allclose(alone, after), "the cache written at position 0 had no effect at position 1"


def test_stale_counters_corrupt_output_and_the_runner_rewrites_them(runner: HfStaticRunner) -> None:
    """A padded prefill advances each layer's counter by T, not by the real rows: left stale, the next
    decode writes its key/value at the wrong row and reads a hole. The runner writes counters every step."""
    meta = runner.metadata
    prompt = prompt_of(3)
    reference = runner.new_conversation()
    good = [reference.run_step(s) for s in plan_prompt(0, prompt, meta)][-1]
    token = int(good.argmax())
    good_next = reference.run_step(Step("decode", 3, (token,), 1)).clone()

    raw = runner.new_conversation()
    program, session = runner.program, raw.session
    ids = torch.zeros(1, T, dtype=torch.long)
    ids[0, :3] = torch.tensor(prompt)
    program.run("prefill", ids, torch.arange(T), causal_mask(0, 3, T, S), session=session)
    assert int(session.state["c0"]) == T  # the counter moved by the padded row count
    stale = program.run("decode", torch.tensor([[token]]), torch.tensor([3]), causal_mask(3, 1, 1, S), session=session)[0]
    assert not torch.allclose(stale[0, 0], good_next, atol=1e-4), "a stale counter went unnoticed"
    # the runner's step on the very same session writes the counters from start_pos first: correct again
    fixed = raw.run_step(Step("decode", 3, (token,), 1))
    torch.testing.assert_close(fixed, good_next, atol=1e-4, rtol=1e-4)
    assert int(session.state["c0"]) == 4  # written to 3 before the step; the graph added 1


def test_sampling_is_seeded_and_respects_top_p(runner: HfStaticRunner) -> None:
    prompt = prompt_of(4, seed=5)
    sampled = Sampling(temperature=1.5, top_p=0.9, seed=11)
    a = runner.new_conversation().generate(prompt, max_new_tokens=8, sampling=sampled, stop_at_eos=False)
    b = runner.new_conversation().generate(prompt, max_new_tokens=8, sampling=sampled, stop_at_eos=False)
    assert a.token_ids == b.token_ids
    others = {runner.new_conversation().generate(prompt, max_new_tokens=8, sampling=Sampling(1.5, 0.9, seed), stop_at_eos=False).token_ids for seed in range(4)}
    assert len(others) > 1, "different seeds never changed a sampled sequence"
    # top_p so small that only the most likely token survives: sampling equals greedy
    greedy = runner.new_conversation().generate(prompt, max_new_tokens=8, stop_at_eos=False)
    narrow = runner.new_conversation().generate(prompt, max_new_tokens=8, sampling=Sampling(1.0, 1e-6, seed=1), stop_at_eos=False)
    assert narrow.token_ids == greedy.token_ids


def test_streaming_and_eos_stop(exported: Callable[..., Path]) -> None:
    runner = HfStaticRunner.from_file(exported("llama"))
    prompt = prompt_of(6, seed=6)
    streamed: list[int] = []
    full = runner.new_conversation().generate(prompt, max_new_tokens=6, stop_at_eos=False, on_token=streamed.append)
    assert tuple(streamed) == full.token_ids
    # make the third generated token an end-of-sequence id: generation stops there and includes it
    import dataclasses

    runner.metadata = dataclasses.replace(runner.metadata, eos_ids=(full.token_ids[2],))
    stopped = runner.new_conversation().generate(prompt, max_new_tokens=6)
    assert stopped.token_ids == full.token_ids[: full.token_ids.index(full.token_ids[2]) + 1]
    assert stopped.stopped == "eos"


def test_mixed_delegates_generate_what_one_backend_does(exported: Callable[..., Path]) -> None:
    """Prefill through the core's reference backend, decode through AOTI, one caller-owned cache."""
    mixed = etsdk.load(exported("llama", prefill="reference", decode="aoti"))
    assert mixed.delegates("prefill") == ("EtsdkReferenceBackend",)
    assert mixed.delegates("decode") == ("EtsdkAotiBackend",)
    mixed_runner = HfStaticRunner(mixed)
    single_runner = HfStaticRunner.from_file(exported("llama"))
    for length in (T - 1, 2 * T + 3):
        prompt = prompt_of(length, seed=7)
        want = single_runner.new_conversation().generate(prompt, max_new_tokens=NEW, stop_at_eos=False)
        got = mixed_runner.new_conversation().generate(prompt, max_new_tokens=NEW, stop_at_eos=False)
        assert got.token_ids == want.token_ids


def test_decode_observes_what_prefill_wrote(exported: Callable[..., Path]) -> None:
    runner = HfStaticRunner(etsdk.load(exported("llama", prefill="reference", decode="aoti")))
    prompt = prompt_of(T, seed=8)
    written = runner.new_conversation()
    written.run_step(Step("prefill", 0, tuple(prompt), T))  # reference backend writes rows 0..T-1
    assert written.session.state["k0"][0, :, :T].abs().sum() > 0
    after_prefill = written.run_step(Step("decode", T, (9,), 1)).clone()  # AOTI reads them
    unwritten = runner.new_conversation()  # same call, a cache prefill never wrote
    without = unwritten.run_step(Step("decode", T, (9,), 1)).clone()
    assert not torch.allclose(after_prefill, without, atol=1e-3)


@pytest.mark.parametrize(("start", "real", "rows"), [(0, 1, 1), (5, 1, 1), (0, T - 1, T), (3, T, T), (S - T, 2, T)])
def test_in_place_inputs_match_the_mask_definition(start: int, real: int, rows: int) -> None:
    from etsdk_hf_static.runtime.planning import MethodInputs as _MethodInputs

    inputs = _MethodInputs(rows, S)
    for _ in range(2):  # a second fill over the first must not leave anything behind
        ids, positions, mask = inputs.fill(Step("decode" if rows == 1 else "prefill", start, tuple(range(1, real + 1)), rows))
    assert ids[0, :real].tolist() == list(range(1, real + 1)) and not ids[0, real:].any()
    assert positions.tolist() == list(range(start, start + rows))
    assert torch.equal(mask, causal_mask(start, real, rows, S))
    assert mask.sum(-1).min() >= 1  # every row, padded ones too, sees at least one column


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0, seed=0)], ids=["greedy", "sampled"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_are_an_error_not_a_token(sampling: Sampling, bad: float) -> None:
    from etsdk import GenerationError
    from etsdk_hf_static.runtime.sampling import choose, generator_for

    logits = torch.zeros(16)
    logits[3] = 1.0
    assert choose(logits, sampling, generator_for(sampling)) in range(16)
    logits[11] = bad
    with pytest.raises(GenerationError, match="non-finite logits"):
        choose(logits, sampling, generator_for(sampling))


@pytest.mark.parametrize(
    "row",
    [
        torch.tensor([1.0, 3.0, 3.0, 2.0]),  # ties: the first maximum
        torch.tensor([-float("inf")] * 3),
        torch.randn(10, 3, generator=torch.Generator().manual_seed(0))[:, 1],  # a strided view
        torch.randn(49152, generator=torch.Generator().manual_seed(1)),
        torch.tensor([1.0, 2.0, 0.5], dtype=torch.float16),
        torch.tensor([1.0, 2.0, 0.5], dtype=torch.bfloat16),  # no numpy dtype: torch's argmax
    ],
    ids=["ties", "all-minus-inf", "strided", "vocab", "float16", "bfloat16"],
)
def test_greedy_choice_is_torch_argmax(row: torch.Tensor) -> None:
    """Greedy picks with numpy on the calling thread (no OpenMP region per token); the token is torch.argmax's."""
    from etsdk_hf_static.runtime.sampling import choose

    if bool(torch.isfinite(row).all()):
        assert choose(row, Sampling(), None) == int(torch.argmax(row))
    else:
        from etsdk_hf_static.runtime.sampling import _argmax

        assert _argmax(row) == int(torch.argmax(row))
