"""hf_static v3: int8 key / value caches (a float32 scale per row and head beside each cache).

Exported with ``kv_cache="int8"``, tiny Llama (full attention), Gemma 3 (ring caches interleaved with a full
one) and Mistral (every layer a ring) generate exactly what the same model generates eagerly in PyTorch over
the same int8 caches (:class:`~etsdk_hf_static.exporting.module.WindowedCausalLM`, the wrapper export traces, run as
plain PyTorch with the model's own attention over the dequantized rows): through etsdk-aoti's int8 attention
kernel, through the reference backend, and with prefill on one and decode on the other. A saved int8
conversation reloads and continues token for token; forks and rewinds of an int8 ring program equal fresh
conversations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import S, T, prompt_of
from etsdk_hf_static.exporting.exporter import export, metadata_for
from etsdk_hf_static.exporting.module import WindowedCausalLM
from etsdk_hf_static.exporting.tiny import tiny_model
from etsdk_hf_static.masks import causal_mask, slot_mask
from etsdk_hf_static.metadata import HfStaticMetadata, MetadataError, read_metadata
from etsdk_hf_static.runtime.runner import HfStaticRunner

WINDOW = 6
NEW = 10
MODELS = {
    "llama": {"seed": 3},
    "gemma3": {"window": WINDOW, "seed": 3, "layers": 4},  # sliding, sliding, full, sliding
    "mistral": {"window": WINDOW, "seed": 3, "layers": 2},  # every layer sliding
}
ROUTES = [("llama", "aoti", "aoti"), ("gemma3", "reference", "aoti"), ("mistral", "reference", "reference")]


@pytest.fixture(scope="module")
def int8_models() -> dict[str, Any]:
    return {arch: tiny_model(arch, **options) for arch, options in MODELS.items()}


@pytest.fixture(scope="module")
def int8_program(int8_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    cache: dict[tuple[str, str, str, str], Path] = {}

    def get(arch: str, prefill: str, decode: str, attention: str = "auto") -> Path:
        key = (arch, prefill, decode, attention)
        if key not in cache:
            path = tmp_path_factory.mktemp(f"int8-{arch}-{prefill}-{decode}") / "model.pte"
            export(int8_models[arch], path, prefill_backend=prefill, decode_backend=decode, prefill_length=T,
                   context_length=S, kv_cache="int8", attention=attention,
                   partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=True)
            cache[key] = path
        return cache[key]

    return get


def eager_int8(model: Any, meta: HfStaticMetadata, prompt: list[int], new: int) -> tuple[list[int], float]:
    """Greedy tokens of ``model`` run eagerly, one token per step, over int8 caches; and the smallest top-2 margin."""
    wrapper = WindowedCausalLM(model, meta.context_length, meta.ring_rows, meta.layer_kinds, "int8").eval()
    tokens, out, margin = list(prompt), [], float("inf")
    with torch.no_grad():
        for position in range(len(prompt) + new - 1):
            window = (
                slot_mask(position, 1, 1, meta.ring_rows, meta.window)
                if meta.ring_rows is not None and meta.window is not None
                else torch.ones(1, 1, 1, 1, dtype=torch.bool)
            )
            logits = wrapper(
                torch.tensor([[tokens[position]]]), torch.tensor([position]), causal_mask(position, 1, 1, S), window
            )[0, -1]
            if position >= len(prompt) - 1:
                top = torch.topk(logits, 2).values
                margin = min(margin, float(top[0] - top[1]))
                tokens.append(int(logits.argmax()))
                out.append(tokens[-1])
    return out, margin


@pytest.mark.parametrize(("arch", "prefill", "decode"), ROUTES, ids=["-".join(r) for r in ROUTES])
def test_int8_cache_generation_equals_eager_pytorch_over_the_same_int8_caches(
    arch: str, prefill: str, decode: str, int8_models: dict[str, Any], int8_program: Callable[..., Path]
) -> None:
    runner = HfStaticRunner.from_file(int8_program(arch, prefill, decode))
    meta = runner.metadata
    assert (meta.version, meta.cache_dtype) == (3, "int8")
    assert meta == metadata_for(int8_models[arch], T, S, "int8")
    for length in (1, T + 3, 2 * T + 1):
        prompt = prompt_of(length, seed=5)
        expected, margin = eager_int8(int8_models[arch], meta, prompt, NEW)
        assert margin > 1e-3, f"eager top-2 margin {margin:.2e} too small for a token comparison"
        runner.reset()
        assert list(runner.generate(prompt, max_new_tokens=NEW, stop_at_eos=False).token_ids) == expected, length


def test_int8_caches_are_int8_states_with_a_scale_per_row_and_head(int8_program: Callable[..., Path]) -> None:
    runner = HfStaticRunner.from_file(int8_program("gemma3", "reference", "aoti"))
    record = runner.program.contract
    assert record is not None and (record.name, record.version) == ("hf_static", 3)
    R = WINDOW + T - 1
    states = {s.name: (s.dtype, tuple(s.shape), s.role.value) for s in record.states}
    assert states["k0"] == ("int8", (1, 2, S, 16), "kv_cache_key")
    assert states["k0_scale"] == ("float32", (1, 2, S, 1), "kv_cache_scale")
    assert states["vw2"] == ("int8", (1, 2, R, 16), "kv_cache_value")
    assert states["vw2_scale"] == ("float32", (1, 2, R, 1), "kv_cache_scale")
    assert len(states) == 4 * 4  # key, value and their scales for each of the 4 layers
    # a quarter of the cache bytes, plus one float per row and head
    session = runner.new_conversation().session
    int8_bytes = sum(session.tensor(name).nbytes for name in states)
    float_bytes = sum(4 * (S if name.startswith(("k0", "v0")) else R) * 2 * 16 for name in states if "_scale" not in name)
    assert int8_bytes == float_bytes // 4 + sum(4 * shape[2] * 2 for _, shape, role in states.values() if role == "kv_cache_scale")


def test_the_aoti_blob_calls_the_int8_kernel_and_decode_reads_the_rows_in_use(
    int8_models: dict[str, Any], tmp_path: Path
) -> None:
    from etsdk.backend import BlobReader
    from etsdk.testing import capture_delegates
    from etsdk_aoti import blob_format, kernels

    path = tmp_path / "model.pte"
    with capture_delegates() as captured:
        export(int8_models["llama"], path, decode_backend="aoti", prefill_backend="reference", prefill_length=T,
               context_length=S, kv_cache="int8", partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}},
               decode_batch=3, quiet=True)
    features = {
        d.method: BlobReader(d.payload, known_features=blob_format.KNOWN_FEATURES).required_features
        for d in captured if d.backend_id == "EtsdkAotiBackend"
    }
    assert blob_format.ATTENTION_INT8_FEATURE in features["decode"] and blob_format.ATTENTION_FEATURE not in features["decode"]
    # decode_batch's per-conversation attention calls: one kernel call per layer for all three
    assert blob_format.ATTENTION_SLOTS_FEATURE in features["decode_batch"]
    assert blob_format.ATTENTION_INT8_FEATURE not in features["decode_batch"]
    runner = HfStaticRunner.from_file(path)
    conversation = runner.new_conversation()
    conversation.prefill(prompt_of(5, seed=2))
    before = kernels.attention_rows_read()
    conversation.generate([], max_new_tokens=4, stop_at_eos=False)
    # decode steps at positions 5 .. 8 read 6 .. 9 rows per layer, whatever S is (the first token came from prefill)
    assert kernels.attention_rows_read() - before == sum(range(6, 9)) * runner.metadata.layers

    # three conversations of different lengths decoding together: each row is its own decode step, reading its own rows
    from etsdk_hf_static.runtime.conversation import Step, run_decode_batch

    prompts = [prompt_of(length, seed=length) for length in (3, T + 2, 7)]
    together = [runner.new_conversation() for _ in prompts]
    for c, prompt in zip(together, prompts):
        c.generate(prompt, max_new_tokens=1, stop_at_eos=False)
    steps = [Step("decode", c.position, (c.pending[0],), 1) for c in together]
    before = kernels.attention_rows_read()
    rows = [r.clone() for r in run_decode_batch(together, steps, [])]
    assert kernels.attention_rows_read() - before == sum(s.start + 1 for s in steps) * runner.metadata.layers
    for prompt, step, row in zip(prompts, steps, rows):
        alone = runner.new_conversation()
        alone.generate(prompt, max_new_tokens=1, stop_at_eos=False)
        torch.testing.assert_close(row, alone.run_step(step), atol=1e-5, rtol=1e-5)


def test_full_length_mode_over_int8_caches_computes_the_same_tokens(
    int8_models: dict[str, Any], int8_program: Callable[..., Path]
) -> None:
    runner = HfStaticRunner.from_file(int8_program("mistral", "reference", "reference", "full"))
    prompt = prompt_of(T + 5, seed=8)
    expected, _ = eager_int8(int8_models["mistral"], runner.metadata, prompt, NEW)
    assert list(runner.generate(prompt, max_new_tokens=NEW, stop_at_eos=False).token_ids) == expected


def test_int8_logits_stay_close_to_float_caches(int8_models: dict[str, Any]) -> None:
    """The quantization itself: one scale per row and head keeps the logits near the float32 caches' ones."""
    model = int8_models["gemma3"]
    meta = metadata_for(model, T, S, "int8")
    prompt = prompt_of(2 * T, seed=9)
    logits = {}
    for dtype in ("float32", "int8"):
        wrapper = WindowedCausalLM(model, S, meta.ring_rows, meta.layer_kinds, dtype).eval()
        with torch.no_grad():
            for position, token in enumerate(prompt):
                out = wrapper(torch.tensor([[token]]), torch.tensor([position]), causal_mask(position, 1, 1, S),
                              slot_mask(position, 1, 1, meta.ring_rows or S, meta.window or S))
        logits[dtype] = out[0, -1]
    error = (logits["int8"] - logits["float32"]).abs().max().item()
    spread = logits["float32"].abs().max().item()
    assert 0 < error < 0.02 * spread, (error, spread)


