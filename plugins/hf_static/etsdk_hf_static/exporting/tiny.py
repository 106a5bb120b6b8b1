"""Embedded tiny models: random-weight causal LMs built from transformers configs, with a character tokenizer.

Nothing is downloaded: the configs are written here and the tokenizer is built
in memory (printable ASCII, one token per character, plus ``<bos>``,
``<eos>``, ``<unk>``) with a small chat template (:data:`CHAT_TEMPLATE`), so
``etsdk chat`` and ``apply_chat_template`` work on it. Used by the README's main
job, the tests and the benchmark's default.

Random weights give near-tied logits, and a near tie flips on rounding between
two correct implementations. :func:`tiny_model` therefore draws the output
projection with standard deviation 1 (not 0.02): logits then spread over
several units and the top two differ by far more than float32 rounding.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

__all__ = ["ARCHITECTURES", "CHAT_TEMPLATE", "GGUF_TYPES", "char_tokenizer", "save_tiny_gguf", "save_tiny_model", "tiny_model", "write_llama_gguf"]

ARCHITECTURES = ("llama", "qwen2", "mistral", "gemma3")
SPECIALS = ("<unk>", "<bos>", "<eos>")
#: one id per special and per distinct printable ASCII character: every id decodes to text
VOCAB = len(SPECIALS) + len(dict.fromkeys(string.printable))
#: ``<bos>[system] ...<eos>[user] ...<eos>[assistant] ...<eos>``; with the generation prompt it ends ``[assistant] ``
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
)


def _config(
    architecture: str, *, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, positions: int, window: int | None
) -> Any:
    import transformers

    classes = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig", "gemma3": "Gemma3TextConfig"}
    if architecture not in classes:
        raise ValueError(f"unknown tiny architecture {architecture!r} (known: {', '.join(ARCHITECTURES)})")
    if window is not None and architecture not in ("mistral", "gemma3"):
        raise ValueError(f"a sliding window needs architecture mistral or gemma3, not {architecture!r}")
    config_class = getattr(transformers, classes[architecture])
    extra: dict[str, Any] = {"sliding_window": window} if architecture != "llama" else {}
    if architecture == "gemma3":  # Gemma 3's pattern: sliding-window layers with every third one full
        extra.update(
            sliding_window=window or 4096, head_dim=hidden // heads, pad_token_id=SPECIALS.index("<unk>"),
            layer_types=["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(layers)],
        )
    return config_class(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        tie_word_embeddings=False,
        bos_token_id=SPECIALS.index("<bos>"),
        eos_token_id=SPECIALS.index("<eos>"),
        **extra,
    )


def tiny_model(
    architecture: str = "llama",
    *,
    vocab: int = VOCAB,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    positions: int = 256,
    seed: int = 0,
    window: int | None = None,
) -> Any:
    """A random-weight ``*ForCausalLM`` (grouped-query attention by default) with well separated logits.

    ``window``: a sliding window of that many positions (``mistral``: every layer; ``gemma3``: two layers in
    three, every third full attention).
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = _config(
        architecture, vocab=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, positions=positions, window=window
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 1.0)
    return model


