"""Plugin discovery through real entry points of real (fixture) distributions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from etsdk.testing import PluginSite

from tests.conftest import plugins_json

GOOD = """
    from etsdk import hookimpl, BackendSpec
    ETSDK_PLUGIN_API = ">=2,<3"

    def _factory(*a, **k):
        raise RuntimeError("not used in this test")

    @hookimpl
    def etsdk_register_backends():
        return [BackendSpec(id="{bid}", version="1.0", partitioner=_factory, preprocess=_factory, runtime=_factory)]
"""


def good(backend_id: str) -> str:
    return GOOD.replace("{bid}", backend_id)


def test_installed_plugins_are_listed_with_status(site: PluginSite) -> None:
    listed = plugins_json(site)
    assert {"reference", "aoti", "tensorrt", "hf_static"} <= listed.keys()
    assert listed["reference"]["status"] == "ok"
    assert listed["reference"]["reason"] is None
    assert listed["reference"]["backends"] == ["EtsdkReferenceBackend"]
    assert listed["aoti"]["distribution"] == "etsdk-aoti"
    assert listed["hf_static"]["runners"] == ["hf_static"]  # the runner for the core's hf_static contract
    assert listed["hf_static"]["commands"] == ["export", "generate", "chat", "serve"]  # the LLM application's commands
    assert "hf_static" in listed["core"]["contracts"]
    trt = listed["tensorrt"]
    assert trt["status"] == "unavailable"
    assert "TensorRT runtime libraries not found" in trt["reason"]
    for entry in listed.values():
        assert set(entry) == {
            "name", "distribution", "version", "backends", "contracts", "runners", "commands", "status", "reason", "refused"
        }


def test_table_output_and_version(site: PluginSite) -> None:
    table = site.run_etsdk(["plugins"])
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split() == [
        "NAME", "DISTRIBUTION", "VERSION", "STATUS", "BACKENDS", "CONTRACTS", "RUNNERS", "COMMANDS"
    ]
    assert "tensorrt: unavailable: EtsdkTensorRTBackend: TensorRT runtime libraries not found" in table.stdout
    version = site.run_etsdk(["--version"])
    assert version.returncode == 0
    import etsdk

    assert version.stdout.strip() == f"etsdk {etsdk.__version__}"


def test_listing_imports_no_heavy_dependencies(site: PluginSite) -> None:
    result = site.run_python(
        """
        import sys, json
        from etsdk.cli.main import main
        main(["plugins", "--json"])
        heavy = sorted(m for m in ("torch", "executorch", "tensorrt") if m in sys.modules)
        print("HEAVY=" + json.dumps(heavy))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "HEAVY=[]"


def test_failing_import_is_reported_and_others_keep_working(site: PluginSite) -> None:
    site.add("broken-dist", "raise ImportError('cannot find libfoo.so.3')\n", plugin="broken", version="2.1")
    site.add("fine-dist", good("FineBackend"), plugin="fine")
    listed = plugins_json(site)
    broken = listed["broken"]
    assert broken["status"] == "failed"
    assert broken["distribution"] == "broken-dist" and broken["version"] == "2.1"
    assert "ImportError: cannot find libfoo.so.3" in broken["reason"]
    assert listed["fine"]["status"] == "ok" and listed["fine"]["backends"] == ["FineBackend"]
    assert listed["reference"]["status"] == "ok"


def test_registration_that_raises_is_isolated(site: PluginSite) -> None:
    site.add(
        "raising-dist",
        """
        from etsdk import hookimpl
        ETSDK_PLUGIN_API = ">=2,<3"

        @hookimpl
        def etsdk_register_backends():
            raise ZeroDivisionError("registration exploded")
        """,
        plugin="raising",
    )
    listed = plugins_json(site)
    assert listed["raising"]["status"] == "failed"
    assert "ZeroDivisionError: registration exploded" in listed["raising"]["reason"]
    assert listed["raising"]["backends"] == []
    assert listed["reference"]["status"] == "ok"


