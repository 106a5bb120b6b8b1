"""Decode tokens/s and prefill ms of a causal LM: etsdk (hf_static + AOTI) vs eager vs XNNPACK vs the weight-read limit.

Model: ``--model DIR`` (any transformers causal LM directory), or ``--shape smollm2-135m`` (an embedded random-weight
LlamaForCausalLM of SmolLM2-135M's shape: 30 layers, hidden 576, intermediate 1536, 9 / 3 heads, head_dim 64, vocab
49152, tied embeddings; 134.5M parameters, 538 MB fp32), or by default the embedded 26M-parameter Llama-style model
sized by ``--hidden/--layers/--vocab``. Nothing is downloaded.

The prompt is exactly T tokens (one prefill call everywhere), then ``--new`` decode steps:

* ``etsdk``: the hf_static program (both methods through etsdk-aoti on CPU) driven by the hf_static runner:
  counters, positions and mask written every step, logits read, greedy choice;
* ``eager``: transformers' model over its ``StaticCache`` (the same :class:`StaticCausalLM` wrapper, run
  eagerly under ``torch.no_grad``), same inputs and counter writes;
* ``xnnpack``: the same wrapper (counters written from the positions inside the graph) exported by stock
  ExecuTorch with ``XnnpackPartitioner`` (caches left as ExecuTorch mutable buffers), run through
  ``executorch.runtime``. Each ExecuTorch method keeps its own mutable buffers, so its decode does not see its
  prefill's cache: its timings are valid, its tokens are not compared.

``--quantize FORMAT`` (``int8``, ``int4``, ...; the embedding and the head in int8, as ``etsdk export
--quantize`` does): the etsdk program holds quantized weights; ``eager`` is transformers with torchao's
quantization of the same kind (int8: ``Int8WeightOnlyConfig``; 4-bit: torchao's ``8da4w``,
``Int8DynamicActivationIntxWeightConfig(int4, PerGroup(32))``, torchao 0.18 having no 4-bit weight-only CPU
kernel) and ``xnnpack`` is ExecuTorch + XNNPACK with torchao's 8da4w / 8da8w, the recipe of ExecuTorch's own LLM
export. ``--gguf TYPE`` (``Q8_0``, ``Q4_0``, ``Q4_1``): the model is written as a GGUF file (linear layers in
TYPE, embedding and head in Q8_0) and etsdk exports that file (the blocks kept as they are). ``--llama-cpp``
adds the ``llama_cpp`` path: llama.cpp (llama-cpp-python, a benchmark-only install) on a GGUF file of the same
weights: ``--gguf``'s file, or for ``--quantize int8`` Q8_0, for a 4-bit ``--quantize`` Q4_0 (Q4_1 for a format
with a minimum; embedding and head Q8_0), for float32 F32; same threads, prompt, greedy steps (llama.cpp's ``eval``, argmax in numpy). With
``--quantize`` / ``--gguf`` the float32 etsdk program runs too, interleaved, as ``etsdk_float``
(``etsdk_vs_etsdk_float_decode``: the quantized program's speed-up).

``--weights-dtype bfloat16|float16``: the etsdk program keeps the linear and embedding weights in that dtype and
computes in float32 (``etsdk export``'s default for a bfloat16 / float16 checkpoint); the float32 program runs
beside it as ``etsdk_float``, ``eager`` runs the same 16-bit weights widened the same way, llama.cpp a BF16 / F16
GGUF file of them, and the limit counts 2 bytes per weight.

``limit``: the machine's weight-read limit, measured in the same run: one read of the model's weight bytes with
the fastest kernel available (``torch.mv`` over one matrix holding the model's weight bytes, ``F.linear`` over
the model's own matrices, and a sum of that matrix on every thread; the fastest counts: torch's CPU GEMV for one
row runs on one thread, so before the sum was added the limit said what one thread reads, about a third of this
machine's bandwidth). A decode step must read every weight once, so
``limit_steps_per_s`` bounds decode tokens/s, and ``<path>_fraction_of_limit`` = path tokens/s / limit steps/s.
With ``--quantize`` / ``--gguf`` the limit counts the packed bytes: the float32 read's bytes per second times the
quantized weights' bytes (``weight_bytes`` is then the quantized size, ``float_weight_bytes`` the float32 one).

``--tail N``: after the decode steps, ``etsdk`` and ``llama_cpp`` also write N more tokens (a chat's next turn: a
prefill shorter than T after the conversation so far; etsdk's is one padded call) and report
``<path>_tail_prefill_ms`` (median) and ``etsdk_vs_llama_cpp_tail_prefill`` (llama.cpp / etsdk: > 1 when etsdk is
faster); the other paths' keys are null.

``--contended``: every round runs each path twice, quiet and with one competing busy process (a Python busy loop,
started before and killed after that path's contended half); reports ``<path>_contended_tokens_per_s`` and
``<path>_contended_over_quiet``.

Per-step memory traffic: ``<path>_minor_faults_per_step`` (page faults while decoding: a path that allocates and
touches fresh model-sized buffers each step shows thousands) is measured everywhere on Linux; hardware memory
traffic counters are read only where ``perf`` can count ``LLC-load-misses`` for this process (``<path>_llc_miss_bytes
_per_step``, 64-byte lines), otherwise ``traffic_counters`` says why not.

Rounds interleave the paths (medians reported). Where etsdk's time goes: ``etsdk_runner_us_per_step`` (a whole
runner decode step) splits into ``etsdk_program_run_us_per_step`` (runtime + bridge + AOTI binding + compiled
code) and the runner's own Python work (the difference). The process's OpenMP settings are reported as
``threads`` and ``omp_wait_policy``; ``--threads N`` calls ``torch.set_num_threads(N)`` (without it the process
default is kept: an explicit ``set_num_threads`` also switches MKL's dynamic mode off, which changes how MKL
runs inside other parallel regions).

Last line: JSON with ``etsdk_tokens_per_s``, ``eager_tokens_per_s``, ``xnnpack_tokens_per_s``,
``etsdk_prefill_ms``, ``eager_prefill_ms``, ``xnnpack_prefill_ms``, ``limit_steps_per_s``, the fractions, the
contended figures with ``--contended``, the breakdown and the parameter count. A path that was not run
(``--no-xnnpack``) keeps its keys, with ``null`` values.

``--rows K,...`` (e.g. ``1,2,4,8,37``): after the prompt, one call of the prefill method over K real rows (padded
to T) against K decode steps, interleaved each round: what a step over K rows at once costs beside K steps of
one, i.e. what a decode step that advances K sessions with one read of the weights could save at most
(``etsdk_rows_steps_over_call``: > 1, the one call is cheaper). A prefill call also pays its T - K padded rows'
elementwise work, so this understates the saving.

``--decode-batch B``: the program also gets ``decode_batch`` over B conversations; each round, one such call (B
conversations after the prompt, each on its own session) against their B decode steps in turn
(``etsdk_batch_call_ms``, ``etsdk_batch_steps_ms``, ``etsdk_batch_steps_over_call``: what ``etsdk serve`` gains
when B requests decode at once).

``--smoke``: a 1-layer model (hidden 64, vocab 256), T=4, S=16, 4 decode steps, one round (``--rows 1,2``,
``--decode-batch 2``), without the XNNPACK
peer (its strict two-method export alone takes over a minute on 2 cores even at this size; its keys are
``null``, as with ``--no-xnnpack``): the same etsdk export, paths, runs and JSON keys; the figures are too noisy
to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from etsdk_hf_static.exporting.exporter import export
from etsdk_hf_static.exporting.module import StaticCausalLM
from etsdk_hf_static.exporting.tiny import tiny_model
from etsdk_hf_static.masks import causal_mask
from etsdk_hf_static.runtime.conversation import run_decode_batch
from etsdk_hf_static.runtime.runner import HfStaticRunner, Step

SHAPES = ("default", "smollm2-135m")
PATHS = ("etsdk", "etsdk_float", "eager", "xnnpack", "llama_cpp")  # every path's keys are in the JSON, null if not run


def smollm2_135m_shape(seed: int = 0) -> Any:
    """A random-weight LlamaForCausalLM of SmolLM2-135M's shape (134.5M parameters, fp32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, hidden_act="silu",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(torch.float32).eval()


