"""etsdk-aoti on CPU: real AOTInductor compiles, the real ExecuTorch runtime, through the bridge.

Compiles are shared per module (one MLP, with weights embedded and in a .ptd).
Stateful behaviour (the toy decoder over prefill and decode steps, sessions,
reset, in-place state) runs in tests/integration/test_state.py for this backend too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import etsdk
import pytest
import torch
from etsdk.backend import BlobReader, BlobWriter, InitContext
from etsdk.testing import NamedDataStub, capture_delegates
from etsdk_aoti import BACKEND_ID, BLOB_FEATURE, blob_format, weights
from etsdk_aoti.blob_format import CPU_TARGET_FEATURE, LINEAR_FEATURE, NAMED_CONSTANTS_FEATURE
from etsdk_aoti.runtime import AotiBinding

TOLERANCE = dict(atol=1e-5, rtol=1e-5)  # Inductor's fused kernels reorder float32 sums


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
        self.register_buffer("scale", torch.tensor([1.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.scale


X = torch.randn(4, 16)


@pytest.fixture(scope="module")
def model() -> MLP:
    return MLP().eval()


@pytest.fixture(scope="module")
def exported(model: MLP, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("aoti")
    with capture_delegates() as captured:
        etsdk.lower(
            module=model, example_inputs=(X,), backend=BACKEND_ID, partitioner_options={"device": "cpu"},
            external_data="weights",
        ).save(root / "mlp.pte")
    (delegate,) = captured
    return {"pte": root / "mlp.pte", "ptd": root / "weights.ptd", "delegate": delegate}


def test_mlp_matches_eager(exported: dict[str, Any], model: MLP) -> None:
    program = etsdk.load(exported["pte"], data=exported["ptd"])
    assert program.delegates("forward") == (BACKEND_ID,)
    for seed in range(3):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(program.run("forward", x)[0], model(x), **TOLERANCE)


def test_weights_are_in_the_ptd_not_the_pte(exported: dict[str, Any]) -> None:
    weight_bytes = (16 * 64 + 64 + 64 * 8 + 8) * 4
    assert exported["ptd"].stat().st_size >= weight_bytes
    assert exported["pte"].stat().st_size < exported["ptd"].stat().st_size + 2_000_000  # the .pte holds the library, not weights


def test_normal_load_prints_no_aoti_warnings(exported: dict[str, Any]) -> None:
    code = (
        "import etsdk, torch\n"
        f"p = etsdk.load({str(exported['pte'])!r}, data={str(exported['ptd'])!r})\n"
        "p.run('forward', torch.randn(4, 16))\n"
        "print('RAN')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "RAN" in result.stdout
    assert "[WARNING]" not in result.stderr
    assert "validate_full_update" not in result.stderr


# ----------------------------------------------------------------------------- load-time failures


def _rebuild(
    payload: bytes,
    *,
    constants: Any = None,
    config: Any = None,
    features: tuple[str, ...] = (BLOB_FEATURE, NAMED_CONSTANTS_FEATURE, CPU_TARGET_FEATURE),
    library: bytes | None = None,
) -> bytes:
    reader = BlobReader(payload, known_features=blob_format.KNOWN_FEATURES)
    writer = BlobWriter(required_features=features)
    writer.add_section("config", json.dumps(config if config is not None else json.loads(bytes(reader.section("config")))).encode())
    writer.add_section("constants", json.dumps(constants if constants is not None else json.loads(bytes(reader.section("constants")))).encode())
    writer.add_section("library", library if library is not None else reader.section("library"), alignment=4096)
    return writer.to_bytes()


@pytest.fixture(scope="module")
def parts(exported: dict[str, Any]) -> dict[str, Any]:
    delegate = exported["delegate"]
    reader = BlobReader(delegate.payload, known_features=blob_format.KNOWN_FEATURES)
    config = json.loads(bytes(reader.section("config")))
    constants = json.loads(bytes(reader.section("constants")))
    named = {key: memoryview(data) for key, data in delegate.named_data.items()}
    return {"signature": delegate.signature, "payload": delegate.payload, "config": config, "constants": constants, "named": named}


def _init(parts: dict[str, Any], blob: bytes, named: dict[str, memoryview] | None = None) -> Any:
    named = NamedDataStub(named if named is not None else parts["named"])
    context = InitContext(BACKEND_ID, "forward", memoryview(blob), {}, named, parts["signature"])  # type: ignore[arg-type]
    return AotiBinding().init(context)


def test_crafted_context_loads_and_runs(parts: dict[str, Any], model: MLP) -> None:
    handle = _init(parts, _rebuild(parts["payload"]))
    out = torch.empty(4, 8)
    with torch.no_grad():
        handle.execute((X, out), ())
    torch.testing.assert_close(out, model(X), **TOLERANCE)


def _constants_with(parts: dict[str, Any], fqn: str, **changes: Any) -> list[dict[str, Any]]:
    constants = json.loads(json.dumps(parts["constants"]))
    target = next(c for c in constants if c["fqn"] == fqn)
    target.update(changes)
    return constants


def test_missing_weight_is_named(parts: dict[str, Any]) -> None:
    constants = _constants_with(parts, "net.0.weight", source="absent")
    for key in ("dtype", "shape", "stride", "key"):
        constants[[c["fqn"] for c in constants].index("net.0.weight")].pop(key)
    with pytest.raises(etsdk.ProgramError, match="constant\\(s\\) missing from the weights: net_0_weight \\(net.0.weight, parameter\\)"):
        _init(parts, _rebuild(parts["payload"], constants=constants))


def test_wrong_shape_and_dtype_are_refused(parts: dict[str, Any]) -> None:
    with pytest.raises(etsdk.BlobFormatError, match="float32 \\[8, 16\\] is 512 bytes, the container expects 4096"):
        _init(parts, _rebuild(parts["payload"], constants=_constants_with(parts, "net.0.weight", shape=[8, 16], stride=[16, 1])))
    with pytest.raises(etsdk.BlobFormatError, match="the container's dtype is torch.float32, the description says float16"):
        _init(parts, _rebuild(parts["payload"], constants=_constants_with(parts, "net.0.weight", dtype="float16")))
    with pytest.raises(etsdk.BlobFormatError, match="the library reports .* the blob describes"):
        _init(parts, _rebuild(parts["payload"], constants=_constants_with(parts, "net.0.weight", nbytes=16)))


def test_truncated_weights_are_refused(parts: dict[str, Any]) -> None:
    key = next(c["key"] for c in parts["constants"] if c["fqn"] == "net.0.weight")
    named = dict(parts["named"], **{key: parts["named"][key][:100]})
    with pytest.raises(etsdk.ProgramError, match=r"constant 'net_0_weight' needs 4096 bytes, its named-data entry 'weights/[0-9a-f]{64}' has 100"):
        _init(parts, _rebuild(parts["payload"]), named)


def test_damaged_library_is_refused_before_dlopen(parts: dict[str, Any]) -> None:
    library = bytearray(BlobReader(parts["payload"], known_features=blob_format.KNOWN_FEATURES).section("library"))
    library[len(library) // 2] ^= 0xFF
    with pytest.raises(etsdk.BlobFormatError, match="library's SHA-256 is .* the blob records"):
        _init(parts, _rebuild(parts["payload"], library=bytes(library)))


def test_every_constant_is_its_own_entry_keyed_by_its_content(parts: dict[str, Any]) -> None:
    import hashlib

    stored = [c for c in parts["constants"] if c["source"] == "entry"]
    assert {c["fqn"] for c in stored} >= {"net.0.weight", "net.0.bias", "net.2.weight"}
    for constant in stored:
        data = parts["named"][constant["key"]]
        assert constant["key"] == f"weights/{hashlib.sha256(data).hexdigest()}"
        assert data.nbytes == constant["shape"][0] * (constant["shape"][1] if len(constant["shape"]) > 1 else 1) * 4


def test_unknown_required_feature_is_refused(parts: dict[str, Any]) -> None:
    blob = _rebuild(parts["payload"], features=(BLOB_FEATURE, "aoti.container.v2-sparse"))
    with pytest.raises(etsdk.UnsupportedFeatureError, match="aoti.container.v2-sparse"):
        _init(parts, blob)


# ----------------------------------------------------------------------------- blob format


def test_blob_decodes_to_typed_records_and_encodes_to_the_same_bytes(parts: dict[str, Any]) -> None:
    from dataclasses import replace

    blob = blob_format.decode(parts["payload"])
    assert isinstance(blob.library, memoryview)
    # X has 4 rows: the MLP's products run on the few-row GEMV, which the blob requires
    assert blob.config.state_inputs == () and blob.config.cpu is not None and blob.config.cpu.target == "native"
    assert blob.required_features() == [BLOB_FEATURE, NAMED_CONSTANTS_FEATURE, LINEAR_FEATURE, CPU_TARGET_FEATURE]
    weight = next(c for c in blob.constants if c.fqn == "net.0.weight")
    assert weight.source is blob_format.Source.ENTRY and weight.view is not None and weight.key in parts["named"]
    assert (weight.view.dtype, weight.view.shape, weight.view.stride) == ("float32", (64, 16), (16, 1))
    assert blob_format.encode(replace(blob, library=bytes(blob.library))) == bytes(parts["payload"])


def test_blob_sections_keep_their_json_spelling() -> None:
    """The sections' exact text is part of the program's hash: key order and json.dumps' default spacing."""
    from etsdk_aoti.library import ConstantKind

    sha = blob_format.library_sha256(b"\x7fELF")
    config = blob_format.Config("cpu", 3, 1, sha, (0,))
    constants = (
        blob_format.Constant(
            "w", "net.w", ConstantKind.PARAMETER, False, 6, 64, blob_format.Source.ENTRY,
            view=blob_format.TensorView("float32", (4, 4), (4, 1)), key="weights/abc",
        ),
        blob_format.Constant(
            "s", "q.scales", ConstantKind.BUFFER, False, 6, 64, blob_format.Source.DERIVED,
            view=blob_format.TensorView("float32", (4, 1), (1, 1)),
            derive=blob_format.Derivation("q8_0", (4, 32), (("blocks", "weights/def"),), "scales"),
        ),
        blob_format.Constant("f", "", ConstantKind.FOLDED, True, 6, 8, blob_format.Source.FOLDED),
    )
    payload = blob_format.encode(blob_format.AotiBlob(config, constants, b"\x7fELF"))
    reader = BlobReader(payload, known_features=blob_format.KNOWN_FEATURES)
    assert reader.required_features == ("aoti.container.v1", "aoti.named_constants.v1", "aoti.state_inputs.v1")
    assert [s.name for s in reader.sections] == ["config", "constants", "library"]
    assert bytes(reader.section("config")).decode() == (
        '{"device": "cpu", "num_inputs": 3, "num_outputs": 1, "library_sha256": "' + sha + '", "state_inputs": [0]}'
    )
    assert bytes(reader.section("constants")).decode() == (
        '[{"name": "w", "fqn": "net.w", "kind": "parameter", "folded": false, "dtype_code": 6, "nbytes": 64, '
        '"source": "entry", "dtype": "float32", "shape": [4, 4], "stride": [4, 1], "key": "weights/abc"}, '
        '{"name": "s", "fqn": "q.scales", "kind": "buffer", "folded": false, "dtype_code": 6, "nbytes": 64, '
        '"source": "derived", "dtype": "float32", "shape": [4, 1], "stride": [1, 1], "derive": {"format": "q8_0", '
        '"weight_shape": [4, 32], "stored": {"blocks": "weights/def"}, "plane": "scales"}}, '
        '{"name": "f", "fqn": "", "kind": "folded", "folded": true, "dtype_code": 6, "nbytes": 8, "source": "folded"}]'
    )
    back = blob_format.decode(payload)
    assert back.constants == constants and back.config == config


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"config": {"device": "tpu"}}, r"config.device must be 'cpu', 'cuda' or 'cuda:N', found 'tpu'"),
        ({"config": {"num_inputs": -1}}, r"config.num_inputs must be a non-negative integer, found -1"),
        ({"config": {"state_inputs": [1]}}, r"config.state_inputs must be \[0\] \(every state binding in order\), found \[1\]"),
        ({"net.0.weight": {"kind": "weight"}}, r"constants\[\d+\] \('net_0_weight'\).kind must be one of unknown, .*found 'weight'"),
        ({"net.0.weight": {"shape": [64, "16"]}}, r"\('net_0_weight'\).shape must be a list of non-negative integers, found \[64, '16'\]"),
        ({"net.0.weight": {"stride": [1]}}, r"'net_0_weight'\): shape \[64, 16\] and stride \[1\] differ in length"),
        ({"net.0.weight": {"key": ""}}, r"\('net_0_weight'\).key must be a non-empty string, found ''"),
        ({"net.0.weight": {"source": "state"}}, r"constant 'net_0_weight' has source 'state': a state bound as a constant.* re-export the program"),
        ({"net.0.weight": {"source": "weights"}}, r"constant 'net_0_weight' has source 'weights': a slot of one weights entry.* re-export"),
        ({"net.0.weight": {"source": "disk"}}, r"constant 'net_0_weight' has unknown source 'disk' \(expected one of entry, derived, absent, folded\)"),
    ],
)
def test_decode_names_the_field_what_it_must_be_and_what_it_is(parts: dict[str, Any], change: dict[str, Any], message: str) -> None:
    config = dict(parts["config"], **change.get("config", {}))
    constants = _constants_with(parts, "net.0.weight", **change.get("net.0.weight", {}))
    with pytest.raises(etsdk.BlobFormatError, match=message):
        blob_format.decode(_rebuild(parts["payload"], config=config, constants=constants))


