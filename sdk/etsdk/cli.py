"""The ``etsdk`` command line.

``etsdk plugins [--json]``   what is installed, and whether it can run here
``etsdk doctor``             versions, and build the native bridge ahead of time
``etsdk demo``               export a small model through a backend and run it
``etsdk --version``
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from etsdk._version import __version__
from etsdk.errors import EtsdkError


def _cmd_plugins(args: argparse.Namespace) -> int:
    from etsdk.registry import list_plugins

    plugins = list_plugins()
    if args.json:
        print(json.dumps([p.to_json() for p in plugins], indent=2))
        return 0
    rows = [("NAME", "DISTRIBUTION", "VERSION", "STATUS", "BACKENDS", "CONTRACTS")]
    for p in plugins:
        rows.append(
            (p.name, p.distribution, p.version, p.status.value, ",".join(p.backends) or "-", ",".join(p.contracts) or "-")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for p in plugins:
        if p.reason:
            print(f"  {p.name}: {p.status.value}: {p.reason}")
    if not plugins:
        print("no etsdk plugins installed (entry-point group 'etsdk.plugins')")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from importlib import metadata

    from etsdk.bridge.build import build

    for dist in ("torch", "executorch", "pluggy"):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = "not installed"
        print(f"{dist}: {version}")
    print(f"etsdk: {__version__}")
    print(f"native bridge: {build(verbose=args.verbose)}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from etsdk.demo import run_demo

    return run_demo(out_dir=args.out_dir, backend=args.backend)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="etsdk", description="Pluggable ExecuTorch backends.")
    parser.add_argument("--version", action="version", version=f"etsdk {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    plugins = sub.add_parser("plugins", help="list installed plugins and whether they can run here")
    plugins.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    plugins.set_defaults(func=_cmd_plugins)
    doctor = sub.add_parser("doctor", help="show versions and build the native bridge")
    doctor.add_argument("--verbose", action="store_true")
    doctor.set_defaults(func=_cmd_doctor)
    demo = sub.add_parser("demo", help="export a small embedded model through a backend and run it")
    demo.add_argument("--out-dir", default=None, help="where to write the .pte (default: a temporary directory)")
    demo.add_argument("--backend", default="EtsdkReferenceBackend")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except EtsdkError as exc:
        print(f"etsdk: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
