"""Quantized hf_static programs: --quantize int8 / int4 and GGUF files, through etsdk-aoti, the reference backend
and both at once; greedy tokens equal the same quantization run eagerly; weights stored once per program.

Each program is exported once per run (module-scoped) and compared token for token with transformers'
``generate`` on the eager model quantized the same way (``etsdk.quantize_model``, or the layers a GGUF file
builds). The margin check of tests/conftest.py guards the comparisons, as for float32.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import etsdk
import pytest
import torch
from conftest import MARGIN, T, hf_generate, prompt_of
from etsdk import QuantizationPlan
from etsdk_hf_static.exporting.exporter import export
from etsdk_hf_static.runtime.runner import HfStaticRunner

S = 48
NEW = 6
AOTI_CPU = {"EtsdkAotiBackend": {"device": "cpu"}}
PLANS = {
    "int8": QuantizationPlan.for_format("int8"),
    "int4": QuantizationPlan.for_format("int4"),
    "int4:a8": QuantizationPlan.for_format("int4:g32:f16:a8"),  # Q4_0's bytes, int8 activations: VNNI products on etsdk-aoti
}


def _quantized(models: dict[str, Any], plan: str) -> Any:
    model = copy.deepcopy(models["llama"])
    etsdk.quantize_model(model, PLANS[plan])
    return model


@pytest.fixture(scope="module")
def programs(models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    cache: dict[tuple[str, str, str], Path] = {}

    def get(plan: str, prefill: str = "aoti", decode: str = "aoti") -> Path:
        key = (plan, prefill, decode)
        if key not in cache:
            path = tmp_path_factory.mktemp(f"q-{plan.replace(':', '-')}-{prefill}-{decode}") / "model.pte"
            model = copy.deepcopy(models["llama"]) if plan != "float" else models["llama"]
            export(model, path, prefill_backend=prefill, decode_backend=decode, prefill_length=T, context_length=S,
                   partitioner_options=AOTI_CPU, quantization=PLANS.get(plan), quiet=True)
            cache[key] = path
        return cache[key]

    return get


def _generate(path: Path, prompt: list[int]) -> list[int]:
    runner = HfStaticRunner.from_file(path)
    return list(runner.new_conversation().generate(prompt, max_new_tokens=NEW, stop_at_eos=False).token_ids)


@pytest.mark.parametrize("plan", ["int8", "int4", "int4:a8"])
@pytest.mark.parametrize(("prefill", "decode"), [("aoti", "aoti"), ("reference", "reference"), ("reference", "aoti")])
def test_quantized_greedy_tokens_equal_the_same_quantization_run_eagerly(
    plan: str, prefill: str, decode: str, models: dict[str, Any], programs: Callable[..., Path]
) -> None:
    eager = _quantized(models, plan)
    for length in (3, T + 2):
        prompt = prompt_of(length, seed=5)
        expected, margin = hf_generate(eager, prompt, NEW)
        assert margin > MARGIN, f"eager top-2 margin {margin:.2e} too small for a token comparison"
        assert _generate(programs(plan, prefill, decode), prompt) == expected


@pytest.mark.parametrize("plan", ["int8", "int4", "int4:a8"])
def test_the_prefill_logits_stay_within_a_stated_tolerance_of_eager(plan: str, models: dict[str, Any], programs: Callable[..., Path]) -> None:
    from etsdk_hf_static.exporting.module import StaticCausalLM
    from etsdk_hf_static.masks import causal_mask

    eager = StaticCausalLM(_quantized(models, plan), S, full_logits=False).eval()  # as exported: the last row's logits
    prompt = torch.tensor([prompt_of(T, seed=9)])
    mask = causal_mask(0, T, T, S)
    with torch.no_grad():
        want = eager(prompt, torch.arange(T), mask)
    program = etsdk.load(programs(plan))
    got = program.run("prefill", prompt, torch.arange(T), mask, session=program.new_session())[0]
    # float32 sums in another order over the same dequantized weights: 1e-4 of the logits' scale
    torch.testing.assert_close(got, want, atol=1e-4 * float(want.abs().max()), rtol=0)


def _named_data_bytes(path: Path) -> int:
    report = etsdk.verify(path, methods=False)
    assert report.ok
    return sum(e.size for e in report.entries if e.key.startswith("weights/"))


@pytest.mark.parametrize("plan", ["float", "int8", "int4"])
def test_a_mixed_program_stores_each_weight_once(plan: str, programs: Callable[..., Path]) -> None:
    """Reference prefill + AOTI decode read the same weights: one entry each, within 5 % of the all-AOTI program."""
    mixed, alone = _named_data_bytes(programs(plan, "reference", "aoti")), _named_data_bytes(programs(plan))
    assert alone > 0 and abs(mixed - alone) <= 0.05 * alone, (mixed, alone)


def test_quantized_programs_are_smaller_and_say_so(programs: Callable[..., Path]) -> None:
    sizes = {plan: _named_data_bytes(programs(plan)) for plan in ("float", "int8", "int4")}
    assert sizes["int4"] < sizes["int8"] < 0.4 * sizes["float"], sizes
    record = etsdk.load(programs("int4")).record
    formats = sorted({w.format for d in record.methods["decode"] for w in d.signature.weights})
    assert formats == ["int4:g32", "int8"]


# --------------------------------------------------------------------------- etsdk export on the command line


def _etsdk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "etsdk", *args], capture_output=True, text=True, timeout=900)


def test_export_quantize_reports_what_it_quantized_and_the_size(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.pte"
    result = _etsdk("export", "--model", str(model_dir), "--backend", "reference", "--quantize", "int4:64:min",
                    "--quantize-head", "float", "--prefill-length", str(T), "--context-length", "32", "-o", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "quantizing (linear int4:g64:min, embedding int8, head float)" in result.stderr
    assert "quantized 14 x int4:g64:min, 1 x int8; kept in float: 1: " in result.stderr
    assert " MiB): " in result.stderr.splitlines()[-1]
    inspected = _etsdk("inspect", str(out))
    assert "model.model.layers.{0..1}.mlp.up_proj: int4:g64:min [128, 64] linear" in inspected.stdout, inspected.stdout


@pytest.mark.parametrize(("short", "exact"), [("int8", "int8:g64:a8"), ("int4", "int4:g32:min:f16:a8"), ("int8:row", "int8")])
def test_the_short_names_mean_the_best_measured_formats(short: str, exact: str, model_dir: Path, tmp_path: Path) -> None:
    result = _etsdk("export", "--model", str(model_dir), "--backend", "reference", "--quantize", short,
                    "--prefill-length", str(T), "--context-length", "32", "-o", str(tmp_path / "q.pte"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"etsdk export: --quantize {short} is {exact} (name a format exactly to choose another)" in result.stderr
    assert f"quantizing (linear {exact}, embedding int8, head int8)" in result.stderr


def test_a_short_name_takes_the_best_format_every_backend_of_the_export_computes() -> None:
    from etsdk_hf_static.apps.commands import resolve_format

    assert resolve_format("int4", ["aoti"]) == "int4:g32:min:f16:a8"
    assert resolve_format("int4", ["aoti", "tensorrt"]) == "int4:g32:min:f16"  # TensorRT computes no :a8 format
    assert resolve_format("int8", ["aoti"]) == "int8:g64:a8"
    assert resolve_format("int8", ["tensorrt"]) == "int8:g64"  # nor int8 activations
    assert resolve_format("int4:g64", ["aoti"]) == "int4:g64"  # an exact name is taken as it is


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--quantize", "int5"], "etsdk: error: --quantize: unknown weight format 'int5'"),
        (["--quantize-head", "int8"], "etsdk: error: --quantize-head go with --quantize FORMAT"),
        (["--quantize", "int4:128"], "cannot quantize LlamaForCausalLM: linear 'model.layers.0.self_attn.q_proj' [64, 64]: format int4:g128 groups 128 values"),
    ],
)
def test_a_wrong_quantize_flag_is_one_line_before_or_without_an_export(model_dir: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = _etsdk("export", "--model", str(model_dir), "--backend", "reference", "-o", str(tmp_path / "x.pte"), *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "x.pte").exists()


# --------------------------------------------------------------------------- GGUF files


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    pytest.importorskip("gguf")
    from etsdk_hf_static.exporting.tiny import save_tiny_gguf

    return save_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def gguf_program(tiny_gguf: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf-aoti") / "model.pte"
    result = _etsdk("export", "--model", str(tiny_gguf[0]), "--backend", "aoti", "--backend-option", "aoti.device=\"cpu\"",
                    "--prefill-length", str(T), "--context-length", str(S), "-o", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kept the file's blocks: 8 x Q4_0, 6 x Q4_1, 2 x Q8_0" in result.stderr
    return path


def test_a_gguf_file_exports_with_its_blocks_byte_for_byte(tiny_gguf: tuple[Path, Any], gguf_program: Path) -> None:
    import hashlib

    import gguf
    import numpy as np
    from etsdk_hf_static.exporting.gguf_import import _llama_rows

    reader = gguf.GGUFReader(str(tiny_gguf[0]))
    report = etsdk.verify(gguf_program, methods=False)  # every entry's bytes hash to its key (content-addressed)
    assert report.ok
    stored = {check.key for check in report.entries}
    program = etsdk.load(gguf_program)
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in ("Q8_0", "Q4_0", "Q4_1"):
            continue
        blocks = np.asarray(tensor.data)
        if ".attn_q." in tensor.name or ".attn_k." in tensor.name:  # llama.cpp's row order undone, rows unchanged
            rows = _llama_rows(blocks, 4 if ".attn_q." in tensor.name else 2)
            assert sorted(map(bytes, rows)) == sorted(map(bytes, blocks))
            blocks = rows
        assert f"weights/{hashlib.sha256(blocks.tobytes()).hexdigest()}" in stored, tensor.name
    formats = {w.name: w.format for d in program.record.methods["decode"] for w in d.signature.weights}
    assert formats["model.model.embed_tokens"] == "q8_0" and formats["model.model.layers.0.mlp.up_proj"] == "q4_1"
    assert formats["model.model.layers.1.self_attn.q_proj"] == "q4_0"


def test_a_gguf_program_generates_what_its_model_computes_eagerly(tiny_gguf: tuple[Path, Any], gguf_program: Path) -> None:
    from etsdk_hf_static.exporting.gguf_import import load_gguf

    eager = load_gguf(tiny_gguf[0], quiet=True)
    runner = HfStaticRunner.from_file(gguf_program)
    for length in (2, T + 3):
        prompt = prompt_of(length, seed=11)
        expected, margin = hf_generate(eager.model, prompt, NEW)
        assert margin > MARGIN
        assert list(runner.new_conversation().generate(prompt, max_new_tokens=NEW, stop_at_eos=False).token_ids) == expected
    # the file's tokenizer and chat template came along
    assert runner.decode_text(runner.encode("hi")) == "hi"
    assert runner.chat_prompt_ids([{"role": "user", "content": "hi"}]) == runner.encode("<bos>[user] hi<eos>[assistant] ", bos=False)


def test_llama_cpp_row_order_is_undone_on_the_query_and_key_projections(tiny_gguf: tuple[Path, Any]) -> None:
    from etsdk.backend import dequantize, weight_planes
    from etsdk_hf_static.exporting.gguf_import import load_gguf

    path, float_model = tiny_gguf
    loaded = load_gguf(path, quiet=True).model
    for name in ("q_proj", "k_proj"):
        layer = getattr(loaded.model.layers[0].self_attn, name)
        weight = dequantize(weight_planes(etsdk.WeightFormat.parse(layer.format), {"blocks": layer.qdata}, (layer.rows, layer.columns)))
        want = getattr(float_model.model.layers[0].self_attn, name).weight.detach()
        assert (weight - want).abs().max() < 0.35 * want.abs().max()  # Q4_0 rounding, in transformers' row order


def test_a_gguf_type_etsdk_does_not_keep_is_named_and_allow_requantize_dequantizes_it(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    from etsdk_hf_static.exporting.tiny import save_tiny_gguf

    path, _ = save_tiny_gguf(tmp_path / "q5.gguf", types={"ffn": "Q5_0"})
    result = _etsdk("export", "--model", str(path), "--backend", "reference", "-o", str(tmp_path / "q5.pte"))
    assert result.returncode == 2 and not (tmp_path / "q5.pte").exists()
    error = [line for line in result.stderr.splitlines() if line.startswith("etsdk: error:")]
    assert len(error) == 1 and "holds tensor types etsdk does not keep as they are (Q5_0: 6 tensor(s), e.g. blk.0.ffn_gate.weight)" in error[0]
    assert "--allow-requantize" in error[0]
    again = _etsdk("export", "--model", str(path), "--backend", "reference", "--allow-requantize", "--quantize", "int8",
                   "--context-length", "32", "--quiet", "-o", str(tmp_path / "q5.pte"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "--allow-requantize: dequantized to float32 6 x Q5_0" in again.stderr  # said even under --quiet
    formats = json.loads(_etsdk("inspect", "--json", str(tmp_path / "q5.pte")).stdout)
    found = {w[1] for d in formats["methods"]["decode"] for w in d.get("weights", [])}
    assert found == {"q8_0", "q4_0", "int8:g64:a8"}  # the file's blocks kept; the Q5_0 layers requantized to int8 (int8:g64:a8)


@pytest.mark.parametrize("plan", ["int8", "int4:a8"])
def test_a_padded_prefill_chunk_multiplies_its_real_rows_only(plan: str, programs: Callable[..., Path]) -> None:
    # the exporter zeroes a chunk's padded rows before every linear layer, and etsdk-aoti's products skip trailing
    # zero rows: a chunk of 3 tokens multiplies 3 rows in every layer, T only when all T are real
    from etsdk_aoti import kernels
    from etsdk_hf_static.runtime.planning import Step

    runner = HfStaticRunner.from_file(programs(plan))
    multiplied, attended = {}, {}
    for real in (3, T):
        conversation = runner.new_conversation()
        before, queries = kernels.rows_multiplied(), kernels.attention_queries_attended()
        conversation.run_step(Step("prefill", 0, tuple(prompt_of(real, seed=2)), T))
        multiplied[real] = kernels.rows_multiplied() - before
        attended[real] = kernels.attention_queries_attended() - queries
    products = (multiplied[T] - 1) // T  # every layer's products; the head multiplies one row: the last real one
    assert products > 0 and multiplied == {3: 3 * products + 1, T: T * products + 1}
    # attention computes the real rows and the first padded one (zeros under the last real row's mask); the other
    # padded rows repeat it and are copied
    heads = attended[T] // T  # query heads times layers
    assert heads > 0 and attended == {3: 4 * heads, T: T * heads}
