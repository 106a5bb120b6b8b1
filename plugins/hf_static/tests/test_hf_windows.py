"""hf_static v2: sliding-window layers in ring caches, exported from tiny Gemma 3 and Mistral models.

Greedy generation runs well past the window (W=6, prompts up to 19 tokens, 10 new ones) and equals transformers'
eager ``generate`` (whose own sliding-window cache is a different implementation), through AOTI, through the
reference backend, and with prefill on one and decode on the other. Conversations over a ring-cache program
fork, rewind, save and load into exactly the tokens of fresh conversations that went the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import etsdk
import pytest
import torch
from conftest import MARGIN, S, T, hf_generate, prompt_of
from etsdk_hf_static.exporting.exporter import export
from etsdk_hf_static.exporting.tiny import tiny_model
from etsdk_hf_static.masks import causal_mask, slot_mask
from etsdk_hf_static.metadata import MetadataError, read_metadata
from etsdk_hf_static.runtime.runner import HfStaticRunner

WINDOW = 6
NEW = 10
#: per architecture: the tiny model (Gemma 3: sliding, sliding, full, sliding; Mistral: every layer sliding)
SHAPES = {"gemma3": {"layers": 4}, "mistral": {"layers": 2}}
ROUTES = [("gemma3", "aoti", "aoti"), ("gemma3", "reference", "reference"), ("gemma3", "reference", "aoti"),
          ("mistral", "aoti", "aoti"), ("mistral", "reference", "reference")]


@pytest.fixture(scope="module")
def windowed_models() -> dict[str, Any]:
    return {arch: tiny_model(arch, window=WINDOW, seed=3, **shape) for arch, shape in SHAPES.items()}


@pytest.fixture(scope="module")
def windowed(windowed_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    cache: dict[tuple[str, str, str], Path] = {}

    def get(arch: str, prefill: str, decode: str) -> Path:
        if (arch, prefill, decode) not in cache:
            path = tmp_path_factory.mktemp(f"{arch}-{prefill}-{decode}") / "model.pte"
            export(windowed_models[arch], path, prefill_backend=prefill, decode_backend=decode, prefill_length=T,
                   context_length=S, partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=True)
            cache[(arch, prefill, decode)] = path
        return cache[(arch, prefill, decode)]

    return get


@pytest.fixture(scope="module")
def ring_runner(windowed: Callable[..., Path]) -> HfStaticRunner:
    return HfStaticRunner.from_file(windowed("gemma3", "reference", "reference"))


@pytest.mark.parametrize(("arch", "prefill", "decode"), ROUTES, ids=["-".join(r) for r in ROUTES])
def test_generation_past_the_window_equals_transformers(
    arch: str, prefill: str, decode: str, windowed_models: dict[str, Any], windowed: Callable[..., Path]
) -> None:
    runner = HfStaticRunner.from_file(windowed(arch, prefill, decode))
    meta = runner.metadata
    assert (meta.version, meta.window, meta.ring_rows) == (2, WINDOW, WINDOW + T - 1)
    assert meta.layer_kinds == (("window", "window", "full", "window") if arch == "gemma3" else ("window", "window"))
    assert runner.program.contract is not None and runner.program.contract.version == 2
    for length in (1, T - 1, T + 1, 2 * T + 3):
        prompt = prompt_of(length, seed=5)
        expected, margin = hf_generate(windowed_models[arch], prompt, NEW)
        assert margin > MARGIN, f"eager top-2 margin {margin:.2e} too small for a token comparison"
        runner.reset()
        got = runner.generate(prompt, max_new_tokens=NEW, stop_at_eos=False).token_ids
        assert list(got) == expected, f"prompt of {length}"
        assert length + NEW > WINDOW + 1  # the comparison runs past the window


def test_ring_caches_have_r_rows_and_the_program_no_counters(ring_runner: HfStaticRunner) -> None:
    record = ring_runner.program.contract
    assert record is not None
    shapes = {s.name: tuple(s.shape) for s in record.states}
    R = WINDOW + T - 1
    assert shapes == {"k0": (1, 2, S, 16), "v0": (1, 2, S, 16), **{f"{p}{i}": (1, 2, R, 16) for p in ("kw", "vw") for i in range(3)}}
    assert [i.name for i in record.method("decode").engine_inputs] == ["input_ids", "positions", "attention_mask", "window_mask"]


def test_the_ring_mask_is_the_causal_mask_on_a_ring_of_s_rows() -> None:
    for start, real, rows in [(0, 1, 1), (0, 5, 8), (3, 8, 8), (22, 1, 1), (20, 3, 8)]:
        assert torch.equal(slot_mask(start, real, rows, S, S), causal_mask(start, real, rows, S))
    ring, window = 13, 6
    mask = slot_mask(17, 3, 8, ring, window)
    for i in range(8):
        p = 17 + min(i, 2)
        wanted = {q % ring for q in range(max(0, p - window + 1), p + 1)}
        assert {s for s in range(ring) if mask[0, 0, i, s]} == wanted


def _fresh(runner: HfStaticRunner) -> Any:
    return runner.new_conversation()


def test_a_short_rewind_keeps_the_ring_and_equals_a_fresh_conversation(ring_runner: HfStaticRunner) -> None:
    prompt, follow = prompt_of(9, seed=1), prompt_of(4, seed=2)
    a = _fresh(ring_runner)
    a.generate(prompt, max_new_tokens=8, stop_at_eos=False)
    before = a.position
    a.rewind(3)
    assert a.position == before - 3  # within R - W + 1 rows: nothing is written again
    b = _fresh(ring_runner)
    b.generate(prompt, max_new_tokens=5, stop_at_eos=False)
    assert a.tokens == b.tokens
    assert a.generate(follow, max_new_tokens=6, stop_at_eos=False).token_ids == b.generate(follow, max_new_tokens=6, stop_at_eos=False).token_ids


def test_a_rewind_past_the_ring_re_prefills_and_equals_a_fresh_conversation(ring_runner: HfStaticRunner) -> None:
    meta = ring_runner.metadata
    reach = meta.rewind_reach()
    assert reach == meta.ring_rows - meta.window + 1 == T
    prompt, follow = prompt_of(5, seed=3), prompt_of(3, seed=4)
    a = _fresh(ring_runner)
    a.generate(prompt, max_new_tokens=20, stop_at_eos=False)
    a.rewind(reach + 4)
    assert a.position == 0 and len(a.pending) == len(a.tokens)  # every kept token is written again
    b = _fresh(ring_runner)
    got = a.generate(follow, max_new_tokens=6, stop_at_eos=False).token_ids
    assert got == b.generate([*a.tokens[: -len(follow) - 6], *follow], max_new_tokens=6, stop_at_eos=False).token_ids


def test_rewinds_count_every_row_written_past_the_new_position(ring_runner: HfStaticRunner) -> None:
    """Two rewinds in a row, and a rewind after a padded prefill chunk, re-prefill when rows they need were
    overwritten (the reach counts the highest row written, not the position before the rewind)."""
    reach = ring_runner.metadata.rewind_reach()
    assert reach == T
    prompt, follow = prompt_of(5, seed=7), prompt_of(3, seed=8)
    a = _fresh(ring_runner)
    a.generate(prompt, max_new_tokens=16, stop_at_eos=False)
    a.rewind(T)  # within reach of the highest row written
    assert a.position > 0
    a.rewind(1)  # one more: now T + 1 rows were written past the position
    assert a.position == 0
    b = _fresh(ring_runner)
    want = b.generate([*a.tokens, *follow], max_new_tokens=5, stop_at_eos=False).token_ids
    assert a.generate(follow, max_new_tokens=5, stop_at_eos=False).token_ids == want

    c = _fresh(ring_runner)
    c.prefill(prompt_of(T, seed=9))  # one full chunk: rows 0 .. T-1
    c.generate(prompt_of(3, seed=10), max_new_tokens=1, stop_at_eos=False)  # a padded chunk writes rows up to 2T-1
    c.rewind(T - 2)
    assert c.position == 0  # the padding reached past what the ring can spare
    d = _fresh(ring_runner)
    want = d.generate([*c.tokens, *follow], max_new_tokens=5, stop_at_eos=False).token_ids
    assert c.generate(follow, max_new_tokens=5, stop_at_eos=False).token_ids == want


def test_a_window_no_shorter_than_the_context_exports_as_full_attention(tmp_path: Path) -> None:
    model = tiny_model("mistral", window=2 * S, seed=3)
    path = tmp_path / "model.pte"
    export(model, path, backend="reference", prefill_length=T, context_length=S, quiet=True)
    runner = HfStaticRunner.from_file(path)
    assert runner.metadata.version == 1
    prompt = prompt_of(T + 2, seed=4)
    expected, margin = hf_generate(model, prompt, 6)
    assert margin > MARGIN
    assert list(runner.generate(prompt, max_new_tokens=6, stop_at_eos=False).token_ids) == expected


def test_fork_save_and_load_continue_exactly(ring_runner: HfStaticRunner, tmp_path: Path) -> None:
    prefix = prompt_of(T + 3, seed=6)
    base = _fresh(ring_runner)
    base.prefill(prefix)  # full chunks written, the rest pending: shared by every fork
    twins = [base.fork() for _ in range(2)]
    for index, twin in enumerate(twins):
        follow = prompt_of(3, seed=10 + index)
        fresh = _fresh(ring_runner).generate([*prefix, *follow], max_new_tokens=8, stop_at_eos=False).token_ids
        assert twin.generate(follow, max_new_tokens=8, stop_at_eos=False).token_ids == fresh
    saved = twins[0].save(tmp_path / "ring.safetensors", {"note": "past the window"})
    loaded, user = ring_runner.load_conversation(saved)
    assert user == {"note": "past the window"} and loaded.tokens == twins[0].tokens
    follow = prompt_of(2, seed=20)
    assert loaded.generate(follow, max_new_tokens=5, stop_at_eos=False).token_ids == twins[0].generate(
        follow, max_new_tokens=5, stop_at_eos=False
    ).token_ids


def test_v2_metadata_that_disagrees_with_itself_is_refused(ring_runner: HfStaticRunner) -> None:
    from dataclasses import replace

    record = ring_runner.program.contract
    assert record is not None
    raw = dict(record.metadata["hf_static"])
    for change, message in [
        ({"ring_rows": WINDOW + T}, r"metadata.ring_rows: W=6, T=8 and S=31 need 13 ring rows, found 14"),
        ({"layer_kinds": ["full"] * 4}, r"metadata.layer_kinds: a hf_static v2 program has a 'window' layer, found none"),
        ({"layer_kinds": ["window"] * 3}, r"metadata.layer_kinds: expected a list of 4 entries"),
        ({"window": S}, r"metadata.window: a ring layer's window must be below S=31, found 31"),
        ({"format": 1}, r"metadata.format: expected 2, found 1"),
    ]:
        edited = replace(record, metadata={**record.metadata, "hf_static": {**raw, **change}})
        with pytest.raises(MetadataError, match=message):
            read_metadata(edited)


def test_a_full_attention_model_still_exports_version_1(exported: Callable[..., Path]) -> None:
    program = etsdk.load(exported("llama", "reference", "reference"))
    assert program.contract is not None and program.contract.version == 1
    meta = read_metadata(program.contract)
    assert meta.version == 1 and "layer_kinds" not in program.contract.metadata["hf_static"]
    assert {f"c{i}" for i in range(meta.layers)} <= {s.name for s in program.contract.states}
