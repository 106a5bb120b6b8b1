"""The batched decode step (export side, eager): row s of one call is slot s's own decode step.

:class:`BatchedDecodeLM` over K slots against K single-conversation wrappers (:class:`WindowedCausalLM`) whose
histories differ in length: the logits and every slot's caches after the step, for full, sliding-window and mixed
layers, float32 and int8 caches, with ``etsdk::attention`` (one call per slot, each reading its own filled rows)
and with the model's own attention; then exported programs with ``decode_batch`` at run time
(:func:`run_decode_batch`, the server's engine): the same replies as each conversation alone.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from etsdk import ExportError, GenerationError, StateSlot
from etsdk.backend import attention_rows_read
from etsdk_hf_static.exporting.attention import filled_attention
from etsdk_hf_static.exporting.batched import BatchedDecodeLM
from etsdk_hf_static.exporting.exporter import export
from etsdk_hf_static.exporting.module import WindowedCausalLM, layer_kinds
from etsdk_hf_static.exporting.tiny import tiny_model
from etsdk_hf_static.masks import causal_mask, slot_mask
from etsdk_hf_static.metadata import ring_rows
from etsdk_hf_static.runtime.conversation import run_decode_batch
from etsdk_hf_static.runtime.planning import Step
from etsdk_hf_static.runtime.runner import HfStaticRunner

S, T = 32, 4
LENGTHS = (5, 13, 22)  # rings of R rows wrap for the longer ones


def _masks(position: int, ring: int | None, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    windowed = slot_mask(position, 1, 1, ring, window) if ring is not None and window is not None else torch.ones(1, 1, 1, 1, dtype=torch.bool)
    return causal_mask(position, 1, 1, S), windowed


@pytest.mark.parametrize("filled", [True, False], ids=["etsdk-attention", "own-attention"])
@pytest.mark.parametrize("cache_dtype", ["float32", "int8"])
@pytest.mark.parametrize("architecture", [("llama", None), ("mistral", 6), ("gemma3", 6)], ids=lambda a: a[0])
def test_each_row_is_its_slots_decode_step(architecture: tuple[str, int | None], cache_dtype: str, filled: bool) -> None:
    name, window = architecture
    torch.manual_seed(0)
    model = tiny_model(name, window=window, layers=3 if name == "gemma3" else 2, positions=64)
    kinds, found_window = layer_kinds(model, S)
    ring = ring_rows(found_window, T, S) if found_window is not None else None
    generator = torch.Generator().manual_seed(1)
    histories = [torch.randint(3, 100, (n + 1,), generator=generator) for n in LENGTHS]
    batched = BatchedDecodeLM(model, S, len(LENGTHS), ring_rows=ring, kinds=kinds, cache_dtype=cache_dtype).eval()
    want, singles = [], []
    with torch.no_grad(), filled_attention(model, filled):
        for slot, history in enumerate(histories):
            single = WindowedCausalLM(model, S, ring, kinds, cache_dtype).eval()
            for p in range(len(history) - 1):
                single(history[p].reshape(1, 1), torch.tensor([p]), *_masks(p, ring, found_window))
            for buffer, tensor in single.named_buffers(recurse=False):
                getattr(batched, f"{buffer}_s{slot}").copy_(tensor)
            last = len(history) - 1
            want.append(single(history[last].reshape(1, 1), torch.tensor([last]), *_masks(last, ring, found_window)))
            singles.append(dict(single.named_buffers(recurse=False)))
        positions = torch.tensor([len(h) - 1 for h in histories])
        masks = [_masks(int(p), ring, found_window) for p in positions]
        before = attention_rows_read()
        got = batched(
            torch.stack([h[-1] for h in histories]).reshape(-1, 1), positions,
            torch.cat([m[0] for m in masks]), torch.cat([m[1] for m in masks]),
        )
        read = attention_rows_read() - before
    assert got.shape == (len(LENGTHS), 1, model.config.vocab_size)
    for slot in range(len(LENGTHS)):
        torch.testing.assert_close(got[slot : slot + 1], want[slot], atol=1e-4, rtol=1e-4)
        for buffer, tensor in singles[slot].items():
            mine = getattr(batched, f"{buffer}_s{slot}")
            if tensor.dtype == torch.int8:  # one row quantized from a float row that rounds differently over K rows
                assert int((mine.int() - tensor.int()).abs().max()) <= 1, f"slot {slot}: {buffer}"
            else:
                torch.testing.assert_close(mine, tensor, atol=1e-5, rtol=1e-5, msg=f"slot {slot}: {buffer}")
    if filled:  # each slot attends over its own filled rows only (a full layer: position + 1; a ring: up to R)
        rows = sum(min(p + 1, ring) if kind == "window" else p + 1 for kind in kinds for p in positions.tolist())
        assert read == rows
    else:
        assert read == 0


def test_buffers_are_per_slot_states() -> None:
    model = tiny_model("llama")
    batched = BatchedDecodeLM(model, S, 2)
    single = WindowedCausalLM(model, S, None, ("full", "full"))
    slots = batched.state_slots()
    assert slots["k0_s1"] == StateSlot("k0", 1) and len(slots) == 2 * len(dict(single.named_buffers(recurse=False)))
    for fqn, slot in slots.items():
        assert getattr(batched, fqn).shape == getattr(single, slot.state).shape and fqn.endswith(f"_s{slot.slot}")
    for bad, message in (
        ({"slots": 0}, "at least one slot"), ({"slots": 2, "kinds": ("full",)}, "kinds"), ({"slots": 2, "cache_dtype": "int4"}, "int4"),
    ):
        with pytest.raises(ExportError, match=message):
            BatchedDecodeLM(model, S, **bad)


# ----------------------------------------------------------------------------- exported: decode_batch at run time

PROMPTS = ([5, 9, 12, 30, 31], list(range(3, 20)), [7, 7, 8])


@pytest.fixture(scope="module")
def batched_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A v1 Llama (float caches, counters) and a v3 Gemma 3 (int8 caches, ring layers) with decode_batch over 3
    conversations, and the Llama without it; the reference backend (etsdk-aoti's side: the conformance kit)."""
    root = tmp_path_factory.mktemp("batched")
    out = {}
    for name, model, options in (
        ("llama", tiny_model("llama", seed=0), {"decode_batch": 3}),
        ("gemma3", tiny_model("gemma3", seed=0, window=6), {"decode_batch": 3, "kv_cache": "int8"}),
        ("plain", tiny_model("llama", seed=0), {}),
    ):
        out[name] = root / f"{name}.pte"
        export(model, out[name], backend="reference", prefill_length=8, context_length=48, quiet=True, **options)
    return out


