"""pytest plugin of the conformance kit (entry point ``pytest11``): options, parametrization, the report.

``pytest --etsdk-backend ID [--etsdk-backend ID2] [--etsdk-backend-option key=value] [--etsdk-companion ID]
[--etsdk-report PATH]`` runs the kit against each backend; with no test paths given it collects only the kit.
``--etsdk-companion ID`` lowers every export with ``(backend under test, ID)``: the companion computes what a
partial backend does not claim. The report (one entry per behaviour and backend: passed / failed / skipped
with the message, a skip's reason included) is printed at the end as one JSON line and written to
``--etsdk-report`` when given. Importing this module is cheap (no torch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

SUITE = Path(__file__).resolve().parent / "suite.py"
_RESULTS = pytest.StashKey[list[dict[str, Any]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("etsdk", "etsdk conformance kit")
    group.addoption("--etsdk-backend", action="append", default=[], help="backend id (or short name) to run the kit against")
    group.addoption(
        "--etsdk-backend-option", action="append", default=[], metavar="KEY=VALUE",
        help="a partitioner option for the backend under test (value parsed as JSON when it can be)",
    )
    group.addoption(
        "--etsdk-companion", default=None, metavar="ID",
        help="a backend that computes what the backend under test does not claim (lowered after it in every export)",
    )
    group.addoption("--etsdk-report", default=None, help="write the kit's JSON report here")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RESULTS] = []
    if config.getoption("etsdk_backend") and _no_explicit_paths(config):
        config.args[:] = [str(SUITE)]


def _no_explicit_paths(config: pytest.Config) -> bool:
    return getattr(config, "args_source", None) != pytest.Config.ArgsSource.ARGS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    backends = metafunc.config.getoption("etsdk_backend")
    if "etsdk_backend_id" in metafunc.fixturenames and backends:
        from etsdk._plugins.registry import resolve_backend_id

        ids = [resolve_backend_id(b) for b in backends]
        metafunc.parametrize("etsdk_backend_id", ids, scope="session", ids=ids)


@pytest.fixture(scope="session")
def etsdk_backend_id() -> str:
    """The backend under test: ``--etsdk-backend ID`` parametrizes it; a plugin's suite may override it."""
    pytest.fail("name the backend under test: pytest --etsdk-backend ID, or override the etsdk_backend_id fixture")


@pytest.fixture(scope="session")
def etsdk_backend_options(pytestconfig: pytest.Config) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for raw in pytestconfig.getoption("etsdk_backend_option"):
        key, _, value = raw.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


@pytest.fixture(scope="session")
def etsdk_companion(pytestconfig: pytest.Config) -> str | None:
    """The companion backend (``--etsdk-companion ID``), or None: the backend under test exports alone."""
    companion = pytestconfig.getoption("etsdk_companion")
    if not companion:
        return None
    from etsdk._plugins.registry import resolve_backend_id

    return str(resolve_backend_id(companion))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    outcome = yield
    report = outcome.get_result()
    function = getattr(item, "function", None)
    if function is None or getattr(function, "__module__", "") != "etsdk.conformance.suite":
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("etsdk_backend_id") if callspec is not None else None
        if backend is None:
            backend = item.funcargs.get("etsdk_backend_id") if hasattr(item, "funcargs") else None
        message = ""
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.outcome == "failed":
            message = _first_line(report)
        behaviour = (function.__doc__ or function.__name__).strip().splitlines()[0]
        item.config.stash[_RESULTS].append(
            {"backend": backend, "behaviour": behaviour, "test": function.__name__, "outcome": report.outcome, "message": message}
        )


def _first_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.strip().splitlines()[0] if text.strip() else ""


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    results = config.stash.get(_RESULTS, [])
    if not results:
        return
    terminalreporter.section("etsdk conformance")
    for r in results:
        suffix = f": {r['message']}" if r["message"] else ""
        terminalreporter.write_line(f"{r['backend']}  {r['outcome']:<7}  {r['behaviour']}{suffix}")
    report: dict[str, Any] = {"format": "etsdk.conformance", "version": 1, "results": results}
    companion = config.getoption("etsdk_companion")
    if companion:
        report["companion"] = companion
    path = config.getoption("etsdk_report")
    if path:
        Path(path).write_text(json.dumps(report, indent=2))
    terminalreporter.write_line(json.dumps(report))