def _model(args: argparse.Namespace) -> Any:
    if args.model:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    if args.shape == "smollm2-135m":
        return smollm2_135m_shape()
    return tiny_model("llama", hidden=args.hidden, layers=args.layers, vocab=args.vocab, heads=8, kv_heads=2, positions=2 * args.context)


class _SelfPositioned(StaticCausalLM):
    """Writes its counters from ``positions[0]`` inside the graph, as transformers' ExecuTorch wrapper does: with
    the counters left as ExecuTorch mutable buffers, a decode counter read back garbage after a few hundred calls
    here (index -4.7e18 in ``index_put``), so the XNNPACK peer must not depend on one surviving across calls."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.cache.layers:
            layer.cumulative_length.copy_(positions[0])
        return super().forward(input_ids, positions, attention_mask)


def _torchao(model: Any, quantize: str | None, *, dynamic: bool) -> Any:
    """A copy of ``model`` quantized by torchao as ``--quantize`` asks (None: the model itself)."""
    if quantize is None:
        return model
    import copy

    from etsdk import WeightFormat
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, Int8WeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    fmt = WeightFormat.parse(quantize)
    quantized = copy.deepcopy(model)
    if fmt.bits == 8 and not dynamic:
        config: Any = Int8WeightOnlyConfig()
    else:
        granularity = PerGroup(fmt.group_size) if fmt.group_size else PerAxis(0)
        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4 if fmt.bits == 4 else torch.int8, weight_granularity=granularity)
    quantize_(quantized, config)
    return quantized


def _quantized_bytes(model: Any, plan: Any) -> int:
    """The weight matrices' bytes once quantized by ``plan`` (a tied head stored once, as etsdk stores it)."""
    import copy

    from etsdk import quantize_model

    report = quantize_model(copy.deepcopy(model), plan)
    return report.quantized_bytes + sum(w.numel() * w.element_size() for w in _weight_matrices(model)) - report.float_bytes


