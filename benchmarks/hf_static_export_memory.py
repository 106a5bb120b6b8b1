"""Peak RSS of exporting a causal LM as an hf_static program through etsdk-aoti (both methods), by stage.

The model (embedded Llama-style, random weights, sized by ``--hidden/--layers/--vocab``) is built first;
the baseline is the process RSS then (model, torch, executorch loaded). Peak RSS is sampled at every export
stage: each progress line the export writes to stderr (``etsdk: ...``, ``etsdk-hf-static: ...``; the stage
after an AOTInductor compile starts right after it), so the report says which stage sets it. Run in a fresh
process per measurement (the peak never goes down).

``--checkpoint float32|bfloat16|float16``: the model is first written as a transformers checkpoint
(safetensors) in that dtype by another process (this one never holds it), and the export reads the directory, as ``etsdk export --model DIR`` does
(weights kept in the checkpoint's dtype, memory-mapped from its file); the baseline is then the process before
loading. Resident memory then counts the checkpoint's mapped file pages (reclaimable page cache) beside the
anonymous memory the export allocates, so ``peak_anon_bytes`` (the largest ``RssAnon`` seen, sampled every 20
ms) is the figure that grows with the model only if something copies it.

Last line: JSON with ``weights_bytes``, ``baseline_rss_bytes``, ``peak_rss_bytes``,
``peak_over_baseline_per_weight``, ``stages`` (stage -> peak RSS bytes when that stage started),
``checkpoint_dtype`` (null without ``--checkpoint``), ``quantize`` (``--quantize FORMAT``: the export quantizes
the linear layers as ``etsdk export --quantize FORMAT`` does; null without), ``meta_trace`` (``--meta-trace``, with
a checkpoint: the export builds the model on the meta device and binds the checkpoint's weights after tracing, as
``etsdk export --meta-trace`` does), ``prefill_backend`` (``--prefill-backend tensorrt``: prefill through
etsdk-tensorrt's ONNX, its engine built at load, decode through etsdk-aoti: ``bytes_written`` then says whether the
two backends store the weights once; default ``aoti``), ``checkpoint_bytes``, ``baseline_anon_bytes``,
``peak_anon_bytes`` and ``peak_anon_over_baseline_per_weight``.

``--shape NAME`` (repeatable: ``smollm2-360m``, ``llama-3.2-1b``, ``llama-3.2-3b``, ``llama-3.1-8b``): a sweep over
real model shapes with random weights. For each shape a checkpoint of ``--checkpoint`` dtype (default bfloat16) is
written tensor by tensor into one safetensors file by another process (built on the meta device: no process ever
holds the model), then exported by a fresh process (``--memory-cap BYTES`` runs that process in a memory cgroup with
that limit, root only), then the program generates ``--generate`` greedy tokens in a third process; the checkpoint
and the program are deleted before the next shape. Each shape's line on stderr gives its figures; the last stdout
line is JSON ``{"shapes": [...]}``: per shape the keys above plus ``shape``, ``parameters``, ``memory_cap_bytes``,
``cgroup_peak_bytes``, ``generated`` (token ids), ``generate_seconds`` and ``rss_target_bytes`` (1.5 GiB + 0.1x the
checkpoint), with ``export_seconds_per_billion_parameters`` across the shapes beside it. Needs free disk for
about 3x the checkpoint of the largest shape (the checkpoint, the export's spooled weights, the program).

Every run's JSON also has ``export_seconds``, ``stage_seconds`` (stage -> seconds after the export started when it
began), ``bytes_written`` (the program's files) and ``peak_rss_over_checkpoint`` (null without a checkpoint).

``--smoke``: a 1-layer model of hidden 128 and vocab 256 (the same export, both methods through AOTInductor,
and the same JSON keys; at this size the ratio is meaningless); with ``--shape``, each shape shrunk to that size.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

# a progress line of the export: "etsdk: tracing 'prefill' (6.7s)", "etsdk-hf-static: loading the model"
_STAGE = re.compile(r"^(etsdk[\w-]*): (.*?)(?: \(\d+(?:\.\d+)?s\))?$")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    """The process's peak resident memory (``VmHWM``; not ``ru_maxrss``, which Linux carries over from the parent
    that forked the process)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


class _AnonPeak:
    """The largest ``RssAnon`` seen while the block runs, sampled every 20 ms on a thread."""

    def __enter__(self) -> _AnonPeak:
        import threading

        self.peak, self.done = _anon(), threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, _anon())

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, _anon())


