"""A GGUF file as a transformers causal LM whose Q8_0 / Q4_0 / Q4_1 weights stay the file's own blocks.

:func:`load_gguf` reads the file with the ``gguf`` package (the format's own
reader), builds the model from the configuration transformers derives from the
file's metadata, and fills it from the file's tensors:

* a Q8_0, Q4_0 or Q4_1 weight of a linear layer or an embedding becomes a
  :class:`etsdk.quantize_model`-style quantized layer holding the file's blocks
  byte for byte (no dequantize-requantize loss: the program computes what
  llama.cpp computes from the same bytes, up to float rounding). llama.cpp
  stores Llama's query and key projections with their rows permuted for its
  rotary layout; those rows are put back in transformers' order, each row's
  blocks unchanged;
* float tensors (norms, biases) are read as float32;
* any other tensor type (Q6_K, Q5_0, ...) is refused naming the type and the
  tensors, unless ``allow_requantize``: then it is dequantized to float32, one
  line on stderr says so, and ``--quantize`` (if given) quantizes it again.

The tokenizer and chat template the file carries are converted by transformers
(``AutoTokenizer.from_pretrained(..., gguf_file=...)``). Needs ``pip install
gguf`` (the ``etsdk-hf-static[gguf]`` extra); without it the export says so in
one line.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etsdk import ExportError
from etsdk.backend import WeightFormat

__all__ = ["GgufModel", "KEPT_TYPES", "load_gguf"]

#: GGUF tensor types kept as they are (their etsdk weight format).
KEPT_TYPES = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1"}
_FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass
class GgufModel:
    """What :func:`load_gguf` built: the model, its tokenizer (None when transformers could not convert it),
    and per GGUF tensor type how many tensors were kept as blocks or dequantized."""

    model: Any
    tokenizer: Any
    kept: dict[str, int] = field(default_factory=dict)
    dequantized: dict[str, int] = field(default_factory=dict)


def _say(text: str, quiet: bool) -> None:
    if not quiet:
        print(f"etsdk-hf-static: {text}", file=sys.stderr, flush=True)


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ExportError(
            "reading a GGUF file needs the gguf package: pip install gguf (or pip install 'etsdk-hf-static[gguf]')"
        ) from None
    return gguf


def _llama_rows(blocks: Any, heads: int) -> Any:
    """Undo llama.cpp's rotary row permutation of a query / key projection with ``heads`` heads (what
    transformers' GGUF loader does to the dequantized weight), on rows only: each row's blocks are unchanged."""
    half = blocks.shape[0] // heads // 2
    return blocks.reshape(heads, half, 2, *blocks.shape[1:]).swapaxes(2, 1).reshape(blocks.shape)


def load_gguf(path: Path, *, allow_requantize: bool = False, quiet: bool = False) -> GgufModel:
    """The model (and tokenizer) of the GGUF file ``path``; raises :class:`etsdk.ExportError` on anything it
    cannot represent exactly (see the module docstring)."""
    gguf = _import_gguf()
    import numpy as np
    import torch
    from etsdk import QuantizedEmbedding, QuantizedLinear
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, KeyError) as exc:
        raise ExportError(f"{path} is not a readable GGUF file: {type(exc).__name__}: {exc}") from None
    architecture = str(reader.fields["general.architecture"].contents()) if "general.architecture" in reader.fields else "?"
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:  # noqa: BLE001 - transformers' GGUF metadata conversion: one clear error
        raise ExportError(
            f"transformers cannot build a model configuration from {path.name} (architecture {architecture}): "
            f"{type(exc).__name__}: {exc}"
        ) from None
    _say(f"building {config.model_type} from {path.name} ({len(reader.tensors)} tensors)", quiet)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    processor_class = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
    processor = processor_class(config=config.to_dict())
    permutes_rows = processor_class.__name__ == "LlamaTensorProcessor"
    exact = processor_class is TensorProcessor or permutes_rows  # a processor that changes values cannot keep blocks
    names = get_gguf_hf_weights_map(model, processor)
    loaded: set[str] = set()
    result = GgufModel(model, None)
    refused: dict[str, list[str]] = {}
    params = dict(model.named_parameters(remove_duplicate=False))
    text_config = config.get_text_config()
    heads = text_config.num_attention_heads
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    quantized: dict[str, Any] = {}  # HF module name -> its quantized layer (a tied head reuses the embedding's)
    for tensor in reader.tensors:
        hf_name = names.get(tensor.name)
        type_name = tensor.tensor_type.name
        if hf_name is None or hf_name not in params:
            raise ExportError(f"{path.name}: tensor '{tensor.name}' ({type_name}) has no place in {type(model).__name__}")
        module_name, _, leaf = hf_name.rpartition(".")
        module = model.get_submodule(module_name)
        blockwise = (
            type_name in KEPT_TYPES
            and leaf == "weight"
            and type(module) in (torch.nn.Linear, torch.nn.Embedding)
            and len(tensor.data.shape) == 2
        )
        if blockwise and exact:
            blocks = np.asarray(tensor.data)
            if permutes_rows and (".attn_q." in tensor.name or ".attn_k." in tensor.name):
                blocks = _llama_rows(blocks, heads if ".attn_q." in tensor.name else kv_heads)
            with warnings.catch_warnings():  # the file's mapping is read-only, and nothing writes to it
                warnings.simplefilter("ignore", UserWarning)
                stored = {"blocks": torch.from_numpy(np.ascontiguousarray(blocks))}
            fmt = WeightFormat.parse(KEPT_TYPES[type_name])
            if isinstance(module, torch.nn.Embedding):
                layer: Any = QuantizedEmbedding(fmt, stored, torch.float32, getattr(module, "embed_scale", None))
            else:
                layer = QuantizedLinear(fmt, stored, module.bias)
            if tuple(layer.qdata.shape[:1]) + (layer.columns,) != tuple(module.weight.shape):
                raise ExportError(
                    f"{path.name}: tensor '{tensor.name}' is [{layer.rows}, {layer.columns}], "
                    f"{hf_name} is {list(module.weight.shape)}"
                )
            quantized[module_name] = layer
            result.kept[type_name] = result.kept.get(type_name, 0) + 1
            loaded.add(hf_name)
            continue
        if type_name not in _FLOAT_TYPES and not allow_requantize:
            refused.setdefault(type_name, []).append(tensor.name)
            continue
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        values = processor.process(weights=values, name=tensor.name).weights
        param = params[hf_name]
        try:
            data = torch.from_numpy(np.ascontiguousarray(values)).reshape(param.shape)
        except RuntimeError:
            raise ExportError(f"{path.name}: tensor '{tensor.name}' has {values.size} values, {hf_name} is {list(param.shape)}") from None
        with torch.no_grad():
            param.copy_(data)
        if type_name not in _FLOAT_TYPES:
            result.dequantized[type_name] = result.dequantized.get(type_name, 0) + 1
        loaded.add(hf_name)
    if refused:
        listing = "; ".join(f"{t}: {len(n)} tensor(s), e.g. {n[0]}" for t, n in sorted(refused.items()))
        raise ExportError(
            f"{path.name} holds tensor types etsdk does not keep as they are ({listing}); etsdk keeps Q8_0, Q4_0 and "
            "Q4_1 blocks exactly. --allow-requantize dequantizes the others to float32 (then --quantize FORMAT "
            "quantizes them again, with its own rounding)"
        )
    head = model.get_output_embeddings()
    head_name = next((n for n, m in model.named_modules() if m is head), None) if head is not None else None
    embedding = model.get_input_embeddings()
    embedding_name = next((n for n, m in model.named_modules() if m is embedding), None)
    tied = head_name is not None and head_name not in quantized and f"{head_name}.weight" not in loaded
    if tied and head_name is not None and embedding_name is not None and embedding_name in quantized:
        source = quantized[embedding_name]  # the file stores the tied head once, as the embedding
        stored = {"blocks": source.qdata}
        quantized[head_name] = QuantizedLinear(WeightFormat.parse(source.format), stored, getattr(head, "bias", None))
        loaded.add(f"{head_name}.weight")
    elif tied and embedding_name is not None and f"{embedding_name}.weight" in loaded:
        loaded.add(f"{head_name}.weight")  # a float embedding: transformers' tie already shares it
    for name, layer in quantized.items():
        owner_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner_name) if owner_name else model, leaf, layer)
    missing = sorted(n for n in params if n not in loaded)
    if missing:
        raise ExportError(f"{path.name} has no tensor for {len(missing)} weight(s) of the model: {', '.join(missing[:6])}")
    kept = ", ".join(f"{n} x {t}" for t, n in sorted(result.kept.items()))
    _say(f"kept the file's blocks: {kept or 'none'}", quiet)
    if result.dequantized:
        # always said, even under --quiet: these weights no longer hold the file's exact values
        print(
            "etsdk-hf-static: --allow-requantize: dequantized to float32 "
            + ", ".join(f"{n} x {t}" for t, n in sorted(result.dequantized.items())),
            file=sys.stderr,
            flush=True,
        )
    result.tokenizer = _tokenizer(path, reader, quiet)
    return result


def _tokenizer(path: Path, reader: Any, quiet: bool) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:  # noqa: BLE001 - a model without a convertible tokenizer still exports
        _say(f"the tokenizer in {path.name} was not converted ({type(exc).__name__}: {exc}); use --prompt-ids", quiet)
        return None
    field_ = reader.fields.get("tokenizer.chat_template")
    if field_ is not None and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = str(field_.contents())
    return tokenizer
