"""The ``etsdk`` command line.

``etsdk plugins [--json]``   what is installed, and whether it can run here
``etsdk doctor``             versions, and build the native bridge ahead of time
``etsdk demo``               export a small model through a backend and run it
``etsdk export``             export a model into a contract's programs (the plugin owning the contract does it)
``etsdk generate``           generate tokens with a program, through the runner registered for its contract
``etsdk chat``               chat with a program in the terminal (the tokenizer's chat template; /rewind, /save, ...)
``etsdk new-backend NAME``   write a complete, pip-installable backend plugin that works at once
``etsdk conformance ID``     run the conformance kit against an installed backend
``etsdk verify``             check a program and its data file completely (structure, content hashes, methods)
``etsdk inspect PTE``        what a program holds: delegates per method, claimed operators, state, named data
``etsdk --version``

Errors on bad input are one line on stderr (``etsdk: error: ...``) and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from etsdk._version import __version__
from etsdk.errors import EtsdkError


def _cmd_plugins(args: argparse.Namespace) -> int:
    from etsdk.cli.listing import print_plugins

    return print_plugins(as_json=args.json)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from importlib import metadata

    from etsdk._runtime.bridge.build import build

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
    from etsdk.cli.demo import run_demo

    return run_demo(out_dir=args.out_dir, backend=args.backend)


def _cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from etsdk._apps.generation import ExportRequest
    from etsdk._export.lower import check_output_path
    from etsdk._plugins.registry import get_runner

    output = check_output_path(args.output, (Path(args.output).stem,) if args.external_data else ())
    spec = get_runner(args.contract)
    if spec.exporter is None:
        raise EtsdkError(f"the runner for contract '{args.contract}' cannot export models")
    method_backends = {m: b for m, b in (("prefill", args.prefill_backend), ("decode", args.decode_backend)) if b}
    sizes = {k: v for k, v in (("T", args.prefill_length), ("S", args.context_length)) if v is not None}
    request = ExportRequest(
        model=args.model,
        output=output,
        backend=args.backend,
        method_backends=method_backends,
        sizes=sizes,
        external_data=args.external_data,
        quiet=args.quiet,
        partitioner_options=_backend_options(args.backend_option),
    )
    for path in spec.exporter(request):
        print(path)
    return 0


def _backend_options(raw: list[str]) -> dict[str, dict[str, object]]:
    """``["aoti.device=cpu", "tensorrt.precision=fp16"]`` -> ``{"aoti": {"device": "cpu"}, ...}`` (JSON values)."""
    out: dict[str, dict[str, object]] = {}
    for item in raw:
        target, sep, value = item.partition("=")
        backend, dot, key = target.partition(".")
        if not sep or not dot or not backend or not key:
            raise EtsdkError(f"--backend-option takes BACKEND.KEY=VALUE (e.g. aoti.device=cpu), found {item!r}")
        try:
            out.setdefault(backend, {})[key] = json.loads(value)
        except json.JSONDecodeError:
            out.setdefault(backend, {})[key] = value
    return out


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise EtsdkError(f"--prompt-ids takes comma-separated integers, found {text!r}") from None


def _cmd_generate(args: argparse.Namespace) -> int:
    from etsdk._apps.chat import open_runner
    from etsdk._apps.generation import Sampling

    if (args.prompt is None) == (args.prompt_ids is None):
        raise EtsdkError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    if args.max_new_tokens < 0:
        raise EtsdkError(f"--max-new-tokens must be >= 0, found {args.max_new_tokens}")
    given_ids = _parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    runner = open_runner(args.program, args.data)
    if args.chat:
        if args.prompt is None:
            raise EtsdkError("--chat applies the chat template to --prompt TEXT, not to --prompt-ids")
        if not hasattr(runner, "chat_prompt_ids"):
            raise EtsdkError("this program's runner does not support chat (it lacks chat_prompt_ids)")
        system = [{"role": "system", "content": args.system}] if args.system else []
        prompt_ids = runner.chat_prompt_ids([*system, {"role": "user", "content": args.prompt}])
    elif args.system is not None:
        raise EtsdkError("--system needs --chat")
    else:
        prompt_ids = given_ids if given_ids is not None else runner.encode(args.prompt)
    streamed: list[int] = []
    shown = ""

    def stream(token: int) -> None:
        # decode everything so far: a token may only complete a character together with the next one
        nonlocal shown
        streamed.append(token)
        if not args.json:
            text = runner.decode_text(streamed)
            print(text[len(shown):] if text.startswith(shown) else f" {token}", end="", flush=True)
            shown = text

    if not args.json and args.prompt is not None and not args.chat:
        print(args.prompt, end="", flush=True)
    result = runner.generate(prompt_ids, max_new_tokens=args.max_new_tokens, sampling=sampling, on_token=stream)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print()
        print(
            f"[{len(result.prompt_ids)} prompt tokens, {len(result.token_ids)} generated ({result.stopped}); "
            f"prefill {result.prefill_ms:.1f} ms; decode {result.decode_tokens_per_s:.1f} tokens/s]"
        )
    return 0


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
    code = run(args.backend, options=options, report=args.report, extra_args=["-k", args.k] if args.k else ())
    return 0 if code == 0 else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from etsdk._runtime.program import data_beside
    from etsdk._runtime.verification import verify

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
    print(
        f"{report.program}{' + ' + str(report.data) if report.data else ''}: structure ok; named data: "
        f"{counts.get('ok', 0)} verified ({report.verified_bytes} bytes), {counts.get('mismatch', 0)} damaged, "
        f"{counts.get('unverifiable', 0)} unverifiable (key is not a content hash)"
    )
    return 0 if report.ok else 1


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
    demo.add_argument("--verbose", action="store_true", help="also show other libraries' warnings and logs")
    demo.set_defaults(func=_cmd_demo)

    export = sub.add_parser("export", help="export a model into a contract's programs (.pte, .ptd)")
    export.add_argument("--model", required=True, help="a transformers model directory")
    export.add_argument("-o", "--output", required=True, help="the .pte to write")
    export.add_argument("--contract", default="hf_static", help="the contract to export for (default: hf_static)")
    export.add_argument("--backend", default="aoti", help="backend for every method: an id or a short name (aoti)")
    export.add_argument("--prefill-backend", default=None, help="backend for the prefill method only")
    export.add_argument("--decode-backend", default=None, help="backend for the decode method only")
    export.add_argument("--prefill-length", type=int, default=None, help="tokens per prefill call (T)")
    export.add_argument("--context-length", type=int, default=None, help="cache rows (S)")
    export.add_argument("--external-data", action="store_true", help="weights in a .ptd beside the .pte")
    export.add_argument("--quiet", action="store_true", help="no progress on stderr")
    export.add_argument(
        "--backend-option", action="append", default=[], metavar="BACKEND.KEY=VALUE",
        help="a partitioner option of one backend, e.g. aoti.device=cpu (repeatable; JSON values)",
    )
    export.add_argument("--verbose", action="store_true", help="also show other libraries' warnings and logs")
    export.set_defaults(func=_cmd_export)

    generate = sub.add_parser("generate", help="generate with a program through its contract's runner")
    generate.add_argument("program", help="the .pte")
    generate.add_argument("--data", default=None, help="its .ptd (default: <stem>.ptd beside the .pte, if there is one)")
    generate.add_argument("--prompt", default=None, help="text (needs the tokenizer saved at export)")
    generate.add_argument("--prompt-ids", default=None, help="comma-separated token ids")
    generate.add_argument("--max-new-tokens", type=int, default=32)
    generate.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    generate.add_argument("--top-p", type=float, default=1.0)
    generate.add_argument("--seed", type=int, default=None)
    generate.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    generate.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template to --prompt")
    generate.add_argument("--system", default=None, help="with --chat: a system message")
    generate.add_argument("--verbose", action="store_true", help="also show other libraries' warnings and logs")
    generate.set_defaults(func=_cmd_generate)

    chat = sub.add_parser("chat", help="chat with a program (the tokenizer's chat template; /reset, /rewind N, /save, /load)")
    chat.add_argument("program", help="the .pte")
    chat.add_argument("--data", default=None, help="its .ptd (default: <stem>.ptd beside the .pte, if there is one)")
    chat.add_argument("--system", default=None, help="a system message")
    chat.add_argument("--max-new-tokens", type=int, default=128, help="per reply")
    chat.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    chat.add_argument("--top-p", type=float, default=1.0)
    chat.add_argument("--seed", type=int, default=None)
    chat.add_argument("--json", action="store_true", help="one JSON object per reply, command and error")
    chat.add_argument("--verbose", action="store_true", help="also show other libraries' warnings and logs")
    chat.set_defaults(func=_cmd_chat)

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
    conformance.add_argument("-k", default=None, help="only behaviours whose test names match (pytest -k)")
    conformance.set_defaults(func=_cmd_conformance)
    verify = sub.add_parser("verify", help="check a program and its data file: structure, content hashes, methods")
    verify.add_argument("program", help="the .pte")
    verify.add_argument("--data", default=None, help="its .ptd (default: <stem>.ptd beside the .pte, if there is one)")
    verify.add_argument("--no-methods", action="store_true", help="do not load the methods (no backend needed)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=_cmd_verify)
    return parser


def _cmd_chat(args: argparse.Namespace) -> int:
    from etsdk._apps.chat import cmd_chat

    return cmd_chat(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("export", "generate", "chat", "demo", "inspect", "verify", "new-backend"):
        from etsdk.cli.quiet import quiet_command_line

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


if __name__ == "__main__":
    sys.exit(main())