def test_strict_mode_turns_failure_into_error(site: PluginSite) -> None:
    site.add("broken-dist", "raise ImportError('cannot find libfoo.so.3')\n", plugin="broken")
    result = site.run_etsdk(["plugins", "--json"], {"ETSDK_STRICT_PLUGINS": "1"})
    assert result.returncode == 2
    assert "ETSDK_STRICT_PLUGINS" in result.stderr
    assert "broken-dist 1.0" in result.stderr and "cannot find libfoo.so.3" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("declared", "status", "fragment"),
    [
        ('">=1,<2"', "skipped", "supports etsdk plugin API >=1,<2 but this etsdk"),
        ('">=3,<4"', "skipped", "upgrade etsdk to a release that provides an API in >=3,<4"),
        ("None", "skipped", "does not declare ETSDK_PLUGIN_API"),
        ('"not a range"', "skipped", "invalid ETSDK_PLUGIN_API"),
        ('">=2"', "ok", None),
        ('">=1,<3"', "ok", None),  # one plugin release for two plugin APIs (docs/migrating.md)
    ],
)
def test_plugin_api_range(site: PluginSite, declared: str, status: str, fragment: str | None) -> None:
    source = good("RangeBackend").replace('ETSDK_PLUGIN_API = ">=2,<3"', f"ETSDK_PLUGIN_API = {declared}")
    if declared == "None":
        source = source.replace("ETSDK_PLUGIN_API = None\n", "")
    site.add("range-dist", source, plugin="ranged")
    entry = plugins_json(site)["ranged"]
    assert entry["status"] == status
    if fragment is None:
        assert entry["reason"] is None and entry["backends"] == ["RangeBackend"]
    else:
        assert fragment in entry["reason"]
        assert "\n" not in entry["reason"]
        assert entry["backends"] == []
    if declared == '">=1,<2"':
        assert "provides API 2" in entry["reason"]
    if declared == '">=3,<4"':  # a plugin newer than this etsdk: the guide to older APIs does not help
        assert "migrating" not in entry["reason"]


#: A plugin written for plugin API 1 as its guide said then: old module paths, preprocess(edge_program,
#: compile_specs), a runtime reading the session itself. Discovery must skip it before calling any of it.
API_1_PLUGIN = """
    from etsdk.hookspec import hookimpl
    from etsdk.registration import BackendSpec, Capability

    ETSDK_PLUGIN_API = ">=1,<2"

    def _partitioner(**options):
        raise RuntimeError("a skipped plugin is never called")

    def _preprocess(edge_program, compile_specs):
        raise RuntimeError("a skipped plugin is never called")

    def _runtime():
        raise RuntimeError("a skipped plugin is never called")

    @hookimpl
    def etsdk_register_backends():
        return [BackendSpec(id="OldApiBackend", version="0.9", partitioner=_partitioner, preprocess=_preprocess,
                            runtime=_runtime, capabilities=frozenset({Capability.CPU}))]
"""


def test_a_plugin_for_plugin_api_1_is_skipped_naming_the_migration_guide(site: PluginSite) -> None:
    site.add("old-api-dist", API_1_PLUGIN, plugin="oldapi", version="0.9")
    entry = plugins_json(site)["oldapi"]
    assert entry["status"] == "skipped" and entry["backends"] == [], entry
    reason = entry["reason"]
    assert reason.startswith("supports etsdk plugin API >=1,<2 but this etsdk (") and "provides API 2" in reason
    assert "port it from API 1 to 2 with docs/migrating.md" in reason, reason
    assert "\n" not in reason
    table = site.run_etsdk(["plugins"])
    assert table.returncode == 0, table.stderr
    (line,) = [line for line in table.stdout.splitlines() if line.strip().startswith("oldapi: ")]
    assert line.strip().startswith("oldapi: skipped: supports etsdk plugin API >=1,<2") and "docs/migrating.md" in line
    root = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
    assert (root / "docs" / "migrating.md").is_file(), "the skip reason names a guide that does not exist"


TWO_BACKENDS = """
    from etsdk import hookimpl, BackendSpec, ContractSpec
    from pathlib import Path
    ETSDK_PLUGIN_API = ">=2,<3"

    def _factory(*a, **k):
        raise RuntimeError("not used in this test")

    @hookimpl
    def etsdk_register_backends():
        return [BackendSpec(id=b, version="1.0", partitioner=_factory, preprocess=_factory, runtime=_factory)
                for b in {backends!r}]
"""


def two_backends(*backends: str) -> str:
    return TWO_BACKENDS.replace("{backends!r}", repr(list(backends)))


