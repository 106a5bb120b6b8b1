"""Serving latency and throughput over HTTP: ``etsdk serve`` vs llama-cpp-python's OpenAI server, same model.

Model: a random-weight LlamaForCausalLM of SmolLM2-135M's shape (30 layers, hidden 576, 9 / 3 heads, vocab 49152,
tied embeddings: :func:`hf_static_decode.smollm2_135m_shape`), nothing downloaded. etsdk serves it exported by
``etsdk_hf_static.export`` (etsdk-aoti on CPU, ``int8:g64`` weights: embedding and head in int8 too, T=``--prefill``,
S=``--context``); llama.cpp serves a GGUF file of the same float weights in Q8_0 (every matrix, blocks of 32), with
``n_ctx`` = S. The two quantizations are not bit-identical, so greedy replies may differ after a few tokens.

Tokenizer: both servers must turn the same text into the same token ids, and a reply's text must turn back into the
reply's ids (so a conversation's next turn can reuse the cached prefix, as with a real tokenizer). A random model
emits arbitrary ids, so the vocabulary here is one token per character: ``<unk> <bos> <eos>``, printable ASCII
without whitespace, ``\\n``, ``▁`` (the space, SentencePiece's way), then CJK / Hangul characters up to the
vocabulary size. The GGUF file declares it as a SentencePiece (``llama``) vocabulary with no merges, no space
prefix, and BOS added before a completion's text (``etsdk serve`` adds it too); the etsdk program gets the
equivalent transformers tokenizer (WordLevel, one token per character, spaces as ``▁``) in ``<stem>.tokenizer/``
(the program is exported from the model object, the tokenizer saved beside it), and both carry the same chat
template (that of
:data:`etsdk_hf_static.exporting.tiny.CHAT_TEMPLATE`; llama-cpp-python uses the GGUF's template when no
``--chat_format`` is given). ``prompt_ids_identical`` in the JSON checks it: every prompt and every rendered
conversation of the run, tokenized by the transformers tokenizer and by llama.cpp (``Llama(vocab_only=True)``),
must give the same ids (a completion prompt after BOS, a conversation as its template renders it, which starts
with ``<bos>``). Prompts are text (not token-id arrays): llama-cpp-python's server only takes strings.

Requests (official ``openai`` client, streamed, greedy: ``temperature 0``, ``repeat_penalty 1``): etsdk gets
``ignore_eos: true``; llama-cpp-python has no such field, so it gets ``logit_bias {eos: -100}`` (a numpy copy of the
logits per token in its Python sampler: microseconds against milliseconds per token). Figures, per server:

* ``<server>_ttft_ms`` / ``<server>_decode_tokens_per_s``: one client, ``/v1/completions``, a ``--prompt-tokens``
  (64) token prompt, ``--new`` (64) tokens. Time to first token: from the request to the first streamed chunk with
  text; decode tokens/s: (tokens - 1) / (last chunk - first chunk);
* ``<server>_concurrent_*``: ``--clients`` (4) threads at once, each its own prompt: per-client time to first token
  (median and max) and decode tokens/s (median), and ``aggregate_tokens_per_s`` = every client's tokens / wall time
  from the first request to the last reply;
* ``<server>_turn_ttft_ms``: one client, ``/v1/chat/completions``, a ``--turns`` (10) turn conversation: each turn
  sends the whole conversation so far (every earlier reply as the server streamed it) plus a new user message of
  ``--turn-tokens`` (16) characters and asks for ``--turn-reply`` (16) tokens; the median time to first token over
  turns 2..N (``<server>_first_turn_ttft_ms``: turn 1). etsdk reports the prompt tokens it reused
  (``X-Etsdk-Cached-Tokens``): ``etsdk_turn_cached_fraction``. llama-cpp-python keeps one context and reuses the
  longest common prefix with its previous request (``Llama.generate``), which is that conversation's last turn here.

Every prompt is new in each round (different random characters), so no figure comes from a previous round's cache.
Completion tokens: etsdk's ``usage`` (``stream_options.include_usage``); llama-cpp-python's streams carry no usage,
so its reply text is re-tokenized (exact with this tokenizer).

Concurrency: ``etsdk serve --slots`` = ``--clients``: each slot its own caches, requests interleaved step by step
in one engine thread; the program has ``decode_batch`` over ``--decode-batch`` conversations (default ``--clients``;
0: none), so the requests decoding at once take their decode steps together in one call. llama-cpp-python's server (this is llama-cpp-python's FastAPI server, not
llama.cpp's native ``llama-server``) has ONE ``Llama`` context behind a lock: no slots, no continuous batching, no
``--parallel``. Concurrent requests queue and run one after another (started with ``--interrupt_requests False``;
its default, True, makes a new request cut off the one streaming). So its per-client first-token times include
the wait behind the others, and its aggregate rate is its single-stream rate. ``llama_cpp_parallel: false`` says so
in the JSON. llama-cpp-python also runs with ``--logits_all False`` (its server's default, True, computes the head
for every prompt token, which llama.cpp's own server does not) and ``--verbose False``.

Rounds interleave the servers (etsdk, llama.cpp, etsdk, ...; ``--rounds`` 3, medians reported). Only one server
process is alive at a time: each round starts its server, sends one short warm-up request, measures (one client,
concurrent clients, conversation), then stops it (SIGTERM, then SIGKILL after ``--stop-timeout``);
``<server>_start_s`` is the time until it answered. Threads: ``--threads`` (2) for both: llama.cpp's ``n_threads``
and ``n_threads_batch``; etsdk serve's torch intra-op threads and its compiled code's OpenMP team through
``OMP_NUM_THREADS`` in its environment. Ratios ``etsdk_vs_llama_cpp_<figure>`` are > 1 when etsdk is better:
etsdk / llama.cpp for tokens/s, llama.cpp / etsdk for times.

Limits: a random-weight model (speed only: no quality); one machine shared with other work
(``loadavg_1min_per_round``); decode rates come from chunk arrival times, so they need replies of more than a few
tokens (a tiny model's chunks arrive bunched);
llama-cpp-python's Python server loop (tokenize, detokenize, SSE) is part of what is measured, as etsdk's is;
every request has a deadline (``--request-timeout``), every server start and stop too, and a failed request is
listed in ``errors`` (its figure then comes from the requests that succeeded, or is ``null``).

Last line: JSON with every figure above per server (``etsdk_*``, ``llama_cpp_*``), the ratios, ``cpu`` (the host),
``kernel_level`` / ``etsdk_aoti_isa`` (etsdk-aoti's kernels' level and ``ETSDK_AOTI_ISA``), ``threads``, the sizes,
``prompt_ids_identical``, ``replies_common_prefix_tokens`` (per round: the leading tokens the two servers' one-client
replies to the same prompt share; the two quantizations part ways after a few), ``<server>_exit_codes`` (etsdk serve
exits 0 after SIGTERM's drain; llama-cpp-python's uvicorn ends by the signal: -15), ``llama_cpp_parallel``,
``errors`` and ``notes``. ``--workdir DIR`` keeps the program, tokenizer and GGUF file there
and reuses them for the same sizes (the 135M-parameter AOTI export takes minutes).

``--smoke``: a 2-layer model (hidden 64, vocab 256), T=8, S=128, prompts of 16 tokens, 4 new tokens, 3 turns of 4
characters and 4 tokens, one round; llama.cpp only if ``llama_cpp`` imports (else its figures are ``null``): the
same code and JSON keys, figures that are noise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SERVERS = ("etsdk", "llama_cpp")
SPECIALS = ("<unk>", "<bos>", "<eos>")
EOS = SPECIALS.index("<eos>")
SPACE = "\u2581"  # SentencePiece's space: llama.cpp turns " " into it before the vocabulary lookup
#: characters the prompts are made of (random strings of them)
ORDINARY = string.ascii_letters + string.digits
#: code point ranges that fill the vocabulary after ASCII: one character, one token, no normalization anywhere
FILL_RANGES = ((0x4E00, 0xA000), (0xAC00, 0xD7A4), (0x3400, 0x4DC0), (0x20000, 0x2A6E0))
#: every key a figure of one server has (null when not measured)
FIGURES = (
    "ttft_ms", "decode_tokens_per_s", "concurrent_ttft_ms", "concurrent_ttft_ms_max", "concurrent_decode_tokens_per_s",
    "concurrent_aggregate_tokens_per_s", "turn_ttft_ms", "first_turn_ttft_ms", "start_s",
)
#: figure -> True when larger is better (ratio etsdk / llama.cpp), False for times (llama.cpp / etsdk)
RATIOS = {
    "ttft_ms": False, "decode_tokens_per_s": True, "concurrent_ttft_ms": False, "concurrent_decode_tokens_per_s": True,
    "concurrent_aggregate_tokens_per_s": True, "turn_ttft_ms": False,
}
LAYOUT = 3  # bump when the files written to --workdir change


# ------------------------------------------------------------------ model, tokenizer, files


def vocabulary(size: int) -> list[str]:
    """One token per character: the specials, ASCII without whitespace, newline, ``▁``, then CJK / Hangul."""
    tokens = [*SPECIALS, *(c for c in string.printable if not c.isspace()), "\n", SPACE]
    for low, high in FILL_RANGES:
        if len(tokens) >= size:
            break
        tokens.extend(chr(c) for c in range(low, min(high, low + size - len(tokens))))
    if len(tokens) < size:
        raise ValueError(f"vocabulary of {size} tokens: only {len(tokens)} characters available")
    return tokens[:size]


def hf_tokenizer(tokens: Sequence[str]) -> Any:
    """The transformers tokenizer that tokenizes as llama.cpp does on the GGUF vocabulary written here."""
    from etsdk_hf_static.exporting.tiny import CHAT_TEMPLATE
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.Fuse()])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<bos>", eos_token="<eos>",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(smoke: bool, vocab: int, context: int) -> Any:
    """The smoke model (2 layers, hidden 64) or the random-weight model of SmolLM2-135M's shape."""
    if smoke:
        from etsdk_hf_static.exporting.tiny import tiny_model

        return tiny_model("llama", vocab=vocab, hidden=64, layers=2, heads=4, kv_heads=2, positions=2 * context)
    from hf_static_decode import smollm2_135m_shape

    return smollm2_135m_shape()


