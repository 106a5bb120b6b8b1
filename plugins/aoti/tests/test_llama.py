"""A tiny Llama-style decoder (transformers config, random weights, static cache) through etsdk-aoti on CPU."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import etsdk  # noqa: E402
from etsdk.backend import BlobReader  # noqa: E402
from etsdk.testing import CapturedDelegate, capture_delegates  # noqa: E402
from etsdk_aoti import BACKEND_ID, STATE_INPUTS_FEATURE, blob_format  # noqa: E402
from etsdk_aoti.testing import llama_methods, static_cache_module, tiny_llama  # noqa: E402

CAPACITY, PREFILL = 32, 4
TOLERANCE = dict(atol=1e-4, rtol=1e-4)  # float32 through Inductor's fused kernels vs eager


@pytest.fixture(scope="module")
def model() -> object:
    return tiny_llama(capacity=CAPACITY)


@pytest.fixture(scope="module")
def pte(model: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    methods, contract = llama_methods(
        model, CAPACITY, PREFILL, prefill_backends=(BACKEND_ID,), decode_backends=(BACKEND_ID,), options={"device": "cpu"}
    )
    path = tmp_path_factory.mktemp("llama") / "llama.pte"
    with capture_delegates() as captured:
        etsdk.lower(methods, contract=contract).save(path)
    DELEGATES[:] = captured
    return path


DELEGATES: list[CapturedDelegate] = []


def test_state_is_an_input_and_folding_copies_no_weight(pte: Path, model: object) -> None:
    """Each blob passes every state as a library input; constants are weights, and what Inductor folds is small.

    Folding runs at load: a folded transposed copy of a weight would double the model in memory (issue 13).
    """
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert {d.method for d in DELEGATES} == {"prefill", "decode"}
    for delegate in DELEGATES:
        reader = BlobReader(delegate.payload, known_features=blob_format.KNOWN_FEATURES)
        assert STATE_INPUTS_FEATURE in reader.required_features
        config = json.loads(bytes(reader.section("config")))
        records = json.loads(bytes(reader.section("constants")))
        assert config["state_inputs"] == list(range(len(delegate.signature.states))) and config["state_inputs"]
        assert {r["source"] for r in records} <= {"entry", "folded", "absent"}
        folded = sum(r["nbytes"] for r in records if r["source"] == "folded")
        assert folded < 0.05 * weight_bytes, (delegate.method, folded, weight_bytes)


def test_llama_prefill_and_decode_match_eager(pte: Path, model: object) -> None:
    program = etsdk.load(pte)
    session = program.new_session()
    pointers = {name: t.data_ptr() for name, t in session.state.items()}
    eager = static_cache_module(copy.deepcopy(model), CAPACITY)
    prompt = torch.tensor([[5, 17, 42, 99]])
    with torch.no_grad():
        want = eager(input_ids=prompt, cache_position=torch.arange(PREFILL))
    got = program.run("prefill", prompt, torch.arange(PREFILL), session=session)[0]
    torch.testing.assert_close(got, want, **TOLERANCE)
    token = int(got[0, -1].argmax())
    for step in range(6):
        position = torch.tensor([PREFILL + step])
        ids = torch.tensor([[token]])
        with torch.no_grad():
            want = eager(input_ids=ids, cache_position=position)
        got = program.run("decode", ids, position, session=session)[0]
        torch.testing.assert_close(got, want, **TOLERANCE)
        token = int(got[0, -1].argmax())
    # the caller's caches hold what eager's hold, updated in place
    torch.testing.assert_close(session.state["k1"], eager.key_cache_1, **TOLERANCE)
    # the counter was written from the last start position, as eager's was
    assert int(session.state["c0"]) == int(eager.cumulative_length_0) == PREFILL + 6
    assert {name: t.data_ptr() for name, t in session.state.items()} == pointers


def test_llama_persistence_check(pte: Path) -> None:
    """Position 1 on a fresh cache differs from position 0 then position 1; no NaN."""
    program = etsdk.load(pte)
    fresh = program.new_session()
    alone = program.run("decode", torch.tensor([[7]]), torch.tensor([1]), session=fresh)[0]
    chained = program.new_session()
    program.run("decode", torch.tensor([[3]]), torch.tensor([0]), session=chained)
    after = program.run("decode", torch.tensor([[7]]), torch.tensor([1]), session=chained)[0]
    assert not torch.isnan(alone).any() and not torch.isnan(after).any()
    assert (alone - after).abs().max() > 1e-4


@pytest.mark.parametrize("change", ["reversed", "missing", "bool"])
def test_state_inputs_other_than_every_binding_in_order_are_refused(pte: Path, change: str) -> None:
    """Same-shaped caches permuted would be swapped silently: the binding refuses before anything runs."""
    from etsdk import BlobFormatError
    from etsdk.backend import BlobWriter, InitContext
    from etsdk.testing import NamedDataStub
    from etsdk_aoti.runtime import AotiBinding

    delegate = next(d for d in DELEGATES if d.method == "decode")
    reader = BlobReader(delegate.payload, known_features=blob_format.KNOWN_FEATURES)
    config = json.loads(bytes(reader.section("config")))
    count = len(config["state_inputs"])
    config["state_inputs"] = {
        "reversed": list(reversed(range(count))), "missing": list(range(count - 1)), "bool": [True, *range(1, count)],
    }[change]
    writer = BlobWriter(required_features=reader.required_features)
    for section in reader.sections:
        data = json.dumps(config).encode() if section.name == "config" else reader.section(section.name)
        writer.add_section(section.name, data, alignment=section.alignment)
    named = NamedDataStub({key: memoryview(data) for key, data in delegate.named_data.items()})
    context = InitContext(BACKEND_ID, "decode", memoryview(writer.to_bytes()), {}, named, delegate.signature)  # type: ignore[arg-type]
    with pytest.raises(BlobFormatError, match=r"state_inputs must be \[0, 1, .*\] \(every state binding in order\)"):
        AotiBinding().init(context)
