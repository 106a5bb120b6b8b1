"""``etsdk inspect``: delegates per method with their operators and state, named data, contract, model identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import etsdk
import pytest
import torch
from etsdk.testing import ToyDecoder, kv_decoder_contract, kv_decoder_methods


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = ToyDecoder(seed=2).eval()
    methods = kv_decoder_methods(model, 4, prefill_backends=("reference",), decode_backends=("reference",))
    path = tmp_path_factory.mktemp("inspect") / "toy.pte"
    etsdk.lower(methods, contract=kv_decoder_contract(model, 4), external_data="toy").save(path)
    return path


def _inspect(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ETSDK_") or k == "ETSDK_CACHE_DIR"}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "etsdk", "inspect", *args], capture_output=True, text=True, env=full)


def test_json_lists_delegates_operators_state_and_named_data(toy: Path) -> None:
    result = _inspect(str(toy), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["contract"]["name"] == "kv_decoder" and report["model"]["weights"]
    (decode,) = report["methods"]["decode"]
    assert decode["backend"] == "EtsdkReferenceBackend" and decode["provider"].startswith("etsdk plugin reference")
    assert {s["state"] for s in decode["states"]} == {"k0", "v0", "k1", "v1"}
    assert all(s["written"] for s in decode["states"])
    assert dict(decode["operators"])["aten::index_put"] == 4
    assert decode["payload_features"] == ["reference.graph.v2"]
    files = {e["file"] for e in report["named_data"]}
    assert files == {"toy.pte", "toy.ptd"}  # the program record in the .pte, weights in the .ptd
    weights = [e for e in report["named_data"] if e["file"] == "toy.ptd"]
    assert weights and all(e["key"].startswith("EtsdkReferenceBackend/") for e in weights)
    assert sum(e["size"] for e in weights) >= sum(p.numel() * 4 for p in ToyDecoder().parameters())


def test_text_names_what_each_delegate_binds(toy: Path) -> None:
    result = _inspect(str(toy))
    assert result.returncode == 0, result.stderr
    assert "contract: kv_decoder v1" in result.stdout
    assert "method prefill: 1 delegate(s)" in result.stdout
    assert "state k0: reads and writes float32 [1, 2, 16, 8] (buffer k_cache_0)" in result.stdout
    assert "payload: etsdk blob requiring reference.graph.v2" in result.stdout


def test_a_missing_backend_is_shown_not_refused(toy: Path) -> None:
    result = _inspect(str(toy), "--json", env={"ETSDK_DISABLE_PLUGINS": "reference"})
    assert result.returncode == 0, result.stderr
    (decode,) = json.loads(result.stdout)["methods"]["decode"]
    assert decode["provider"].startswith("not installed")
    assert decode["operators"]  # read from the program record, no backend needed


def test_a_damaged_file_is_a_one_line_error(toy: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.pte"
    bad.write_bytes(toy.read_bytes()[:200])
    result = _inspect(str(bad))
    assert result.returncode == 2 and result.stderr.startswith("etsdk: error:") and result.stderr.count("\n") == 1
    assert torch is not None