def prepare(args: argparse.Namespace, workdir: Path) -> tuple[Path, Path, Any, int]:
    """The etsdk program (with its tokenizer beside it) and the GGUF file in ``workdir`` (reused when there for the
    same sizes); returns their paths, the tokenizer and the parameter count."""
    from etsdk_hf_static.metadata import tokenizer_dir

    pte, gguf_path = workdir / "model.pte", workdir / "model.gguf"
    stamp_path = workdir / "serve_files.json"
    stamp = json.dumps({"layout": LAYOUT, "smoke": args.smoke, "vocab": args.vocab, "prefill": args.prefill,
                        "context": args.context, "quantization": args.quantization, "gguf_type": args.gguf_type,
                        "decode_batch": args.decode_batch})
    tokens = vocabulary(args.vocab)
    tokenizer = hf_tokenizer(tokens)
    reuse = stamp_path.is_file() and stamp_path.read_text() == stamp and pte.is_file() and gguf_path.is_file()
    if reuse:
        print(f"reusing {pte} and {gguf_path}", file=sys.stderr, flush=True)
        params = json.loads((workdir / "serve_params.json").read_text())["parameters"]
        return pte, gguf_path, tokenizer, params
    import torch
    from etsdk import QuantizationPlan
    from etsdk_hf_static import export
    from etsdk_hf_static.exporting.tiny import GGUF_TYPES, write_llama_gguf

    stamp_path.unlink(missing_ok=True)
    model = build_model(args.smoke, args.vocab, args.context)
    params = sum(p.numel() for p in model.parameters())
    if model.config.vocab_size != len(tokens):
        raise SystemExit(f"the model's vocabulary is {model.config.vocab_size} tokens, the tokenizer's {len(tokens)}")
    started = time.perf_counter()
    with torch.no_grad():
        write_llama_gguf(model, gguf_path, types=dict.fromkeys(GGUF_TYPES, args.gguf_type), tokens=list(tokens),
                         characters=True)  # before export: quantization changes the model in place
    print(f"wrote {gguf_path} ({gguf_path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - started:.0f} s); "
          f"exporting {pte} (T={args.prefill}, S={args.context}, {args.quantization}, decode_batch "
          f"{args.decode_batch or 'none'})...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    export(model, pte, backend="aoti", prefill_length=args.prefill, context_length=args.context,
           decode_batch=args.decode_batch or None,
           quantization=QuantizationPlan.for_format(args.quantization),
           partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=True)
    tokenizer.save_pretrained(tokenizer_dir(pte))
    print(f"exported in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    (workdir / "serve_params.json").write_text(json.dumps({"parameters": params}))
    stamp_path.write_text(stamp)
    return pte, gguf_path, tokenizer, params


# ------------------------------------------------------------------ server processes


class ServerProcess:
    """One server process started here, its stderr in a log file; :meth:`stop` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        self._log_file = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     env=env)
        self.base_url: str | None = None

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_ready(self, ready: Callable[[], str | None], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was ready:\n{self.tail()}")
            url = ready()
            if url:
                self.base_url = url
                return url
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.tail()}")

    def stop(self, timeout: float) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL; returns the exit status (None if it would not die)."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    print(f"{self.name} still running {timeout:.0f} s after SIGTERM: killing it", file=sys.stderr, flush=True)
                    self.proc.kill()
                    try:
                        self.proc.wait(10)
                    except subprocess.TimeoutExpired:
                        return None
            return self.proc.returncode
        finally:
            self._log_file.close()


def etsdk_executable() -> list[str]:
    beside = Path(sys.executable).with_name("etsdk")
    if beside.is_file():
        return [str(beside)]
    return [sys.executable, "-m", "etsdk"]


def start_etsdk(pte: Path, slots: int, threads: int, log: Path, timeout: float) -> ServerProcess:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    server = ServerProcess("etsdk serve", [*etsdk_executable(), "serve", str(pte), "--port", "0", "--slots", str(slots)],
                           env, log)
    pattern = re.compile(r"etsdk serve: listening on (http://\S+/v1)")

    def ready() -> str | None:
        match = pattern.search(server.tail(1 << 16))
        return match.group(1) if match else None

    server.wait_ready(ready, timeout)
    return server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_llama(gguf_path: Path, model_id: str, context: int, threads: int, log: Path, timeout: float) -> ServerProcess:
    port = free_port()
    argv = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path), "--model_alias", model_id,
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(context), "--n_threads", str(threads),
        "--n_threads_batch", str(threads), "--logits_all", "False", "--interrupt_requests", "False", "--verbose", "False",
    ]
    server = ServerProcess("llama_cpp.server", argv, dict(os.environ), log)
    url = f"http://127.0.0.1:{port}/v1"

    def ready() -> str | None:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as reply:
                return url if reply.status == 200 else None
        except OSError:
            return None

    server.wait_ready(ready, timeout)
    return server


# ------------------------------------------------------------------ requests


def client(base_url: str, timeout: float) -> Any:
    import openai

    return openai.OpenAI(base_url=base_url, api_key="none", timeout=timeout, max_retries=0)


def request_options(server: str) -> dict[str, Any]:
    """Greedy, no repetition penalty, and no stop at EOS, in each server's terms."""
    if server == "etsdk":
        return {"temperature": 0.0, "stream_options": {"include_usage": True},
                "extra_body": {"ignore_eos": True, "repeat_penalty": 1.0}}
    return {"temperature": 0.0, "logit_bias": {str(EOS): -100}, "extra_body": {"repeat_penalty": 1.0}}


def stream(api: Any, server: str, model: str, *, prompt: str | None = None, messages: list[dict[str, str]] | None = None,
           max_tokens: int, tokenizer: Any, timeout: float) -> dict[str, Any]:
    """One streamed request: its start, first and last text chunk times (perf_counter), text, tokens, cached tokens."""
    started = time.perf_counter()
    options = request_options(server)
    if messages is not None:
        raw = api.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=max_tokens,
                                                             stream=True, **options)
    else:
        raw = api.completions.with_raw_response.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True,
                                                       **options)
    cached = raw.headers.get("x-etsdk-cached-tokens")
    prefilled = raw.headers.get("x-etsdk-prefill-tokens")
    chunks = raw.parse()
    first = last = None
    pieces: list[str] = []
    usage = None
    try:
        for chunk in chunks:
            now = time.perf_counter()
            if getattr(chunk, "usage", None) is not None:
                usage = chunk.usage
            if chunk.choices:
                choice = chunk.choices[0]
                text = choice.delta.content if messages is not None else choice.text
                if text:
                    first = now if first is None else first
                    last = now
                    pieces.append(text)
            if now - started > timeout:
                raise TimeoutError(f"request still streaming after {timeout:.0f} s")
    finally:
        chunks.close()
    if first is None or last is None:
        raise RuntimeError("no text streamed")
    text = "".join(pieces)
    tokens = usage.completion_tokens if usage is not None else len(tokenizer.encode(text, add_special_tokens=False))
    return {"start": started, "first": first, "last": last, "end": time.perf_counter(), "text": text, "tokens": tokens,
            "cached": int(cached) if cached is not None else None, "prefilled": int(prefilled) if prefilled is not None else None}


