"""``etsdk.read_contract``: a program's contract read without the runtime, torch or any backend."""

from __future__ import annotations

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
    model = ToyDecoder().eval()
    path = tmp_path_factory.mktemp("toy") / "toy.pte"
    methods = kv_decoder_methods(model, 4, prefill_backends=("EtsdkReferenceBackend",), decode_backends=("EtsdkReferenceBackend",))
    etsdk.lower(methods, contract=kv_decoder_contract(model, 4)).save(path)
    return path


def test_it_reads_what_load_reads(toy: Path) -> None:
    contract = etsdk.read_contract(toy)
    assert contract is not None and contract == etsdk.load(toy).contract
    assert contract.name == "kv_decoder" and contract.dims["T"] == 4


def test_a_program_without_a_contract_has_none(tmp_path: Path) -> None:
    path = tmp_path / "mlp.pte"
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()).eval()
    etsdk.lower(module=model, example_inputs=(torch.randn(2, 4),), backend="EtsdkReferenceBackend").save(path)
    assert etsdk.read_contract(path) is None


def test_bad_files_get_loads_messages(tmp_path: Path) -> None:
    with pytest.raises(etsdk.ProgramError, match="program file not found"):
        etsdk.read_contract(tmp_path / "missing.pte")
    (tmp_path / "text.pte").write_text("not a program")
    with pytest.raises(etsdk.ProgramError, match="is not a valid ExecuTorch program"):
        etsdk.read_contract(tmp_path / "text.pte")


def test_it_needs_neither_torch_nor_executorch_nor_the_backend(toy: Path) -> None:
    code = (
        "import sys, etsdk\n"
        f"contract = etsdk.read_contract({str(toy)!r})\n"
        "print(contract.name, sorted(m for m in ('torch', 'executorch') if m in sys.modules))\n"
    )
    env = {**os.environ, "ETSDK_DISABLE_PLUGINS": "reference"}  # its backend is not even registered
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "kv_decoder []"
