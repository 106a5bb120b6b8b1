"""Programs say which CPU they need: the recorded target, the refusal at load, exports for a CPU the host is not.

Three AOTInductor compiles of one tiny model (no etsdk-aoti kernel calls: eight rows per product), shared by
the module: ``native`` (the default), ``x86-64-v3``, and ``x86-64-v4`` exported while ``ETSDK_HIDE_CPU_FEATURES``
hides AVX-512 (a build host that cannot run its own output: the library must never be loaded there). A host
without a feature is simulated with the same variable; the host's own features are re-read on every check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import etsdk
import pytest
import torch
from etsdk import BackendUnavailableError, BlobFormatError, ExportError, UnsupportedFeatureError
from etsdk.backend import BlobReader, BlobWriter, cache_dir, cpu_target, host_cpu
from etsdk.testing import capture_delegates
from etsdk_aoti import BACKEND_ID, blob_format, runtime, serializer
from etsdk_aoti.blob_format import CPU_TARGET_FEATURE, HOST_CPU_TARGET_FEATURE, KNOWN_FEATURES
from etsdk_aoti.library import ConstantKind, GeneratedSource
from etsdk_aoti.partitioner import AotiPartitioner

HIDE = "ETSDK_HIDE_CPU_FEATURES"
AVX512 = ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
X = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))

pytestmark = pytest.mark.skipif(host_cpu().machine != "x86_64", reason="the targets exported here are x86-64 levels")


class Tiny(torch.nn.Module):
    """Parameters, a float buffer and an int64 buffer (constants of three kinds and two dtypes), two outputs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(32, 16)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 16))
        self.register_buffer("order", torch.randperm(16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.nn.functional.gelu(self.lin(x)) * self.scale
        return y.index_select(1, self.order), y.sum(-1)


@pytest.fixture(scope="module")
def model() -> Tiny:
    return Tiny().eval()


def _export(model: Tiny, path: Path, **options: Any) -> dict[str, Any]:
    stderr = io.StringIO()
    with capture_delegates() as captured, contextlib.redirect_stderr(stderr):
        etsdk.lower(
            module=model, example_inputs=(X,), backend=BACKEND_ID, partitioner_options={"device": "cpu", **options},
            quiet=False,
        ).save(path)
    (delegate,) = captured
    return {"pte": path, "payload": delegate.payload, "blob": blob_format.decode(delegate.payload), "stderr": stderr.getvalue()}


@pytest.fixture(scope="module")
def native(model: Tiny, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(HIDE, raising=False)
        return _export(model, tmp_path_factory.mktemp("native") / "native.pte")


@pytest.fixture(scope="module")
def v3(model: Tiny, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(HIDE, raising=False)
        return _export(model, tmp_path_factory.mktemp("v3") / "v3.pte", cpu_target="x86-64-v3")


def _mapped_libraries() -> set[str]:
    """Files under the temporary directory mapped into this process: where AOTInductor writes what it compiles
    (etsdk-aoti's export directory, Inductor's cache), so a library loaded from there shows."""
    temporary = tempfile.gettempdir()
    with open("/proc/self/maps", encoding="utf-8") as f:
        paths = {parts[5].strip() for parts in (line.split(None, 5) for line in f) if len(parts) == 6}
    return {path for path in paths if path.startswith(temporary) or "etsdk-aoti-" in path}


@pytest.fixture(scope="module")
def cross(model: Tiny, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """x86-64-v4 exported by a host that (as far as etsdk can tell) lacks AVX-512: nothing may load the library."""

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the compiled library was loaded during a cross-target export: {args}")

    before = _mapped_libraries()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(HIDE, ",".join(AVX512))
        mp.setattr(serializer, "Library", never)
        out = _export(model, tmp_path_factory.mktemp("v4") / "v4.pte", cpu_target="x86-64-v4")
    out["mapped"] = _mapped_libraries() - before
    return out


# ----------------------------------------------------------------------------- what is recorded


def test_a_default_export_records_this_hosts_cpu(native: dict[str, Any]) -> None:
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    blob = native["blob"]
    cpu = blob.config.cpu
    host = host_cpu()
    assert CPU_TARGET_FEATURE in blob.required_features()
    assert (cpu.target, cpu.machine, cpu.march, cpu.kernels) == ("native", "x86_64", "native", "portable")
    real = dataclasses.replace(host, features=host.features | host.hidden, hidden=frozenset())
    assert list(cpu.features) == real.isa_features()  # every instruction-set feature of the host, sorted
    assert cpu.vec_isa == str(pick_vec_isa())
    assert cpu.built_on == host.describe()


def test_a_target_export_records_the_target_and_runs_like_eager(v3: dict[str, Any], model: Tiny, tmp_path: Path) -> None:
    cpu = v3["blob"].config.cpu
    assert (cpu.target, cpu.machine, cpu.vec_isa, cpu.march) == ("x86-64-v3", "x86_64", "avx2", "x86-64-v3")
    assert set(cpu.features) == cpu_target("x86-64-v3").features and "avx2" in cpu.features and "avx512f" not in cpu.features
    # and the code was compiled for it: no AVX-512 register anywhere in the library
    objdump = shutil.which("objdump")
    if objdump is not None:
        library = tmp_path / "v3.so"
        library.write_bytes(bytes(v3["blob"].library))
        listing = subprocess.run([objdump, "-d", str(library)], capture_output=True, text=True, check=True).stdout
        assert "%ymm" in listing and "%zmm" not in listing
    if not cpu_target("x86-64-v3").runs_on(host_cpu()):
        pytest.skip("this host does not run x86-64-v3 code")
    program = etsdk.load(v3["pte"])
    for got, want in zip(program.run("forward", X), model(X)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _inspect(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "etsdk", "inspect", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_inspect_shows_the_target(v3: dict[str, Any]) -> None:
    text = _inspect(str(v3["pte"]))
    needs = " ".join(sorted(cpu_target("x86-64-v3").features))
    assert f"        cpu target: x86-64-v3 (x86_64): needs {needs}\n" in text
    assert "vector ISA avx2, -march=x86-64-v3" in text
    (delegate,) = json.loads(_inspect("--json", str(v3["pte"])))["methods"]["forward"]
    assert f"cpu target: x86-64-v3 (x86_64): needs {needs}" in delegate["details"]


# ----------------------------------------------------------------------------- refused at load (hostile host)


@pytest.mark.parametrize("program", ["native", "v3"])
def test_a_host_that_lacks_a_needed_feature_refuses_the_program_before_loading_it(
    program: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    exported = request.getfixturevalue(program)
    if "avx2" not in host_cpu().features:
        pytest.skip("this host has no AVX2 to hide")
    touched: list[str] = []

    def never(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            touched.append(name)
            raise AssertionError(f"{name} called for a program this host cannot run")

        return call

    monkeypatch.setattr(runtime, "cached_library", never("cached_library"))
    monkeypatch.setattr(runtime, "Library", never("Library"))
    cached = cache_dir() / "aoti" / f"{exported['blob'].config.library_sha256}.so"
    existed = cached.exists()
    monkeypatch.setenv(HIDE, "avx2,fma")
    program = etsdk.load(exported["pte"])  # methods load when first used: their delegates' init refuses
    with pytest.raises(BackendUnavailableError) as caught:
        program.load_method("forward")
    message = str(caught.value)
    target = exported["blob"].config.cpu.target
    assert "\n" not in message
    assert f"compiled for {target} (x86_64, needs " in message
    assert "this host lacks avx2 fma:" in message and "re-export it with --cpu-target" in message
    assert caught.value.backend_id == BACKEND_ID
    assert touched == [] and cached.exists() == existed  # never written to the cache, never loaded


# ----------------------------------------------------------------------------- exporting for a CPU the host is not


def test_a_cross_target_export_never_loads_the_library_and_reads_what_the_container_reports(
    cross: dict[str, Any], native: dict[str, Any]
) -> None:
    cpu = cross["blob"].config.cpu
    assert (cpu.target, cpu.march) == ("x86-64-v4", "x86-64-v4") and set(AVX512) <= set(cpu.features)
    assert cpu.vec_isa in ("avx512", "avx2")  # avx2 where this host's 512-bit ISA needs more than v4 (AMX, VNNI)
    assert "hidden by ETSDK_HIDE_CPU_FEATURES" in cpu.built_on
    assert cross["mapped"] == set(), "a compiled library was mapped into the exporting process"
    assert "read from Inductor's generated source" in cross["stderr"]

    def container(blob: Any) -> list[tuple[Any, ...]]:
        return [(c.name, c.fqn, c.kind, c.folded, c.dtype_code, c.nbytes) for c in blob.constants]

    # the native export read the same model's constants from a loaded container
    assert container(cross["blob"]) == container(native["blob"])
    assert {c.kind for c in cross["blob"].constants} == {ConstantKind.PARAMETER, ConstantKind.BUFFER}
    assert {c.dtype_code for c in cross["blob"].constants} == {6, 4}  # float32, int64: torch's ScalarType codes
    got = cross["blob"].config
    assert (got.num_inputs, got.num_outputs) == (native["blob"].config.num_inputs, native["blob"].config.num_outputs) == (1, 2)


def test_a_cross_target_program_runs_where_its_target_does(cross: dict[str, Any], model: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HIDE, raising=False)
    if not cpu_target("x86-64-v4").runs_on(host_cpu()):
        with pytest.raises(BackendUnavailableError, match="compiled for x86-64-v4"):
            etsdk.load(cross["pte"]).load_method("forward")
        return
    # the runtime compares the container's constants with those read from the source: a mismatch is refused
    program = etsdk.load(cross["pte"])
    for got, want in zip(program.run("forward", X), model(X)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- bad input


def test_an_unknown_target_is_refused_in_one_line_before_anything_compiles(model: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("compiled despite an unknown cpu_target")

    monkeypatch.setattr(serializer, "compile_partition", never)
    with pytest.raises(ExportError) as caught:
        etsdk.lower(module=model, example_inputs=(X,), backend=BACKEND_ID, partitioner_options={"device": "cpu", "cpu_target": "x86-64-v9"})
    message = str(caught.value)
    assert "\n" not in message and "'x86-64-v9'" in message
    assert all(name in message for name in ("native", "x86-64-v3", "x86-64-v4"))
    with pytest.raises(ExportError, match="cpu_target must be one of native, x86-64, x86-64-v2, x86-64-v3, x86-64-v4, found 'armv8-a'"):
        AotiPartitioner(device="cpu", cpu_target="armv8-a")  # another machine's target


class _CompileStopped(Exception):
    pass


@pytest.mark.parametrize(("target", "march"), [("native", None), ("x86-64-v3", "x86-64-v3")])
def test_a_cuda_librarys_host_code_is_compiled_for_the_cpu_target(
    model: Tiny, monkeypatch: pytest.MonkeyPatch, target: str, march: str | None
) -> None:
    """A CUDA library's wrapper is C++ Inductor compiles ``-march=native`` unless told: the target reaches that
    compile too (the compile itself needs CUDA: stopped where it would start)."""
    seen: dict[str, Any] = {}

    def compile_stub(edge_program: Any, device: str, workdir: Path, *args: Any, **kwargs: Any) -> Any:
        seen.update(device=device, options=args[3] if len(args) > 3 else kwargs.get("target_options"))
        raise _CompileStopped

    monkeypatch.setattr(serializer, "compile_partition", compile_stub)
    with pytest.raises(ExportError, match="_CompileStopped"):
        etsdk.lower(module=model, example_inputs=(X,), backend=BACKEND_ID, partitioner_options={"device": "cuda", "cpu_target": target})
    assert seen["device"] == "cuda"
    assert seen["options"].get("cpp.march") == march  # native: Inductor's own -march=native, recorded as such


def _as_cuda(payload: bytes, *, record: bool = True) -> bytes:
    """``payload`` (a CPU blob) as a CUDA blob would say it: device cuda, its CPU record the host code's (features as
    the writer sets them), or, ``record=False``, as written before CUDA blobs had one."""
    features = tuple(f for f in BlobReader(payload, known_features=KNOWN_FEATURES).required_features if f != CPU_TARGET_FEATURE)
    if not record:
        return _with_config(payload, lambda config: (config.update(device="cuda"), config.pop("cpu")), features)
    return _with_config(payload, _set("device", "cuda"), (*features, CPU_TARGET_FEATURE, HOST_CPU_TARGET_FEATURE))


def test_a_cuda_blobs_host_code_record_goes_with_its_own_feature(v3: dict[str, Any]) -> None:
    cuda = _as_cuda(v3["payload"])
    assert set(blob_format.decode(cuda).required_features()) == set(BlobReader(cuda, known_features=KNOWN_FEATURES).required_features)
    # a reader that knows CPU records only for CPU libraries refuses it as a feature it lacks, not as damage
    with pytest.raises(UnsupportedFeatureError, match=HOST_CPU_TARGET_FEATURE):
        BlobReader(cuda, known_features=KNOWN_FEATURES - {HOST_CPU_TARGET_FEATURE})
    without = _with_config(v3["payload"], _set("device", "cuda"))  # the record without the feature
    with pytest.raises(BlobFormatError, match=f"config.cpu for device 'cuda', which goes with requiring {HOST_CPU_TARGET_FEATURE}"):
        blob_format.decode(without)
    cpu_with = _with_config(v3["payload"], lambda config: None, (*BlobReader(v3["payload"], known_features=KNOWN_FEATURES).required_features, HOST_CPU_TARGET_FEATURE))
    with pytest.raises(BlobFormatError, match=f"no config.cpu for a device other than the CPU, which goes with requiring {HOST_CPU_TARGET_FEATURE}"):
        blob_format.decode(cpu_with)
    # a CUDA blob written before the record loads as before: nothing to check, and inspect says so
    old = blob_format.decode(_as_cuda(v3["payload"], record=False))
    assert old.config.cpu is None and HOST_CPU_TARGET_FEATURE not in old.required_features()
    assert "cpu target of the host code: not recorded (an older blob): built for its exporting host" in blob_format.describe(old)


def test_a_cuda_blob_carries_its_host_codes_cpu_and_a_host_that_lacks_it_refuses_first(
    v3: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = _as_cuda(v3["payload"])
    blob = blob_format.decode(cuda)
    assert (blob.config.device, blob.config.cpu) == ("cuda", v3["blob"].config.cpu)
    assert any(line.startswith("cpu target of the host code: x86-64-v3 (x86_64): needs ") for line in blob_format.describe(blob))
    if "avx2" not in host_cpu().features:
        pytest.skip("this host has no AVX2 to hide")
    monkeypatch.setenv(HIDE, "avx2,fma")
    context = SimpleNamespace(blob=memoryview(cuda), states=())
    # the CPU is checked before the GPU: this host (which has no CUDA either, or hides nothing of it) is told
    # what its CPU lacks, and nothing is written or loaded
    monkeypatch.setattr(runtime, "cached_library", lambda *a: pytest.fail("a library was cached for a host that cannot run it"))
    with pytest.raises(BackendUnavailableError, match="compiled for x86-64-v3 .*this host lacks avx2 fma"):
        runtime.AotiBinding().init(context)  # type: ignore[arg-type]


def _with_config(payload: bytes, change: Any, features: tuple[str, ...] | None = None) -> bytes:
    reader = BlobReader(payload, known_features=KNOWN_FEATURES)
    config = json.loads(bytes(reader.section("config")))
    change(config)
    writer = BlobWriter(required_features=list(features if features is not None else reader.required_features))
    writer.add_section("config", json.dumps(config).encode())
    writer.add_section("constants", bytes(reader.section("constants")))
    writer.add_section("library", reader.section("library"), alignment=4096)
    return writer.to_bytes()


def _set(path: str, value: Any) -> Any:
    def change(config: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        target = config
        for part in parents:
            target = target[part]
        if value is _DELETE:
            del target[leaf]
        else:
            target[leaf] = value

    return change


_DELETE = object()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_set("cpu.features", ["avx2", "avx"]), "config.cpu.features must be a sorted list of distinct feature names"),
        (_set("cpu.features", ["avx", 2]), "config.cpu.features must be a sorted list"),
        (_set("cpu.features", "avx2"), "config.cpu.features must be a sorted list"),
        (_set("cpu.kernels", "avx512"), "config.cpu.kernels must be 'portable', found 'avx512'"),
        (_set("cpu.target", _DELETE), "config.cpu has no 'target'"),
        (_set("cpu.machine", "x86 64"), "config.cpu.machine must be a machine name"),
        (_set("cpu.vec_isa", ""), "config.cpu.vec_isa must be a non-empty string"),
        (_set("cpu", "x86-64-v3"), "config.cpu must be an object, found str"),
        (_set("cpu", _DELETE), f"has no config.cpu, which goes with requiring {CPU_TARGET_FEATURE}"),
    ],
)
def test_a_damaged_cpu_record_is_refused_naming_the_field(native: dict[str, Any], change: Any, message: str) -> None:
    with pytest.raises(BlobFormatError) as caught:
        blob_format.decode(_with_config(native["payload"], change))
    assert message in str(caught.value)


def test_a_cpu_record_goes_with_its_required_feature(native: dict[str, Any]) -> None:
    features = tuple(f for f in BlobReader(native["payload"], known_features=KNOWN_FEATURES).required_features if f != CPU_TARGET_FEATURE)
    with pytest.raises(BlobFormatError, match=f"has config.cpu, which goes with requiring {CPU_TARGET_FEATURE}"):
        blob_format.decode(_with_config(native["payload"], lambda config: None, features))
    # a reader that does not know the feature refuses the blob instead of running code it cannot check
    with pytest.raises(UnsupportedFeatureError, match=CPU_TARGET_FEATURE):
        BlobReader(native["payload"], known_features=KNOWN_FEATURES - {CPU_TARGET_FEATURE})


def test_generated_source_that_does_not_parse_is_an_export_error(tmp_path: Path) -> None:
    good = (
        "    : AOTInductorModelBase(1,\n 2,\n 1,\n device_str, std::move(cubin_dir), false) {\n"
        '    constants_info_[0].name = "w";\n'
        "    constants_info_[0].dtype = cached_torch_dtype_bfloat16;\n"
        "    constants_info_[0].data_size = 64;\n"
        "    constants_info_[0].from_folded = false;\n"
        "    constants_info_[0].type = static_cast<int32_t>(torch::aot_inductor::ConstantType::TensorConstant);\n"
        '    constants_info_[0].original_fqn = "m.w";\n'
    )
    source = GeneratedSource.parse(good, tmp_path / "x.wrapper.cpp")
    (constant,) = source.constants()
    assert (source.num_inputs, source.num_outputs) == (1, 2)
    assert (constant.name, constant.fqn, constant.kind, constant.folded, constant.dtype_code, constant.nbytes) == (
        "w", "m.w", ConstantKind.TENSOR_CONSTANT, False, 15, 64
    )
    cases = {
        good.replace("AOTInductorModelBase", "Other"): "expected one AOTInductorModelBase(num_inputs, num_outputs, num_constants, ...), found 0",
        good.replace("1,\n device_str", "2,\n device_str"): "the model declares 2 constant(s), constants_info_ describes indices [0]",
        good.replace("TensorConstant", "Weird"): "ConstantType::Weird, expected one of Unknown, Parameter",
        good.replace("bfloat16", "nosuchtype"): "cached_torch_dtype_nosuchtype, which torch does not know",
        good.replace("= 64", "= lots"): "constants_info_[0].data_size is 'lots', expected",
        good.replace("    constants_info_[0].from_folded = false;\n", ""): "constants_info_[0] sets no from_folded",
    }
    for text, message in cases.items():
        with pytest.raises(ExportError) as caught:
            GeneratedSource.parse(text, tmp_path / "x.wrapper.cpp")
        assert message in str(caught.value) and "x.wrapper.cpp" in str(caught.value)
    with pytest.raises(ExportError, match=r"expected one Inductor wrapper source \(\*.wrapper.cpp\) in .*, found none"):
        GeneratedSource.read(tmp_path)
    assert os.listdir(tmp_path) == []