def ttft_ms(r: dict[str, Any]) -> float:
    return (r["first"] - r["start"]) * 1e3


def decode_rate(r: dict[str, Any]) -> float | None:
    span = r["last"] - r["first"]
    return (r["tokens"] - 1) / span if r["tokens"] > 1 and span > 0 else None


def random_text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(ORDINARY) for _ in range(length))


def run_round(server: str, base_url: str, model: str, plan: dict[str, Any], args: argparse.Namespace, tokenizer: Any,
              errors: list[str]) -> dict[str, Any]:
    """One server's measurements for one round: warm-up, one client, concurrent clients, the conversation."""
    timeout = args.request_timeout
    out: dict[str, Any] = {}
    api = client(base_url, timeout)
    stream(api, server, model, prompt=plan["warmup"], max_tokens=2, tokenizer=tokenizer, timeout=timeout)

    try:  # one client
        r = stream(api, server, model, prompt=plan["single"], max_tokens=args.new, tokenizer=tokenizer, timeout=timeout)
        out.update(ttft_ms=ttft_ms(r), decode_tokens_per_s=decode_rate(r), single_text=r["text"], single_tokens=r["tokens"])
    except Exception as exc:  # noqa: BLE001 - recorded, the other figures still run
        errors.append(f"{server} one client: {type(exc).__name__}: {exc}")

    results: list[dict[str, Any] | None] = [None] * len(plan["clients"])
    barrier = threading.Barrier(len(plan["clients"]))

    def work(i: int) -> None:
        try:
            barrier.wait(timeout)
            results[i] = stream(client(base_url, timeout), server, model, prompt=plan["clients"][i], max_tokens=args.new,
                                tokenizer=tokenizer, timeout=timeout)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{server} client {i}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(plan["clients"]))]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + timeout + 10
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    if any(w.is_alive() for w in workers):
        errors.append(f"{server}: concurrent clients still running after {timeout:.0f} s (left to the server's stop)")
    done = [r for r in results if r is not None]
    if done:
        rates = [x for x in (decode_rate(r) for r in done) if x is not None]
        wall = max(r["end"] for r in done) - min(r["start"] for r in done)
        out.update(
            concurrent_ttft_ms=statistics.median(ttft_ms(r) for r in done),
            concurrent_ttft_ms_max=max(ttft_ms(r) for r in done),
            concurrent_decode_tokens_per_s=statistics.median(rates) if rates else None,
            concurrent_aggregate_tokens_per_s=sum(r["tokens"] for r in done) / wall if len(done) == len(results) else None,
        )

    messages: list[dict[str, str]] = []
    turn_ttfts, cached_fractions = [], []
    for turn, user in enumerate(plan["turns"]):
        messages.append({"role": "user", "content": user})
        try:
            r = stream(api, server, model, messages=messages, max_tokens=args.turn_reply, tokenizer=tokenizer, timeout=timeout)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{server} turn {turn + 1}: {type(exc).__name__}: {exc}")
            break
        messages.append({"role": "assistant", "content": r["text"]})
        if turn == 0:
            out["first_turn_ttft_ms"] = ttft_ms(r)
        else:
            turn_ttfts.append(ttft_ms(r))
            if r["cached"] is not None and r["prefilled"] is not None:
                cached_fractions.append(r["cached"] / (r["cached"] + r["prefilled"]))
    out["turn_ttft_ms"] = statistics.median(turn_ttfts) if turn_ttfts else None
    out["turn_cached_fraction"] = statistics.median(cached_fractions) if cached_fractions else None
    out["conversation"] = messages
    return out


