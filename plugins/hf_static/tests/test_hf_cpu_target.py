"""``etsdk export --cpu-target``: every etsdk-aoti partition compiled for the target, and the line saying so.

One export, in a subprocess: prefill on etsdk-aoti with attention over every row (T rows per product: no call of
etsdk-aoti's kernels), decode on the reference backend.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import S, T
from etsdk import ExportError
from etsdk.backend import cpu_target, host_cpu
from etsdk_hf_static.exporting.exporter import cpu_summary, export

pytestmark = pytest.mark.skipif(host_cpu().machine != "x86_64", reason="the target exported here is an x86-64 level")


def _etsdk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "etsdk", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def v3_export(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("cpu-target") / "tiny.pte"
    result = _etsdk(
        "export", "--model", str(model_dir), "--prefill-backend", "aoti", "--decode-backend", "reference",
        "--attention", "full", "--prefill-length", str(T), "--context-length", str(S), "--cpu-target", "x86-64-v3",
        "-o", str(out),
    )
    assert result.returncode == 0, result.stderr
    return out, result.stderr


def test_every_aoti_partition_is_built_for_the_target_and_the_export_says_so(v3_export: tuple[Path, str]) -> None:
    out, stderr = v3_export
    needs = " ".join(sorted(cpu_target("x86-64-v3").features))
    assert stderr.rstrip().splitlines()[-1] == f"etsdk-hf-static: built for x86-64-v3: runs on x86_64 CPUs with {needs}"
    result = _etsdk("inspect", "--json", str(out))
    assert result.returncode == 0, result.stderr
    methods = json.loads(result.stdout)["methods"]
    (prefill,) = methods["prefill"]
    assert prefill["backend"] == "EtsdkAotiBackend" and "aoti.cpu_target.v1" in prefill["payload_features"]
    assert f"cpu target: x86-64-v3 (x86_64): needs {needs}" in prefill["details"]
    assert all("details" not in d for d in methods["decode"])  # the reference backend says nothing of its payload


def test_a_native_export_says_how_to_export_for_a_fleet() -> None:
    line = cpu_summary("native")
    assert line.startswith("built for this host's CPU (native: ")
    assert line.endswith("; to run on other machines, export with --cpu-target x86-64-v3 (AVX2) or x86-64-v4 (AVX-512)")


def test_an_unknown_target_is_refused_in_one_line_before_the_model_loads(tmp_path: Path) -> None:
    result = _etsdk("export", "--model", str(tmp_path / "missing"), "--cpu-target", "x86-64-v9", "-o", str(tmp_path / "x.pte"))
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("etsdk")]
    assert len(errors) == 1, result.stderr
    assert "--cpu-target: unknown CPU target 'x86-64-v9'; choose one of: native, x86-64, x86-64-v2, x86-64-v3, x86-64-v4" in errors[0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"backend": "reference"}, "--cpu-target applies to etsdk-aoti (EtsdkAotiBackend) partitions; no method uses it"),
        (
            {"partitioner_options": {"aoti": {"cpu_target": "x86-64-v4"}}},
            "--cpu-target x86-64-v3 and the backend option aoti.cpu_target=x86-64-v4 disagree",
        ),
    ],
)
def test_a_target_nothing_can_take_is_refused_before_the_model_loads(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(ExportError) as caught:
        export(tmp_path / "missing", tmp_path / "x.pte", cpu_target="x86-64-v3", **options)
    assert message in str(caught.value)