def _together(runner: HfStaticRunner, prompts: Sequence[Sequence[int]], new: int) -> list[list[int]]:
    """Greedy replies to ``prompts``, their prompts run alone and their decode steps together whenever 2 or more
    are decoding (one spare for a row left over)."""
    generations = [runner.new_conversation().begin(p, max_new_tokens=new, sampling=None) for p in prompts]
    for generation in generations:
        while generation.decode_step is None and not generation.done:
            generation.advance()
    spares = [runner.new_conversation()]
    while not all(g.done for g in generations):
        live = [g for g in generations if not g.done]
        if len(live) == 1:
            live[0].advance()
            continue
        started = time.perf_counter()
        rows = run_decode_batch([g.conversation for g in live], [g.decode_step for g in live], spares)
        for generation, logits in zip(live, rows):
            generation.took(logits, started)
    return [g.tokens for g in generations]


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_decoding_together_gives_each_conversation_its_own_reply(batched_programs: dict[str, Path], name: str) -> None:
    runner = HfStaticRunner.from_file(batched_programs[name])
    assert runner.decode_batch == 3 and "decode_batch" in runner.program.methods
    alone = [list(runner.new_conversation().generate(p, max_new_tokens=12).token_ids) for p in PROMPTS]
    assert _together(runner, PROMPTS, 12) == alone  # rows of different lengths, then two rows and a spare
    # the logits themselves, one step: row j is conversation j's own decode step
    conversations = [runner.new_conversation() for _ in PROMPTS]
    for conversation, prompt in zip(conversations, PROMPTS):
        conversation.generate(prompt, max_new_tokens=1)
    steps = [Step("decode", c.position, (c.pending[0],), 1) for c in conversations]
    rows = [r.clone() for r in run_decode_batch(conversations, steps, [])]
    for j, (conversation, step) in enumerate(zip(conversations, steps)):
        assert conversation.position == step.start + 1 and conversation.pending == ()
        twin = runner.new_conversation()
        twin.generate(PROMPTS[j], max_new_tokens=1)
        torch.testing.assert_close(rows[j], twin.run_step(step), atol=1e-4, rtol=1e-4)