def test_duplicate_backend_id_refuses_that_record_of_both_and_nothing_else(site: PluginSite) -> None:
    site.add("first-dist", two_backends("SharedBackend", "FirstOwnBackend"), plugin="first", version="1.2")
    site.add("second-dist", two_backends("SharedBackend", "SecondOwnBackend"), plugin="second", version="3.4")
    listed = plugins_json(site)
    for name in ("first", "second"):
        assert listed[name]["status"] == "ok"
        (refusal,) = listed[name]["refused"]
        assert "backend id 'SharedBackend' is claimed by both" in refusal
        assert "first-dist 1.2" in refusal and "second-dist 3.4" in refusal
    lookup = site.run_python(
        """
        import etsdk
        print("OWN", etsdk.get_backend("FirstOwnBackend").id, etsdk.get_backend("SecondOwnBackend").id)
        try:
            etsdk.get_backend("SharedBackend")
        except etsdk.PluginConflictError as e:
            print("CONFLICT", e)
        """
    )
    assert "OWN FirstOwnBackend SecondOwnBackend" in lookup.stdout, lookup.stderr
    assert "CONFLICT backend id 'SharedBackend' is claimed by both first-dist 1.2" in lookup.stdout, lookup.stderr
    table = site.run_etsdk(["plugins"])
    assert "first: refused: backend id 'SharedBackend'" in table.stdout
    strict = site.run_etsdk(["plugins"], {"ETSDK_STRICT_PLUGINS": "1"})
    assert strict.returncode == 2 and "SharedBackend" in strict.stderr


def test_a_plugin_whose_only_record_is_refused_has_failed(site: PluginSite) -> None:
    site.add("first-dist", good("SharedBackend"), plugin="first")
    site.add("second-dist", good("SharedBackend"), plugin="second")
    listed = plugins_json(site)
    assert listed["first"]["status"] == listed["second"]["status"] == "failed"
    assert "claimed by both" in listed["first"]["reason"]


def test_a_plugin_cannot_take_over_a_core_backend(site: PluginSite) -> None:
    site.add("shadow-dist", two_backends("EtsdkReferenceBackend", "ShadowOwnBackend"), plugin="shadow")
    listed = plugins_json(site)
    assert listed["reference"]["status"] == "ok" and listed["reference"]["refused"] == []
    assert listed["shadow"]["status"] == "ok"
    (refusal,) = listed["shadow"]["refused"]
    assert "backend id 'EtsdkReferenceBackend' belongs to the etsdk core" in refusal and "shadow-dist 1.0" in refusal
    lookup = site.run_python(
        """
        import etsdk
        spec = etsdk.get_backend("EtsdkReferenceBackend")
        print("OWNER", spec.partitioner.__module__, etsdk.get_backend("ShadowOwnBackend").id)
        """
    )
    assert "OWNER etsdk.reference_backend.plugin ShadowOwnBackend" in lookup.stdout, lookup.stderr


CONTRACTS = """
    from pathlib import Path
    from etsdk import hookimpl, ContractSpec, RunnerSpec
    ETSDK_PLUGIN_API = ">=2,<3"
    HERE = Path(__file__).resolve().parent

    @hookimpl
    def etsdk_register_contracts():
        return [ContractSpec(name="kv_decoder", version={version}, path=HERE / "kv_decoder_{version}.json")]

    @hookimpl
    def etsdk_register_runners():
        return [RunnerSpec(contract="kv_decoder", factory=lambda program: None, versions=({version},))]
"""


def _contract_plugin(site: PluginSite, version: int) -> None:
    import etsdk

    spec = etsdk.get_contract("kv_decoder", 1)
    text = spec.path.read_text().replace('"version": 1', f'"version": {version}')
    (site.root / f"kv_decoder_{version}.json").write_text(text)
    site.add(f"contracts-v{version}", CONTRACTS.replace("{version}", str(version)), plugin=f"contracts{version}")


def test_a_plugin_cannot_take_over_a_core_contract_and_its_runner_goes_with_it(site: PluginSite) -> None:
    _contract_plugin(site, 1)
    listed = plugins_json(site)
    assert listed["core"]["status"] == "ok" and listed["core"]["refused"] == []
    assert listed["contracts1"]["status"] == "failed"
    refused = listed["contracts1"]["refused"]
    assert any("contract 'kv_decoder' v1 belongs to the etsdk core" in r for r in refused)
    assert any("runner for contract 'kv_decoder' v1 refused: the plugin's own contract record was refused" in r for r in refused)
    lookup = site.run_python(
        """
        import etsdk
        print("PATH", etsdk.get_contract("kv_decoder", 1).path.parent.parent.name)
        """
    )
    assert "PATH contracts" in lookup.stdout, lookup.stderr


def test_a_new_contract_version_from_a_plugin_coexists_with_the_core_one(site: PluginSite) -> None:
    _contract_plugin(site, 9)
    listed = plugins_json(site)
    assert listed["contracts9"]["status"] == "ok" and listed["contracts9"]["refused"] == []
    lookup = site.run_python(
        """
        import etsdk
        print("V1", etsdk.get_contract("kv_decoder", 1).path.name, "V9", etsdk.get_contract("kv_decoder", 9).path.name)
        print("RUNNER", etsdk.get_runner("kv_decoder", 9).versions)
        """
    )
    assert "V1 1.json V9 kv_decoder_9.json" in lookup.stdout, lookup.stderr
    assert "RUNNER (9,)" in lookup.stdout


