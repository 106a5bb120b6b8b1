"""The conformance kit: it passes for the reference backend, and fails for broken backends at the right behaviour.

The kit's own tests run here for the reference backend (``from etsdk.conformance.suite import *``). Four
deliberately broken backends, each built on the reference backend's parts with one fault, run the kit in a
subprocess as an installed distribution would: each fails exactly where its fault is, and the report says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from etsdk.conformance.suite import *  # noqa: F403 - the kit's tests, for the reference backend
from etsdk.testing import PluginSite


@pytest.fixture(scope="session")
def etsdk_backend_id() -> str:
    return "EtsdkReferenceBackend"


BROKEN = """
    import dataclasses
    from etsdk import BackendSpec, hookimpl
    from etsdk.backend import BlobReader, BlobWriter, Capability, Option
    from etsdk.reference_backend.partitioner import ReferencePartitioner
    from etsdk.reference_backend.runtime import ReferenceBinding
    from etsdk.reference_backend.serializer import preprocess

    ETSDK_PLUGIN_API = ">=2,<3"


    class CopiesState(ReferenceBinding):
        '''Updates a private copy of the session's state: the caller never sees the update.'''

        def init(self, context):
            handle = super().init(context)
            inner = handle.execute
            handle.execute = lambda args, state: inner(args, tuple(t.clone() for t in state))
            return handle


    class SwapsOutputs(ReferenceBinding):
        '''Writes its outputs in reverse order (engine order instead of the delegate's).'''

        def init(self, context):
            handle = super().init(context)
            inner = handle.execute
            n = len(context.signature.inputs)
            handle.execute = lambda args, state: inner(tuple(args[:n]) + tuple(reversed(args[n:])), state)
            return handle


    class IgnoresFeatures(ReferenceBinding):
        '''Reads blobs whatever features they require.'''

        def init(self, context):
            required, optional = BlobReader.declared_features(context.blob)
            reader = BlobReader(context.blob, known_features=required)
            writer = BlobWriter(required_features=[f for f in required if f.startswith("reference.")], producer="x")
            for section in reader.sections:
                writer.add_section(section.name, reader.section(section.name), alignment=section.alignment)
            return super().init(dataclasses.replace(context, blob=memoryview(writer.to_bytes())))


    class IgnoresScales(ReferenceBinding):
        '''Multiplies by quantized weights as if every scale were 1.'''

        def init(self, context):
            import torch

            handle = super().init(context)
            linear_q = torch.ops.etsdk.linear_q.default
            for call in handle._calls:
                if call.op is linear_q:
                    call.op = lambda x, q, s, m, b, f: linear_q(x, q, torch.ones_like(s), m, b, f)
            return handle


    def spec(backend_id, binding, formats=()):
        return BackendSpec(
            id=backend_id, version="0",
            partitioner=lambda **options: ReferencePartitioner(backend_id=backend_id, **options),
            preprocess=preprocess, runtime=binding,
            capabilities=frozenset({Capability.CPU, Capability.CALLER_OWNED_STATE}),
            options=(Option("ops", (list, tuple), None),),
            weight_formats=formats,
        )


    @hookimpl
    def etsdk_register_backends():
        return [spec("BrokenCopiesState", CopiesState), spec("BrokenSwapsOutputs", SwapsOutputs),
                spec("BrokenIgnoresFeatures", IgnoresFeatures), spec("BrokenIgnoresScales", IgnoresScales, ("int8", "int4:g32"))]