class _StageRecorder:
    """Stands in for ``sys.stderr``: passes everything through and records, at each progress line, the peak RSS
    and the seconds since the export started."""

    def __init__(self, stream: TextIO, stages: dict[str, int], seconds: dict[str, float]) -> None:
        self.stream, self.stages, self.seconds, self.pending = stream, stages, seconds, ""
        self.started = time.perf_counter()

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            match = _STAGE.match(line)
            if match:
                stage = f"{match.group(1)}: {match.group(2)}"[:80]
                self.stages[stage] = _peak()
                self.seconds[stage] = round(time.perf_counter() - self.started, 2)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@dataclass(frozen=True)
class Shape:
    """A Llama-style model shape (the published configs' sizes; the weights are random)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    def config(self, dtype: str) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            max_position_embeddings=4096, tie_word_embeddings=self.tied, rope_theta=500000.0,
            bos_token_id=1, eos_token_id=2, dtype=dtype,
        )


SHAPES = {
    "smollm2-360m": Shape(960, 2560, 32, 15, 5, 49152, True),  # 362M parameters
    "llama-3.2-1b": Shape(2048, 8192, 16, 32, 8, 128256, True),  # 1.24B
    "llama-3.2-3b": Shape(3072, 8192, 28, 24, 8, 128256, True),  # 3.21B
    "llama-3.1-8b": Shape(4096, 14336, 32, 32, 8, 128256, False),  # 8.03B
}
SMOKE_SHAPE = dict(hidden=128, intermediate=256, layers=1, heads=4, kv_heads=2, vocab=256)
_SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def _model(args: argparse.Namespace) -> Any:
    from etsdk_hf_static.exporting.tiny import tiny_model

    return tiny_model("llama", hidden=args.hidden, layers=args.layers, vocab=args.vocab, heads=16, kv_heads=2, positions=512)


def write_shape_checkpoint(directory: Path, shape: Shape, dtype: str, seed: int = 0) -> int:
    """Write a random-weight checkpoint of ``shape`` as one safetensors file, one tensor at a time; returns the
    parameter count. The model is built on the meta device (names and shapes only) and each tensor is generated
    in chunks of rows, so the writer holds at most one chunk (a real-size checkpoint never exists in memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = shape.config(dtype)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tensors = {name: t for name, t in model.state_dict().items() if not (shape.tied and name == "lm_head.weight")}
    torch_dtype = getattr(torch, dtype)
    size = torch.empty((), dtype=torch_dtype).element_size()
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * size
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    generator = torch.Generator().manual_seed(seed)
    with open(directory / "model.safetensors", "wb") as out:
        out.write(len(encoded).to_bytes(8, "little") + encoded)
        for name, tensor in tensors.items():
            flat = tensor.reshape(tensor.shape[0], -1) if tensor.dim() else tensor.reshape(1, 1)
            step = max(1, (1 << 24) // max(1, flat.shape[1]))
            for start in range(0, flat.shape[0], step):
                rows = min(step, flat.shape[0] - start)
                if name.endswith("norm.weight"):
                    chunk = torch.ones(rows, flat.shape[1])
                else:
                    chunk = torch.randn(rows, flat.shape[1], generator=generator) * 0.02
                out.write(chunk.to(torch_dtype).view(torch.uint8).numpy().tobytes())
    return sum(t.numel() for t in tensors.values())


def _program_bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.suffix in (".pte", ".ptd"))


def measure(args: argparse.Namespace, source: Any, checkpoint_bytes: int | None, output: Path) -> dict[str, Any]:
    """Export ``source`` (a model object or a checkpoint directory) to ``output`` in this process; the figures."""
    from etsdk import QuantizationPlan
    from etsdk_hf_static.exporting.exporter import export

    stages: dict[str, int] = {}
    seconds: dict[str, float] = {}
    if checkpoint_bytes is not None:
        weights = checkpoint_bytes
        from transformers import AutoModelForCausalLM  # noqa: F401 - in the baseline, as the model object path has it
    else:
        weights = sum(p.numel() * p.element_size() for p in source.parameters())
    baseline, baseline_anon = _rss(), _anon()
    print(f"weights {weights / 2**20:.0f} MiB{f' ({args.checkpoint} checkpoint)' if args.checkpoint else ''}, "
          f"baseline RSS {baseline / 2**20:.0f} MiB", file=sys.stderr)
    stderr = sys.stderr
    sys.stderr = recorder = _StageRecorder(stderr, stages, seconds)  # type: ignore[assignment]
    try:
        with _AnonPeak() as anon:
            options: dict[str, dict[str, Any]] = {"EtsdkAotiBackend": {"device": "cpu"}}
            if args.prefill_backend == "tensorrt":  # no TensorRT here: the ONNX is kept and the engine built at load
                options["tensorrt"] = {"device": "cpu", "build": "load"}
            written = export(source, output, backend="aoti", prefill_backend=args.prefill_backend, prefill_length=32,
                             context_length=256, partitioner_options=options, quiet=False,
                             quantization=QuantizationPlan.for_format(args.quantize) if args.quantize else None,
                             meta_trace=args.meta_trace)
    finally:
        sys.stderr = stderr
    elapsed = time.perf_counter() - recorder.started
    peak = _peak()
    return {
        "weights_bytes": weights,
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": peak,
        "peak_over_baseline_per_weight": (peak - baseline) / weights,
        "stages": stages,
        "checkpoint_dtype": args.checkpoint,
        "quantize": args.quantize,
        "meta_trace": args.meta_trace,
        "prefill_backend": args.prefill_backend,
        "checkpoint_bytes": checkpoint_bytes,
        "baseline_anon_bytes": baseline_anon,
        "peak_anon_bytes": anon.peak,
        "peak_anon_over_baseline_per_weight": (anon.peak - baseline_anon) / weights,
        "export_seconds": round(elapsed, 2),
        "stage_seconds": seconds,
        "bytes_written": _program_bytes(written),
        "peak_rss_over_checkpoint": peak / checkpoint_bytes if checkpoint_bytes else None,
    }


def _last_json(result: subprocess.CompletedProcess[str], what: str) -> Any:
    if result.returncode != 0:
        raise SystemExit(f"{what} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _generate(program: Path, tokens: int) -> tuple[list[int], float]:
    code = (
        "import json, sys, time\n"
        "from etsdk_hf_static.runtime.runner import HfStaticRunner\n"
        "runner = HfStaticRunner.from_file(sys.argv[1])\n"
        "start = time.perf_counter()\n"
        "vocab = runner.metadata.vocab_size\n"
        f"ids = runner.generate([1, 17 % vocab, 400 % vocab, 9000 % vocab], max_new_tokens={tokens}, stop_at_eos=False).token_ids\n"
        "print(json.dumps([list(ids), time.perf_counter() - start]))\n"
    )
    ids, seconds = _last_json(subprocess.run([sys.executable, "-c", code, str(program)], capture_output=True, text=True),
                              "generating")
    return ids, seconds


def sweep(args: argparse.Namespace) -> None:
    """``--shape``: per shape, write a checkpoint, export it in a fresh (optionally capped) process, generate."""
    import shutil

    runs = []
    parent = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="etsdk-shapes-"))
    for name in args.shape:
        work = parent / name
        shutil.rmtree(work, ignore_errors=True)
        try:
            checkpoint, program = work / "checkpoint", work / "model.pte"
            started = time.perf_counter()
            wrote = _last_json(subprocess.run(
                [sys.executable, __file__, "--write-shape", name, "--write-checkpoint", str(checkpoint),
                 "--checkpoint", args.checkpoint, *(["--smoke"] if args.smoke else [])],
                capture_output=True, text=True), "writing the checkpoint")
            print(f"{name}: {wrote['parameters'] / 1e9:.2f}B parameters, {args.checkpoint} checkpoint written in "
                  f"{time.perf_counter() - started:.0f}s", file=sys.stderr)
            command = [sys.executable, __file__, "--export-checkpoint", str(checkpoint), "--output", str(program),
                       "--checkpoint", args.checkpoint, *(["--quantize", args.quantize] if args.quantize else []),
                       *(["--meta-trace"] if args.meta_trace else []), "--prefill-backend", args.prefill_backend]
            group = None
            if args.memory_cap:
                from etsdk.testing import memory_cgroup

                group = memory_cgroup(f"etsdk-bench-{os.getpid()}-{name}", args.memory_cap)
                if group is None:
                    raise SystemExit("--memory-cap needs root and a writable memory cgroup")
                command = group.command(command)
            try:
                result = subprocess.run(command, stdout=subprocess.PIPE, stderr=None if args.verbose else subprocess.PIPE,
                                        text=True)
                figures = _last_json(result, f"exporting {name}" + (f" under a {args.memory_cap}-byte cap" if group else ""))
                cgroup_peak = group.peak() if group else None
            finally:
                if group is not None:
                    group.remove()
            shutil.rmtree(checkpoint)  # before generating: the disk holds one model at a time
            # a TensorRT prefill needs TensorRT to run: the program is only measured
            runs_here = args.generate and args.prefill_backend == "aoti"
            ids, generate_seconds = _generate(program, args.generate) if runs_here else ([], None)
            figures.update(
                shape=name, parameters=wrote["parameters"], memory_cap_bytes=args.memory_cap, cgroup_peak_bytes=cgroup_peak,
                generated=ids, generate_seconds=generate_seconds,
                rss_target_bytes=int(1.5 * 2**30 + 0.1 * figures["checkpoint_bytes"]),
            )
            runs.append(figures)
            print(
                f"{name}: checkpoint {figures['checkpoint_bytes'] / 2**30:.2f} GiB, export {figures['export_seconds']:.0f}s, "
                f"peak RSS {figures['peak_rss_bytes'] / 2**30:.2f} GiB (target {figures['rss_target_bytes'] / 2**30:.2f}), "
                f"peak anonymous {figures['peak_anon_bytes'] / 2**30:.2f} GiB, wrote {figures['bytes_written'] / 2**30:.2f} GiB"
                + (f", cgroup peak {cgroup_peak / 2**30:.2f} GiB of {args.memory_cap / 2**30:.2f}" if cgroup_peak else "")
                + (f", generated {ids}" if ids else ""),
                file=sys.stderr,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if not args.workdir:
        shutil.rmtree(parent, ignore_errors=True)
    print(json.dumps({
        "shapes": runs,
        "export_seconds_per_billion_parameters": [r["export_seconds"] / (r["parameters"] / 1e9) for r in runs],
    }))


def _bytes(text: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--checkpoint", choices=("float32", "bfloat16", "float16"), default=None,
                        help="export from a safetensors checkpoint of this dtype (default: from the model object; "
                             "with --shape: bfloat16)")
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES), default=[],
                        help="a real model shape to sweep over (repeatable)")
    parser.add_argument("--quantize", default=None, metavar="FORMAT",
                        help="with the export, quantize the linear layers to FORMAT (int8, int4:g32, ...) and the embedding "
                             "and head to int8, as etsdk export --quantize FORMAT does")
    parser.add_argument("--meta-trace", action="store_true",
                        help="with --checkpoint or --shape: build the model on the meta device, bind the checkpoint's "
                             "weights after tracing (etsdk export --meta-trace)")
    parser.add_argument("--prefill-backend", choices=("aoti", "tensorrt"), default="aoti",
                        help="the prefill method's backend (tensorrt: its ONNX kept, the engine built at load; decode "
                             "stays on aoti)")
    parser.add_argument("--memory-cap", type=_bytes, default=None,
                        help="with --shape: export inside a memory cgroup of this many bytes (e.g. 4GiB; needs root)")
    parser.add_argument("--generate", type=int, default=4, help="with --shape: greedy tokens the program generates (0: none)")
    parser.add_argument("--workdir", default=None, help="with --shape: where checkpoints and programs are written")
    parser.add_argument("--verbose", action="store_true", help="with --shape: show the exports' progress")
    parser.add_argument("--smoke", action="store_true", help="1 layer, hidden 128, vocab 256")
    parser.add_argument("--write-checkpoint", default=None, help=argparse.SUPPRESS)  # the --checkpoint writer process
    parser.add_argument("--write-shape", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--export-checkpoint", default=None, help=argparse.SUPPRESS)  # a --shape export process
    parser.add_argument("--output", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.meta_trace and not (args.checkpoint or args.shape or args.export_checkpoint):
        parser.error("--meta-trace builds the model from a checkpoint: give --checkpoint DTYPE or --shape NAME")
    if args.shape:
        args.checkpoint = args.checkpoint or "bfloat16"
        sweep(args)
        return
    if args.smoke:
        args.hidden, args.layers, args.vocab = 128, 1, 256
    if args.write_shape:
        shape = SHAPES[args.write_shape]
        if args.smoke:
            shape = Shape(**SMOKE_SHAPE, tied=shape.tied)
        print(json.dumps({"parameters": write_shape_checkpoint(Path(args.write_checkpoint), shape, args.checkpoint)}))
        return
    if args.write_checkpoint:
        import torch

        _model(args).to(getattr(torch, args.checkpoint)).save_pretrained(args.write_checkpoint)
        return
    if args.export_checkpoint:
        source = Path(args.export_checkpoint)
        print(json.dumps(measure(args, source, sum(p.stat().st_size for p in source.glob("*.safetensors")), Path(args.output))))
        return

    with tempfile.TemporaryDirectory() as tmp:
        source: Any
        checkpoint_bytes = None
        if args.checkpoint:
            # written by another process: this one never holds the model (its freed pages would hide what the
            # export allocates, and its peak would set ru_maxrss)
            source = Path(tmp) / "checkpoint"
            subprocess.run([sys.executable, __file__, "--write-checkpoint", str(source), "--checkpoint", args.checkpoint,
                            "--hidden", str(args.hidden), "--layers", str(args.layers), "--vocab", str(args.vocab)], check=True)
            checkpoint_bytes = sum(p.stat().st_size for p in source.glob("*.safetensors"))
        else:
            source = _model(args)
        print(json.dumps(measure(args, source, checkpoint_bytes, Path(tmp) / "model.pte")))


if __name__ == "__main__":
    main()
