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

__all__ = ["ARCHITECTURES", "CHAT_TEMPLATE", "char_tokenizer", "save_tiny_model", "tiny_model"]

ARCHITECTURES = ("llama", "qwen2", "mistral")
SPECIALS = ("<unk>", "<bos>", "<eos>")
#: one id per special and per distinct printable ASCII character: every id decodes to text
VOCAB = len(SPECIALS) + len(dict.fromkeys(string.printable))
#: ``<bos>[system] ...<eos>[user] ...<eos>[assistant] ...<eos>``; with the generation prompt it ends ``[assistant] ``
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
)


def _config(architecture: str, *, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, positions: int) -> Any:
    import transformers

    classes = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}
    if architecture not in classes:
        raise ValueError(f"unknown tiny architecture {architecture!r} (known: {', '.join(ARCHITECTURES)})")
    config_class = getattr(transformers, classes[architecture])
    extra: dict[str, Any] = {"sliding_window": None} if architecture != "llama" else {}
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
) -> Any:
    """A random-weight ``*ForCausalLM`` (grouped-query attention by default) with well separated logits."""
    import torch
    from transformers import AutoModelForCausalLM

    config = _config(architecture, vocab=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, positions=positions)
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