"""

EXPECTED_FAILURES = {
    "BrokenCopiesState": {
        "in-place caller-owned state: updated with an unchanged data pointer",
        "repeated calls accumulate state: one loaded method, prefill then decode steps",
        "persistence: decode at position 1 on a fresh cache differs from position 0 then 1",
    },
    "BrokenSwapsOutputs": {"binding order: user outputs in their slots"},
    "BrokenIgnoresFeatures": {"refusal of an unknown required feature: in the backend's own blob"},
    "BrokenIgnoresScales": {"quantized weights: each declared format computes the format's math (etsdk::linear_q / embedding_q)"},
}


def test_the_kit_fails_each_broken_backend_at_its_fault(tmp_path: Path) -> None:
    site = PluginSite(tmp_path / "site")
    site.add("broken-backends", BROKEN, plugin="broken")
    report = tmp_path / "report.json"
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--etsdk-report", str(report),
            "-k", "not mutated_payloads and not unclaimed"]
    for backend in EXPECTED_FAILURES:
        args += ["--etsdk-backend", backend]
    run = tmp_path / "run"
    run.mkdir()
    result = subprocess.run(args, cwd=run, capture_output=True, text=True, env=site.env())
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(report.read_text())["results"]
    for backend, expected in EXPECTED_FAILURES.items():
        mine = [r for r in results if r["backend"] == backend]
        assert mine, f"no results for {backend}: {result.stdout[-2000:]}"
        failed = {r["behaviour"] for r in mine if r["outcome"] == "failed"}
        assert expected <= failed, (backend, failed)
        for r in mine:
            if r["outcome"] == "failed":
                name = r["behaviour"].split(":")[0]
                assert r["message"].startswith((f"AssertionError: {name}", f"Failed: {name}")), r
    swaps = {r["behaviour"] for r in results if r["backend"] == "BrokenSwapsOutputs" and r["outcome"] == "failed"}
    assert "binding order with an aliased output: user outputs beside a cache update" in swaps
    ignores = {r["behaviour"] for r in results if r["backend"] == "BrokenIgnoresFeatures" and r["outcome"] == "failed"}
    assert ignores == {"refusal of an unknown required feature: in the backend's own blob"}
    scales = {r["behaviour"] for r in results if r["backend"] == "BrokenIgnoresScales" and r["outcome"] == "failed"}
    assert scales == EXPECTED_FAILURES["BrokenIgnoresScales"]  # the only fault: every other behaviour passes
    skipped = {r["behaviour"]: r["message"] for r in results if r["backend"] == "BrokenCopiesState" and r["outcome"] == "skipped"}
    assert "declares no weight formats" in skipped.get(next(iter(EXPECTED_FAILURES["BrokenIgnoresScales"])), ""), skipped
    assert "BrokenCopiesState  failed   in-place caller-owned state" in result.stdout


def test_conformance_without_pytest_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    """pytest is not a dependency of etsdk: without it the command says what to install, with no traceback."""
    code = (
        "import sys; sys.modules['pytest'] = None; from etsdk.cli import main; "
        "sys.exit(main(['conformance', 'EtsdkReferenceBackend']))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert lines == ["etsdk: error: the conformance kit needs pytest: pip install 'etsdk[conformance]'"], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


PARTIAL = """
    from etsdk import BackendSpec, hookimpl
    from etsdk.backend import Capability, OperatorPartitioner
    from etsdk.reference_backend.runtime import ReferenceBinding
    from etsdk.reference_backend.serializer import preprocess

    ETSDK_PLUGIN_API = ">=2,<3"

    # The linear layers (as edge lowers them) and the cache write, not the attention reading the cache:
    # "all_or_none" leaves the cache's operators to the next backend of the method.
    LINEAR_AND_CACHE_WRITE = ["aten::linear", "aten::addmm", "aten::index_put"]


    @hookimpl
    def etsdk_register_backends():
        return [BackendSpec(
            id="EtsdkPartialLinear", version="0",
            partitioner=lambda **options: OperatorPartitioner(
                "EtsdkPartialLinear", ops=LINEAR_AND_CACHE_WRITE, state_claims="all_or_none"),
            preprocess=preprocess, runtime=ReferenceBinding,
            capabilities=frozenset({Capability.CPU, Capability.CALLER_OWNED_STATE}),
        )]
"""


def test_a_partial_backend_passes_with_a_companion(tmp_path: Path) -> None:
    """A backend claiming only linear layers and a cache write passes every behaviour that applies when the
    reference backend computes the rest; each skipped behaviour says why; without the companion it fails."""
    site = PluginSite(tmp_path / "site")
    site.add("partial-backend", PARTIAL, plugin="partial")
    run = tmp_path / "run"
    run.mkdir()
    report = tmp_path / "report.json"
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--etsdk-report", str(report),
            "--etsdk-backend", "EtsdkPartialLinear", "--etsdk-companion", "EtsdkReferenceBackend"]
    result = subprocess.run(args, cwd=run, capture_output=True, text=True, env=site.env())
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    parsed = json.loads(report.read_text())
    assert parsed["companion"] == "EtsdkReferenceBackend"
    results = parsed["results"]
    outcomes = {r["test"]: r["outcome"] for r in results}
    assert not [t for t, o in outcomes.items() if o == "failed"], results
    for test in ("test_exports_and_runs_like_eager", "test_user_outputs_land_in_their_slots",
                 "test_state_updated_in_place", "test_repeated_calls_accumulate_state",
                 "test_aliased_output_beside_user_outputs", "test_bad_inputs_refused_before_execution"):
        assert outcomes.get(test) == "passed", (test, results)
    for r in results:
        if r["outcome"] == "skipped":
            assert r["message"], r  # a skip says why
    assert "EtsdkPartialLinear  passed   export and run vs eager" in result.stdout

    alone = [*args[:args.index("--etsdk-companion")], "-k", "repeated_calls"]
    result = subprocess.run(alone, cwd=run, capture_output=True, text=True, env=site.env())
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