def round_plan(rng: random.Random, args: argparse.Namespace) -> dict[str, Any]:
    """This round's prompts (the same for both servers; new ones every round)."""
    return {
        "warmup": random_text(rng, 8),
        "single": random_text(rng, args.prompt_tokens),
        "clients": [random_text(rng, args.prompt_tokens) for _ in range(args.clients)],
        "turns": [random_text(rng, args.turn_tokens) for _ in range(args.turns)],
    }


def same_ids(gguf_path: Path, tokenizer: Any, texts: list[tuple[str, bool]]) -> bool | None:
    """Whether llama.cpp and etsdk serve make the same ids of every ``(text, completion)``: a completion prompt
    after BOS (both servers add it), a rendered conversation as it is (its template starts with ``<bos>``).
    None: no llama_cpp."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    vocab = Llama(str(gguf_path), vocab_only=True, verbose=False)
    bos = SPECIALS.index("<bos>")
    try:
        return all(
            vocab.tokenize(text.encode("utf-8"), add_bos=completion, special=True)
            == [*([bos] if completion else []), *tokenizer.encode(text, add_special_tokens=False)]
            for text, completion in texts
        )
    finally:
        vocab.close()


def common_prefix(a: str | None, b: str | None) -> int | None:
    """Leading characters (= tokens here) two replies share."""
    if a is None or b is None:
        return None
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# ------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per server, interleaved (medians reported)")
    parser.add_argument("--threads", type=int, default=2, help="threads of each server (default 2)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (and etsdk serve --slots)")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="tokens of each completion prompt")
    parser.add_argument("--new", type=int, default=64, help="tokens generated per completion request")
    parser.add_argument("--turns", type=int, default=10, help="turns of the conversation")
    parser.add_argument("--turn-tokens", type=int, default=16, help="characters (= tokens) of each user message")
    parser.add_argument("--turn-reply", type=int, default=16, help="tokens of each reply in the conversation")
    parser.add_argument("--prefill", type=int, default=64, help="T: the etsdk program's prefill rows per call")
    parser.add_argument("--decode-batch", type=int, default=None, help="B: the etsdk program's decode_batch "
                        "(concurrent requests' decode steps in one call; default --clients, 0: none)")
    parser.add_argument("--context", type=int, default=1024, help="S: the etsdk program's cache rows and llama.cpp's n_ctx")
    parser.add_argument("--quantization", default="int8:g64:a8", help="the etsdk program's weight format (default int8:g64:a8: what --quantize int8 means)")
    parser.add_argument("--gguf-type", default="Q8_0", help="the GGUF file's matrices' type (default Q8_0)")
    parser.add_argument("--no-llama-cpp", action="store_true", help="measure etsdk serve only (llama.cpp's keys null)")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds a request may take")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="seconds a server may take to answer")
    parser.add_argument("--stop-timeout", type=float, default=60.0, help="seconds after SIGTERM before SIGKILL")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    parser.add_argument("--workdir", default=None, help="keep the program, tokenizer and GGUF file here and reuse them "
                        "for the same sizes (a 135M-parameter AOTI export takes minutes)")
    parser.add_argument("--smoke", action="store_true", help="2 layers, hidden 64, vocab 256, T=8, S=128, 16-token "
                        "prompts, 4 new tokens, 3 turns, one round: checks the script, not the figures")
    args = parser.parse_args()
    args.vocab = 49152
    if args.smoke:
        args.vocab, args.prefill, args.context, args.rounds = 256, 8, 128, 1
        args.prompt_tokens, args.new, args.turns, args.turn_tokens, args.turn_reply = 16, 4, 3, 4, 4
        args.request_timeout, args.start_timeout, args.stop_timeout = 60.0, 180.0, 30.0
    if args.decode_batch is None:
        args.decode_batch = args.clients if args.clients > 1 else 0
    if args.decode_batch == 1 or args.decode_batch < 0:
        parser.error("--decode-batch must be 0 (no decode_batch) or at least 2")
    for name in ("rounds", "threads", "clients", "prompt_tokens", "turns", "turn_tokens", "prefill"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.new < 2 or args.turn_reply < 1:
        parser.error("--new must be at least 2 (a decode rate needs two tokens) and --turn-reply at least 1")
    # the conversation's last prompt: <bos>, per turn "[user] " + message + <eos> + "[assistant] " + reply + <eos>
    conversation_rows = 1 + args.turns * (len("[user] ") + args.turn_tokens + 1 + len("[assistant] ") + args.turn_reply + 1)
    if max(conversation_rows, args.prompt_tokens + args.new) >= args.context:
        parser.error(f"the conversation ({conversation_rows} tokens) or a completion ({args.prompt_tokens + args.new}) "
                     f"does not fit --context {args.context}")

    llama_ok = not args.no_llama_cpp
    if llama_ok:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            llama_ok = False
            print("llama_cpp does not import: etsdk serve only (llama_cpp_* figures null)", file=sys.stderr, flush=True)
    errors: list[str] = []
    rounds: dict[str, list[dict[str, Any]]] = {s: [] for s in SERVERS}
    exits: dict[str, list[int | None]] = {s: [] for s in SERVERS}
    loads: list[float] = []
    texts: list[tuple[str, bool]] = []  # (text, is a completion prompt) for the tokenizer check
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(args.workdir) if args.workdir else Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        pte, gguf_path, tokenizer, params = prepare(args, workdir)
        model_id = pte.stem
        servers = [s for s in SERVERS if s == "etsdk" or llama_ok]
        for r in range(args.rounds):
            plan = round_plan(rng, args)
            texts.extend((t, True) for t in (plan["single"], *plan["clients"]))
            for server in servers:
                log = Path(scratch) / f"{server}-{r}.log"
                proc: ServerProcess | None = None
                started = time.perf_counter()
                try:
                    if server == "etsdk":
                        proc = start_etsdk(pte, args.clients, args.threads, log, args.start_timeout)
                    else:
                        proc = start_llama(gguf_path, model_id, args.context, args.threads, log, args.start_timeout)
                    start_s = time.perf_counter() - started
                    assert proc.base_url is not None
                    result = run_round(server, proc.base_url, model_id, plan, args, tokenizer, errors)
                    result["start_s"] = start_s
                    rounds[server].append(result)
                    conversation = tokenizer.apply_chat_template(result.pop("conversation"), tokenize=False)
                    texts.append((conversation, False))
                except Exception as exc:
                    if server == "etsdk":
                        raise
                    errors.append(f"{server} round {r}: {type(exc).__name__}: {exc}")
                finally:
                    if proc is not None:
                        exits[server].append(proc.stop(args.stop_timeout))
                last = rounds[server][-1] if rounds[server] and len(rounds[server]) == r + 1 else {}
                print(f"round {r} {server}: ttft {_fmt(last.get('ttft_ms'))} ms, decode {_fmt(last.get('decode_tokens_per_s'))} "
                      f"tok/s; {args.clients} clients: ttft {_fmt(last.get('concurrent_ttft_ms'))} ms, "
                      f"{_fmt(last.get('concurrent_aggregate_tokens_per_s'))} tok/s in all; turns 2..{args.turns} ttft "
                      f"{_fmt(last.get('turn_ttft_ms'))} ms", file=sys.stderr, flush=True)
            loads.append(os.getloadavg()[0])
        identical = same_ids(gguf_path, tokenizer, texts) if llama_ok else None

    out: dict[str, Any] = {
        "model": "smoke (2 layers, hidden 64)" if args.smoke else "SmolLM2-135M shape, random weights",
        "parameters": params, "vocab": args.vocab, "prefill_length": args.prefill, "context_length": args.context,
        "etsdk_quantization": args.quantization, "llama_cpp_gguf_type": args.gguf_type, "rounds": args.rounds,
        "clients": args.clients, "etsdk_slots": args.clients, "etsdk_decode_batch": args.decode_batch, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new,
        "turns": args.turns, "turn_tokens": args.turn_tokens, "turn_reply_tokens": args.turn_reply,
        "threads": args.threads, "loadavg_1min_per_round": [round(x, 2) for x in loads],
    }
    for server in SERVERS:
        for key in FIGURES:
            values = [x[key] for x in rounds[server] if x.get(key) is not None]
            out[f"{server}_{key}"] = statistics.median(values) if values else None
    fractions = [x["turn_cached_fraction"] for x in rounds["etsdk"] if x.get("turn_cached_fraction") is not None]
    out["etsdk_turn_cached_fraction"] = statistics.median(fractions) if fractions else None
    for key, higher_better in RATIOS.items():
        e, ll = out[f"etsdk_{key}"], out[f"llama_cpp_{key}"]
        out[f"etsdk_vs_llama_cpp_{key}"] = (e / ll if higher_better else ll / e) if e and ll else None
    out["etsdk_exit_codes"], out["llama_cpp_exit_codes"] = exits["etsdk"], exits["llama_cpp"]
    out["prompt_ids_identical"] = identical
    pairs = list(zip(rounds["etsdk"], rounds["llama_cpp"]))
    out["replies_common_prefix_tokens"] = [common_prefix(a.get("single_text"), b.get("single_text")) for a, b in pairs]
    out["llama_cpp_available"] = llama_ok
    out["llama_cpp_parallel"] = False if llama_ok else None
    out["llama_cpp_concurrency"] = (
        "llama-cpp-python's server: one Llama context behind a lock, no slots or continuous batching; concurrent "
        "requests queue (--interrupt_requests False) and run one at a time"
    )
    out["etsdk_concurrency"] = f"etsdk serve --slots {args.clients}: one engine thread interleaving the slots step by step"
    from etsdk.backend import host_cpu

    out["cpu"] = host_cpu().describe()
    try:
        from etsdk_aoti.kernels import current_level

        out["kernel_level"] = current_level().name
    except ImportError:
        out["kernel_level"] = None
    out["etsdk_aoti_isa"] = os.environ.get("ETSDK_AOTI_ISA")
    out["omp_num_threads_etsdk"] = args.threads
    out["errors"] = errors
    out["notes"] = [
        "ratios etsdk_vs_llama_cpp_*: > 1 when etsdk is better (tokens/s etsdk/llama.cpp, times llama.cpp/etsdk)",
        "llama.cpp's concurrent first-token times include the queue behind the other clients (serial server)",
        f"etsdk {args.quantization} vs llama.cpp {args.gguf_type} from the same float weights; replies may differ",
        "completion tokens: etsdk usage; llama.cpp re-tokenized text (one character per token here)",
        "OMP_NUM_THREADS=threads for etsdk serve; n_threads and n_threads_batch for llama.cpp",
    ]
    print(f"cpu: {out['cpu']}; etsdk-aoti kernel level: {out['kernel_level']}", file=sys.stderr, flush=True)
    print(json.dumps(out))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    main()
