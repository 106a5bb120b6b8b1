"""The bridge runs plugin runtime bindings inside the real ExecuTorch runtime."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import etsdk
import numpy as np
import pytest
import torch
from etsdk._runtime.bridge import runtime_backend_names
from etsdk.reference_backend import BACKEND_ID
from etsdk.reference_backend.runtime import ReferenceBinding
from etsdk.testing import PluginSite

from tests.backends import RaisingBinding, make_backend_plugin


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 16), torch.nn.SiLU(), torch.nn.Linear(16, 3)
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(x) * 2.0, torch.relu(y - 0.5)


EXAMPLE = (torch.randn(2, 8), torch.randn(4))


@pytest.fixture(scope="module")
def model() -> MLP:
    return MLP().eval()


@pytest.fixture(scope="module")
def programs(model: MLP, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("programs")
    embedded = etsdk.lower(module=model, example_inputs=EXAMPLE, backend=BACKEND_ID)
    embedded.save(root / "embedded" / "mlp.pte")
    external = etsdk.lower(module=model, example_inputs=EXAMPLE, backend=BACKEND_ID, external_data="weights")
    assert external.data_files == ("weights",)
    external.save(root / "external" / "mlp.pte")
    return {
        "embedded": root / "embedded" / "mlp.pte",
        "external": root / "external" / "mlp.pte",
        "external_data": root / "external" / "weights.ptd",
    }


def _check_matches(program: etsdk.Program, model: MLP) -> None:
    for seed in range(3):
        torch.manual_seed(seed)
        x, y = torch.randn(2, 8), torch.randn(4)
        got = program.run("forward", x, y)
        want = model(x, y)
        assert len(got) == 2
        torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[1], want[1])


def test_embedded_weights_match_eager(programs: dict[str, Path], model: MLP) -> None:
    program = etsdk.load(programs["embedded"])
    assert program.methods == ("forward",)
    assert program.delegates("forward") == (BACKEND_ID,)
    _check_matches(program, model)


def test_external_weights_match_eager(programs: dict[str, Path], model: MLP) -> None:
    # the weights really left the .pte
    assert programs["external"].stat().st_size < programs["embedded"].stat().st_size
    assert programs["external_data"].stat().st_size > 16 * 16 * 4
    program = etsdk.load(programs["external"], data=programs["external_data"])
    _check_matches(program, model)


def test_method_metadata(programs: dict[str, Path]) -> None:
    program = etsdk.load(programs["embedded"])
    info = program.method_info("forward")
    assert [(t.shape, t.dtype) for t in info.inputs if t] == [((2, 8), torch.float32), ((4,), torch.float32)]
    assert [(t.shape, t.dtype, t.nbytes) for t in info.outputs if t] == [
        ((2, 3), torch.float32, 24),
        ((4,), torch.float32, 16),
    ]
    assert info.backends == (BACKEND_ID,)
    assert program.contract is None
    with pytest.raises(etsdk.ProgramError, match="has no method 'decode' \\(methods: forward\\)"):
        program.load_method("decode")
    with pytest.raises(etsdk.ProgramError, match="takes 2 input\\(s\\), got 1"):
        program.run("forward", torch.randn(2, 8))


def _mapping_of(address: int) -> str | None:
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split()
        low, high = (int(v, 16) for v in span.split("-"))
        if low <= address < high:
            return rest[-1] if len(rest) >= 5 else ""
    return None


def _address(buffer: Any) -> int:
    return int(np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0])


class SpyBinding(ReferenceBinding):
    """Records where the blob, the named data and the tensor arguments live."""

    records: dict[str, Any] = {}

    def init(self, context: Any) -> Any:
        keys = [k for k in context.named_data.keys() if k.startswith("weights/")]  # the weights (canonical entries)
        buffers = [context.named_data.get(k) for k in keys]
        self.records["named_data"] = [_mapping_of(_address(b)) for b in buffers]
        self.records["blob"] = _mapping_of(_address(context.blob))
        handle = super().init(context)
        inner = handle.execute
        records = self.records

        def execute(args: Any, state: Any) -> None:
            records.setdefault("calls", []).append(
                [(a.data_ptr(), a.is_contiguous()) for a in args if isinstance(a, torch.Tensor)]
            )
            inner(args, state)
            records["written"] = args[-1].clone()

        handle.execute = execute
        return handle


@pytest.fixture(scope="module")
def spy_programs(model: MLP, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    etsdk.register_plugin(make_backend_plugin("EtsdkSpyBackend", SpyBinding), "spy")
    root = tmp_path_factory.mktemp("spy")
    lowered = etsdk.lower(
        module=model,
        example_inputs=EXAMPLE,
        backend="EtsdkSpyBackend",
        external_data="spyweights",
    )
    lowered.save(root / "spy.pte")
    return {"pte": root / "spy.pte", "ptd": root / "spyweights.ptd"}


def test_zero_copy_named_data_blob_and_arguments(spy_programs: dict[str, Path], model: MLP) -> None:
    SpyBinding.records.clear()
    program = etsdk.load(spy_programs["pte"], data=spy_programs["ptd"])
    x, y = torch.randn(2, 8), torch.randn(4)
    outs = program.run("forward", x, y)
    outs2 = program.run("forward", x, y)
    records = SpyBinding.records
    # named data and the blob are views of the mapped files, not copies
    assert records["named_data"] and all(m == str(spy_programs["ptd"]) for m in records["named_data"])
    assert records["blob"] == str(spy_programs["pte"])
    # arguments are tensors over the runtime's planned memory, stable across calls
    assert records["calls"][0] == records["calls"][1]
    # the output the binding wrote in place is what the runtime returned
    torch.testing.assert_close(records["written"], outs[-1])
    torch.testing.assert_close(outs2[0], model(x, y)[0], atol=1e-5, rtol=1e-5)


def test_execute_error_carries_type_message_and_traceback(model: MLP, tmp_path: Path) -> None:
    etsdk.register_plugin(make_backend_plugin("EtsdkRaiseExecBackend", lambda: RaisingBinding("execute")), "raise-exec")
    etsdk.lower(module=model, example_inputs=EXAMPLE, backend="EtsdkRaiseExecBackend").save(tmp_path / "r.pte")
    program = etsdk.load(tmp_path / "r.pte")
    with pytest.raises(etsdk.DelegateError) as info:
        program.run("forward", *EXAMPLE)
    err = info.value
    assert err.original_type == "ValueError"
    assert err.original_message == "binding failed on 4 arguments: boom 42"
    assert "fail_in_binding" in err.original_traceback
    assert err.backend_id == "EtsdkRaiseExecBackend" and err.method == "forward" and err.phase == "execute"
    assert isinstance(err.__cause__, ValueError)
    assert "raised ValueError during execute in method 'forward': binding failed" in str(err)
    # the program is still usable and the error does not leak into the next call
    with pytest.raises(etsdk.DelegateError):
        program.run("forward", *EXAMPLE)


def test_init_error_surfaces_at_load_method(model: MLP, tmp_path: Path) -> None:
    etsdk.register_plugin(make_backend_plugin("EtsdkRaiseInitBackend", lambda: RaisingBinding("init")), "raise-init")
    etsdk.lower(module=model, example_inputs=EXAMPLE, backend="EtsdkRaiseInitBackend").save(tmp_path / "r.pte")
    program = etsdk.load(tmp_path / "r.pte")
    with pytest.raises(etsdk.DelegateError, match="raised LookupError during init in method 'forward'") as info:
        program.load_method("forward")
    assert info.value.original_message == "init refused: blob checksum 0xdead"


def test_backends_register_lazily_once_and_are_repointed(programs: dict[str, Path], model: MLP) -> None:
    class Unused(ReferenceBinding):
        pass

    etsdk.register_plugin(make_backend_plugin("EtsdkNeverUsedBackend", Unused), "never-used")
    etsdk.load(programs["embedded"])
    names = runtime_backend_names()
    assert BACKEND_ID in names
    assert "EtsdkNeverUsedBackend" not in names  # only what a program uses is registered
    count = len(names)
    etsdk.reset_registry()  # a rebuilt plugin registry re-points the same slot
    program = etsdk.load(programs["embedded"])
    _check_matches(program, model)
    assert len(runtime_backend_names()) == count
    assert runtime_backend_names().count(BACKEND_ID) == 1


def test_registry_slots_running_out_is_a_clear_error(site: PluginSite) -> None:
    result = site.run_python(
        """
        import etsdk
        from etsdk._runtime.bridge import ensure_registered, runtime_backend_names
        try:
            for i in range(40):
                ensure_registered(f"EtsdkFiller{i}Backend")
        except etsdk.BridgeRegistryError as e:
            print("FULL", len(runtime_backend_names()), e)
        """
    )
    assert result.returncode == 0, result.stderr
    line = next(text for text in result.stdout.splitlines() if text.startswith("FULL"))
    assert "could not register backend id 'EtsdkFiller" in line
    assert "fixed number of slots" in line


def test_unknown_backend_id_names_backend_and_how_to_install(model: MLP, tmp_path: Path, site: PluginSite) -> None:
    etsdk.register_plugin(make_backend_plugin("EtsdkElsewhereBackend", ReferenceBinding), "elsewhere")
    etsdk.lower(module=model, example_inputs=EXAMPLE, backend="EtsdkElsewhereBackend").save(tmp_path / "e.pte")
    # a fresh process has no plugin providing that id
    result = site.run_python(
        f"""
        import etsdk
        try:
            etsdk.load({str(tmp_path / "e.pte")!r})
        except etsdk.BackendNotFoundError as e:
            print("NOTFOUND", e.backend_id, "|", e)
        """
    )
    assert "NOTFOUND EtsdkElsewhereBackend |" in result.stdout, result.stderr
    assert "method 'forward' delegates to backend 'EtsdkElsewhereBackend'" in result.stdout
    assert "pip install" in result.stdout


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip-header", "empty"])
def test_corrupted_pte_is_refused(programs: dict[str, Path], tmp_path: Path, damage: str) -> None:
    data = bytearray(programs["embedded"].read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = bytearray(b"\x17" * len(data))
    elif damage == "flip-header":
        data[4:8] = b"XXXX"
    else:
        data = bytearray()
    bad = tmp_path / "bad.pte"
    bad.write_bytes(bytes(data))
    with pytest.raises(etsdk.ProgramError, match="not a valid ExecuTorch program"):
        etsdk.load(bad)


def test_missing_files_are_clear_errors(programs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(etsdk.ProgramError, match="program file not found"):
        etsdk.load(tmp_path / "nope.pte")
    with pytest.raises(etsdk.ProgramError, match="data file not found"):
        etsdk.load(programs["external"], data=tmp_path / "nope.ptd")
    # the program needs its .ptd but none was given
    program = etsdk.load(programs["external"])
    with pytest.raises(etsdk.ProgramError, match="needs its .ptd"):
        program.load_method("forward")


def test_calls_from_several_threads(programs: dict[str, Path], model: MLP) -> None:
    program = etsdk.load(programs["external"], data=programs["external_data"])
    failures: list[str] = []

    def worker(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(40):
            x, y = torch.randn(2, 8, generator=gen), torch.randn(4, generator=gen)
            got = program.run("forward", x, y)
            want = model(x, y)
            if not (torch.allclose(got[0], want[0], atol=1e-5) and torch.equal(got[1], want[1])):
                failures.append(f"thread {seed}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_blob_requiring_unknown_feature_fails_closed(model: MLP, tmp_path: Path) -> None:
    """A self-consistent program whose reference payload requires a feature this reader lacks: refused at init."""
    from etsdk.testing import transform_payloads, with_required_feature

    with transform_payloads(lambda backend, method, payload: with_required_feature(payload, "reference.graph.v9")):
        etsdk.lower(module=model, example_inputs=EXAMPLE, backend=BACKEND_ID).save(tmp_path / "future.pte")
    program = etsdk.load(tmp_path / "future.pte")
    with pytest.raises(etsdk.UnsupportedFeatureError, match="requires feature\\(s\\) reference.graph.v9") as info:
        program.load_method("forward")
    assert info.value.feature == "reference.graph.v9"


def test_missing_compiler_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from etsdk._runtime.bridge import build

    monkeypatch.setenv("ETSDK_CACHE_DIR", str(tmp_path))  # nothing cached here: a build is needed
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(etsdk.BridgeBuildError, match="no C\\+\\+ compiler found .*apt-get install g\\+\\+"):
        build.build()


def test_bridge_builds_into_the_cache_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from etsdk._runtime.bridge import build

    monkeypatch.setenv("ETSDK_CACHE_DIR", str(tmp_path))
    first = build.build()
    assert first.is_file() and tmp_path in first.parents
    mtime = first.stat().st_mtime_ns
    assert build.build() == first and first.stat().st_mtime_ns == mtime  # cached, not rebuilt
