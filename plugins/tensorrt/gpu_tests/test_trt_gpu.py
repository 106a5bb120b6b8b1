"""The same checks against a real TensorRT on a real GPU: run where TensorRT (10.15+) and CUDA are installed.

    python -m pytest plugins/tensorrt/gpu_tests -q

Skipped everywhere else (and whenever ``tensorrt`` is the tests' stand-in). Nothing here has run in this
project's CI, which has neither: see the README's "What was verified where".
"""

from __future__ import annotations

import copy
from pathlib import Path

import etsdk
import pytest
import torch

tensorrt = pytest.importorskip("tensorrt")
if "standin" in str(getattr(tensorrt, "__file__", "")):
    pytest.skip("tensorrt is the tests' stand-in here, not TensorRT", allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from etsdk_tensorrt import BACKEND_ID  # noqa: E402

T = 4
TOLERANCE = {"atol": 1e-3, "rtol": 1e-3}  # TensorRT's fp32 kernels against eager on the same GPU


def test_toy_decoder_caller_owned_state_on_the_gpu(tmp_path: Path) -> None:
    from etsdk.testing import ToyDecoder, kv_decoder_contract, kv_decoder_methods

    model = ToyDecoder(seed=1).eval()
    methods = kv_decoder_methods(
        model, T, prefill_backends=(BACKEND_ID,), decode_backends=(BACKEND_ID,),
        partitioner_options={BACKEND_ID: {"device": "cuda"}},
    )
    with torch.no_grad():
        etsdk.lower(methods, contract=kv_decoder_contract(model, T), quiet=False).save(tmp_path / "toy.pte")
    program = etsdk.load(tmp_path / "toy.pte")
    session = program.new_session()
    assert session.state["k0"].is_cuda
    pointers = {n: t.data_ptr() for n, t in session.state.items()}
    eager = copy.deepcopy(model)
    eager.reset_caches()
    prompt = torch.tensor([[3, 5, 7, 9]])
    got = program.run("prefill", prompt, torch.arange(T), session=session)[0]
    with torch.no_grad():
        want = eager(prompt, torch.arange(T))
    torch.testing.assert_close(got, want, **TOLERANCE)
    for step, token in enumerate([1, 4, 2]):
        ids, position = torch.tensor([[token]]), torch.tensor([T + step])
        got = program.run("decode", ids, position, session=session)[0]
        with torch.no_grad():
            want = eager(ids, position)
        torch.testing.assert_close(got, want, **TOLERANCE)
    torch.testing.assert_close(session.state["k1"].cpu(), eager.k_cache_1, **TOLERANCE)
    assert {n: t.data_ptr() for n, t in session.state.items()} == pointers


def test_prefill_tensorrt_decode_aoti_on_the_gpu_equals_transformers(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from etsdk_hf_static.exporting.exporter import export
    from etsdk_hf_static.exporting.tiny import tiny_model
    from etsdk_hf_static.runtime.runner import HfStaticRunner

    model = tiny_model("llama", seed=0)
    path = tmp_path / "mixed.pte"
    export(
        copy.deepcopy(model), path, prefill_backend="tensorrt", decode_backend="aoti", prefill_length=8,
        context_length=32, partitioner_options={BACKEND_ID: {"device": "cuda"}, "EtsdkAotiBackend": {"device": "cuda"}},
    )
    prompt = torch.randint(3, model.config.vocab_size, (11,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    got = HfStaticRunner(etsdk.load(path)).new_conversation().generate(prompt, max_new_tokens=6, stop_at_eos=False)
    assert list(got.token_ids) == want[0, len(prompt) :].tolist()
