"""Decode tokens/s as the context capacity S grows: attention over the filled rows vs over every row.

The same model exported as hf_static programs through etsdk-aoti at each S of ``--contexts`` (default 256, 2048,
8192) with attention over the filled rows (``etsdk export``'s default, ``etsdk::attention``), and at the largest S
also in full-length mode (``--attention full``: SDPA over every row, masked; what every export did before), the
peer. Each round runs every program once, interleaved: a conversation of ``--prompt`` tokens (default T = 32,
one prefill call), then ``--new`` greedy decode steps (32); and, with ``--fill N``, the largest-S programs once
more after a prompt of N tokens (attention then reads N rows per step whatever the mode).

``--kv-int8`` adds the program with int8 key / value caches at the largest S (``etsdk export --kv-cache int8``,
hf_static v3, filled attention) to every round; ``--llama-cpp`` adds llama.cpp (llama-cpp-python, a
benchmark-only install) on a GGUF file of the same float32 weights with a context of the largest S, once with
its default f16 cache and once with a q8_0 cache (flash attention on, as llama.cpp requires for a quantized
value cache). The read limit: the tokens/s at which one step would read every weight and every cache row it
attends over once, at the read bandwidth measured in the same run (a 512 MiB float32 sum, every thread).

Model: ``--shape smollm2-135m`` (the random-weight model of SmolLM2-135M's shape from ``hf_static_decode.py``;
decode speed does not depend on weight values) or by default the embedded 26M-parameter Llama-style model.
``--workdir DIR`` keeps the exported programs and reuses them.

Last line: JSON with ``contexts``, ``filled_tokens_per_s`` (per S), ``full_tokens_per_s`` (largest S),
``filled_over_smallest`` (decode at the largest S over the smallest, filled: the issue's target is >= 0.9),
``full_over_smallest``, ``filled_over_full`` (at the largest S), ``fill``, ``filled_fill_tokens_per_s``,
``full_fill_tokens_per_s`` (null without ``--fill``), ``int8_tokens_per_s``, ``int8_fill_tokens_per_s``,
``int8_over_float_fill`` (int8 caches over float32 ones after the long prompt: the issue's target is >= 1.3; null
without ``--kv-int8``), ``quantize``, ``quantized_fill_tokens_per_s`` (``{"float32": .., "int8": ..}`` caches over
``--quantize`` weights) and ``quantized_int8_over_float_fill`` (null without ``--quantize``), ``llama_cpp_tokens_per_s`` and ``llama_cpp_fill_tokens_per_s`` (``{"f16": .., "q8_0":
..}``, null without ``--llama-cpp``), ``read_gb_per_s``, ``fill_read_limit_tokens_per_s`` (``{"float32": ..,
"int8": ..}`` cache), ``rounds``, ``parameters``.

``--smoke``: a 1-layer model, S = 16 and 32, T = 4, 4 decode steps, one round, ``--kv-int8 --quantize int8``:
the same exports, runs and keys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from etsdk_hf_static.exporting.exporter import export
from etsdk_hf_static.exporting.tiny import tiny_model
from etsdk_hf_static.runtime.runner import HfStaticRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_static_decode import smollm2_135m_shape  # noqa: E402


def _program(
    model: Any, workdir: Path, S: int, T: int, attention: str, kv_cache: str = "float32", quantize: str | None = None
) -> HfStaticRunner:
    weights = f"-w{quantize.replace(':', '_')}" if quantize else ""
    path = workdir / f"S{S}-T{T}-{attention}{'-int8' if kv_cache == 'int8' else ''}{weights}.pte"
    if not path.exists():
        import copy

        from etsdk import QuantizationPlan

        print(f"long_context: exporting S={S} ({attention}, {kv_cache} caches, {quantize or 'float32'} weights) ...",
              file=sys.stderr, flush=True)
        plan = QuantizationPlan.for_format(quantize) if quantize else None
        export(copy.deepcopy(model) if plan else model, path, backend="aoti", prefill_length=T, context_length=S,
               attention=attention, kv_cache=kv_cache, quantization=plan,
               partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=True)
    return HfStaticRunner.from_file(path)


def _read_gb_per_s() -> float:
    """Read bandwidth of this machine now: the best of 5 sums over 512 MiB of float32 (every thread)."""
    import time

    data = torch.ones(128 * 2**20)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best / 1e9


def _step_bytes(model: Any, runner: HfStaticRunner, filled: int) -> int:
    """Bytes one decode step reads at least: every weight once, and every cache row (and scale) it attends over."""
    meta = runner.metadata
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    per_row = 2 * meta.kv_heads * (meta.head_dim * (1 if meta.cache_dtype == "int8" else 4) + (4 if meta.cache_dtype == "int8" else 0))
    return weights + meta.layers * filled * per_row


class _LlamaCpp:
    """llama.cpp over a GGUF file of the model's float32 weights: one context per cache type (f16, q8_0)."""

    def __init__(self, model: Any, workdir: Path, S: int, T: int) -> None:
        import numpy as np
        from etsdk_hf_static.exporting.tiny import write_llama_gguf
        from llama_cpp import Llama

        path = workdir / "model-f32.gguf"
        if not path.exists():
            write_llama_gguf(model, path, types={"token_embd": "F32", "output": "F32", "attn": "F32", "ffn": "F32"})
        threads = torch.get_num_threads()
        q8_0 = 8  # GGML_TYPE_Q8_0
        self.contexts = {"f16": Llama(str(path), n_ctx=S, n_batch=min(512, S), n_threads=threads, verbose=False)}
        config = model.config
        if (getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads) % 32 == 0:
            # (llama.cpp's q8_0 cache needs heads of a multiple of its 32-value blocks: not the smoke model's)
            self.contexts["q8_0"] = Llama(str(path), n_ctx=S, n_batch=min(512, S), n_threads=threads, type_k=q8_0,
                                          type_v=q8_0, flash_attn=True, verbose=False)
        self.vocab = model.config.vocab_size
        self._np = np

    def decode(self, cache: str, prompt: list[int], new: int) -> float:
        """Greedy decode tokens/s after ``prompt`` (the prompt's evaluation not timed)."""
        import time

        llm = self.contexts[cache]
        llm.reset()
        llm.eval(prompt)
        logits = self._np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(self.vocab,))
        token = int(self._np.argmax(logits))
        start = time.perf_counter()
        for _ in range(new - 1):  # as etsdk's decode_tokens_per_s: the first token comes from the prompt's logits
            llm.eval([token])
            logits = self._np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(self.vocab,))
            token = int(self._np.argmax(logits))
        return (new - 1) / (time.perf_counter() - start)


