"""The ``etsdk`` command line.

The core's commands are contract-generic:

``etsdk plugins [--json]``   what is installed, and whether it can run here
``etsdk doctor``             versions, and build the native bridge ahead of time
``etsdk demo``               export a small model through a backend and run it
``etsdk new-backend NAME``   write a complete, pip-installable backend plugin that works at once
``etsdk conformance ID``     run the conformance kit against an installed backend
``etsdk verify``             check a program and its data file completely (structure, content hashes, methods)
``etsdk inspect PTE``        what a program holds: delegates per method, claimed operators, state, named data
``etsdk --version``

Plugins add commands through the ``etsdk_register_commands`` hook (:class:`etsdk.CommandSpec`);
etsdk-hf-static adds ``etsdk export``, ``etsdk generate`` and ``etsdk chat``. The registry is read only
when the parser is built for something other than a core command or ``--version``.

Errors on bad input are one line on stderr (``etsdk: error: ...``) and exit status 2, for plugin commands too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from etsdk._plugins.registry import CORE_COMMANDS
from etsdk._version import __version__
from etsdk.errors import EtsdkError


def _cmd_plugins(args: argparse.Namespace) -> int:
    from etsdk.cli.listing import print_plugins

    return print_plugins(as_json=args.json)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from importlib import metadata

    from etsdk._host_cpu import host_cpu
    from etsdk._plugins.registry import get_backend, list_plugins
    from etsdk._runtime.bridge.build import build

    for dist in ("torch", "executorch", "pluggy"):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = "not installed"
        print(f"{dist}: {version}")
    print(f"etsdk: {__version__}")
    print(f"cpu: {host_cpu().describe()}")
    print(f"native bridge: {build(verbose=args.verbose)}")
    failed = 0
    for backend_id in (b for plugin in list_plugins() for b in plugin.backends):
        spec = get_backend(backend_id)
        if spec.doctor is None:
            continue
        try:
            lines = list(spec.doctor())
        except EtsdkError as exc:
            lines, failed = [f"error: {exc}"], 1
        for line in lines:
            print(f"{backend_id}: {line}")
    return failed


def _cmd_demo(args: argparse.Namespace) -> int:
    from etsdk.cli.demo import run_demo

    return run_demo(out_dir=args.out_dir, backend=args.backend)


def _cmd_new_backend(args: argparse.Namespace) -> int:
    from etsdk.scaffold import new_backend

    made = new_backend(args.name, args.dir)
    print(f"wrote {made.directory} (backend id {made.backend_id}):")
    for path in made.files:
        print(f"  {path.relative_to(made.directory)}")
    print(f"next: pip install -e {made.directory} && etsdk plugins && pytest {made.directory / 'tests'}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from etsdk._runtime.inspection import inspect_program
    from etsdk._runtime.program import data_beside

    report = inspect_program(args.program, args.data if args.data is not None else data_beside(args.program))
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render())
    return 0


def _cmd_conformance(args: argparse.Namespace) -> int:
    from etsdk.conformance import run

    options = {}
    for raw in args.option:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise EtsdkError(f"--option takes key=value, found {raw!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    extra = ["-k", args.k] if args.k else []
    code = run(args.backend, options=options, report=args.report, extra_args=extra, companion=args.companion)
    return 0 if code == 0 else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from etsdk._runtime.program import data_beside
    from etsdk._runtime.verification import verify
    from etsdk._state.signature import PROGRAM_RECORD_KEY

    data = args.data if args.data is not None else data_beside(args.program)
    report = verify(args.program, data, methods=not args.no_methods)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0 if report.ok else 1
    counts: dict[str, int] = {}
    for entry in report.entries:
        counts[entry.status] = counts.get(entry.status, 0) + 1
        if entry.status == "mismatch":
            print(f"DAMAGED  {entry.file}: '{entry.key}' ({entry.size} bytes) hashes to {entry.found}")
    for method, status in report.methods:
        print(f"method {method}: {status}")
    unverifiable = [entry.key for entry in report.entries if entry.status == "unverifiable"]
    if PROGRAM_RECORD_KEY in unverifiable:
        print(f"note: '{PROGRAM_RECORD_KEY}' is the program record of an older etsdk: re-export to make it verifiable")
    named = ", ".join(f"'{key}'" for key in unverifiable[:3]) + (f" and {len(unverifiable) - 3} more" if len(unverifiable) > 3 else "")
    print(
        f"{report.program}{' + ' + str(report.data) if report.data else ''}: structure ok; named data: "
        f"{counts.get('ok', 0)} verified ({report.verified_bytes} bytes), {counts.get('mismatch', 0)} damaged, "
        f"{len(unverifiable)} unverifiable (key is not a content hash{': ' + named if named else ''})"
    )
    return 0 if report.ok else 1


def build_parser(*, plugin_commands: bool = True) -> argparse.ArgumentParser:
    """The parser: the core's commands, and with ``plugin_commands`` every command a plugin registered."""
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
    demo.add_argument("--verbose", action="store_true", help="also show other libraries' warnings and logs")
    demo.set_defaults(func=_cmd_demo)

    if plugin_commands:
        _add_plugin_commands(sub)

    scaffold = sub.add_parser("new-backend", help="write a complete backend plugin (etsdk-NAME/) that works at once")
    scaffold.add_argument("name", help="a lowercase Python identifier, e.g. my_npu (backend id MyNpuBackend)")
    scaffold.add_argument("--dir", default=".", help="where to create etsdk-NAME/ (default: the current directory)")
    scaffold.set_defaults(func=_cmd_new_backend)

    inspect = sub.add_parser("inspect", help="show what a program holds, without running it")
    inspect.add_argument("program", help="the .pte")
    inspect.add_argument("--data", default=None, help="its .ptd (default: <stem>.ptd beside the .pte, if there is one)")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(func=_cmd_inspect)

    conformance = sub.add_parser(
        "conformance",
        help="run the conformance kit against installed backends (needs pytest: pip install 'etsdk[conformance]')",
    )
    conformance.add_argument("backend", nargs="+", help="backend ids or short names")
    conformance.add_argument("--option", action="append", default=[], help="partitioner option key=value (JSON value)")
    conformance.add_argument("--report", default=None, help="write the JSON report here")
    conformance.add_argument(
        "--companion", default=None, metavar="ID",
        help="a backend lowered after the one under test in every export, computing what it does not claim",
    )
    conformance.add_argument("-k", default=None, help="only behaviours whose test names match (pytest -k)")
    conformance.set_defaults(func=_cmd_conformance)
    verify = sub.add_parser("verify", help="check a program and its data file: structure, content hashes, methods")
    verify.add_argument("program", help="the .pte")
    verify.add_argument("--data", default=None, help="its .ptd (default: <stem>.ptd beside the .pte, if there is one)")
    verify.add_argument("--no-methods", action="store_true", help="do not load the methods (no backend needed)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=_cmd_verify)
    return parser


#: core commands that silence other libraries' noise before they run (plugin commands say so in their CommandSpec)
_QUIET = frozenset({"demo", "inspect", "verify", "new-backend"})

#: commands that official plugins provide, for a useful error where the plugin is missing (names only: no import)
_PLUGIN_COMMANDS = {"export": "etsdk-hf-static", "generate": "etsdk-hf-static", "chat": "etsdk-hf-static"}


def _add_plugin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """One subparser per command the registry kept; a command whose ``configure`` raises is kept as an error."""
    from etsdk._plugins.registry import get_commands

    for spec, provider in get_commands():
        try:
            spec.configure(argparse.ArgumentParser(prog=f"etsdk {spec.name}"))  # a dry run: a failure leaves no half-built subparser
        except Exception as exc:  # noqa: BLE001 - one plugin's broken command must not break the others
            broken = sub.add_parser(spec.name, help=spec.help, add_help=False)
            broken.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            broken.set_defaults(func=_unusable(spec.name, provider, exc), _etsdk_quiet=False)
            continue
        command = sub.add_parser(spec.name, help=spec.help)
        spec.configure(command)
        command.set_defaults(func=spec.run, _etsdk_quiet=spec.quiet)


def _unusable(name: str, provider: str, exc: Exception) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        raise EtsdkError(f"the '{name}' command of {provider} could not set up its arguments: {type(exc).__name__}: {exc}")

    return run


def _command_word(argv: Sequence[str]) -> str | None:
    """The command named on the command line (the first word that is not an option), or None."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _needs_plugin_commands(argv: Sequence[str]) -> bool:
    """Whether the parser must hold plugin commands: not for a core command, nor for ``--version`` alone."""
    command = _command_word(argv)
    if command is None:
        return "--version" not in argv  # `etsdk --help`, or no command at all: the list shows every command
    return command not in CORE_COMMANDS


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(plugin_commands=_needs_plugin_commands(argv))
    except EtsdkError as exc:  # ETSDK_STRICT_PLUGINS and a plugin problem
        print(f"etsdk: error: {exc}", file=sys.stderr)
        return 2
    command = _command_word(argv)
    if command in _PLUGIN_COMMANDS and command not in _plugin_command_names():
        distribution = _PLUGIN_COMMANDS[command]
        print(
            f"etsdk: error: 'etsdk {command}' is a command of the {distribution} plugin, which is not installed here "
            f"or did not register it: pip install {distribution} (`etsdk plugins` lists plugin problems)",
            file=sys.stderr,
        )
        return 2
    args = _parse(parser, argv)
    if args.command in _QUIET or getattr(args, "_etsdk_quiet", False):
        from etsdk._apps.quiet import quiet_command_line

        quiet_command_line(verbose=getattr(args, "verbose", False))  # this process only: the library never does
    try:
        return int(args.func(args))
    except EtsdkError as exc:
        print(f"etsdk: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the disk or the file system refused (full disk, permissions, ...)
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        print(f"etsdk: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what was being written has been removed on the way out (atomic writes)
        print("\netsdk: interrupted", file=sys.stderr)
        return 130


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that arguments no parser knows are reported by the command's own parser.

    argparse's ``parse_args`` reports them with the top-level usage (``usage: etsdk [-h] ...``), which does not say
    what the command takes; here ``etsdk generate x.pte --top-kk 40`` prints ``etsdk generate``'s usage and
    ``unrecognized arguments: --top-kk 40``, for the core's commands and plugin commands alike (exit status 2).
    """
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        name = getattr(args, "command", None)
        command = _subparsers(parser).get(name or "")
        if command is not None and name in argv and argv.index(unknown[0]) < argv.index(name):
            command = None  # given before the command word: the top level's (etsdk --bogus plugins)
        (command or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Command name -> its subparser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _plugin_command_names() -> set[str]:
    from etsdk._plugins.registry import get_commands

    return {spec.name for spec, _ in get_commands()}


if __name__ == "__main__":
    sys.exit(main())
