"""Conformance corpus: malformed hf_static programs and calls, each refused before anything executes.

Program cases start from the real exported Llama program (its contract record and its methods' engine
I/O as the runtime reports them) and break one thing; ``check_program`` is what the runner runs before
its first step. Call cases go through a real conversation and check that no state was touched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import etsdk
import pytest
import torch
from conftest import S, T
from etsdk import Contract, ContractError, GenerationError, MethodInfo, Sampling, TensorInfo
from etsdk_hf_static.exporting.tiny import VOCAB
from etsdk_hf_static.metadata import MetadataError
from etsdk_hf_static.runtime.runner import HfStaticRunner, ProgramMismatchError, check_program

V, L = VOCAB, 2


def _meta(**changes: Any) -> Callable[[Contract], Contract]:
    def edit(record: Contract) -> Contract:
        meta = dict(record.metadata["hf_static"])
        for key, value in changes.items():
            if value is _DROP:
                meta.pop(key)
            else:
                meta[key] = value
        return dataclasses.replace(record, metadata={**record.metadata, "hf_static": meta})

    return edit


_DROP = object()


def _record(**changes: Any) -> Callable[[Contract], Contract]:
    return lambda record: dataclasses.replace(record, **changes)


def _dims(**changes: int) -> Callable[[Contract], Contract]:
    return lambda record: dataclasses.replace(record, dims={**record.dims, **changes})


def _state(name: str, **changes: Any) -> Callable[[Contract], Contract]:
    def edit(record: Contract) -> Contract:
        states = tuple(dataclasses.replace(s, **changes) if s.name == name else s for s in record.states)
        return dataclasses.replace(record, states=states)

    return edit


def _drop_state(name: str) -> Callable[[Contract], Contract]:
    return lambda record: dataclasses.replace(record, states=tuple(s for s in record.states if s.name != name))


def _extra_state(record: Contract) -> Contract:
    return dataclasses.replace(record, states=(*record.states, dataclasses.replace(record.states[0], name="k9")))


def _method_input(method: str, name: str, **changes: Any) -> Callable[[Contract], Contract]:
    def edit(record: Contract) -> Contract:
        methods = []
        for m in record.methods:
            if m.name == method:
                m = dataclasses.replace(m, inputs=tuple(dataclasses.replace(i, **changes) if i.name == name else i for i in m.inputs))
            methods.append(m)
        return dataclasses.replace(record, methods=tuple(methods))

    return edit


RECORD_CASES: list[tuple[str, Callable[[Contract], Any], type[Exception], str]] = [
    ("no record", lambda r: None, MetadataError, "embeds no contract record"),
    ("other contract", _record(name="kv_decoder"), MetadataError, "found contract 'kv_decoder'"),
    ("unknown contract version", _record(version=4), MetadataError, "version 4 is not supported"),
    ("v1 metadata under version 2", _record(version=2), MetadataError, "metadata.format: expected 2, found 1"),
    ("v1 metadata under version 3", _record(version=3), MetadataError, "metadata.format: expected 3, found 1"),
    ("missing metadata", _record(metadata={}), MetadataError, "lacks its 'hf_static' metadata"),
    ("metadata not an object", _record(metadata={"hf_static": "S=31"}), MetadataError, "found str"),
    ("unknown metadata field", _meta(rope="yarn"), MetadataError, "unknown field(s) rope"),
    ("metadata format 2", _meta(format=2), MetadataError, "metadata.format: expected 1, found 2"),
    ("context length missing", _meta(context_length=_DROP), MetadataError, "context_length: expected a positive integer, found None"),
    ("context length zero", _meta(context_length=0), MetadataError, "context_length: expected a positive integer, found 0"),
    ("context length boolean", _meta(context_length=True), MetadataError, "found True"),
    ("context length disagrees with the cache", _meta(context_length=S + 1), MetadataError, f"context_length is {S + 1} but the contract record's dim S is {S}"),
    ("prefill length disagrees", _meta(prefill_length=T - 1), MetadataError, f"prefill_length is {T - 1} but the contract record's dim T is {T}"),
    ("vocab size disagrees", _meta(vocab_size=V + 1), MetadataError, f"vocab_size is {V + 1} but the contract record's dim V is {V}"),
    ("layers disagree", _meta(layers=3), MetadataError, "layers is 3 but the contract record's dim L is 2"),
    ("kv heads disagree", _meta(kv_heads=4), MetadataError, "kv_heads is 4"),
    ("head dim disagrees", _meta(head_dim=8), MetadataError, "head_dim is 8"),
    ("prefill longer than context", _meta(prefill_length=S + 1), MetadataError, f"prefill_length {S + 1} exceeds context_length {S}"),
    ("eos not a list", _meta(eos_ids=2), MetadataError, "eos_ids: expected a list of integers, found 2"),
    ("eos outside vocabulary", _meta(eos_ids=[2, V]), MetadataError, f"[{V}] outside the vocabulary"),
    ("eos not integer", _meta(eos_ids=[1.5]), MetadataError, "eos_ids: expected a list of integers"),
    ("bos outside vocabulary", _meta(bos_id=-1), MetadataError, "bos_id: expected null or a token id"),
    ("half-precision cache", _meta(cache_dtype="float16"), MetadataError, "cache_dtype: hf_static v1 supports 'float32', found 'float16'"),
    ("additive float mask", _meta(mask="float_additive"), MetadataError, "mask: hf_static v1 supports 'bool_true_visible'"),
    ("logits not last", _meta(logits="first"), MetadataError, "logits: hf_static v1 supports 'last', found 'first'"),
    ("architecture not text", _meta(architecture=7), MetadataError, "architecture: expected a string"),
    ("full_logits not a bool", _meta(full_logits="no"), MetadataError, "metadata.full_logits: expected true or false, found 'no'"),
    ("cache length mismatch", _state("k0", shape=(1, 2, S - 1, 16)), ProgramMismatchError, f"state 'k0': expected float32 [1, 2, {S}, 16], found float32 [1, 2, {S - 1}, 16]"),
    ("cache equal bytes other dtype", _state("v1", dtype="int32"), ProgramMismatchError, "state 'v1': expected float32"),
    ("cache equal bytes other shape", _state("k1", shape=(1, 2, 16, S)), ProgramMismatchError, f"found float32 [1, 2, 16, {S}]"),
    ("counter wrong dtype", _state("c0", dtype="int32"), ProgramMismatchError, "state 'c0': expected int64 [], found int32 []"),
    ("missing counter", _drop_state("c1"), ProgramMismatchError, "state 'c1' is missing"),
    ("extra state", _extra_state, ProgramMismatchError, "unexpected state(s) k9"),
    ("cache mismatch between methods", _method_input("decode", "k0_in", shape=(1, 2, S - 1, 16)), ProgramMismatchError, "method 'decode' binds state 'k0' as float32"),
]


def _io(method: str, side: str, index: int, *, dtype: Any = None, shape: tuple[int, ...] | None = None, drop: bool = False, none: bool = False) -> Callable[[dict[str, MethodInfo]], dict[str, MethodInfo]]:
    def edit(infos: dict[str, MethodInfo]) -> dict[str, MethodInfo]:
        info = infos[method]
        items = list(getattr(info, side))
        if drop:
            items.pop(index)
        elif none:
            items[index] = None
        else:
            old = items[index]
            assert old is not None
            items[index] = dataclasses.replace(old, dtype=dtype if dtype is not None else old.dtype, shape=shape if shape is not None else old.shape)
        return {**infos, method: dataclasses.replace(info, **{side: tuple(items)})}

    return edit


def _without(method: str) -> Callable[[dict[str, MethodInfo]], dict[str, MethodInfo]]:
    return lambda infos: {k: v for k, v in infos.items() if k != method}


def _renamed(old: str, new: str) -> Callable[[dict[str, MethodInfo]], dict[str, MethodInfo]]:
    return lambda infos: {(new if k == old else k): v for k, v in infos.items()}


def _extra_output(method: str) -> Callable[[dict[str, MethodInfo]], dict[str, MethodInfo]]:
    def edit(infos: dict[str, MethodInfo]) -> dict[str, MethodInfo]:
        info = infos[method]
        extra = TensorInfo(1, (1, 1, V), torch.float32, 4 * V)
        return {**infos, method: dataclasses.replace(info, outputs=(extra, *info.outputs))}

    return edit


IO_CASES: list[tuple[str, Callable[[dict[str, MethodInfo]], dict[str, MethodInfo]], str]] = [
    ("missing decode method", _without("decode"), "no method 'decode'"),
    ("wrong method name", _renamed("prefill", "prefil"), "no method 'prefill'"),
    ("prefill lacks the mask input", _io("prefill", "inputs", 2, drop=True), "has 2 engine input(s), contract 'hf_static' v1 binds 3"),
    ("mask of rank 3", _io("prefill", "inputs", 2, shape=(1, T, S)), f"input 2 ('attention_mask', role mask): expected bool [1, 1, {T}, {S}], found bool [1, {T}, {S}]"),
    ("mask equal bytes other dtype", _io("decode", "inputs", 2, dtype=torch.uint8), "found uint8"),
    ("mask equal bytes other shape", _io("prefill", "inputs", 2, shape=(1, 1, S, T)), f"found bool [1, 1, {S}, {T}]"),
    ("float mask", _io("decode", "inputs", 2, dtype=torch.float32), "input 2 ('attention_mask', role mask): expected bool"),
    ("tokens int32", _io("prefill", "inputs", 0, dtype=torch.int32), "input 0 ('input_ids', role tokens): expected int64"),
    ("tokens equal bytes other shape", _io("prefill", "inputs", 0, shape=(T, 1)), f"found int64 [{T}, 1]"),
    ("positions equal bytes float64", _io("prefill", "inputs", 1, dtype=torch.float64), "input 1 ('positions', role positions): expected int64"),
    ("decode positions of two rows", _io("decode", "inputs", 1, shape=(2,)), "expected int64 [1], found int64 [2]"),
    ("non-tensor input", _io("decode", "inputs", 0, none=True), "found a non-tensor value"),
    ("logits equal bytes other shape", _io("prefill", "outputs", 0, shape=(1, V, T)), f"found float32 [1, {V}, {T}]"),
    ("logits vocab mismatch", _io("decode", "outputs", 0, shape=(1, 1, V + 1)), f"expected float32 [1, 1, {V}], found float32 [1, 1, {V + 1}]"),
    ("logits not the last output", _extra_output("prefill"), "has 2 engine output(s), contract 'hf_static' v1 binds 1"),
    ("decode logits of T rows", _io("decode", "outputs", 0, shape=(1, T, V)), f"found float32 [1, {T}, {V}]"),
    ("logits half precision", _io("prefill", "outputs", 0, dtype=torch.float16), "output 0 ('logits', role logits): expected float32"),
]


def _infos(runner: HfStaticRunner) -> dict[str, MethodInfo]:
    return {m: runner.program.method_info(m) for m in runner.program.methods}


def test_the_unbroken_program_passes(runner: HfStaticRunner) -> None:
    meta = check_program(runner.program.contract, _infos(runner))
    assert (meta.context_length, meta.prefill_length, meta.vocab_size, meta.layers) == (S, T, V, L)


@pytest.mark.parametrize(("case", "edit", "error", "message"), RECORD_CASES, ids=[c[0] for c in RECORD_CASES])
def test_malformed_record_is_refused(runner: HfStaticRunner, case: str, edit: Callable[[Contract], Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        check_program(edit(runner.program.contract), _infos(runner))
    assert message in str(caught.value), f"{case}: {caught.value}"
    assert isinstance(caught.value, ContractError)


@pytest.mark.parametrize(("case", "edit", "message"), IO_CASES, ids=[c[0] for c in IO_CASES])
def test_malformed_engine_io_is_refused(runner: HfStaticRunner, case: str, edit: Callable[[dict[str, MethodInfo]], dict[str, MethodInfo]], message: str) -> None:
    with pytest.raises(ProgramMismatchError) as caught:
        check_program(runner.program.contract, edit(_infos(runner)))
    assert message in str(caught.value), f"{case}: {caught.value}"


CALL_CASES: list[tuple[str, Any, dict[str, Any], str]] = [
    ("prompt longer than S", list(range(3, 3 + S + 1)), {}, f"context length S is {S}"),
    ("prompt plus new tokens past S", [5] * (S - 2), {"max_new_tokens": 4},
     f"{S - 2} prompt token(s) + 4 new token(s) = {S + 2} cache rows, but the program's context length S is {S}; "
     "to make it fit: fewer new tokens (--max-new-tokens 2) or a program exported with a longer context"),
    ("negative token id", [5, -1], {}, "token 1 is -1, outside the vocabulary"),
    ("token id equal to the vocabulary size", [V], {}, f"token 0 is {V}, outside the vocabulary 0..{V - 1}"),
    ("float token id", [5, 1.5], {}, "token 1 must be an integer id, found 1.5"),
    ("boolean token id", [True], {}, "token 0 must be an integer id, found True"),
    ("text instead of ids", "hello", {}, "found text"),
    ("float tensor of ids", torch.tensor([1.0, 2.0]), {}, "must be integers, found a float32 tensor"),
    ("empty prompt", [], {}, "the prompt is empty"),
    ("zero new tokens", [5], {"max_new_tokens": 0}, "max_new_tokens must be a positive integer, found 0"),
    ("boolean new tokens", [5], {"max_new_tokens": True}, "found True"),
]


@pytest.mark.parametrize(("case", "prompt", "options", "message"), CALL_CASES, ids=[c[0] for c in CALL_CASES])
def test_malformed_call_is_refused_before_any_step(runner: HfStaticRunner, case: str, prompt: Any, options: dict[str, Any], message: str) -> None:
    conversation = runner.new_conversation()
    with pytest.raises(GenerationError) as caught:
        conversation.generate(prompt, **options)
    assert message in str(caught.value), f"{case}: {caught.value}"
    assert conversation.position == 0
    assert all(int(t.count_nonzero()) == 0 for t in conversation.session.state.values()), "a step ran"


def test_second_turn_past_the_context_leaves_the_first_intact(runner: HfStaticRunner) -> None:
    conversation = runner.new_conversation()
    conversation.generate([5, 6, 7], max_new_tokens=2, stop_at_eos=False)
    before = {k: t.clone() for k, t in conversation.session.state.items()}
    with pytest.raises(GenerationError, match=rf"^5 row\(s\) in use \+ {S - 4} prompt token\(s\) \+ 2 new token\(s\) = {S + 3} cache rows.*reset\(\)"):
        conversation.generate([8] * (S - 4), max_new_tokens=2)
    assert conversation.position == 4
    assert all(torch.equal(before[k], t) for k, t in conversation.session.state.items())


@pytest.mark.parametrize(("options", "message"), [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"temperature": float("nan")}, "temperature")])
def test_bad_sampling_options_are_refused(options: dict[str, float], message: str) -> None:
    with pytest.raises(GenerationError, match=message):
        Sampling(**options)


def test_a_program_of_another_contract_is_refused(tmp_path_factory: pytest.TempPathFactory) -> None:
    from etsdk.testing import ToyDecoder, kv_decoder_contract, kv_decoder_methods

    model = ToyDecoder().eval()
    path = tmp_path_factory.mktemp("toy") / "toy.pte"
    methods = kv_decoder_methods(model, 4, prefill_backends=("EtsdkReferenceBackend",), decode_backends=("EtsdkReferenceBackend",))
    etsdk.lower(methods, contract=kv_decoder_contract(model, 4)).save(path)
    with pytest.raises(MetadataError, match="expected a program of contract 'hf_static', found contract 'kv_decoder'"):
        HfStaticRunner(etsdk.load(path))



@pytest.mark.parametrize("field", ["version", "name", "methods"])
def test_record_without_its_version_name_or_methods_is_refused(runner: HfStaticRunner, field: str) -> None:
    """The embedded record is parsed strictly before a runner ever sees it (``etsdk.load``)."""
    assert runner.program.contract is not None
    raw = runner.program.contract.to_json()
    del raw[field]
    with pytest.raises(ContractError, match=field):
        Contract.from_json(raw, where="etsdk/program")