def test_a_saved_int8_conversation_reloads_token_exactly(int8_program: Callable[..., Path], tmp_path: Path) -> None:
    runner = HfStaticRunner.from_file(int8_program("gemma3", "reference", "aoti"))
    base = runner.new_conversation()
    base.generate(prompt_of(T + 4, seed=11), max_new_tokens=6, stop_at_eos=False)
    saved = base.save(tmp_path / "int8.safetensors", {"cache": "int8"})
    loaded, user = runner.load_conversation(saved)
    assert user == {"cache": "int8"} and loaded.tokens == base.tokens
    for name in ("k0", "k0_scale", "kw1", "vw1_scale"):
        assert torch.equal(loaded.session.tensor(name), base.session.tensor(name)), name
    follow = prompt_of(3, seed=12)
    assert loaded.generate(follow, max_new_tokens=8, stop_at_eos=False).token_ids == base.generate(
        follow, max_new_tokens=8, stop_at_eos=False
    ).token_ids


def test_fork_and_rewind_of_an_int8_ring_program_equal_fresh_conversations(int8_program: Callable[..., Path]) -> None:
    runner = HfStaticRunner.from_file(int8_program("mistral", "reference", "reference"))
    prompt, follow = prompt_of(T + 3, seed=13), prompt_of(3, seed=14)
    a = runner.new_conversation()
    a.generate(prompt, max_new_tokens=8, stop_at_eos=False)
    twin = a.fork()
    a.rewind(3)
    b = runner.new_conversation()
    b.generate(prompt, max_new_tokens=5, stop_at_eos=False)
    assert a.tokens == b.tokens
    assert a.generate(follow, max_new_tokens=6, stop_at_eos=False).token_ids == b.generate(
        follow, max_new_tokens=6, stop_at_eos=False
    ).token_ids
    fresh = runner.new_conversation().generate([*twin.tokens, *follow], max_new_tokens=6, stop_at_eos=False).token_ids
    assert twin.generate(follow, max_new_tokens=6, stop_at_eos=False).token_ids == fresh


