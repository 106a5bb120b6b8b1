"""Conversations fork, rewind, restore, save and load: exactly the tokens of a fresh conversation going the same way.

Greedy, the tiny Llama, through AOTI and through the reference backend. "Exactly" is checked three ways: the
tokens equal a fresh conversation's, the cache rows written are bit-identical where the very same calls were made
(and the calls are counted), and transformers' eager ``generate`` agrees with a top-2 margin that makes a token
comparison meaningful.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import MARGIN, NEW, S, T, hf_generate, prompt_of
from etsdk import GenerationError, StateError
from etsdk_hf_static.runtime.conversation import Conversation
from etsdk_hf_static.runtime.runner import HfStaticRunner, Step

BACKENDS = {"aoti": ("aoti", "aoti"), "reference": ("reference", "reference")}


@pytest.fixture(scope="module", params=list(BACKENDS))
def any_runner(request: pytest.FixtureRequest, exported: Callable[..., Path]) -> HfStaticRunner:
    prefill, decode = BACKENDS[request.param]
    return HfStaticRunner.from_file(exported("llama", prefill, decode))


def _same_rows(a: Conversation, b: Conversation) -> bool:
    """The written cache rows of ``a`` and ``b`` are bit-identical (the same calls computed them)."""
    if a.position != b.position:
        return False
    rows = a.position
    return all(
        torch.equal(t[:, :, :rows], b.session.state[name][:, :, :rows])
        for name, t in a.session.state.items()
        if name[0] in "kv"
    )


def _check_eager(models: dict[str, Any], prompt: list[int], got: tuple[int, ...]) -> None:
    expected, margin = hf_generate(models["llama"], prompt, len(got))
    assert margin > MARGIN, f"eager top-2 margin {margin:.2e} too small for a token comparison"
    assert list(got) == expected


def _count_calls(runner: HfStaticRunner, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    calls: Counter[str] = Counter()
    for name, method in runner.methods.items():
        original = method.execute

        def counted(inputs: Any, *, session: Any = None, _name: str = name, _original: Any = original) -> Any:
            calls[_name] += 1
            return _original(inputs, session=session)

        monkeypatch.setattr(method, "execute", counted)
    return calls


def test_fork_continues_exactly_like_a_fresh_conversation(any_runner: HfStaticRunner, models: dict[str, Any]) -> None:
    p1, p2, p3 = prompt_of(T + 3, seed=11), prompt_of(3, seed=12), prompt_of(5, seed=13)
    base = any_runner.new_conversation()
    first = base.generate(p1, max_new_tokens=3, stop_at_eos=False)
    fork = base.fork()
    assert fork.tokens == base.tokens and fork.position == base.position
    assert all(fork.session.state[n].data_ptr() != t.data_ptr() for n, t in base.session.state.items())
    got = {"base": base.generate(p2, max_new_tokens=NEW, stop_at_eos=False), "fork": fork.generate(p3, max_new_tokens=NEW, stop_at_eos=False)}
    for key, conversation, prompt in (("base", base, p2), ("fork", fork, p3)):
        fresh = any_runner.new_conversation()
        assert fresh.generate(p1, max_new_tokens=3, stop_at_eos=False).token_ids == first.token_ids
        want = fresh.generate(prompt, max_new_tokens=NEW, stop_at_eos=False)
        assert got[key].token_ids == want.token_ids
        assert conversation.tokens == fresh.tokens and _same_rows(conversation, fresh)
        _check_eager(models, p1 + list(first.token_ids) + prompt, got[key].token_ids)


def test_rewind_continues_exactly_like_a_fresh_conversation(any_runner: HfStaticRunner, models: dict[str, Any]) -> None:
    p1, p2 = prompt_of(T + 2, seed=21), prompt_of(4, seed=22)
    conversation = any_runner.new_conversation()
    long = conversation.generate(p1, max_new_tokens=8, stop_at_eos=False)
    conversation.rewind(3)
    assert conversation.tokens == tuple(p1) + long.token_ids[:5]
    assert conversation.pending == (long.token_ids[4],)  # the state a fresh conversation is in after 5 tokens
    got = conversation.generate(p2, max_new_tokens=NEW, stop_at_eos=False)
    fresh = any_runner.new_conversation()
    assert fresh.generate(p1, max_new_tokens=5, stop_at_eos=False).token_ids == long.token_ids[:5]
    want = fresh.generate(p2, max_new_tokens=NEW, stop_at_eos=False)
    assert got.token_ids == want.token_ids and _same_rows(conversation, fresh)
    _check_eager(models, p1 + list(long.token_ids[:5]) + p2, got.token_ids)

    conversation.rewind(len(conversation.tokens) - 6)  # back into the prompt: keep its first 6 tokens
    assert conversation.tokens == tuple(p1[:6]) and conversation.position == 5
    again = conversation.generate(p2, max_new_tokens=NEW, stop_at_eos=False)
    assert again.token_ids == any_runner.new_conversation().generate(p1[:6] + p2, max_new_tokens=NEW, stop_at_eos=False).token_ids
    _check_eager(models, p1[:6] + p2, again.token_ids)

    conversation.rewind(len(conversation.tokens))  # everything: an empty conversation over stale, masked rows
    assert conversation.tokens == () and conversation.position == 0
    empty = conversation.generate(p2, max_new_tokens=NEW, stop_at_eos=False)
    assert empty.token_ids == any_runner.new_conversation().generate(p2, max_new_tokens=NEW, stop_at_eos=False).token_ids


def test_restore_continues_exactly_like_a_fresh_conversation(any_runner: HfStaticRunner) -> None:
    p1, p2, p3 = prompt_of(2 * T, seed=31), prompt_of(T, seed=32), prompt_of(2, seed=33)  # 19 + T + NEW = S rows
    conversation = any_runner.new_conversation()
    first = conversation.generate(p1, max_new_tokens=3, stop_at_eos=False)
    snapshot = conversation.snapshot({"turn": 1})
    pointers = {n: t.data_ptr() for n, t in conversation.session.state.items()}
    conversation.generate(p2, max_new_tokens=NEW, stop_at_eos=False)  # go elsewhere
    assert conversation.restore(snapshot) == {"turn": 1}
    assert conversation.tokens == tuple(p1) + first.token_ids and conversation.position == len(p1) + 2
    assert {n: t.data_ptr() for n, t in conversation.session.state.items()} == pointers
    got = conversation.generate(p3, max_new_tokens=NEW, stop_at_eos=False)
    fresh = any_runner.new_conversation()
    fresh.generate(p1, max_new_tokens=3, stop_at_eos=False)
    assert got.token_ids == fresh.generate(p3, max_new_tokens=NEW, stop_at_eos=False).token_ids
    assert _same_rows(conversation, fresh)


@pytest.mark.parametrize("prefix_length", [T - 3, 2 * T, 2 * T + 2])  # longest: prefix + T + 1 + NEW = S
def test_a_prefix_prefilled_once_forks_into_four_exact_conversations(
    prefix_length: int, any_runner: HfStaticRunner, models: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only full prefill chunks of the prefix are written; the rest stays pending, so each fork makes exactly the
    calls a whole-prompt run makes after those chunks, whichever way its suffix splits into chunks."""
    prefix = prompt_of(prefix_length, seed=41)
    suffixes = [prompt_of(n, seed=50 + n) for n in (1, 3, T - 1, T + 1)]
    calls = _count_calls(any_runner, monkeypatch)
    shared = any_runner.new_conversation()
    written = shared.prefill(prefix)
    chunks = prefix_length // T
    assert written == chunks * T and shared.pending == tuple(prefix[written:])
    assert calls == Counter({"prefill": chunks} if chunks else {})  # the shared prefill ran once, here
    forks = [shared.fork() for _ in suffixes]
    used = []
    results = []
    for fork, suffix in zip(forks, suffixes):
        calls.clear()
        results.append(fork.generate(suffix, max_new_tokens=NEW, stop_at_eos=False))
        used.append(Counter(calls))
    for fork, suffix, got, fork_calls in zip(forks, suffixes, results, used):
        calls.clear()
        fresh = any_runner.new_conversation()
        want = fresh.generate(prefix + suffix, max_new_tokens=NEW, stop_at_eos=False)
        whole = Counter(calls)
        assert got.token_ids == want.token_ids
        assert _same_rows(fork, fresh), "the fork's cache differs from a whole-prompt run's: not the same calls"
        assert fork_calls + Counter({"prefill": chunks}) == whole  # the whole run's calls, less the shared ones
        _check_eager(models, prefix + suffix, got.token_ids)
    assert shared.position == written and shared.pending == tuple(prefix[written:])  # untouched by its forks