def _decode(runner: HfStaticRunner, prompt: list[int], new: int) -> float:
    conversation = runner.new_conversation()
    result = conversation.generate(prompt, max_new_tokens=new, stop_at_eos=False)
    return result.decode_tokens_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=("default", "smollm2-135m"), default="default")
    parser.add_argument("--contexts", default="256,2048,8192", help="S values, comma-separated")
    parser.add_argument("--prompt", type=int, default=32, help="T: prompt length = tokens per prefill call")
    parser.add_argument("--new", type=int, default=32, help="decode steps per conversation")
    parser.add_argument("--fill", type=int, default=None, help="also decode after a prompt of N tokens at the largest S")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kv-int8", action="store_true", help="also an int8-cache program at the largest S")
    parser.add_argument("--llama-cpp", action="store_true", help="also llama.cpp on the same weights at the largest S")
    parser.add_argument(
        "--quantize", default=None, metavar="FORMAT",
        help="with --kv-int8: also both caches at the largest S over weights in FORMAT (etsdk export --quantize)",
    )
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--smoke", action="store_true", help="smallest sizes, one round, same keys")
    args = parser.parse_args()
    if args.smoke:
        args.contexts, args.prompt, args.new, args.rounds, args.fill, args.kv_int8 = "16,32", 4, 4, 1, 20, True
        args.quantize = args.quantize or "int8"
    contexts = sorted(int(c) for c in args.contexts.split(","))
    largest = contexts[-1]
    if args.fill is not None and not args.prompt <= args.fill <= largest - args.new:
        parser.error(f"--fill must be in {args.prompt}..{largest - args.new} (prompt .. S - new)")
    if args.smoke:
        model = tiny_model("llama", hidden=64, layers=1, vocab=256, heads=4, kv_heads=2, positions=largest)
    elif args.shape == "smollm2-135m":
        model = smollm2_135m_shape()
    else:
        model = tiny_model("llama", hidden=512, layers=8, vocab=8192, heads=8, kv_heads=2, positions=largest)
    parameters = sum(p.numel() for p in model.parameters())
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="etsdk-long-context-"))
    workdir.mkdir(parents=True, exist_ok=True)
    T = args.prompt
    runners = {("filled", S): _program(model, workdir, S, T, "auto") for S in contexts}
    runners[("full", largest)] = _program(model, workdir, largest, T, "full")
    if args.kv_int8:
        runners[("int8", largest)] = _program(model, workdir, largest, T, "auto", "int8")
    if args.kv_int8 and args.quantize:
        runners[("qfilled", largest)] = _program(model, workdir, largest, T, "auto", "float32", args.quantize)
        runners[("qint8", largest)] = _program(model, workdir, largest, T, "auto", "int8", args.quantize)
    llama = _LlamaCpp(model, workdir, largest, T) if args.llama_cpp else None
    step_bytes = {
        dtype: _step_bytes(model, runners[(mode, largest)], args.fill or T)
        for dtype, mode in (("float32", "filled"), ("int8", "int8")) if (mode, largest) in runners
    }
    del model
    vocab = runners[("filled", largest)].metadata.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (T,), generator=generator).tolist()
    long_prompt = torch.randint(3, vocab, (args.fill,), generator=generator).tolist() if args.fill else None
    speeds: dict[tuple[str, int], list[float]] = {key: [] for key in runners}
    fill_modes = [mode for mode in ("filled", "full", "int8", "qfilled", "qint8") if (mode, largest) in runners]
    fill_speeds: dict[str, list[float]] = {mode: [] for mode in fill_modes}
    caches = tuple(llama.contexts) if llama is not None else ()
    llama_speeds: dict[str, list[float]] = {cache: [] for cache in caches}
    llama_fill: dict[str, list[float]] = {cache: [] for cache in caches}
    for round_index in range(args.rounds):
        for key, runner in runners.items():
            speeds[key].append(_decode(runner, prompt, args.new))
        for cache in caches:
            assert llama is not None
            llama_speeds[cache].append(llama.decode(cache, prompt, args.new))
        if long_prompt is not None:
            for mode in fill_modes:
                fill_speeds[mode].append(_decode(runners[(mode, largest)], long_prompt, args.new))
            for cache in caches:
                assert llama is not None
                llama_fill[cache].append(llama.decode(cache, long_prompt, args.new))
        row = ", ".join(f"{m} S={S}: {speeds[(m, S)][-1]:.1f}" for m, S in runners)
        row += "".join(f", llama.cpp {c}: {llama_speeds[c][-1]:.1f}" for c in caches)
        if long_prompt is not None:
            row += "; after the long prompt: " + ", ".join(f"{m}: {fill_speeds[m][-1]:.1f}" for m in fill_modes)
            row += "".join(f", llama.cpp {c}: {llama_fill[c][-1]:.1f}" for c in caches)
        print(f"long_context: round {round_index + 1}: {row} tok/s", file=sys.stderr, flush=True)
    read_gb_per_s = _read_gb_per_s()
    median = {key: statistics.median(values) for key, values in speeds.items()}
    smallest = median[("filled", contexts[0])]
    fill_median = {mode: statistics.median(values) for mode, values in fill_speeds.items() if values}
    out = {
        "contexts": contexts,
        "rounds": args.rounds,
        "parameters": parameters,
        "prompt_tokens": T,
        "new_tokens": args.new,
        "filled_tokens_per_s": {str(S): median[("filled", S)] for S in contexts},
        "full_tokens_per_s": {str(largest): median[("full", largest)]},
        "filled_over_smallest": median[("filled", largest)] / smallest,
        "full_over_smallest": median[("full", largest)] / smallest,
        "filled_over_full": median[("filled", largest)] / median[("full", largest)],
        "fill": args.fill,
        "filled_fill_tokens_per_s": statistics.median(fill_speeds["filled"]) if long_prompt else None,
        "full_fill_tokens_per_s": statistics.median(fill_speeds["full"]) if long_prompt else None,
        "int8_tokens_per_s": median.get(("int8", largest)),
        "int8_fill_tokens_per_s": fill_median.get("int8"),
        "int8_over_float_fill": fill_median["int8"] / fill_median["filled"] if "int8" in fill_median else None,
        "quantize": args.quantize,
        "quantized_fill_tokens_per_s": (
            {"float32": fill_median["qfilled"], "int8": fill_median["qint8"]} if "qint8" in fill_median else None
        ),
        "quantized_int8_over_float_fill": fill_median["qint8"] / fill_median["qfilled"] if "qint8" in fill_median else None,
        "llama_cpp_tokens_per_s": {c: statistics.median(v) for c, v in llama_speeds.items()} if caches else None,
        "llama_cpp_fill_tokens_per_s": {c: statistics.median(v) for c, v in llama_fill.items()} if caches and long_prompt else None,
        "read_gb_per_s": read_gb_per_s,
        "fill_read_limit_tokens_per_s": {dtype: read_gb_per_s * 1e9 / size for dtype, size in step_bytes.items()},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
