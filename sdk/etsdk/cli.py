"""The ``etsdk`` command line.

``etsdk plugins [--json]``   what is installed, and whether it can run here
``etsdk doctor``             versions, and build the native bridge ahead of time
``etsdk demo``               export a small model through a backend and run it
``etsdk export``             export a model into a contract's programs (the plugin owning the contract does it)
``etsdk generate``           generate tokens with a program, through the runner registered for its contract
``etsdk verify``             check a program and its data file completely (structure, content hashes, methods)
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
    from etsdk.registry import list_plugins

    plugins = list_plugins()
    if args.json:
        print(json.dumps([p.to_json() for p in plugins], indent=2))
        return 0
    rows = [("NAME", "DISTRIBUTION", "VERSION", "STATUS", "BACKENDS", "CONTRACTS", "RUNNERS")]
    for p in plugins:
        rows.append(
            (
                p.name,
                p.distribution,
                p.version,
                p.status.value,
                ",".join(p.backends) or "-",
                ",".join(p.contracts) or "-",
                ",".join(p.runners) or "-",
            )
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


def _cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from etsdk.generation import ExportRequest
    from etsdk.lowering import check_output_path
    from etsdk.registry import get_runner

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
    )
    for path in spec.exporter(request):
        print(path)
    return 0


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise EtsdkError(f"--prompt-ids takes comma-separated integers, found {text!r}") from None


def _cmd_generate(args: argparse.Namespace) -> int:
    from etsdk.generation import Sampling
    from etsdk.program import data_beside, load
    from etsdk.registry import get_runner

    if (args.prompt is None) == (args.prompt_ids is None):
        raise EtsdkError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    if args.max_new_tokens < 0:
        raise EtsdkError(f"--max-new-tokens must be >= 0, found {args.max_new_tokens}")
    given_ids = _parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    program = load(args.program, data=args.data if args.data is not None else data_beside(args.program))
    contract = program.contract
    if contract is None:
        raise EtsdkError(f"{args.program} embeds no contract; etsdk generate needs a program exported for one")
    spec = get_runner(contract.name)
    if contract.version not in spec.versions:
        raise EtsdkError(
            f"{args.program} follows {contract.name} v{contract.version}; the installed runner drives "
            f"version(s) {', '.join(map(str, spec.versions))}"
        )
    runner = spec.factory(program)
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

    if not args.json and args.prompt is not None:
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


def _cmd_verify(args: argparse.Namespace) -> int:
    from etsdk.integrity import verify
    from etsdk.program import data_beside

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
    generate.set_defaults(func=_cmd_generate)

    verify = sub.add_parser("verify", help="check a program and its data file: structure, content hashes, methods")
    verify.add_argument("program", help="the .pte")
    verify.add_argument("--data", default=None, help="its .ptd (default: <stem>.ptd beside the .pte, if there is one)")
    verify.add_argument("--no-methods", action="store_true", help="do not load the methods (no backend needed)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=_cmd_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
