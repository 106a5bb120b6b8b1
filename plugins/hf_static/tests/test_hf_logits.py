"""Prefill logits: by default a chunk computes its last real row's only (the row generation reads), the other rows
zero; ``full_logits=True`` keeps every row's. Both through real exports (reference backend: the graph, not a
kernel, decides which rows are projected) and eager PyTorch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import etsdk
import pytest
import torch
from conftest import S, T, prompt_of
from etsdk_hf_static.exporting.exporter import export
from etsdk_hf_static.exporting.module import StaticCausalLM
from etsdk_hf_static.masks import causal_mask, last_real_row
from etsdk_hf_static.metadata import read_metadata
from etsdk_hf_static.runtime.runner import HfStaticRunner


@pytest.mark.parametrize("rows", [1, 2, 8, 64])
def test_the_last_real_row_is_read_from_every_causal_mask(rows: int) -> None:
    context = 2 * rows + 5
    for start in (0, 1, rows, context - rows):
        for real in range(1, rows + 1):
            assert last_real_row(causal_mask(start, real, rows, context)).tolist() == [real - 1], (start, real)


@pytest.fixture(scope="module")
def both(models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    """The tiny Llama exported on the reference backend twice: ``{False: default, True: full_logits=True}``."""
    out = {}
    for full in (False, True):
        path = tmp_path_factory.mktemp(f"logits-{full}") / "model.pte"
        export(models["llama"], path, backend="reference", prefill_length=T, context_length=S, full_logits=full, quiet=True)
        out[full] = path
    return out


def _prefill(path: Path, tokens: list[int], start: int) -> torch.Tensor:
    program = etsdk.load(path)
    ids = torch.zeros(1, T, dtype=torch.long)
    ids[0, : len(tokens)] = torch.tensor(tokens)
    positions = torch.arange(start, start + T)
    session = program.new_session()
    for name, tensor in session.state.items():
        if name.startswith("c"):  # the counters say where the chunk is written, as a conversation sets them
            tensor.fill_(start)
    return program.run("prefill", ids, positions, causal_mask(start, len(tokens), T, S), session=session)[0]


@pytest.mark.parametrize(("start", "real"), [(0, 1), (0, 3), (0, T), (5, T - 2), (S - T, 4)])
def test_a_default_program_projects_only_the_last_real_row(both: dict[bool, Path], models: dict[str, Any], start: int, real: int) -> None:
    tokens = prompt_of(real, seed=start)
    last, every = _prefill(both[False], tokens, start), _prefill(both[True], tokens, start)
    assert last.shape == every.shape == (1, T, models["llama"].config.vocab_size)
    others = torch.arange(T) != real - 1
    assert torch.count_nonzero(last[0, others]) == 0
    assert torch.count_nonzero(every[0, others]) > 0  # a full-logits program projects them all
    scale = float(every[0, real - 1].abs().max())
    torch.testing.assert_close(last[0, real - 1], every[0, real - 1], atol=1e-5 * scale, rtol=0)
    with torch.no_grad():  # and the full program's rows are the model's own
        eager = StaticCausalLM(models["llama"], S).eval()
        for name, counter in eager.named_buffers():
            if name.startswith("cumulative_length"):
                counter.fill_(start)
        ids = torch.zeros(1, T, dtype=torch.long)
        ids[0, :real] = torch.tensor(tokens)
        want = eager(ids, torch.arange(start, start + T), causal_mask(start, real, T, S))
    torch.testing.assert_close(every[0, :real], want[0, :real], atol=1e-5 * scale, rtol=0)


def test_the_metadata_says_which_rows_are_projected(both: dict[bool, Path]) -> None:
    records = {full: etsdk.load(path).contract for full, path in both.items()}
    assert read_metadata(records[False]).full_logits is False
    assert read_metadata(records[True]).full_logits is True
    assert records[False] is not None and records[False].metadata["hf_static"]["full_logits"] is False
    # a full-logits program writes no field: what programs exported before it existed mean, so older runners read it
    assert records[True] is not None and "full_logits" not in records[True].metadata["hf_static"]


def test_generation_is_the_same_either_way(both: dict[bool, Path]) -> None:
    runners: dict[bool, Callable[[list[int]], list[int]]] = {}
    for full, path in both.items():
        runner = HfStaticRunner.from_file(path)
        runners[full] = lambda prompt, r=runner: list(r.new_conversation().generate(prompt, max_new_tokens=4, stop_at_eos=False).token_ids)
    for length in (1, T - 1, T + 3):
        prompt = prompt_of(length, seed=3)
        assert runners[False](prompt) == runners[True](prompt), length


@pytest.mark.parametrize(("start", "real"), [(0, 3), (5, 1), (S - T, T - 1)])
def test_zeroed_padding_leaves_the_real_rows_bit_for_bit(models: dict[str, Any], start: int, real: int) -> None:
    ids = torch.zeros(1, T, dtype=torch.long)
    ids[0, :real] = torch.tensor(prompt_of(real, seed=real))
    out = {}
    for skip in (False, True):
        wrapper = StaticCausalLM(models["llama"], S, skip_padding=skip).eval()
        for name, counter in wrapper.named_buffers():
            if name.startswith("cumulative_length"):
                counter.fill_(start)
        with torch.no_grad():
            out[skip] = (wrapper(ids, torch.arange(start, start + T), causal_mask(start, real, T, S)), wrapper.key_cache_0.clone())
        if wrapper.padding is not None:
            wrapper.padding.close()
    assert torch.equal(out[True][0][0, :real], out[False][0][0, :real])
    rows = slice(start, start + real)  # the cache rows the real tokens wrote; the padded ones differ
    assert torch.equal(out[True][1][:, :, rows], out[False][1][:, :, rows])
    assert not torch.equal(out[True][1][:, :, start + real : start + T], out[False][1][:, :, start + real : start + T])


def test_export_leaves_no_hook_on_the_model(both: dict[bool, Path], models: dict[str, Any]) -> None:
    hooked = [name for name, module in models["llama"].named_modules() if module._forward_pre_hooks]
    assert hooked == []


def test_padding_rows_touch_the_sequence_layout_only() -> None:
    from etsdk_hf_static.exporting.module import PaddingRows

    layer = torch.nn.Linear(5, 3)
    model = torch.nn.Sequential(layer)
    padding = PaddingRows(model)
    x = torch.randn(1, 4, 5)
    with torch.no_grad():
        padding.set(4, last_real_row(causal_mask(0, 2, 4, 8)))  # two real rows of four
        zeroed = layer(x)
        gathered = layer(x[0])  # [T, K]: rows in another order (a mixture of experts' tokens), left alone
        padding.rows = None
        plain = layer(x)
    assert torch.equal(zeroed[0, :2], plain[0, :2]) and torch.equal(zeroed[0, 2:], layer.bias.expand(2, 3))
    assert torch.equal(gathered, plain[0])
    padding.close()
    assert not layer._forward_pre_hooks