def test_decode_batch_refusals(batched_programs: dict[str, Path]) -> None:
    runner = HfStaticRunner.from_file(batched_programs["llama"])
    a, b, c, d = (runner.new_conversation() for _ in range(4))
    for conversation in (a, b, c, d):
        conversation.generate([4, 5, 6], max_new_tokens=1)
    step = Step("decode", 3, (9,), 1)
    cases = [
        (([a, b, c, d], [step] * 4, []), "advances 3 conversations: 4 given"),
        (([a, b], [step] * 2, []), "2 given with 2 step(s) and 0 spare"),
        (([a, a, b], [step] * 3, []), "distinct conversations"),
        (([a, b, c], [step, step, Step("prefill", 3, (9,), 8)], []), "runs decode steps"),
        (([a, b, c], [step, step, Step("decode", 48, (9,), 1)], []), "outside 0..47"),
    ]
    before = [dict((n, t.clone()) for n, t in x.session.state.items()) for x in (a, b, c, d)]
    for args, message in cases:
        with pytest.raises(GenerationError, match=re.escape(message)):
            run_decode_batch(*args)
    for x, saved in zip((a, b, c, d), before):
        assert all(torch.equal(x.session.state[n], t) for n, t in saved.items()), "a refused call changed a session"
    with pytest.raises(GenerationError, match="distinct conversations of one loaded model"):
        other = HfStaticRunner.from_file(batched_programs["llama"]).new_conversation()  # another load: another model
        run_decode_batch([a, b], [step, step], [other])
    generation = runner.new_conversation().begin(list(range(3, 20)), max_new_tokens=2, sampling=None)
    with pytest.raises(GenerationError, match="chunk\\(s\\) left to run"):
        generation.took(torch.zeros(runner.metadata.vocab_size), time.perf_counter())
    generation.cancel()
    with pytest.raises(GenerationError, match="has stopped \\(cancelled\\)"):
        generation.took(torch.zeros(runner.metadata.vocab_size), time.perf_counter())
    plain = HfStaticRunner.from_file(batched_programs["plain"])
    assert plain.decode_batch is None and "B" not in plain.program.contract.dims
    assert "method.slots" not in plain.program.contract.required_features  # the record older readers know
    with pytest.raises(GenerationError, match="has no decode_batch method"):
        run_decode_batch([plain.new_conversation(), plain.new_conversation()], [step, step], [])


def _serve(runner: HfStaticRunner, prompts: Sequence[Sequence[int]], new: int) -> tuple[dict[int, Any], Any]:
    """``prompts`` through the server's engine (4 slots), submitted together; each one's outcome, and the metrics."""
    from etsdk import Sampling
    from etsdk_hf_static.apps.serve.engine import Engine, Job
    from etsdk_hf_static.apps.serve.metrics import Metrics

    metrics = Metrics()
    engine = Engine(runner, slots=4, queue=4, metrics=metrics)
    done = {i: threading.Event() for i in range(len(prompts))}
    outcomes: dict[int, Any] = {}

    def emit(index: int) -> Any:
        def receive(event: tuple[str, Any]) -> None:
            if event[0] in ("done", "error"):
                outcomes[index] = event[1]
                done[index].set()
        return receive

    try:
        for index, prompt in enumerate(prompts):
            engine.submit(Job(tuple(prompt), new, Sampling(ignore_eos=True), emit(index)))
        assert all(event.wait(120) for event in done.values())
    finally:
        engine.stop()
    return outcomes, metrics


def test_the_server_engine_decodes_requests_together(batched_programs: dict[str, Path]) -> None:
    runner = HfStaticRunner.from_file(batched_programs["llama"])
    alone = [list(runner.new_conversation().generate(p, max_new_tokens=12, stop_at_eos=False).token_ids) for p in PROMPTS]
    outcomes, metrics = _serve(runner, PROMPTS, 12)
    for index in range(len(PROMPTS)):
        outcome = outcomes[index]
        assert not isinstance(outcome, Exception), outcome
        assert outcome.completion_tokens == 12
        assert runner.decode_text(alone[index]) == outcome.text, index
    assert metrics.value("decode_batch_calls_total") > 0
    assert metrics.value("decode_batch_rows_total") >= 2 * metrics.value("decode_batch_calls_total")


def test_a_failed_decode_batch_call_fails_its_requests_and_a_refused_one_steps_alone(
    batched_programs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from etsdk_hf_static.apps.serve import engine as engine_module

    runner = HfStaticRunner.from_file(batched_programs["llama"])
    real = engine_module.run_decode_batch
    calls = {"n": 0}

    def refused(*args: Any) -> Any:
        raise GenerationError("refused before running")

    monkeypatch.setattr(engine_module, "run_decode_batch", refused)  # every call refused: each request steps alone
    outcomes, metrics = _serve(runner, PROMPTS, 6)
    alone = [runner.decode_text(runner.new_conversation().generate(p, max_new_tokens=6, stop_at_eos=False).token_ids) for p in PROMPTS]
    assert [outcomes[i].text for i in range(len(PROMPTS))] == alone and metrics.value("decode_batch_calls_total") == 0

    def broken(*args: Any) -> Any:  # the first call fails inside the program: its requests fail, the rest go on
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("the delegate failed")
        return real(*args)

    monkeypatch.setattr(engine_module, "run_decode_batch", broken)
    outcomes, _ = _serve(runner, PROMPTS, 6)
    failed = [i for i, o in outcomes.items() if isinstance(o, Exception)]
    assert failed and all("the delegate failed" in str(outcomes[i]) for i in failed)
    assert calls["n"] >= 1
