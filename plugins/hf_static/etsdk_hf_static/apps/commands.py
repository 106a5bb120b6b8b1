"""The command-line application over hf_static programs: ``etsdk export``, ``etsdk generate``, ``etsdk chat``, ``etsdk serve``.

Registered through the ``etsdk_register_commands`` hook (:mod:`etsdk_hf_static.plugin`): the core's command
line adds a subparser per :class:`etsdk.CommandSpec` and calls its ``run``. Importing this module is cheap
(argparse and etsdk's light names); the runner, the exporter and torch load when a command runs.

``export`` builds an :class:`etsdk.ExportRequest` and hands it to the exporter of the runner registered for
``--contract`` (default ``hf_static``: this plugin's). ``generate`` loads the program and drives the runner
registered for the contract it embeds as an :class:`etsdk.TextRunner`; ``--chat`` and ``etsdk chat`` need the
tokenizer's chat template, which :class:`~etsdk_hf_static.runtime.runner.HfStaticRunner` provides.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from etsdk import CommandSpec, EtsdkError, QuantizationPlan, TextRunner

from etsdk_hf_static.runtime.fitting import context_fixes, does_not_fit, rows_needed

if TYPE_CHECKING:
    from etsdk import Sampling

__all__ = [
    "COMMANDS",
    "backend_options",
    "configure_chat",
    "configure_export",
    "configure_generate",
    "add_sampling_arguments",
    "open_runner",
    "run_chat",
    "run_export",
    "run_generate",
    "sampling_from_args",
]


# --------------------------------------------------------------------------- etsdk export


def configure_export(export: argparse.ArgumentParser) -> None:
    export.add_argument(
        "--model", required=True,
        help="a transformers model directory, or a GGUF file (its Q8_0 / Q4_0 / Q4_1 weights are kept as they are)",
    )
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
    export.add_argument(
        "--decode-batch", type=int, default=None, metavar="B",
        help="also export decode_batch: one decode step for B conversations in one call, every weight read once "
        "for all of them (etsdk serve runs concurrent requests' steps together with it)",
    )
    export.add_argument("--external-data", action="store_true", help="weights in a .ptd beside the .pte")
    export.add_argument(
        "--attention", choices=("auto", "filled", "full"), default="auto",
        help="filled: attention reads only the cache rows in use, so decode cost follows the conversation, not S "
        "(needs backends that claim etsdk::attention: aoti, reference); full: every row, masked; "
        "auto (default): filled where every backend claims it",
    )
    export.add_argument(
        "--kv-cache", choices=("float32", "int8"), default="float32",
        help="int8: key / value caches of int8 rows with a scale per row and head (a quarter of the cache's "
        "bytes, read by every decode step and saved with every session; hf_static v3); float32 (default)",
    )
    export.add_argument(
        "--weights-dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
        help="the program's linear / embedding weights: auto (default) keeps a bfloat16 / float16 checkpoint's "
        "dtype (half the bytes of float32, computed in float32); float32 upcasts them",
    )
    export.add_argument(
        "--meta-trace", action="store_true",
        help="build the model from config.json with its weights on the meta device: trace and compile against "
        "their descriptions, read each weight from the safetensors files only when it is stored (not with --quantize)",
    )
    export.add_argument(
        "--full-logits", action="store_true",
        help="prefill returns every row's logits (to score text: perplexity, per-token quality); by default it "
        "computes the last real row's only, the one generation reads, and leaves the other rows zero",
    )
    quantize = export.add_argument_group("quantized weights (default: the model's own weights)")
    quantize.add_argument(
        "--quantize", default=None, metavar="FORMAT",
        help="the linear layers' format: int8 (int8:g64:a8 where the backends compute it: groups of 64 with int8 "
        "activations, else int8:g64), int4 (int4:g32:min:f16:a8 where the backends "
        "compute it: Q4_1's bytes with int8 activations, the best measured 4-bit format), or an exact name: int8:row (one "
        "scale per row), int8:gGROUP, int4:gGROUP (32, 64, 128, 256) with :min (a minimum per group), :f16 / :bf16 "
        "scales, and :a8 (each layer's input rounded to int8 per block of 32 too: llama.cpp's arithmetic)",
    )
    quantize.add_argument(
        "--quantize-embedding", default=None, metavar="FORMAT",
        help="with --quantize: the input embedding's format, or float (default: int8)",
    )
    quantize.add_argument(
        "--quantize-head", default=None, metavar="FORMAT",
        help="with --quantize: the output head's format, or float (default: int8)",
    )
    quantize.add_argument(
        "--allow-requantize", action="store_true",
        help="a GGUF file with other tensor types (Q6_K, ...): dequantize them to float instead of refusing",
    )
    export.add_argument(
        "--cpu-target", default=None, metavar="NAME",
        help="the CPU the etsdk-aoti code is compiled for: native (default: this host, every feature it has) or a "
        "baseline a fleet shares: x86-64-v3 (AVX2), x86-64-v4 (AVX-512), x86-64-v2, x86-64; armv8-a, "
        "armv8.2-a+dotprod, armv8.6-a+i8mm on aarch64. A machine that lacks a feature refuses the program at load",
    )
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


#: What ``--quantize`` short names mean: the first format every backend of the export computes, in the order of what
#: measured best on quality and on speed (SmolLM2-135M-Instruct's weights, benchmarks/README.md: int8:g64:a8 98.05 % top-1
#: and 1.33x llama.cpp's Q8_0 at the AVX2 level, where int8:g64, as good, decoded 0.69x there; int4:g32:min:f16:a8,
#: Q4_1's bytes, 98.4 % and 1.4-1.6x Q4_1, where int8 per row measured 96.9 % and symmetric int4:g32 71 %). Exact names
#: are taken as they are; ``int8:row`` is per-row int8 (the format named ``int8`` in the Python API).
SHORT_FORMATS: dict[str, tuple[str, ...]] = {
    "int8": ("int8:g64:a8", "int8:g64"),
    "int4": ("int4:g32:min:f16:a8", "int4:g32:min:f16", "int4:g32:min"),
    "int8:row": ("int8",),
}


def resolve_format(name: str, backends: list[str]) -> str:
    """The exact format ``--quantize NAME`` means for an export to ``backends`` (ids or short names): a short name's
    first format that every backend computes (its last where none computes them all: the export then says which
    backend refuses it); any other name unchanged."""
    from etsdk import get_backend, resolve_backend_id

    choices = SHORT_FORMATS.get(name)
    if choices is None:
        return name
    computed = [set(get_backend(resolve_backend_id(b)).weight_formats) for b in backends]
    return next((c for c in choices if all(c in formats for formats in computed)), choices[-1])


def _quantization(args: argparse.Namespace) -> QuantizationPlan | None:
    """The --quantize flags as a plan (refused before anything loads when a format name is wrong)."""
    if args.quantize is None:
        given = [flag for flag, value in (("--quantize-embedding", args.quantize_embedding), ("--quantize-head", args.quantize_head)) if value]
        if given:
            raise EtsdkError(f"{' and '.join(given)} go with --quantize FORMAT (the linear layers' format)")
        return None
    backends = [b for b in (args.prefill_backend or args.backend, args.decode_backend or args.backend) if b]
    linear = resolve_format(args.quantize, backends)
    if linear != args.quantize and not args.quiet:
        print(f"etsdk export: --quantize {args.quantize} is {linear} (name a format exactly to choose another)", file=sys.stderr)
    try:
        return QuantizationPlan.for_format(linear, embedding=args.quantize_embedding, head=args.quantize_head)
    except ValueError as exc:
        raise EtsdkError(f"--quantize: {exc}") from None


def run_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from etsdk import ExportRequest, check_output_path, get_runner

    output = check_output_path(args.output, (Path(args.output).stem,) if args.external_data else ())
    spec = get_runner(args.contract)
    if spec.exporter is None:
        raise EtsdkError(f"the runner for contract '{args.contract}' cannot export models")
    method_backends = {m: b for m, b in (("prefill", args.prefill_backend), ("decode", args.decode_backend)) if b}
    quantization = _quantization(args)
    sizes = {k: v for k, v in (("T", args.prefill_length), ("S", args.context_length), ("B", args.decode_batch)) if v is not None}
    request = ExportRequest(
        model=args.model,
        output=output,
        backend=args.backend,
        method_backends=method_backends,
        sizes=sizes,
        external_data=args.external_data,
        quiet=args.quiet,
        partitioner_options=backend_options(args.backend_option),
        quantization=quantization,
        allow_requantize=args.allow_requantize,
        options={
            "attention": args.attention, "kv_cache": args.kv_cache, "weights_dtype": args.weights_dtype,
            "meta_trace": args.meta_trace, "full_logits": args.full_logits,
            **({"cpu_target": args.cpu_target} if args.cpu_target is not None else {}),
        },
    )
    for path in spec.exporter(request):
        print(path)
    return 0


# --------------------------------------------------------------------------- etsdk generate


def configure_generate(generate: argparse.ArgumentParser) -> None:
    generate.add_argument("program", help="the .pte")
    generate.add_argument("--data", default=None, help="its .ptd (default: <stem>.ptd beside the .pte, if there is one)")
    generate.add_argument("--prompt", default=None, help="text (needs the tokenizer saved at export)")
    generate.add_argument(
        "--prompt-file", default=None, metavar="PATH",
        help="read the prompt text from PATH, or from stdin for '-' (one trailing newline is dropped)",
    )
    generate.add_argument("--prompt-ids", default=None, help="comma-separated token ids")
    generate.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="at most N new tokens (default 32)")
    add_sampling_arguments(generate)
    generate.add_argument(
        "--json", action="store_true",
        help="print one JSON object (ids, text, timings) instead of streaming text and a statistics line",
    )
    generate.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template to --prompt")
    generate.add_argument("--system", default=None, help="with --chat: a system message")
    generate.add_argument("--verbose", action="store_true", help="also show other libraries' warnings and logs")


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise EtsdkError(f"--prompt-ids takes comma-separated integers, found {text!r}") from None


#: flag of each etsdk.Sampling field, for messages that name what the user typed
_SAMPLING_FLAGS = {
    "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
    "repeat_penalty": "--repeat-penalty", "repeat_last_n": "--repeat-last-n", "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty", "seed": "--seed", "stop": "--stop", "ignore_eos": "--ignore-eos",
}


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """The sampling and stopping flags of ``etsdk generate`` and ``etsdk chat`` (llama.cpp's names and defaults)."""
    group = parser.add_argument_group("sampling and stopping (defaults: greedy, stop at end of sequence)")
    group.add_argument("--temperature", type=float, default=0.0, metavar="F", help="0 (default) is greedy; else at least 1e-6")
    group.add_argument("--top-k", type=int, default=0, metavar="N", help="sample among the N most likely tokens (0: off)")
    group.add_argument("--top-p", type=float, default=1.0, metavar="F", help="nucleus sampling, in (0, 1] (1: off)")
    group.add_argument("--min-p", type=float, default=0.0, metavar="F",
                       help="drop tokens less likely than F times the most likely one, in [0, 1] (0: off)")
    group.add_argument("--repeat-penalty", type=float, default=1.0, metavar="F",
                       help="penalize tokens of the last --repeat-last-n (prompt and generated), > 0 (1: off)")
    group.add_argument("--repeat-last-n", type=int, default=64, metavar="N",
                       help="the penalties' window in tokens (default 64; -1: the whole conversation, 0: off)")
    group.add_argument("--presence-penalty", type=float, default=0.0, metavar="F", help="subtracted once per token seen (0: off)")
    group.add_argument("--frequency-penalty", type=float, default=0.0, metavar="F",
                       help="subtracted per occurrence of a token (0: off)")
    group.add_argument("--seed", type=int, default=None, metavar="N", help="seed of the sampler, in [0, 2**64)")
    group.add_argument(
        "--stop", action="append", default=[], metavar="TEXT",
        help="stop when the text generated contains TEXT, which is not printed (repeatable; \\n, \\t, \\r, \\\\ are escapes)",
    )
    group.add_argument("--ignore-eos", action="store_true", help="keep generating past an end-of-sequence token")


def _unescape(text: str) -> str:
    """``\\n``, ``\\t``, ``\\r`` and ``\\\\`` in a ``--stop`` value as the characters they name (as llama.cpp does)."""
    out, chars = [], iter(text)
    for char in chars:
        if char == "\\":
            following = next(chars, "")
            out.append({"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}.get(following, "\\" + following))
        else:
            out.append(char)
    return "".join(out)


def sampling_from_args(args: argparse.Namespace) -> Sampling:
    """The :class:`etsdk.Sampling` of the sampling flags; a bad value is an error naming its flag and range."""
    from etsdk import GenerationError, Sampling

    fields = {name: getattr(args, name) for name in _SAMPLING_FLAGS if name != "stop"}
    try:
        return Sampling(**fields, stop=tuple(_unescape(s) for s in args.stop))
    except GenerationError as exc:
        message = str(exc)
        name = next((n for n in sorted(_SAMPLING_FLAGS, key=len, reverse=True) if message.startswith(n)), None)
        raise GenerationError(f"{_SAMPLING_FLAGS[name]}: {message}" if name else message) from None


def _read_prompt(path: str) -> str:
    """The prompt text of ``--prompt-file PATH`` (stdin for ``-``), one trailing newline dropped."""
    from pathlib import Path

    where = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EtsdkError(f"--prompt-file: no such file: {path}") from None
    except IsADirectoryError:
        raise EtsdkError(f"--prompt-file: {path} is a directory") from None
    except UnicodeDecodeError as exc:
        raise EtsdkError(f"--prompt-file: {where} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise EtsdkError(f"--prompt-file: cannot read {where}: {exc.strerror or exc}") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise EtsdkError(f"--prompt-file: the prompt read from {where} is empty")
    return text


def _preflight(args: argparse.Namespace, text: str | None, given_ids: list[int] | None) -> list[int] | None:
    """Refuse what the program's contract can refuse before anything heavy loads; the prompt's ids when known.

    Reads the contract with :func:`etsdk.read_contract` (no torch, no runtime, no backend): for an hf_static
    program, ``--max-new-tokens`` beyond the context, ``--prompt-ids`` outside the vocabulary and a prompt
    that cannot fit with its new tokens are refused here. A text prompt is encoded with the tokenizer saved
    beside the program first (that imports transformers, still before the program and its methods load).
    Programs of other contracts: their runner checks its requests after the load.
    """
    from pathlib import Path

    from etsdk import read_contract

    contract = read_contract(args.program)
    if contract is None:
        raise EtsdkError(f"{args.program} embeds no contract; etsdk needs a program exported for one to run it")
    from etsdk_hf_static.metadata import CONTRACT_NAME, read_metadata

    if contract.name != CONTRACT_NAME:
        return None
    meta = read_metadata(contract)
    S, new = meta.context_length, args.max_new_tokens
    if new >= S:
        raise EtsdkError(
            f"--max-new-tokens {new} cannot fit: the program's context length S is {S} rows, and the prompt takes "
            f"at least one of them (at most --max-new-tokens {S - 1}; or a program exported with a longer "
            "--context-length)"
        )
    if given_ids is not None:
        bad = next(((i, t) for i, t in enumerate(given_ids) if not 0 <= t < meta.vocab_size), None)
        if bad is not None:
            raise EtsdkError(f"--prompt-ids: token {bad[0]} is {bad[1]}, outside the vocabulary 0..{meta.vocab_size - 1}")
        ids = given_ids
    else:
        from etsdk_hf_static.runtime.runner import chat_template_ids, encode_text, load_tokenizer, no_tokenizer

        assert text is not None
        name = Path(args.program).name
        tokenizer = load_tokenizer(args.program)
        if tokenizer is None:
            raise no_tokenizer(name)
        if args.chat:
            system = [{"role": "system", "content": args.system}] if args.system else []
            ids = chat_template_ids(tokenizer, [*system, {"role": "user", "content": text}], meta.vocab_size, name)
        else:
            ids = encode_text(tokenizer, text, meta.bos_id)
    if not ids:
        raise EtsdkError("the prompt is empty (no token)")
    if rows_needed(0, len(ids), new) > S:  # a fresh conversation's request, counted as every check counts
        raise EtsdkError(does_not_fit(0, len(ids), new, S, context_fixes(0, len(ids), new, S)))
    return ids


def open_runner(program_path: str, data: str | None) -> TextRunner:
    """Load ``program_path`` and the runner registered for the contract it embeds (a text-generating one)."""
    from etsdk import data_beside, get_runner, load

    from etsdk_hf_static.runtime.startup import mark, say_loading

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
    """``etsdk generate``: the text to stdout (the prompt echoed first), the statistics line to stderr.

    Everything the arguments and the program's contract can refuse is refused before the program loads
    (:func:`_preflight`); an error after the prompt was echoed starts on a new line.
    """
    from etsdk_hf_static.apps.streaming import TextStream, decode_rate
    from etsdk_hf_static.runtime.startup import mark, say_loading
    from etsdk_hf_static.runtime.stops import cut_at_stop

    if sum(source is not None for source in (args.prompt, args.prompt_file, args.prompt_ids)) != 1:
        raise EtsdkError("give exactly one of --prompt TEXT, --prompt-file PATH ('-': stdin) or --prompt-ids 1,2,3")
    if args.max_new_tokens < 1:
        raise EtsdkError(f"--max-new-tokens must be a positive integer, found {args.max_new_tokens}")
    if args.chat and args.prompt_ids is not None:
        raise EtsdkError("--chat applies the chat template to --prompt TEXT or --prompt-file PATH, not to --prompt-ids")
    if args.system is not None and not args.chat:
        raise EtsdkError("--system needs --chat")
    sampling = sampling_from_args(args)
    given_ids = _parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    text = _read_prompt(args.prompt_file) if args.prompt_file is not None else args.prompt
    say_loading(args.program)  # before the tokenizer and torch load: seconds
    mark("start")
    prompt_ids = _preflight(args, text, given_ids)
    runner = open_runner(args.program, args.data)
    if prompt_ids is None:  # a program of another contract: its runner encodes
        if args.chat:
            from etsdk_hf_static.apps.chat import chat_runner

            system = [{"role": "system", "content": args.system}] if args.system else []
            prompt_ids = chat_runner(runner).chat_prompt_ids([*system, {"role": "user", "content": text or ""}])
        else:
            prompt_ids = given_ids if given_ids is not None else runner.encode(text or "")
    mark("prompt")
    # the text continues the prompt (the chat template's too) as an hf_static runner's result reads with a tokenizer
    # (ids joined by spaces, or another contract's runner, read on their own)
    from etsdk_hf_static.runtime.runner import HfStaticRunner

    continues = isinstance(runner, HfStaticRunner) and runner.tokenizer is not None
    stream = TextStream(runner.decode_text, sys.stdout, sampling.stop, context=prompt_ids if continues else ())

    chosen: list[int] = []

    def on_token(token: int) -> None:
        chosen.append(token)
        if len(chosen) == 1:
            mark("first_token")
        if not args.json:
            stream(token)

    try:
        if not args.json and text is not None and not args.chat:
            stream.echo(text)
        result = runner.generate(
            prompt_ids, max_new_tokens=args.max_new_tokens, sampling=sampling, on_token=on_token
        )
    except BaseException:
        stream.end_line()  # an error message starts on its own line, never after the echoed prompt
        raise
    generated = result.text if result.text is not None else cut_at_stop(runner.decode_text(result.token_ids), sampling.stop)
    if args.json:
        print(json.dumps({**result.to_json(), "text": generated}))
        return 0
    stream.finish(generated)
    print(
        f"[{len(result.prompt_ids)} prompt tokens, {len(result.token_ids)} generated ({result.stopped}); "
        f"prefill {result.prefill_ms:.1f} ms; {decode_rate(result)}]",
        file=sys.stderr, flush=True,
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
    add_sampling_arguments(chat)
    chat.add_argument("--json", action="store_true", help="one JSON object per reply, command and error")
    chat.add_argument("--verbose", action="store_true", help="also show other libraries' warnings and logs")


def run_chat(args: argparse.Namespace) -> int:
    """``etsdk chat`` (its arguments: :func:`configure_chat`; the session: :mod:`etsdk_hf_static.apps.chat`)."""
    from etsdk import GenerationError

    from etsdk_hf_static.apps.chat import ChatSession, chat_runner, continued_lines, terminal_lines
    from etsdk_hf_static.apps.chat import run_chat as chat_loop

    sampling = sampling_from_args(args)
    if isinstance(args.max_new_tokens, bool) or args.max_new_tokens < 1:
        raise GenerationError(f"--max-new-tokens must be a positive integer, found {args.max_new_tokens}")
    runner = chat_runner(open_runner(args.program, args.data))
    chat = ChatSession(
        runner, system=args.system, max_new_tokens=args.max_new_tokens, sampling=sampling,
        context_shift=not getattr(args, "no_context_shift", False),
    )
    interactive = sys.stdin.isatty()
    lines = terminal_lines("> ", sys.stderr) if interactive else continued_lines(sys.stdin)
    if interactive and not args.json:
        print(
            f"etsdk chat: {chat.context_length} rows of context; /help lists the commands, a trailing \\ continues "
            "a line, Ctrl-C stops a reply",
            file=sys.stderr, flush=True,
        )
    try:
        return chat_loop(chat, lines, sys.stdout, sys.stderr, as_json=args.json, interactive=interactive)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _configure_serve(parser: argparse.ArgumentParser) -> None:
    from etsdk_hf_static.apps.serve.command import configure_serve

    configure_serve(parser)


def _run_serve(args: argparse.Namespace) -> int:
    from etsdk_hf_static.apps.serve.command import run_serve

    return run_serve(args)


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
    CommandSpec(
        name="serve",
        help="serve a program over HTTP with the OpenAI API (chat, completions, streaming; needs etsdk-hf-static[serve])",
        configure=_configure_serve,
        run=_run_serve,
        quiet=True,
    ),
)
