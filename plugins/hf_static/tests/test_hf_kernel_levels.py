"""One LLM through etsdk-aoti at every kernel level this host runs: the tokens do not depend on the CPU's level.

Three programs of the tiny Llama, each exported once (the compiled code is the same for every level: the kernels
are chosen per process, :func:`etsdk_aoti.kernels.use_level`): float32 weights over int8 key / value caches (the
float GEMV and the int8 attention kernel), int8:g64:a8 weights (int8 weights times int8 activations, and the int8
embedding / head's float product; float attention), and int4:g32:min:f16:a8 weights (the 4-bit int8-activation
products, fused). At each level (portable, avx2, avx2vnni,
avx512, avx512vnni on x86; portable, neonv8, neon on aarch64; a level the host cannot run is skipped, naming what it
lacks) each program generates what the same model generates eagerly in PyTorch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import etsdk
import pytest
from conftest import MARGIN, S, T, hf_generate, prompt_of
from etsdk import BackendUnavailableError, QuantizationPlan
from etsdk.backend import host_cpu
from etsdk_aoti import kernels
from etsdk_aoti.kernels.levels import LEVELS, requested_level
from etsdk_aoti.testing import host_level_names, run_at_level
from etsdk_hf_static.exporting.exporter import export
from etsdk_hf_static.runtime.runner import HfStaticRunner
from test_hf_int8_cache import eager_int8

NEW = 5
PROGRAMS = {  # name -> (linear format or None, kv cache)
    "float32-int8cache": (None, "int8"),
    "int8:g64:a8": ("int8:g64:a8", "float32"),
    "int4:g32:min:f16:a8": ("int4:g32:min:f16:a8", "float32"),
}


@pytest.fixture(scope="module")
def level_programs(models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """Each program and the eager model it must agree with (quantized the same way)."""
    made = {}
    for name, (linear, kv_cache) in PROGRAMS.items():
        model = copy.deepcopy(models["llama"])
        plan = QuantizationPlan.for_format(linear) if linear else None
        path = tmp_path_factory.mktemp(f"levels-{name.replace(':', '-')}") / "model.pte"
        export(copy.deepcopy(model), path, backend="aoti", prefill_length=T, context_length=S, kv_cache=kv_cache,
               partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quantization=plan, quiet=True)
        if plan is not None:
            etsdk.quantize_model(model, plan)
        made[name] = (path, model)
    return made


@pytest.fixture(params=host_level_names())
def level(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from run_at_level(request.param)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_every_kernel_level_generates_the_eager_tokens(name: str, level: str, level_programs: dict[str, tuple[Path, Any]]) -> None:
    path, model = level_programs[name]
    runner = HfStaticRunner.from_file(path)
    assert kernels.current_level().name == level
    compared = 0
    for length in (3, T + 3):
        prompt = prompt_of(length, seed=11)
        if PROGRAMS[name][1] == "int8":
            expected, margin = eager_int8(model, runner.metadata, prompt, NEW)
        else:
            expected, margin = hf_generate(model, prompt, NEW)
        if margin < MARGIN:
            continue
        got = list(runner.new_conversation().generate(prompt, max_new_tokens=NEW, stop_at_eos=False).token_ids)
        assert got == expected, f"level {level}, {name}, prompt of {length}: {got} != eager {expected}"
        compared += 1
    assert compared >= 1, "no prompt with a clear top-1 margin to compare"


def test_a_level_the_host_cannot_run_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = host_cpu().machine
    top = [lv for lv in LEVELS if lv.machine == machine][-1]
    if not top.features:
        pytest.skip(f"no level above portable is listed for {machine}")
    hidden = sorted(top.features)[:2]
    before = kernels.current_level()
    monkeypatch.setenv("ETSDK_HIDE_CPU_FEATURES", ",".join(hidden))
    with pytest.raises(BackendUnavailableError) as caught:
        kernels.use_level(top.name)
    message = str(caught.value)
    assert "\n" not in message and f"level {top.name} needs" in message and all(f in message for f in hidden), message
    assert kernels.current_level() == before  # nothing of the refused level was loaded or selected
    monkeypatch.setenv("ETSDK_AOTI_ISA", top.name)
    with pytest.raises(BackendUnavailableError, match=rf"^ETSDK_AOTI_ISA={top.name}: level {top.name} needs"):
        requested_level()
    monkeypatch.setenv("ETSDK_AOTI_ISA", "avx9000")
    with pytest.raises(BackendUnavailableError, match="unknown etsdk-aoti kernel level 'avx9000'; the levels are: portable"):
        requested_level()