def char_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` with one token per printable ASCII character and :data:`CHAT_TEMPLATE`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<bos>", eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tiny_model(directory: str | Path, architecture: str = "llama", **options: Any) -> Path:
    """Write a tiny model and its tokenizer as a transformers model directory (``from_pretrained`` reads it)."""
    directory = Path(directory)
    model = tiny_model(architecture, **options)
    model.save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return directory


#: Tensor types :func:`save_tiny_gguf` writes by default: the embedding and the head in Q8_0, attention in
#: Q4_0, the MLP in Q4_1 (every block format etsdk keeps), norms in F32.
GGUF_TYPES = {"token_embd": "Q8_0", "output": "Q8_0", "attn": "Q4_0", "ffn": "Q4_1"}


def _llama_permute(weight: Any, heads: int) -> Any:
    """llama.cpp's rotary row order for a query / key projection (what its converter writes)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _byte_level_alphabet() -> list[str]:
    """The 256 characters GPT-2's byte-level BPE stands each byte for (printable bytes as themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), ord("\u00ff") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def save_tiny_gguf(path: str | Path, *, types: dict[str, str] | None = None, seed: int = 0) -> tuple[Path, Any]:
    """Write a tiny random-weight Llama as a GGUF file the way llama.cpp's converter lays it out (byte-level BPE
    tokenizer of 256 tokens plus ``<bos>`` / ``<eos>``, :data:`CHAT_TEMPLATE`); returns the path and the float
    model it was quantized from. ``types``: :data:`GGUF_TYPES` overrides (``{"ffn": "Q5_0"}``). Needs ``gguf``."""
    tokens = ["<unk>", "<bos>", "<eos>", *_byte_level_alphabet()]
    model = tiny_model("llama", vocab=len(tokens), hidden=64, layers=2, heads=4, kv_heads=2, seed=seed)
    return write_llama_gguf(model, path, types=types, tokens=tokens), model


def write_llama_gguf(
    model: Any, path: str | Path, *, types: dict[str, str] | None = None, tokens: list[str] | None = None,
    characters: bool = False,
) -> Path:
    """Write a ``LlamaForCausalLM`` as a GGUF file as llama.cpp's converter lays it out (query / key rows in its
    rotary order), each group of tensors in ``types`` (:data:`GGUF_TYPES` keys; ``F32`` or a type the ``gguf``
    package quantizes: Q8_0, Q4_0, Q4_1, Q5_0, ...). ``tokens``: the vocabulary (default: placeholders, for
    models run from token ids; a byte-level BPE tokenizer with no merges). ``characters``: ``tokens`` are single
    characters (after ``<unk> <bos> <eos>``, the space as ``\u2581``) declared as a SentencePiece vocabulary without
    merges or a space prefix, BOS added before a text: every text round-trips through llama.cpp's tokenizer. A tied
    head is written once, as the embedding. Needs ``gguf``."""
    import gguf
    import numpy as np

    path = Path(path)
    chosen = dict(GGUF_TYPES, **(types or {}))
    config = model.config
    vocab = config.vocab_size
    if tokens is None:  # one merge first (llama.cpp wants at least one), the byte-level alphabet, placeholders
        first = ["<unk>", "<bos>", "<eos>", "\u0120", "t", "\u0120t"]
        tokens = [*first, *(c for c in _byte_level_alphabet() if c not in first)]
        tokens = [*tokens, *(f"<t{i}>" for i in range(len(tokens), vocab))][:vocab]
    merges = ["\u0120 t"] if "\u0120t" in tokens else []
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("etsdk llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    if characters:
        writer.add_tokenizer_model("llama")
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(tokens) - 3))
    writer.add_token_scores([0.0] * len(tokens))
    if not characters:
        writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(characters)
    if characters:
        writer.add_add_eos_token(False)
        writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def value(name: str) -> Any:
        return model.get_parameter(name).detach().float().numpy()

    def put(name: str, array: Any, kind: str) -> None:
        array = np.ascontiguousarray(array, dtype=np.float32)
        if kind == "F32":
            writer.add_tensor(name, array)
            return
        qtype = gguf.GGMLQuantizationType[kind]
        writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)

    put("token_embd.weight", value("model.embed_tokens.weight"), chosen["token_embd"])
    put("output_norm.weight", value("model.norm.weight"), "F32")
    if not config.tie_word_embeddings:
        put("output.weight", value("lm_head.weight"), chosen["output"])
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", value(prefix + "input_layernorm.weight"), "F32")
        put(f"blk.{i}.ffn_norm.weight", value(prefix + "post_attention_layernorm.weight"), "F32")
        put(f"blk.{i}.attn_q.weight", _llama_permute(value(prefix + "self_attn.q_proj.weight"), heads), chosen["attn"])
        put(f"blk.{i}.attn_k.weight", _llama_permute(value(prefix + "self_attn.k_proj.weight"), kv_heads), chosen["attn"])
        put(f"blk.{i}.attn_v.weight", value(prefix + "self_attn.v_proj.weight"), chosen["attn"])
        put(f"blk.{i}.attn_output.weight", value(prefix + "self_attn.o_proj.weight"), chosen["attn"])
        for hf, name in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
            put(f"blk.{i}.{name}.weight", value(prefix + f"mlp.{hf}.weight"), chosen["ffn"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
