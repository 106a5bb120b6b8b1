"""The conformance kit: the behaviour every etsdk backend must show, checked against any installed backend.

* ``etsdk conformance BACKEND_ID [--report PATH] [--option key=value] [--companion ID]`` runs it from the
  command line (``--companion``: a backend lowered after the one under test in every export, computing what a
  partial backend does not claim);
* ``pytest --etsdk-backend BACKEND_ID`` runs it through pytest (the ``pytest11`` plugin
  :mod:`etsdk.conformance.pytest_plugin` ships with etsdk);
* a plugin's own test suite imports :mod:`etsdk.conformance.suite` and overrides the ``etsdk_backend_id``
  fixture (``etsdk new-backend`` writes that file).

Behaviours: export and run vs eager (a linear model, operators the backend does not claim, a second backend
in the same method); binding order (same-shaped user outputs, user outputs beside an aliased cache output);
caller-owned state (updated in place with an unchanged data pointer, repeated calls, fresh load, session
isolation, one cache shared across methods and backends, the persistence check); refusals (an unknown
required blob feature, bad inputs before execution, damaged payloads never crash the process).

The kit runs on pytest, which etsdk itself does not depend on: ``pip install 'etsdk[conformance]'``. Without
it :func:`run` (and so ``etsdk conformance``) refuses with an :class:`etsdk.EtsdkError` saying so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["run"]

#: What to install for the kit (pytest); the ``conformance`` extra of etsdk's pyproject.toml.
_INSTALL_HINT = "pip install 'etsdk[conformance]'"


def _import_pytest() -> Any:
    """pytest, or an :class:`etsdk.EtsdkError` naming the extra that installs it (one line on the command line)."""
    try:
        import pytest
    except ImportError as exc:
        from etsdk.errors import EtsdkError

        missing = getattr(exc, "name", None)
        cause = "" if missing in (None, "pytest") else f" (importing pytest failed: {exc})"
        raise EtsdkError(f"the conformance kit needs pytest: {_INSTALL_HINT}{cause}") from exc
    return pytest


def run(
    backend_ids: Sequence[str], *, options: Mapping[str, Any] | None = None, report: str | Path | None = None,
    extra_args: Sequence[str] = (), companion: str | None = None,
) -> int:
    """Run the kit in this process through pytest; returns pytest's exit code.

    ``companion``: a backend id every export lowers with after the backend under test (``--etsdk-companion``).

    Raises :class:`etsdk.EtsdkError` when pytest cannot be imported (``pip install 'etsdk[conformance]'``).
    """
    import json
    from importlib import metadata

    pytest = _import_pytest()

    from etsdk.conformance.pytest_plugin import SUITE

    args = [str(SUITE), "-q", "-p", "no:cacheprovider"]
    if not any(ep.value == "etsdk.conformance.pytest_plugin" for ep in metadata.entry_points(group="pytest11")):
        args += ["-p", "etsdk.conformance.pytest_plugin"]  # etsdk used from a source tree, not installed
    for backend in backend_ids:
        args += ["--etsdk-backend", backend]
    for key, value in (options or {}).items():
        args += ["--etsdk-backend-option", f"{key}={json.dumps(value)}"]
    if companion is not None:
        args += ["--etsdk-companion", companion]
    if report is not None:
        args += ["--etsdk-report", str(report)]
    return int(pytest.main([*args, *extra_args]))