def test_generate_right_after_a_prefix_equals_the_whole_prompt(runner: HfStaticRunner) -> None:
    prompt = prompt_of(T + 5, seed=61)
    shared = runner.new_conversation()
    shared.prefill(prompt)
    got = shared.generate([], max_new_tokens=NEW, stop_at_eos=False)
    assert got.token_ids == runner.new_conversation().generate(prompt, max_new_tokens=NEW, stop_at_eos=False).token_ids


def test_saved_on_mixed_delegates_continues_token_exact_on_all_aoti(
    exported: Callable[..., Path], models: dict[str, Any], tmp_path: Path
) -> None:
    mixed = HfStaticRunner.from_file(exported("llama", "reference", "aoti"))
    aoti = HfStaticRunner.from_file(exported("llama"))
    assert mixed.program.delegates("prefill") != aoti.program.delegates("prefill")
    assert mixed.program.fingerprint is not None and mixed.program.fingerprint == aoti.program.fingerprint
    p1, p2 = prompt_of(T + 4, seed=71), prompt_of(3, seed=72)
    conversation = mixed.new_conversation()
    first = conversation.generate(p1, max_new_tokens=3, stop_at_eos=False)
    path = conversation.save(tmp_path / "chat.safetensors", {"who": "mixed"})
    there = conversation.generate(p2, max_new_tokens=NEW, stop_at_eos=False)  # continuing where it was saved
    moved, metadata = aoti.load_conversation(path)
    assert metadata == {"who": "mixed"}
    assert moved.tokens == tuple(p1) + first.token_ids and moved.position == len(p1) + 2
    here = moved.generate(p2, max_new_tokens=NEW, stop_at_eos=False)
    assert here.token_ids == there.token_ids
    fresh = aoti.new_conversation()
    fresh.generate(p1, max_new_tokens=3, stop_at_eos=False)
    assert fresh.generate(p2, max_new_tokens=NEW, stop_at_eos=False).token_ids == here.token_ids
    _check_eager(models, p1 + list(first.token_ids) + p2, here.token_ids)


