"""Plugin discovery through real entry points of real (fixture) distributions."""

from __future__ import annotations

import json

import pytest
from etsdk.testing import PluginSite

from tests.conftest import plugins_json

GOOD = """
    from etsdk import hookimpl, BackendSpec
    ETSDK_PLUGIN_API = ">=1,<2"

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
    assert "hf_static" in listed["core"]["contracts"]
    trt = listed["tensorrt"]
    assert trt["status"] == "unavailable"
    assert "TensorRT runtime libraries not found" in trt["reason"]
    for entry in listed.values():
        assert set(entry) == {"name", "distribution", "version", "backends", "contracts", "runners", "status", "reason"}


def test_table_output_and_version(site: PluginSite) -> None:
    table = site.run_etsdk(["plugins"])
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split()[:4] == ["NAME", "DISTRIBUTION", "VERSION", "STATUS"]
    assert "tensorrt: unavailable: EtsdkTensorRTBackend: TensorRT runtime libraries not found" in table.stdout
    version = site.run_etsdk(["--version"])
    assert version.returncode == 0
    import etsdk

    assert version.stdout.strip() == f"etsdk {etsdk.__version__}"


def test_listing_imports_no_heavy_dependencies(site: PluginSite) -> None:
    result = site.run_python(
        """
        import sys, json
        from etsdk.cli import main
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
        ETSDK_PLUGIN_API = ">=1,<2"

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
        ('">=2,<3"', "skipped", "supports etsdk plugin API >=2,<3 but this etsdk"),
        ("None", "skipped", "does not declare ETSDK_PLUGIN_API"),
        ('"not a range"', "skipped", "invalid ETSDK_PLUGIN_API"),
        ('">=1"', "ok", None),
    ],
)
def test_plugin_api_range(site: PluginSite, declared: str, status: str, fragment: str | None) -> None:
    source = good("RangeBackend").replace('ETSDK_PLUGIN_API = ">=1,<2"', f"ETSDK_PLUGIN_API = {declared}")
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
    if declared == '">=2,<3"':
        assert "provides API 1" in entry["reason"]


def test_duplicate_backend_id_names_both_distributions(site: PluginSite) -> None:
    site.add("first-dist", good("SharedBackend"), plugin="first", version="1.2")
    site.add("second-dist", good("SharedBackend"), plugin="second", version="3.4")
    listed = plugins_json(site)
    for name in ("first", "second"):
        assert listed[name]["status"] == "failed"
        assert "backend id 'SharedBackend' is claimed by both" in listed[name]["reason"]
        assert "first-dist 1.2" in listed[name]["reason"] and "second-dist 3.4" in listed[name]["reason"]
    lookup = site.run_python(
        """
        import etsdk
        try:
            etsdk.get_backend("SharedBackend")
        except etsdk.PluginConflictError as e:
            print("CONFLICT", e)
        """
    )
    assert "CONFLICT backend id 'SharedBackend' is claimed by both first-dist 1.2" in lookup.stdout, lookup.stderr
    strict = site.run_etsdk(["plugins"], {"ETSDK_STRICT_PLUGINS": "1"})
    assert strict.returncode == 2 and "SharedBackend" in strict.stderr


def test_duplicate_backend_id_with_the_core_is_refused(site: PluginSite) -> None:
    site.add("shadow-dist", good("EtsdkReferenceBackend"), plugin="shadow")
    listed = plugins_json(site)
    assert listed["shadow"]["status"] == "failed"
    assert "etsdk 0.1.0" in listed["shadow"]["reason"] and "shadow-dist 1.0" in listed["shadow"]["reason"]


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
            ETSDK_PLUGIN_API = ">=1,<2"
            @hookimpl
            def etsdk_register_backend():
                return []
            """,
            "unknown hook etsdk_register_backend()",
        ),
        (
            """
            from etsdk import hookimpl
            ETSDK_PLUGIN_API = ">=1,<2"
            @hookimpl
            def etsdk_edge_transform_passes(backend, extra):
                return None
            """,
            "argument(s) backend, extra not in the specification etsdk_edge_transform_passes(backend_id)",
        ),
        (
            """
            ETSDK_PLUGIN_API = ">=1,<2"
            def etsdk_register_backends():
                return []
            """,
            "etsdk_register_backends() looks like a hook but is not marked with @etsdk.hookimpl",
        ),
        (
            """
            from etsdk import hookimpl
            ETSDK_PLUGIN_API = ">=1,<2"
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
    module.ETSDK_PLUGIN_API = ">=1,<2"  # type: ignore[attr-defined]

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