def _gguf_types(quantize: str | None, gguf_type: str | None) -> dict[str, str]:
    if gguf_type:
        return {"token_embd": "Q8_0", "output": "Q8_0", "attn": gguf_type, "ffn": gguf_type}
    if quantize is None:
        return {"token_embd": "F32", "output": "F32", "attn": "F32", "ffn": "F32"}
    from etsdk import WeightFormat

    fmt = WeightFormat.parse(quantize)
    kind = "Q8_0" if fmt.bits == 8 else "Q4_1" if fmt.with_min else "Q4_0"
    return {"token_embd": "Q8_0", "output": "Q8_0", "attn": kind, "ffn": kind}


def _xnnpack_program(model: Any, T: int, S: int, path: Path) -> Any:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    wrapper = _SelfPositioned(model, S).eval()
    exported = {}
    for name, rows in (("prefill", T), ("decode", 1)):
        example = (torch.zeros(1, rows, dtype=torch.long), torch.arange(rows), causal_mask(0, rows, rows, S))
        exported[name] = torch.export.export(wrapper, example, strict=True)
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    path.write_bytes(edge.to_executorch().buffer)
    return Runtime.get().load_program(path)


def _time(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _weight_matrices(model: Any) -> list[torch.Tensor]:
    seen: set[int] = set()
    out = []
    for p in model.parameters():
        if p.dim() == 2 and p.data_ptr() not in seen:  # tied embeddings counted once
            seen.add(p.data_ptr())
            out.append(p.detach())
    return out


class _WeightReadLimit:
    """Time to read the model's weight bytes once with the fastest kernel at hand (same process, same run)."""

    def __init__(self, model: Any) -> None:
        self.weights = _weight_matrices(model)
        self.nbytes = sum(w.numel() * w.element_size() for w in self.weights)
        columns = model.config.get_text_config().hidden_size
        flat = torch.empty(self.nbytes // 4 // columns * columns, dtype=torch.float32)
        offset = 0
        for w in self.weights:  # real values: untouched pages would read the shared zero page, not memory
            n = min(w.numel(), flat.numel() - offset)
            flat[offset : offset + n] = w.reshape(-1)[:n].float()
            offset += n
        self.matrix = flat.view(-1, columns)
        self.vector = torch.randn(columns)
        self.inputs = {c: torch.randn(1, c) for c in {w.shape[1] for w in self.weights}}

    def mv(self) -> None:
        torch.mv(self.matrix, self.vector)

    def linear(self) -> None:
        for w in self.weights:
            torch.nn.functional.linear(self.inputs[w.shape[1]], w)

    def sum(self) -> None:
        self.matrix.sum()


class _Busy:
    """One competing busy process (a Python busy loop) while the block runs."""

    def __enter__(self) -> _Busy:
        self.process = subprocess.Popen([sys.executable, "-S", "-c", "while True:\n    pass\n"])
        time.sleep(0.3)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.process.kill()
        self.process.wait()
        # let load-following code see a quiet window before the next quiet measurement (etsdk-aoti's team size
        # follows the load on its cores, measured over >= 0.1 s windows, so it lags the change by about that much)
        time.sleep(0.3)


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _traffic_counters() -> tuple[bool, str]:
    """Whether ``perf`` can count LLC load misses of this process here (and why not)."""
    if shutil.which("perf") is None:
        return False, "perf is not installed"
    probe = subprocess.run(["perf", "stat", "-x,", "-e", "LLC-load-misses", "true"], capture_output=True, text=True)
    if probe.returncode != 0 or "not supported" in probe.stderr or "<not counted>" in probe.stderr:
        return False, "no hardware cache counters here (virtual machine or perf_event_paranoid)"
    return True, "perf LLC-load-misses"


def _llc_misses(fn: Any) -> int | None:
    """LLC load misses of this process while ``fn`` runs (perf attached to our pid), or None."""
    with tempfile.NamedTemporaryFile("r", suffix=".csv") as out:
        perf = subprocess.Popen(["perf", "stat", "-x,", "-e", "LLC-load-misses", "-p", str(os.getpid()), "-o", out.name])
        time.sleep(0.2)
        try:
            fn()
        finally:
            perf.send_signal(2)
            perf.wait()
        for line in out.read().splitlines():
            fields = line.split(",")
            if len(fields) > 2 and "LLC-load-misses" in line and fields[0].strip().isdigit():
                return int(fields[0])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a transformers model directory (default: embedded model)")
    parser.add_argument("--shape", choices=SHAPES, default="default", help="embedded model when no --model is given")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--prefill", type=int, default=32, help="T: prompt length = tokens per prefill call")
    parser.add_argument("--context", type=int, default=256, help="S: cache rows")
    parser.add_argument("--new", type=int, default=32, help="decode steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) first (default: leave it)")
    parser.add_argument("--contended", action="store_true", help="also run every path beside one busy process")
    parser.add_argument("--no-xnnpack", action="store_true", help="skip the XNNPACK peer (its export is slow)")
    parser.add_argument("--quantize", default=None, metavar="FORMAT", help="quantized weights (int8, int4, int4:64, ...)")
    parser.add_argument("--gguf", default=None, metavar="TYPE", help="export a GGUF file of the model (Q8_0, Q4_0, Q4_1)")
    parser.add_argument("--weights-dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="the etsdk program's weight dtype (16-bit: widened to float32 where used)")
    parser.add_argument("--llama-cpp", action="store_true", help="add llama.cpp on a GGUF file of the same weights")
    parser.add_argument("--tail", type=int, default=0, metavar="N",
                        help="after decoding, time a prefill of N more tokens (a next turn) on etsdk and llama.cpp")
    parser.add_argument(
        "--cpu-target", default=None, metavar="NAME",
        help="compile the etsdk programs' AOTInductor code for this CPU target (x86-64-v3: AVX2, with ETSDK_AOTI_ISA=avx2 "
        "the whole program runs at the AVX2 level); default: this host",
    )
    parser.add_argument("--decode-batch", type=int, default=0, metavar="B",
                        help="also export decode_batch over B conversations and time one call against B decode steps")
    parser.add_argument("--rows", default=None, metavar="K,...",
                        help="also time one prefill call over K rows against K decode steps, for each K (<= T)")
    parser.add_argument("--workdir", default=None, help="keep the exported programs here and reuse them for the same "
                        "--model/--shape/sizes (a 135M-parameter AOTI export takes minutes; delete the directory "
                        "after changing the code)")
    parser.add_argument("--smoke", action="store_true", help="1 layer, hidden 64, vocab 256, T=4, S=16, 4 steps, "
                        "one round, --rows 1,2, no XNNPACK peer: checks the script, not the figures")
    args = parser.parse_args()
    if args.smoke:
        args.hidden, args.layers, args.vocab = 64, 1, 256
        args.prefill, args.context, args.new, args.rounds = 4, 16, 4, 1
        args.no_xnnpack = True  # a slow optional peer: its keys stay, null
    if args.smoke and args.tail:
        args.tail = 3
    if args.smoke and args.rows is None:
        args.rows = "1,2"
    try:
        rows = sorted({int(k) for k in args.rows.split(",")}) if args.rows else []
    except ValueError:
        parser.error(f"--rows takes row counts separated by commas, found {args.rows!r}")
    if rows and not 1 <= rows[0] <= rows[-1] <= args.prefill:
        parser.error(f"--rows: every K must be 1..T ({args.prefill}), found {args.rows}")
    if args.smoke and not args.decode_batch:
        args.decode_batch = 2
    if args.decode_batch and args.decode_batch < 2:
        parser.error(f"--decode-batch must be 2 or more (or 0: none), found {args.decode_batch}")
    if rows and 2 * args.prefill > args.context:  # the prompt's T rows, then a prefill call's T rows after them
        parser.error(f"--rows needs two prefill calls' rows in the context: 2 x T ({args.prefill}) > S ({args.context})")
    T, S = args.prefill, args.context
    if T + args.new + 1 + args.tail > S:
        parser.error("prefill + new (+ tail) must fit the context")
    if args.quantize and args.gguf:
        parser.error("--quantize and --gguf are two ways to quantize: give one")
    narrow = args.weights_dtype != "float32"
    if narrow and (args.quantize or args.gguf):
        parser.error("--weights-dtype keeps 16-bit weights unquantized: give it without --quantize / --gguf")
    if args.threads:
        torch.set_num_threads(args.threads)
    from etsdk import QuantizationPlan

    model = _model(args)
    params = sum(p.numel() for p in model.parameters())
    limit = _WeightReadLimit(model)
    plan = QuantizationPlan.for_format(args.quantize) if args.quantize else None
    if args.gguf:
        plan = QuantizationPlan.for_format({"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1"}[args.gguf], embedding="q8_0", head="q8_0")
    read_bytes = _quantized_bytes(model, plan) if plan is not None else limit.nbytes // 2 if narrow else limit.nbytes
    narrowed: Any = None
    if narrow:
        import copy

        from etsdk import keep_16bit_weights

        narrowed = copy.deepcopy(model).to(getattr(torch, args.weights_dtype))
        keep_16bit_weights(narrowed)
    print(f"model: {type(model).__name__}, {params / 1e6:.1f}M parameters ({limit.nbytes / 1e6:.0f} MB of weight "
          f"matrices{f', {read_bytes / 1e6:.0f} MB quantized' if plan else ''}{f', {args.weights_dtype}' if narrow else ''}), T={T}, S={S}, threads "
          f"{torch.get_num_threads()}", file=sys.stderr)
    prompt = torch.randint(0, model.config.vocab_size, (T,), generator=torch.Generator().manual_seed(0)).tolist()
    counters_ok, counters_why = _traffic_counters()

    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.workdir) if args.workdir else Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        pte = tmp / "model.pte"
        # a workdir's programs are reused only for the same model and sizes (else they are exported again)
        stamp = json.dumps({k: getattr(args, k) for k in ("model", "shape", "hidden", "layers", "vocab", "prefill", "context", "quantize", "gguf", "weights_dtype", "cpu_target", "decode_batch")})
        reuse = bool(args.workdir) and (tmp / "programs.json").is_file() and (tmp / "programs.json").read_text() == stamp
        if not reuse:
            for stale in ("model.pte", "float.pte", "xnnpack.pte", "model.gguf"):
                (tmp / stale).unlink(missing_ok=True)
        gguf_path = tmp / "model.gguf"
        aoti_options = {"EtsdkAotiBackend": {"device": "cpu", **({"cpu_target": args.cpu_target} if args.cpu_target else {})}}
        if args.gguf or args.llama_cpp:
            from etsdk_hf_static.exporting.tiny import write_llama_gguf

            if not (reuse and gguf_path.is_file()):
                types = _gguf_types(args.quantize, args.gguf)
                if narrow:
                    types = dict.fromkeys(types, {"bfloat16": "BF16", "float16": "F16"}[args.weights_dtype])
                write_llama_gguf(model, gguf_path, types=types)
        if not (reuse and pte.is_file()):
            import copy

            source: Any = str(gguf_path) if args.gguf else copy.deepcopy(model) if plan is not None else model  # quantized in place
            source = narrowed if narrow else source
            export(source, pte, backend="aoti", prefill_length=T, context_length=S, quantization=None if args.gguf else plan,
                   partitioner_options=aoti_options, decode_batch=args.decode_batch or None, quiet=True)
        runner = HfStaticRunner.from_file(pte)
        float_runner = None
        if plan is not None or narrow:
            float_pte = tmp / "float.pte"
            if not (reuse and float_pte.is_file()):
                export(model, float_pte, backend="aoti", prefill_length=T, context_length=S,
                       partitioner_options=aoti_options, quiet=True)
            float_runner = HfStaticRunner.from_file(float_pte)
        eager_model = narrowed if narrow else _torchao(model, args.quantize or (args.gguf and "int4"), dynamic=False)
        eager = StaticCausalLM(eager_model, S, full_logits=False).eval()  # what the programs compute: the last row's
        eager_counters = [b for n, b in eager.named_buffers() if n.startswith("cumulative_length")]
        peers: dict[str, Any] = {}

        tails: dict[str, list[float]] = {"etsdk": [], "llama_cpp": []}
        tail_tokens = torch.randint(0, model.config.vocab_size, (args.tail,), generator=torch.Generator().manual_seed(1)).tolist()

        def run_etsdk(steps: int, which: Any = None) -> tuple[float, float, float]:
            conversation = (which or runner).new_conversation()
            faults = _minor_faults()
            result = conversation.generate(prompt, max_new_tokens=steps + 1, stop_at_eos=False)
            if tail_tokens and which is None:  # the next turn's prompt: its calls, up to the logits of its last row
                tails["etsdk"].append(conversation.generate(tail_tokens, max_new_tokens=1, stop_at_eos=False).prefill_ms)
            return result.prefill_ms, result.decode_tokens_per_s, (_minor_faults() - faults) / (steps + 1)

        def run_eager(steps: int) -> tuple[float, float, float]:
            with torch.no_grad():
                for c in eager_counters:
                    c.fill_(0)
                prefill_s = _time(lambda: eager(torch.tensor([prompt]), torch.arange(T), causal_mask(0, T, T, S)))
                pos, token = T, 1

                def decode() -> None:
                    nonlocal pos, token
                    for _ in range(steps):
                        for c in eager_counters:
                            c.fill_(pos)
                        logits = eager(torch.tensor([[token]]), torch.tensor([pos]), causal_mask(pos, 1, 1, S))
                        token, pos = int(logits[0, -1].argmax()), pos + 1

                faults = _minor_faults()
                seconds = _time(decode)
                return prefill_s * 1e3, steps / seconds, (_minor_faults() - faults) / steps

        peers["etsdk"] = run_etsdk
        if float_runner is not None:
            peers["etsdk_float"] = lambda steps: run_etsdk(steps, float_runner)
        peers["eager"] = run_eager
        if not args.no_xnnpack:
            xnn_path = tmp / "xnnpack.pte"
            if reuse and xnn_path.is_file():
                from executorch.runtime import Runtime

                xnn = Runtime.get().load_program(xnn_path)
            else:
                xnn = _xnnpack_program(_torchao(model, args.quantize or (args.gguf and "int4"), dynamic=True), T, S, xnn_path)
            xnn_prefill, xnn_decode = xnn.load_method("prefill"), xnn.load_method("decode")

            def run_xnnpack(steps: int) -> tuple[float, float, float]:
                prefill_s = _time(lambda: xnn_prefill.execute([torch.tensor([prompt]), torch.arange(T), causal_mask(0, T, T, S)]))
                pos, token = T, 1

                def decode() -> None:
                    nonlocal pos, token
                    for _ in range(steps):
                        (logits,) = xnn_decode.execute([torch.tensor([[token]]), torch.tensor([pos]), causal_mask(pos, 1, 1, S)])
                        token, pos = int(logits[0, -1].argmax()), pos + 1

                faults = _minor_faults()
                seconds = _time(decode)
                return prefill_s * 1e3, steps / seconds, (_minor_faults() - faults) / steps

            peers["xnnpack"] = run_xnnpack
        if args.llama_cpp:
            import numpy as np
            from llama_cpp import Llama

            llm = Llama(str(gguf_path), n_ctx=S, n_batch=T, n_threads=torch.get_num_threads(), logits_all=False, verbose=False)
            vocab = model.config.vocab_size

            def last_logits() -> Any:
                # the context's own logits of the last token, without a copy (Llama.eval_logits converts every
                # row so far to Python lists: 12 MB of lists per step at this vocabulary)
                return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))

            def run_llama_cpp(steps: int) -> tuple[float, float, float]:
                llm.reset()
                prefill_s = _time(lambda: llm.eval(prompt))
                token = int(np.argmax(last_logits()))

                def decode() -> None:
                    nonlocal token
                    for _ in range(steps):
                        llm.eval([token])
                        token = int(np.argmax(last_logits()))

                faults = _minor_faults()
                seconds = _time(decode)
                if tail_tokens:
                    llm.eval([token])  # the last chosen token, as etsdk's conversation holds it
                    tails["llama_cpp"].append(_time(lambda: llm.eval(tail_tokens)) * 1e3)
                return prefill_s * 1e3, steps / seconds, (_minor_faults() - faults) / steps

            peers["llama_cpp"] = run_llama_cpp
        if args.workdir:
            (tmp / "programs.json").write_text(stamp)

        def run_limit(steps: int) -> tuple[float, float, float]:
            reads = max(4, steps // 4)
            mv = _time(lambda: [limit.mv() for _ in range(reads)]) / reads
            linear = _time(lambda: [limit.linear() for _ in range(reads)]) / reads
            total = _time(lambda: [limit.sum() for _ in range(reads)]) / reads
            return 0.0, 1.0 / min(mv, linear, total), 0.0

        peers["limit"] = run_limit

        def breakdown() -> tuple[float, float]:
            conversation = runner.new_conversation()
            conversation.generate(prompt, max_new_tokens=1, stop_at_eos=False)
            holder = getattr(conversation, "_inputs", None) or runner._inputs  # the conversation owns them since 3820fcb
            inputs = holder["decode"].fill(Step("decode", T, (1,), 1))
            whole = _time(lambda: [conversation.run_step(Step("decode", T + i, (1,), 1)) for i in range(args.new)])
            run = _time(lambda: [runner.program.run("decode", *inputs, session=conversation.session) for _ in range(args.new)])
            return whole / args.new * 1e6, run / args.new * 1e6

        by_rows: dict[int, list[tuple[float, float]]] = {k: [] for k in rows}

        def run_rows() -> None:
            """One prefill call over k rows vs k decode steps after the prompt, each rewound after it."""
            conversation = runner.new_conversation()
            conversation.generate(prompt, max_new_tokens=1, stop_at_eos=False)
            start, pending, kept = conversation.position, tuple(conversation.pending), len(conversation.tokens)
            fresh = torch.randint(0, model.config.vocab_size, (T,), generator=torch.Generator().manual_seed(2)).tolist()
            ids = pending + tuple(fresh)
            for k in rows:
                chunk, singles = Step("prefill", start, ids[:k], T), [Step("decode", start + i, (ids[i],), 1) for i in range(k)]
                call = _time(lambda step=chunk: conversation.run_step(step))
                conversation.rewind(len(conversation.tokens) - kept)
                steps = _time(lambda each=singles: [conversation.run_step(step) for step in each])
                conversation.rewind(len(conversation.tokens) - kept)
                by_rows[k].append((call * 1e3, steps * 1e3))

        by_batch: list[tuple[float, float]] = []

        def run_batch() -> None:
            """One decode_batch call for B conversations (each after the prompt) vs their B decode steps in turn; both
            write the same row of each conversation (a step names its position), so nothing needs rewinding."""
            first = runner.new_conversation()
            first.generate(prompt, max_new_tokens=1, stop_at_eos=False)
            conversations = [first, *(first.fork() for _ in range(args.decode_batch - 1))]
            steps = [Step("decode", c.position, (c.pending[0],), 1) for c in conversations]
            call = _time(lambda: run_decode_batch(conversations, steps, []))
            singles = _time(lambda: [c.run_step(step) for c, step in zip(conversations, steps)])
            by_batch.append((call * 1e3, singles * 1e3))

        for fn in peers.values():  # warm-up
            fn(2)
        if args.decode_batch:  # warm-up
            run_batch()
            by_batch.clear()
        if rows:  # warm-up: its figures are dropped
            run_rows()
            for figures in by_rows.values():
                figures.clear()
        quiet: dict[str, list[tuple[float, float, float]]] = {name: [] for name in peers}
        contended: dict[str, list[tuple[float, float, float]]] = {name: [] for name in peers}
        splits = []
        loads = [os.getloadavg()[0]]
        for r in range(args.rounds):
            order = list(peers) if r % 2 == 0 else list(reversed(peers))
            for name in order:
                quiet[name].append(peers[name](args.new))
                if args.contended:
                    with _Busy():
                        contended[name].append(peers[name](args.new))
            splits.append(breakdown())
            if rows:
                run_rows()
            if args.decode_batch:
                run_batch()
            loads.append(os.getloadavg()[0])
            line = ", ".join(f"{n} {quiet[n][-1][1]:.1f}" + (f"/{contended[n][-1][1]:.1f}" if args.contended else "") for n in peers)
            print(f"round {r} (tokens/s{', quiet/contended' if args.contended else ''}): {line}", file=sys.stderr)
        traffic: dict[str, float | None] = {}
        if counters_ok:
            for name, fn in (("etsdk", lambda: run_etsdk(args.new)), ("eager", lambda: run_eager(args.new))):
                misses = _llc_misses(fn)
                traffic[name] = misses * 64 / args.new if misses is not None else None

    out: dict[str, Any] = {
        "parameters": params, "weight_bytes": read_bytes, "float_weight_bytes": limit.nbytes,
        "quantize": args.quantize, "gguf": args.gguf, "weights_dtype": args.weights_dtype, "prefill_length": T, "context_length": S,
        "new_tokens": args.new, "threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "loadavg_1min_per_round": [round(x, 2) for x in loads],
    }
    float_steps = statistics.median(d for _, d, _ in quiet["limit"])
    out["limit_bytes_per_s"] = float_steps * limit.nbytes
    limit_steps = out["limit_bytes_per_s"] / read_bytes  # the same bytes per second over the packed weights
    out["limit_steps_per_s"] = limit_steps
    for name in PATHS:
        if name not in peers:  # not run: the same keys, null
            for key in ("tokens_per_s", "prefill_ms", "fraction_of_limit", "minor_faults_per_step"):
                out[f"{name}_{key}"] = None
            if args.contended:
                out[f"{name}_contended_tokens_per_s"] = out[f"{name}_contended_over_quiet"] = None
            continue
        out[f"{name}_tokens_per_s"] = statistics.median(d for _, d, _ in quiet[name])
        out[f"{name}_prefill_ms"] = statistics.median(p for p, _, _ in quiet[name])
        out[f"{name}_fraction_of_limit"] = out[f"{name}_tokens_per_s"] / limit_steps
        out[f"{name}_minor_faults_per_step"] = statistics.median(f for _, _, f in quiet[name])
        if args.contended:
            out[f"{name}_contended_tokens_per_s"] = statistics.median(d for _, d, _ in contended[name])
            out[f"{name}_contended_over_quiet"] = out[f"{name}_contended_tokens_per_s"] / out[f"{name}_tokens_per_s"]
        if name in traffic:
            out[f"{name}_llc_miss_bytes_per_step"] = traffic[name]
    if args.contended:
        out["limit_contended_steps_per_s"] = statistics.median(d for _, d, _ in contended["limit"])
    out["traffic_counters"] = counters_why
    out["etsdk_runner_us_per_step"] = statistics.median(w for w, _ in splits)
    out["etsdk_program_run_us_per_step"] = statistics.median(r for _, r in splits)
    out["etsdk_vs_eager_decode"] = out["etsdk_tokens_per_s"] / out["eager_tokens_per_s"]
    xnnpack = out["xnnpack_tokens_per_s"]
    out["etsdk_vs_xnnpack_decode"] = out["etsdk_tokens_per_s"] / xnnpack if xnnpack is not None else None
    floating = out["etsdk_float_tokens_per_s"]
    out["etsdk_vs_etsdk_float_decode"] = out["etsdk_tokens_per_s"] / floating if floating is not None else None
    llama = out["llama_cpp_tokens_per_s"]
    out["etsdk_vs_llama_cpp_decode"] = out["etsdk_tokens_per_s"] / llama if llama is not None else None
    out["rows"] = rows or None
    medians = {k: (statistics.median(c for c, _ in v), statistics.median(d for _, d in v)) for k, v in by_rows.items()}
    out["etsdk_rows_call_ms"] = {str(k): call for k, (call, _) in medians.items()} if rows else None
    out["etsdk_rows_steps_ms"] = {str(k): steps for k, (_, steps) in medians.items()} if rows else None
    out["etsdk_rows_steps_over_call"] = {str(k): steps / call for k, (call, steps) in medians.items()} if rows else None
    out["decode_batch"] = args.decode_batch or None
    batch_call = statistics.median(c for c, _ in by_batch) if by_batch else None
    batch_steps = statistics.median(d for _, d in by_batch) if by_batch else None
    out["etsdk_batch_call_ms"], out["etsdk_batch_steps_ms"] = batch_call, batch_steps
    out["etsdk_batch_steps_over_call"] = batch_steps / batch_call if batch_call and batch_steps else None
    out["tail_tokens"] = args.tail
    for name in ("etsdk", "llama_cpp"):  # the rounds' tails: not the warm-up's (the first), nor the traffic runs'
        runs = tails[name][1 : 1 + args.rounds] if args.tail else []
        out[f"{name}_tail_prefill_ms"] = statistics.median(runs) if runs else None
    both = out["etsdk_tail_prefill_ms"], out["llama_cpp_tail_prefill_ms"]
    out["etsdk_vs_llama_cpp_tail_prefill"] = both[1] / both[0] if None not in both else None
    from etsdk.backend import host_cpu
    from etsdk_aoti.kernels import current_level

    out["cpu"] = host_cpu().describe()  # every figure's machine, and the level etsdk's kernels ran at (ETSDK_AOTI_ISA)
    out["kernel_level"] = current_level().name
    print(f"cpu: {out['cpu']}; etsdk-aoti kernel level: {out['kernel_level']}", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