def test_get_runner_honours_conflicts(site: PluginSite) -> None:
    runner = """
        from etsdk import hookimpl, RunnerSpec
        ETSDK_PLUGIN_API = ">=2,<3"

        @hookimpl
        def etsdk_register_runners():
            return [RunnerSpec(contract="shared_contract", factory=lambda program: None)]
    """
    site.add("runner-a", runner, plugin="ra")
    site.add("runner-b", runner, plugin="rb")
    result = site.run_python(
        """
        import etsdk
        try:
            etsdk.get_runner("shared_contract", 1)
        except etsdk.PluginConflictError as e:
            print("CONFLICT", e)
        try:
            etsdk.get_runner("shared_contract")
        except etsdk.PluginConflictError as e:
            print("CONFLICT2", e)
        """
    )
    assert "CONFLICT runner for contract 'shared_contract' v1 is claimed by both runner-a" in result.stdout, result.stderr
    assert "CONFLICT2" in result.stdout


def test_allow_and_deny_lists(site: PluginSite) -> None:
    site.add("one-dist", good("OneBackend"), plugin="one")
    site.add("two-dist", good("TwoBackend"), plugin="two")
    only = plugins_json(site, {"ETSDK_PLUGINS": "one,reference"})
    assert only["one"]["status"] == "ok" and only["reference"]["status"] == "ok"
    assert only["two"]["status"] == "skipped"
    assert "not listed in ETSDK_PLUGINS" in only["two"]["reason"]
    # a distribution name selects too
    by_dist = plugins_json(site, {"ETSDK_PLUGINS": "two-dist"})
    assert by_dist["two"]["status"] == "ok" and by_dist["one"]["status"] == "skipped"
    denied = plugins_json(site, {"ETSDK_DISABLE_PLUGINS": "two, tensorrt"})
    assert denied["two"]["status"] == "skipped" and "ETSDK_DISABLE_PLUGINS" in denied["two"]["reason"]
    assert denied["tensorrt"]["status"] == "skipped"
    assert denied["one"]["status"] == "ok"


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        (
            """
            from etsdk import hookimpl
            ETSDK_PLUGIN_API = ">=2,<3"
            @hookimpl
            def etsdk_register_backend():
                return []
            """,
            "unknown hook etsdk_register_backend()",
        ),
        (
            """
            from etsdk import hookimpl
            ETSDK_PLUGIN_API = ">=2,<3"
            @hookimpl
            def etsdk_edge_transform_passes(backend, extra):
                return None
            """,
            "argument(s) backend, extra not in the specification etsdk_edge_transform_passes(backend_id)",
        ),
        (
            """
            ETSDK_PLUGIN_API = ">=2,<3"
            def etsdk_register_backends():
                return []
            """,
            "etsdk_register_backends() looks like a hook but is not marked with @etsdk.hookimpl",
        ),
        (
            """
            from etsdk import hookimpl
            ETSDK_PLUGIN_API = ">=2,<3"
            @hookimpl
            def etsdk_register_backends():
                return [{"id": "DictBackend"}]
            """,
            "etsdk_register_backends() returned a dict, expected BackendSpec",
        ),
    ],
    ids=["unknown-hook", "wrong-arguments", "unmarked-hook", "wrong-record-type"],
)
def test_hook_validation_errors_name_the_plugin(site: PluginSite, source: str, fragment: str) -> None:
    site.add("invalid-dist", source, plugin="invalid")
    entry = plugins_json(site)["invalid"]
    assert entry["status"] == "failed"
    assert "plugin 'invalid'" in entry["reason"]
    assert fragment in entry["reason"]


def test_in_process_plugin_registration() -> None:
    import types

    import etsdk

    module = types.ModuleType("inline_plugin")
    module.ETSDK_PLUGIN_API = ">=2,<3"  # type: ignore[attr-defined]

    def bad_hook(nonsense):  # type: ignore[no-untyped-def]
        return []

    module.etsdk_register_backends = etsdk.hookimpl(bad_hook)  # type: ignore[attr-defined]
    bad_hook.__name__ = "etsdk_register_backends"
    with pytest.raises(etsdk.PluginValidationError, match="argument\\(s\\) nonsense"):
        etsdk.register_plugin(module, "inline")
    assert "inline" not in {p.name for p in etsdk.list_plugins()}


def test_json_is_a_list(site: PluginSite) -> None:
    result = site.run_etsdk(["plugins", "--json"])
    assert isinstance(json.loads(result.stdout), list)