def test_truncated_ptd_file_fails_cleanly(exported: dict[str, Any], tmp_path: Path) -> None:
    bad = tmp_path / "weights.ptd"
    bad.write_bytes(exported["ptd"].read_bytes()[:-512])
    code = (
        "import etsdk, torch\n"
        "try:\n"
        f"    etsdk.load({str(exported['pte'])!r}, data={str(bad)!r}).run('forward', torch.randn(4, 16))\n"
        "except etsdk.EtsdkError as e:\n"
        "    print('REFUSED', type(e).__name__, e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]  # no crash
    assert "REFUSED" in result.stdout


# ----------------------------------------------------------------------------- reading constants


def test_a_constant_reads_its_entry_zero_copy_and_container_sizes_may_be_rounded_up() -> None:
    data = bytearray(torch.arange(6, dtype=torch.float32).numpy().tobytes())
    back = weights.read(memoryview(data), torch.float32, (2, 3), (3, 1))
    assert torch.equal(back, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    data[0:4] = torch.tensor([9.0]).numpy().tobytes()
    assert back[0, 0] == 9.0  # a view of the bytes, not a copy
    assert weights.size_matches(24, 24) and weights.size_matches(412, 448) and weights.size_matches(0, 0)
    assert not weights.size_matches(412, 512) and not weights.size_matches(100, 64)


def test_missing_library_is_a_clear_export_error(monkeypatch: pytest.MonkeyPatch, model: MLP) -> None:
    import torch._inductor

    monkeypatch.setattr(torch._inductor, "aot_compile", lambda *a, **k: ["/tmp/x.wrapper.cpp", "/tmp/x.kernel.cpp"])
    with pytest.raises(etsdk.ExportError, match="produced 0 compiled libraries .* it produced: /tmp/x.wrapper.cpp, /tmp/x.kernel.cpp"):
        etsdk.lower(module=model, example_inputs=(X,), backend=BACKEND_ID, partitioner_options={"device": "cpu"})


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        x = self.proj(q)
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)


def test_partitioner_keeps_attention_whole_for_inductor() -> None:
    from etsdk_aoti.partitioner import AotiPartitioner

    ep = torch.export.export(_Attention(), (torch.randn(1, 2, 4, 8),)).run_decompositions({})
    keep, check = AotiPartitioner(device="cpu").ops_to_not_decompose(ep)
    assert check is None
    assert keep == [torch.ops.aten.scaled_dot_product_attention.default]  # linear etc. are decomposed as usual


def test_partitioner_asks_for_state_on_its_device() -> None:
    from etsdk_aoti.partitioner import AotiPartitioner

    assert AotiPartitioner(device="cpu").state_device == "cpu"
    assert AotiPartitioner(device="cuda:0").state_device == "cuda"  # constructing needs no GPU


def test_kernel_threads_option_reaches_the_compile_specs_and_bad_values_are_refused() -> None:
    from etsdk_aoti.partitioner import KERNEL_THREADS_SPEC, AotiPartitioner

    def specs(partitioner: AotiPartitioner) -> dict[str, bytes]:
        return {spec.key: spec.value for spec in partitioner.delegation_spec.compile_specs}

    assert specs(AotiPartitioner(device="cpu"))[KERNEL_THREADS_SPEC] == b"1"  # default: on the calling thread
    assert specs(AotiPartitioner(device="cpu", kernel_threads=-1))[KERNEL_THREADS_SPEC] == b"-1"
    for bad in (0, -2, True, 1.5):
        with pytest.raises(etsdk.ExportError, match=r"kernel_threads must be -1 \(the caller's team\) or >= 1"):
            AotiPartitioner(device="cpu", kernel_threads=bad)  # type: ignore[arg-type]
    listed = {option.name for option in etsdk.get_backend(BACKEND_ID).options}
    assert {"device", "kernel_threads"} <= listed
