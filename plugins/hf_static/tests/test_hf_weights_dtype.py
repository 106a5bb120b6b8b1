"""A bfloat16 / float16 checkpoint exports with its own weight dtype: half the bytes, the same tokens.

``etsdk export`` (``weights_dtype="auto"``) loads a 16-bit checkpoint in its dtype (memory-mapped, nothing
copied) and keeps every linear / embedding weight 16-bit in the program, computing in float32; the program then
generates what transformers generates from the same weights upcast to float32, through etsdk-aoti (decode on its
GEMV reading the 16-bit weights) and the reference backend alike, and stores each weight once.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import T, assert_generates_like
from etsdk_hf_static.exporting.exporter import checkpoint_dtype, export
from etsdk_hf_static.exporting.tiny import save_tiny_model
from etsdk_hf_static.runtime.runner import HfStaticRunner

S = 40
NEW = 6
AOTI_CPU = {"EtsdkAotiBackend": {"device": "cpu"}}


@pytest.fixture(scope="module")
def half_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny Llama saved in bfloat16 and in float16 (transformers model directories)."""
    root = tmp_path_factory.mktemp("half")
    source = save_tiny_model(root / "float32", "llama", seed=3, positions=64)
    from transformers import AutoModelForCausalLM

    out = {}
    for dtype in ("bfloat16", "float16"):
        model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype))
        model.save_pretrained(root / dtype)
        out[dtype] = root / dtype
    out["float32"] = source
    return out


@pytest.fixture(scope="module")
def programs(half_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """bfloat16 kept (prefill on the reference backend, decode on etsdk-aoti: both read one entry per weight),
    the same upcast with ``weights_dtype="float32"``, float16 kept through etsdk-aoti alone, and the bfloat16 one
    again built on the meta device (``meta_trace``: its weights bound from the checkpoint after tracing)."""
    root = tmp_path_factory.mktemp("half-programs")
    made = {}
    for name, directory, dtype, prefill, meta in (
        ("bfloat16", half_dirs["bfloat16"], "auto", "reference", False),
        ("upcast", half_dirs["bfloat16"], "float32", "reference", False),
        ("float16", half_dirs["float16"], "auto", "aoti", False),
        ("bfloat16-meta", half_dirs["bfloat16"], "auto", "reference", True),
    ):
        path = root / f"{name}.pte"
        export(directory, path, prefill_backend=prefill, decode_backend="aoti", prefill_length=T, context_length=S,
               weights_dtype=dtype, partitioner_options=AOTI_CPU, meta_trace=meta, quiet=True)
        made[name] = path
    return made


def _upcast(directory: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def _inspect(path: Path) -> dict[str, Any]:
    """``etsdk inspect --json`` of ``path``."""
    result = subprocess.run([sys.executable, "-m", "etsdk", "inspect", str(path), "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def _weight_entries(path: Path) -> dict[str, int]:
    return {e["key"]: e["size"] for e in _inspect(path)["named_data"] if e["key"].startswith("weights/")}


def test_the_checkpoint_dtype_is_read_from_its_config(half_dirs: dict[str, Path], tmp_path: Path) -> None:
    assert checkpoint_dtype(half_dirs["bfloat16"]) == "bfloat16"
    assert checkpoint_dtype(half_dirs["float16"]) == "float16"
    assert checkpoint_dtype(half_dirs["float32"]) == "float32"
    (tmp_path / "config.json").write_text("{not json")
    assert checkpoint_dtype(tmp_path) == "float32"


@pytest.mark.parametrize("program", ["bfloat16", "float16", "bfloat16-meta"])
def test_a_16bit_program_generates_what_transformers_generates_from_the_upcast_weights(
    half_dirs: dict[str, Path], programs: dict[str, Path], program: str
) -> None:
    reference = _upcast(half_dirs[program.removesuffix("-meta")])
    assert_generates_like(HfStaticRunner.from_file(programs[program]), reference, (1, T + 3, 2 * T + 1), NEW, seed=5)


def test_the_program_stores_the_checkpoint_bytes_once_at_half_the_float32_size(
    half_dirs: dict[str, Path], programs: dict[str, Path]
) -> None:
    kept, upcast = _weight_entries(programs["bfloat16"]), _weight_entries(programs["upcast"])
    assert 0.45 < sum(kept.values()) / sum(upcast.values()) < 0.55, (sum(kept.values()), sum(upcast.values()))
    from safetensors import safe_open

    with safe_open(str(half_dirs["bfloat16"] / "model.safetensors"), framework="pt") as f:
        for name in ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight"):
            tensor = f.get_tensor(name)
            assert tensor.dtype == torch.bfloat16
            digest = hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
            assert f"weights/{digest}" in kept, f"{name}'s bfloat16 bytes are not one of the program's weight entries"
    # both backends read the same entries: as many as the float32-upcast program has (one per weight)
    assert len(kept) == len(upcast)


def test_tracing_on_the_meta_device_stores_the_same_weights(programs: dict[str, Path]) -> None:
    """The meta-traced program's weight entries are the transformers-loaded one's, byte for byte (each entry's key
    is its bytes' SHA-256); only AOTInductor's compiled code differs between any two compiles."""
    assert _weight_entries(programs["bfloat16-meta"]) == _weight_entries(programs["bfloat16"])


def test_16bit_weights_are_read_on_the_gemv_and_the_blobs_say_so(programs: dict[str, Path]) -> None:
    for name, wanted in (("float16", True), ("upcast", False)):  # float16: both methods through etsdk-aoti
        methods = _inspect(programs[name])["methods"]
        for method in ("prefill", "decode") if name == "float16" else ("decode",):
            (delegate,) = methods[method]
            assert ("aoti.kernels.linear16.v1" in delegate["payload_features"]) is wanted, (method, delegate["payload_features"])


def test_a_wrong_weights_dtype_is_refused_before_loading(tmp_path: Path) -> None:
    from etsdk import ExportError

    with pytest.raises(ExportError, match="weights_dtype must be one of auto, float32, bfloat16, float16, found 'int8'"):
        export(tmp_path / "no-such-model", tmp_path / "out.pte", weights_dtype="int8", quiet=True)
    assert not (tmp_path / "out.pte").exists()


def test_a_model_object_is_cast_weight_by_weight_leaving_quantized_layers_and_ties() -> None:
    from etsdk import QuantizationPlan, quantize_model
    from etsdk_hf_static.exporting.exporter import _cast_weights
    from etsdk_hf_static.exporting.tiny import tiny_model

    model = tiny_model("llama", seed=3)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's are
    _cast_weights(model, torch.bfloat16)
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.lm_head.weight.dtype == torch.bfloat16
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert model.model.norm.weight.dtype == torch.float32  # left to keep_16bit_weights

    quantized = tiny_model("llama", seed=3)
    quantize_model(quantized, QuantizationPlan.for_format("int8:g32:f16", embedding="float", head="float"))
    _cast_weights(quantized, torch.bfloat16)
    layer = quantized.model.layers[0].mlp.up_proj
    assert layer.scales.dtype == torch.float16 and layer.qdata.dtype == torch.int8  # the format's own tensors
    assert quantized.model.embed_tokens.weight.dtype == torch.bfloat16