@pytest.mark.parametrize(
    ("arch", "context_length", "message"),
    [
        ("llama-other", S, r"another model \(weights fingerprint"),
        ("llama", S + 16, rf"state 'k0' shape: the snapshot has \[1, 2, {S}, 16\], the program \[1, 2, {S + 16}, 16\]"),
    ],
)
def test_loading_on_another_model_or_another_s_is_refused(
    arch: str, context_length: int, message: str, exported: Callable[..., Path], tmp_path: Path
) -> None:
    source = HfStaticRunner.from_file(exported("llama", "reference", "aoti"))
    saved = source.new_conversation()
    saved.generate(prompt_of(5, seed=81), max_new_tokens=2, stop_at_eos=False)
    path = saved.save(tmp_path / "saved.safetensors")
    other = HfStaticRunner.from_file(exported(arch, "reference", "reference", context_length=context_length))
    target = other.new_conversation()
    target.generate(prompt_of(4, seed=82), max_new_tokens=2, stop_at_eos=False)
    tokens, state = target.tokens, {n: t.clone() for n, t in target.session.state.items()}
    with pytest.raises(StateError, match=message):
        target.load(path)
    with pytest.raises(StateError, match=message):
        other.load_conversation(path)
    assert target.tokens == tokens and all(torch.equal(target.session.state[n], t) for n, t in state.items())


def test_two_threads_with_their_own_conversations_match_one_thread(runner: HfStaticRunner) -> None:
    """Issue 14: each conversation owns its inputs, so conversations of one runner on two threads are exact."""
    prompts = [prompt_of(1 + (5 * i) % (2 * T + 3), seed=90 + i) for i in range(32)]
    expected = [runner.new_conversation().generate(p, max_new_tokens=NEW, stop_at_eos=False).token_ids for p in prompts]
    barrier = threading.Barrier(2)
    results: dict[int, list[tuple[int, ...]]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def work(index: int) -> None:
        conversation = runner.new_conversation()
        order = prompts if index == 0 else prompts[::-1]
        try:
            barrier.wait()
            for prompt in order:
                conversation.reset()
                results[index].append(conversation.generate(prompt, max_new_tokens=NEW, stop_at_eos=False).token_ids)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert results[0] == expected and results[1] == expected[::-1]


@pytest.mark.parametrize(
    "step",
    [
        Step("decode", -1, (5,), 1),
        Step("decode", S, (5,), 1),
        Step("prefill", S - T + 1, (5,), T),
        Step("prefill", 0, (), T),
        Step("decode", 0, (5, 6), 1),
        Step("prefill", 0, (5,), 1),
        Step("verify", 0, (5,), 1),
        Step("decode", 0, (10**6,), 1),
    ],
    ids=["negative", "past-the-end", "padded-past-the-end", "no-tokens", "too-many", "wrong-rows", "no-method", "bad-id"],
)
def test_steps_outside_the_cache_are_refused_before_anything_runs(step: Step, runner: HfStaticRunner) -> None:
    conversation = runner.new_conversation()
    before = {n: t.clone() for n, t in conversation.session.state.items()}
    with pytest.raises(GenerationError):
        conversation.run_step(step)
    assert all(torch.equal(conversation.session.state[n], t) for n, t in before.items())
    assert conversation.position == 0 and conversation.tokens == ()


def test_rewind_and_restore_refuse_what_they_cannot_do(runner: HfStaticRunner, tmp_path: Path) -> None:
    conversation = runner.new_conversation()
    conversation.generate(prompt_of(3, seed=91), max_new_tokens=2, stop_at_eos=False)
    for bad in (-1, 6, True, 1.5):
        with pytest.raises(GenerationError, match="rewind takes"):
            conversation.rewind(bad)  # type: ignore[arg-type]
    plain = conversation.session.save(tmp_path / "plain.safetensors")  # a session, not a conversation
    with pytest.raises(StateError, match="not taken from an hf_static conversation"):
        conversation.load(plain)
    (tmp_path / "junk.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(StateError):
        conversation.load(tmp_path / "junk.safetensors")
    gap = runner.new_conversation()
    gap.run_step(Step("decode", 1, (7,), 1))  # row 0 never written: the history is unknown
    with pytest.raises(GenerationError, match="reset"):
        gap.rewind(1)
    with pytest.raises(GenerationError, match="reset"):
        gap.save(tmp_path / "gap.safetensors")
    gap.reset()
    assert gap.tokens == ()
