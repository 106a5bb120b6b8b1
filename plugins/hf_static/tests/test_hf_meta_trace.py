"""``etsdk export --meta-trace``: the model built from its config on the meta device, traced against its weights'
descriptions, its weights bound from the safetensors checkpoint afterwards, exports the same program, byte for
byte, as the model held in memory (the bfloat16 / etsdk-aoti case is in test_hf_weights_dtype.py); what it cannot
do is refused before anything is loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import T, assert_generates_like
from etsdk import ExportError
from etsdk_hf_static.exporting.exporter import export
from etsdk_hf_static.exporting.tiny import save_tiny_model, tiny_model
from etsdk_hf_static.runtime.runner import HfStaticRunner

S = 40
NEW = 6
TINY = {"seed": 4, "positions": 64}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("meta-trace") / "model", "llama", **TINY)


def test_equals_the_model_in_memory_byte_for_byte_and_generates_its_tokens(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_memory = tiny_model("llama", **TINY)  # the very model save_tiny_model wrote (same seed): every weight resident
    export(in_memory, tmp_path / "memory.pte", backend="reference", prefill_length=T, context_length=S, quiet=True)
    from transformers import AutoModelForCausalLM

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("meta_trace loaded the model through transformers")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", never)  # transformers never loads the weights
    export(model_dir, tmp_path / "meta.pte", backend="reference", prefill_length=T, context_length=S, meta_trace=True, quiet=True)
    assert (tmp_path / "meta.pte").read_bytes() == (tmp_path / "memory.pte").read_bytes()
    assert_generates_like(HfStaticRunner.from_file(tmp_path / "meta.pte"), in_memory, (1, T + 3, 2 * T + 1), NEW, seed=9)


def _refused(model: object, tmp_path: Path, match: str, **options: object) -> None:
    with pytest.raises(ExportError, match=match):
        export(model, tmp_path / "out.pte", backend="reference", context_length=S, meta_trace=True, quiet=True, **options)
    assert not (tmp_path / "out.pte").exists()


def test_what_it_cannot_do_is_refused_up_front(model_dir: Path, tmp_path: Path) -> None:
    from etsdk import QuantizationPlan

    _refused(model_dir, tmp_path, r"does not combine with quantization \(--quantize\)", quantization=QuantizationPlan.for_format("int8"))
    _refused(tiny_model("llama", **TINY), tmp_path, "model directory's model on the meta device; found a LlamaForCausalLM object")
    _refused(tmp_path / "model.gguf", tmp_path, "found a GGUF file")


def test_a_checkpoint_that_does_not_match_its_config_is_refused(model_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(model_dir / "model.safetensors"))
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "generation_config.json"):
        (broken / name).write_bytes((model_dir / name).read_bytes())
    _refused(broken, tmp_path, "reads a safetensors checkpoint; .* has neither model.safetensors nor model.safetensors.index.json")
    save_file({k: v for k, v in weights.items() if k != "model.norm.weight"}, str(broken / "model.safetensors"))
    _refused(broken, tmp_path, r"the checkpoint has no tensor 'model.norm.weight' \(1 of the model's")
    weights["model.layers.0.mlp.up_proj.weight"] = weights["model.layers.0.mlp.up_proj.weight"][:-1]
    save_file(weights, str(broken / "model.safetensors"))
    _refused(broken, tmp_path, r"checkpoint's 'model.layers.0.mlp.up_proj.weight' is \[127, 64\]; the model's config describes \[128, 64\]")
    (broken / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    _refused(broken, tmp_path, "cannot read .*model.safetensors as safetensors")
    (broken / "model.safetensors").unlink()
    (broken / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    _refused(broken, tmp_path, "is not a safetensors index")


def test_the_command_line_flag(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli.pte"
    result = subprocess.run(
        [sys.executable, "-m", "etsdk", "export", "--model", str(model_dir), "--backend", "reference", "-o", str(out),
         "--context-length", str(S), "--meta-trace"],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "on the meta device (float32 weights, read when stored)" in result.stderr
    # the same program as the default export, which transformers loads (the same sizes: S given, T its default)
    export(model_dir, tmp_path / "loaded.pte", backend="reference", context_length=S, quiet=True)
    assert out.read_bytes() == (tmp_path / "loaded.pte").read_bytes()
