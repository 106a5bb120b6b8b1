"""Every benchmark runs: ``benchmarks/NAME.py --smoke`` exits 0 and ends with its documented JSON keys.

Smoke runs use the smallest sizes and one round through the same code as a full run, so a benchmark that
an API change broke fails here instead of rotting until someone measures. Nothing here looks at the figures
(a smoke run's timings are noise). A new benchmark needs an entry in :data:`EXPECTED_KEYS`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"

#: script -> the keys its last stdout line must contain (benchmarks/README.md documents them)
EXPECTED_KEYS: dict[str, set[str]] = {
    "serve_vs_llama_server": {
        "etsdk_ttft_ms", "etsdk_decode_tokens_per_s", "etsdk_concurrent_ttft_ms", "etsdk_concurrent_aggregate_tokens_per_s",
        "etsdk_turn_ttft_ms", "etsdk_turn_cached_fraction", "llama_cpp_ttft_ms", "llama_cpp_decode_tokens_per_s",
        "llama_cpp_concurrent_aggregate_tokens_per_s", "llama_cpp_turn_ttft_ms", "etsdk_vs_llama_cpp_decode_tokens_per_s",
        "etsdk_vs_llama_cpp_ttft_ms", "etsdk_vs_llama_cpp_turn_ttft_ms", "prompt_ids_identical", "llama_cpp_parallel",
        "cpu", "kernel_level", "threads", "errors", "etsdk_exit_codes", "etsdk_decode_batch",
    },
    "bridge_overhead": {
        "us_per_call_bridge",
        "us_per_call_peer",
        "us_per_call_portable",
        "us_per_call_reference_backend",
        "us_added_bridge_vs_peer",
        "us_added_per_delegate_call",
        "ratio_bridge_to_peer",
    },
    "long_context": {
        "contexts",
        "rounds",
        "parameters",
        "filled_tokens_per_s",
        "full_tokens_per_s",
        "filled_over_smallest",
        "full_over_smallest",
        "filled_over_full",
        "fill",
        "filled_fill_tokens_per_s",
        "full_fill_tokens_per_s",
        "int8_tokens_per_s",
        "int8_fill_tokens_per_s",
        "int8_over_float_fill",
        "quantize",
        "quantized_fill_tokens_per_s",
        "quantized_int8_over_float_fill",
        "llama_cpp_tokens_per_s",
        "llama_cpp_fill_tokens_per_s",
        "read_gb_per_s",
        "fill_read_limit_tokens_per_s",
    },
    "state_copies": {"capacities", "etsdk_us_per_step", "peer_us_per_step", "etsdk_flat_ratio", "peer_growth_ratio"},
    "aoti_export_memory": {
        "weights_bytes",
        "etsdk_peak_rss_bytes",
        "etsdk_baseline_rss_bytes",
        "stock_peak_rss_bytes",
        "stock_baseline_rss_bytes",
        "etsdk_export_over_weights",
        "stock_export_over_weights",
    },
    "aoti_decode": {
        "etsdk_us_per_step",
        "direct_us_per_step",
        "overhead_pct",
        "etsdk_structural_us_per_step",
        "parameters",
    },
    "hf_static_decode": {
        "cpu",
        "kernel_level",
        "parameters",
        "weight_bytes",
        "float_weight_bytes",
        "quantize",
        "gguf",
        "weights_dtype",
        "prefill_length",
        "context_length",
        "new_tokens",
        "threads",
        "omp_wait_policy",
        "loadavg_1min_per_round",
        "limit_steps_per_s",
        "limit_bytes_per_s",
        *(
            f"{path}_{key}"
            for path in ("etsdk", "etsdk_float", "eager", "xnnpack", "llama_cpp")
            for key in ("tokens_per_s", "prefill_ms", "fraction_of_limit", "minor_faults_per_step")
        ),
        "traffic_counters",
        "tail_tokens",
        "etsdk_tail_prefill_ms",
        "llama_cpp_tail_prefill_ms",
        "etsdk_vs_llama_cpp_tail_prefill",
        "rows",  # --smoke times --rows 1,2
        "etsdk_rows_call_ms",
        "etsdk_rows_steps_ms",
        "etsdk_rows_steps_over_call",
        "decode_batch",  # --smoke times --decode-batch 2
        "etsdk_batch_call_ms",
        "etsdk_batch_steps_ms",
        "etsdk_batch_steps_over_call",
        "etsdk_runner_us_per_step",
        "etsdk_program_run_us_per_step",
        "etsdk_vs_eager_decode",
        "etsdk_vs_xnnpack_decode",
        "etsdk_vs_etsdk_float_decode",
        "etsdk_vs_llama_cpp_decode",
    },
    "load_verify": {
        "weight_bytes",
        "load_s",
        "unverified_load_s",
        "sha256_load_s",
        "process_s",
        "unverified_process_s",
        "default_over_unverified",
        "default_over_unverified_process",
    },
    "quantized_kernels": {
        "threads",
        "rounds",
        "shapes",
        "fp32_us_small_m1",
        *(f"{k}_over_fp32_small_m{m}" for k in ("etsdk_int8", "etsdk_int8_g32", "etsdk_int8_g64", "etsdk_int8_g64_a8", "etsdk_int4_g32", "etsdk_int4_g32_a8", "etsdk_int4_g32_min_f16_a8", "aten_int8", "aten_int4_g32") for m in (1, 8)),
        "cpu",
        "kernel_levels",
    },
    "quantized_quality": {
        "model",
        "positions",
        "variants",
        *(f"{v}_{k}" for v in ("gguf", "int8", "int4") for k in ("top1_agreement", "mean_kl", "weight_bytes")),
    },
    "first_token": {
        "rounds",
        "prompt_tokens",
        "loadavg_1min_per_round",
        "etsdk_first_token_s",
        "eager_first_token_s",
        "etsdk_over_eager_first_token",
        "etsdk_stages_s",
        "eager_stages_s",
        "etsdk_exit_s",
        "eager_exit_s",
        "etsdk_prefill_ms",
    },
    "hf_static_export_memory": {
        "weights_bytes",
        "baseline_rss_bytes",
        "peak_rss_bytes",
        "peak_over_baseline_per_weight",
        "stages",
        "checkpoint_dtype",
        "peak_anon_bytes",
        "peak_anon_over_baseline_per_weight",
        "export_seconds",
        "stage_seconds",
        "bytes_written",
        "peak_rss_over_checkpoint",
        "quantize",
        "meta_trace",
        "prefill_backend",
    },
}

#: variants whose last line has other keys than the script's plain run (``--shape``: one entry per shape)
VARIANT_KEYS = {
    # every kernel level this host runs, interleaved: the portable level is one every host has
    "quantized_kernels--levelsall": {"cpu", "kernel_levels", "etsdk_int8_g64_portable_over_fp32_small_m1", "etsdk_int4_g32_min_f16_a8_portable_over_fp32_small_m8"},
    "hf_static_export_memory--shapesmollm2-360m--quantizeint8": {"shapes", "export_seconds_per_billion_parameters"},
}

#: scripts that take a working directory for what they write (the others write only to temporary directories)
WORKDIR_FLAG = {"hf_static_decode": "--workdir", "serve_vs_llama_server": "--workdir"}

SCRIPTS = sorted({p.stem for p in BENCHMARKS.glob("*.py")} | set(EXPECTED_KEYS))
#: further smoke runs of one script with other flags: (script, flags), each its own test
VARIANTS = [
    # the quantized paths (llama.cpp is a benchmark-only install) and a next turn's prefill
    ("hf_static_decode", ["--quantize", "int4", "--tail", "3"]),
    ("quantized_kernels", ["--levels", "all"]),  # the kernels at every instruction-set level this host runs
    ("hf_static_decode", ["--weights-dtype", "bfloat16"]),  # 16-bit weights beside the float32 program
    # export from a checkpoint directory, the model built on the meta device (the default load: the --shape run)
    ("hf_static_export_memory", ["--checkpoint", "bfloat16", "--meta-trace"]),
    ("hf_static_export_memory", ["--prefill-backend", "tensorrt"]),  # TensorRT prefill's ONNX beside AOTI decode
    # the shape sweep (checkpoint writer, export with quantization into a spill, generate)
    ("hf_static_export_memory", ["--shape", "smollm2-360m", "--quantize", "int8"]),
]

#: a hang guard, not a timing check (a smoke run takes ~10-120 s; much longer on a loaded machine)
TIMEOUT_S = 1800


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "flags"),
    [*((name, []) for name in SCRIPTS), *VARIANTS],
    ids=[*SCRIPTS, *(f"{name}{''.join(flags)}" for name, flags in VARIANTS)],
)
def test_benchmark_smoke(name: str, flags: list[str], tmp_path: Path) -> None:
    script = BENCHMARKS / f"{name}.py"
    assert script.is_file(), f"tests expect benchmarks/{name}.py: remove its entry from EXPECTED_KEYS"
    assert name in EXPECTED_KEYS, f"benchmarks/{name}.py has no entry in EXPECTED_KEYS: add its documented JSON keys"
    command = [sys.executable, str(script), "--smoke", *flags]
    if name in WORKDIR_FLAG:
        command += [WORKDIR_FLAG[name], str(tmp_path / "work")]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    report = f"stdout (end):\n{result.stdout[-3000:]}\nstderr (end):\n{result.stderr[-6000:]}"
    assert result.returncode == 0, report
    lines = result.stdout.strip().splitlines()
    assert lines, report
    try:
        last = json.loads(lines[-1])
    except json.JSONDecodeError:
        pytest.fail(f"the last stdout line is not JSON\n{report}")
    assert isinstance(last, dict), report
    missing = VARIANT_KEYS.get(f"{name}{''.join(flags)}", EXPECTED_KEYS[name]) - set(last)
    assert not missing, f"missing keys {sorted(missing)}\n{report}"
    if name == "hf_static_decode":  # --smoke times --rows 1,2: each K has its figures
        assert last["rows"] == [1, 2] and set(last["etsdk_rows_steps_over_call"] or {}) == {"1", "2"}, report
        assert last["decode_batch"] == 2 and last["etsdk_batch_call_ms"] > 0 and last["etsdk_batch_steps_over_call"] > 0, report
    for entry in last["shapes"] if name == "hf_static_export_memory" and "--shape" in flags else []:  # each shape's figures
        missing = (EXPECTED_KEYS[name] | {"shape", "parameters", "generated", "rss_target_bytes"}) - set(entry)
        assert not missing, f"missing keys {sorted(missing)} in a shape's figures\n{report}"
        assert len(entry["generated"]) == 4, report
