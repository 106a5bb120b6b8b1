"""The command-line application over hf_static programs: ``etsdk export``, ``etsdk generate``, ``etsdk chat``.

Registered through the ``etsdk_register_commands`` hook (:mod:`etsdk_hf_static.plugin`): the core's command
line adds a subparser per :class:`etsdk.CommandSpec` and calls its ``run``. Importing this module is cheap
(argparse and etsdk's light names); the runner, the exporter and torch load when a command runs.

``export`` builds an :class:`etsdk.ExportRequest` and hands it to the exporter of the runner registered for
``--contract`` (default ``hf_static``: this plugin's). ``generate`` loads the program and drives the runner
registered for the contract it embeds as an :class:`etsdk.TextRunner`; ``--chat`` and ``etsdk chat`` need the
tokenizer's chat template, which :class:`~etsdk_hf_static.runner.HfStaticRunner` provides.
"""

from __future__ import annotations

import argparse
import json

from etsdk import CommandSpec, EtsdkError, TextRunner

__all__ = [
    "COMMANDS",
    "backend_options",
    "configure_chat",
    "configure_export",
    "configure_generate",
    "open_runner",
    "run_chat",
    "run_export",
    "run_generate",
]


# --------------------------------------------------------------------------- etsdk export


def configure_export(export: argparse.ArgumentParser) -> None:
    export.add_argument("--model", required=True, help="a transformers model directory")
    export.add_argument("-o", "--output", required=True, help="the .pte to write")
    export.add_argument("--contract", default="hf_static", help="the contract to export for (default: hf_static)")
    export.add_argument("--backend", default="aoti", help="backend for every method: an id or a short name (aoti)")
    export.add_argument("--prefill-backend", default=None, help="backend for the prefill method only")
    export.add_argument("--decode-backend", default=None, help="backend for the decode method only")
    export.add_argument(
        "--prefill-length", type=int, default=None, metavar="T",
        help="tokens per prefill call (default: 64, or S when S is smaller; a prompt runs in chunks of T)",
    )
    export.add_argument(
        "--context-length", type=int, default=None, metavar="S",
        help="cache rows: prompt and replies of a conversation together "
        "(default: the model's max_position_embeddings, at most 2048)",
    )
    export.add_argument("--external-data", action="store_true", help="weights in a .ptd beside the .pte")
    export.add_argument("--quiet", action="store_true", help="no progress on stderr")
    export.add_argument(
        "--backend-option", action="append", default=[], metavar="BACKEND.KEY=VALUE",
        help="a partitioner option of one backend, e.g. aoti.device=cpu (repeatable; JSON values)",
    )
    export.add_argument("--verbose", action="store_true", help="also show other libraries' warnings and logs")


def backend_options(raw: list[str]) -> dict[str, dict[str, object]]:
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


def run_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from etsdk import ExportRequest, check_output_path, get_runner

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
        partitioner_options=backend_options(args.backend_option),
    )
    for path in spec.exporter(request):
        print(path)
    return 0


# --------------------------------------------------------------------------- etsdk generate


def configure_generate(generate: argparse.ArgumentParser) -> None:
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


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise EtsdkError(f"--prompt-ids takes comma-separated integers, found {text!r}") from None


def open_runner(program_path: str, data: str | None) -> TextRunner:
    """Load ``program_path`` and the runner registered for the contract it embeds (a text-generating one)."""
    from etsdk import data_beside, get_runner, load

    from etsdk_hf_static.startup import mark, say_loading

    mark("start")
    say_loading(program_path)
    program = load(program_path, data=data if data is not None else data_beside(program_path))
    mark("program")
    contract = program.contract
    if contract is None:
        raise EtsdkError(f"{program_path} embeds no contract; etsdk needs a program exported for one to run it")
    runner = get_runner(contract.name, contract.version).factory(program)
    if not isinstance(runner, TextRunner):
        raise EtsdkError(
            f"the runner for contract '{contract.name}' v{contract.version} does not generate text "
            "(its runner is not an etsdk.TextRunner: encode, decode_text, generate)"
        )
    return runner


def run_generate(args: argparse.Namespace) -> int:
    from etsdk import Sampling

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
        from etsdk_hf_static.chat import chat_runner

        system = [{"role": "system", "content": args.system}] if args.system else []
        prompt_ids = chat_runner(runner).chat_prompt_ids([*system, {"role": "user", "content": args.prompt}])
    elif args.system is not None:
        raise EtsdkError("--system needs --chat")
    else:
        prompt_ids = given_ids if given_ids is not None else runner.encode(args.prompt)
    from etsdk_hf_static.startup import mark

    mark("prompt")
    streamed: list[int] = []
    shown = ""

    def stream(token: int) -> None:
        # decode everything so far: a token may only complete a character together with the next one
        nonlocal shown
        streamed.append(token)
        if len(streamed) == 1:
            mark("first_token")
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


# --------------------------------------------------------------------------- etsdk chat


def configure_chat(chat: argparse.ArgumentParser) -> None:
    chat.add_argument("program", help="the .pte")
    chat.add_argument("--data", default=None, help="its .ptd (default: <stem>.ptd beside the .pte, if there is one)")
    chat.add_argument("--system", default=None, help="a system message")
    chat.add_argument(
        "--max-new-tokens", type=int, default=128,
        help="per reply (default 128); a reply gets at most the rows the context has left",
    )
    chat.add_argument(
        "--no-context-shift", action="store_true",
        help="keep every exchange: refuse a message that does not fit instead of dropping the oldest exchanges",
    )
    chat.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    chat.add_argument("--top-p", type=float, default=1.0)
    chat.add_argument("--seed", type=int, default=None)
    chat.add_argument("--json", action="store_true", help="one JSON object per reply, command and error")
    chat.add_argument("--verbose", action="store_true", help="also show other libraries' warnings and logs")


def run_chat(args: argparse.Namespace) -> int:
    from etsdk_hf_static.chat import cmd_chat

    return cmd_chat(args)


COMMANDS = (
    CommandSpec(
        name="export",
        help="export a model into a contract's programs (.pte, .ptd)",
        configure=configure_export,
        run=run_export,
        quiet=True,
    ),
    CommandSpec(
        name="generate",
        help="generate with a program through its contract's runner",
        configure=configure_generate,
        run=run_generate,
        quiet=True,
    ),
    CommandSpec(
        name="chat",
        help="chat with a program (the tokenizer's chat template; /help lists the commands)",
        configure=configure_chat,
        run=run_chat,
        quiet=True,
    ),
)