def test_v3_metadata_that_disagrees_with_its_contract_is_refused(int8_program: Callable[..., Path]) -> None:
    from dataclasses import replace

    for arch, change, message in [
        ("llama", {"cache_dtype": "float32"}, r"metadata.cache_dtype: hf_static v3 supports 'int8', found 'float32'"),
        ("llama", {"window": 6, "ring_rows": 13}, r"no layer has a window, so window and ring_rows must be null"),
        ("llama", {"format": 2}, r"metadata.format: expected 3, found 2"),
        ("mistral", {"ring_rows": WINDOW + T}, r"metadata.ring_rows: W=6, T=8 and S=31 need 13 ring rows, found 14"),
    ]:
        record = HfStaticRunner.from_file(int8_program(*ROUTES[[r[0] for r in ROUTES].index(arch)])).program.contract
        assert record is not None
        edited = replace(record, metadata={**record.metadata, "hf_static": {**record.metadata["hf_static"], **change}})
        with pytest.raises(MetadataError, match=message):
            read_metadata(edited)


def test_an_unknown_cache_dtype_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    from etsdk import ExportError

    with pytest.raises(ExportError, match=r"kv_cache must be one of float32, int8, found 'int4'"):
        export(tmp_path / "no-such-model", tmp_path / "model.pte", kv_cache="int4", quiet=True)


@pytest.mark.parametrize(("architecture", "flags", "version"), [("mistral", [], 2), ("llama", ["--kv-cache", "int8"], 3)])
def test_etsdk_export_and_generate_drive_v2_and_v3_programs(
    architecture: str, flags: list[str], version: int, tmp_path: Path
) -> None:
    """The command line, as a user runs it: a sliding-window model (v2) and int8 caches (v3) export and generate."""
    from etsdk_hf_static.exporting.tiny import save_tiny_model
    from test_hf_generate_cli import _etsdk, _json

    directory = save_tiny_model(tmp_path / "model", architecture, seed=1, **({"window": WINDOW} if version == 2 else {}))
    out = tmp_path / "model.pte"
    result = _etsdk("export", "--model", str(directory), "--backend", "reference", "--prefill-length", str(T),
                    "--context-length", str(S), "-o", str(out), *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"hf_static v{version}" in result.stderr, result.stderr[-3000:]
    prompt = prompt_of(T + 3, seed=2)
    got = _json("generate", str(out), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "6", "--ignore-eos")
    runner = HfStaticRunner.from_file(out)
    assert runner.metadata.version == version
    assert got["token_ids"] == list(runner.generate(prompt, max_new_tokens=6, stop_at_eos=False).token_ids)
