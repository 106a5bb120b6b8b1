"""Generated ids as text (runtime.detokenize.IncrementalText): a completion reads as its prompt's continuation under a
SentencePiece-style tokenizer, a character split over ids waits for its last one, and each id costs a decode of a
few ids, not of all of them."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from etsdk_hf_static.runtime.detokenize import CONTEXT_IDS, IncrementalText

WORDS = ["The", "capital", "of", "France", "is", "Paris", "and", "it", "has", ",", "."]


def sentencepiece_like(words: Sequence[str] = WORDS, byte_tokens: bool = True) -> Any:
    """``words`` as tokens with SentencePiece's space handling (``▁`` before every word; the decoder drops the space
    of a text's first word), and byte tokens ``<0x..>`` for what is not a word (byte fallback)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for word in words:
        vocab["\u2581" + word] = len(vocab)
        vocab[word] = len(vocab)
    for byte in range(256 if byte_tokens else 0):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0),
    ])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return sentencepiece_like()


def decoder(tokenizer: Any, calls: list[int] | None = None) -> Any:
    def decode(ids: Sequence[int]) -> str:
        if calls is not None:
            calls.append(len(ids))
        return str(tokenizer.decode(list(ids), skip_special_tokens=True))

    return decode


def test_a_completion_keeps_the_space_its_first_word_has_after_the_prompt(tokenizer: Any) -> None:
    prompt = tokenizer.encode("The capital of France is")
    reply = tokenizer.convert_tokens_to_ids(["\u2581Paris", "\u2581and", "\u2581it", "\u2581is", "."])
    decode = decoder(tokenizer)
    assert decode(reply) == "Paris and it is."  # decoded alone, the first word loses its space: "...isParis"
    text = IncrementalText(decode, prompt)
    pieces = [text.extend([token]) for token in reply]
    assert pieces == [" Paris", " and", " it", " is", "."] and text.text == text.final() == " Paris and it is."
    assert decode(prompt) + text.text == decode(prompt + reply)  # prompt + completion reads as the whole
    alone = IncrementalText(decode)  # no context: a chat reply, text on its own
    alone.extend(reply)
    assert alone.text == "Paris and it is."


def test_a_character_split_over_ids_waits_for_its_last_one(tokenizer: Any) -> None:
    euro = tokenizer.convert_tokens_to_ids(["<0xE2>", "<0x82>", "<0xAC>"])  # U+20AC in UTF-8
    text = IncrementalText(decoder(tokenizer), tokenizer.encode("it is"))
    assert text.extend(euro[:1]) == "" and text.extend(euro[1:2]) == ""  # an incomplete character is never shown
    assert text.final().endswith("\ufffd")  # given up at the end, as the tokenizer reads it
    assert text.extend(euro[2:]) == "\u20ac" and text.final() == "\u20ac"
    assert text.extend(tokenizer.convert_tokens_to_ids(["\u2581Paris"])) == " Paris"


@pytest.mark.parametrize("bare_space", [False, True], ids=["words", "words-and-a-bare-space"])
def test_random_replies_read_as_the_whole_text_does_and_cost_a_few_ids_a_decode(tokenizer: Any, bare_space: bool) -> None:
    if bare_space:  # "▁" alone: nothing at a text's start, a space before the next word
        tokenizer = sentencepiece_like(words=[*WORDS, ""])
    rng = random.Random(0)
    # words with and without their space, specials, and whole UTF-8 characters spelled in byte tokens
    words = [t for t in tokenizer.get_vocab() if not t.startswith("<0x")]
    characters = [[f"<0x{b:02X}>" for b in c.encode()] for c in "\u00e9\u20ac\U0001f600"]

    def piece() -> list[str]:
        return rng.choice(characters) if rng.random() < 0.2 else [rng.choice(words)]

    for _ in range(50):
        prompt = tokenizer.convert_tokens_to_ids([t for _ in range(rng.randint(0, 8)) for t in piece()])
        reply = tokenizer.convert_tokens_to_ids([t for _ in range(rng.randint(1, 40)) for t in piece()])
        calls: list[int] = []
        text = IncrementalText(decoder(tokenizer, calls), prompt)
        for token in reply:
            text.extend([token])
        whole, before = decoder(tokenizer)(prompt + reply), decoder(tokenizer)(prompt)
        assert before + text.final() == whole, (prompt, reply)
        # a window of the context's last ids and the ids since the last complete text (a character is at most 4
        # bytes; specials add no text): never the whole reply
        assert max(calls) <= CONTEXT_IDS + 8, (max(calls), len(reply))


def test_a_long_run_of_special_ids_keeps_the_window_short(tokenizer: Any) -> None:
    prompt = tokenizer.encode("The capital of France is")
    special, paris, euro = tokenizer.convert_tokens_to_ids("</s>"), tokenizer.convert_tokens_to_ids("\u2581Paris"), [
        tokenizer.convert_tokens_to_ids(f"<0x{b:02X}>") for b in "\u20ac".encode()
    ]
    reply = [paris, *[special] * 300, *euro[:2], *[special] * 50, euro[2], *[special] * 100, paris]
    calls: list[int] = []
    text = IncrementalText(decoder(tokenizer, calls), prompt)
    pieces = [text.extend([token]) for token in reply]
    assert "".join(pieces) == text.final() == " Paris\u20ac Paris"
    assert decoder(tokenizer)(prompt) + text.final() == decoder(tokenizer)(prompt + reply)
    # 300 specials after a word: each decode reads the word's window and the new id, not the run so far
    assert max(calls[: 2 * 301]) <= CONTEXT_IDS + 1, max(calls[: 2 * 301])
    # a character split over ids waits, with the specials inside it, for its last byte; the 100 specials after
    # it then read that window (its 3 bytes and the 50 specials) and the new id: never longer
    tail = calls[-2 * 101 : -2]
    assert max(tail) == max(tail[:2]) <= 3 + 50 + 1, tail


def test_a_bare_space_that_reads_as_nothing_alone_keeps_its_space_before_the_next_word() -> None:
    # a decoder that strips the text's leading space (SentencePiece's): "▁" first reads as nothing, yet it is the
    # space before what follows; a chat reply starts with no context, so the window is empty then
    tokenizer = sentencepiece_like(words=[*WORDS, ""], byte_tokens=True)
    space, paris, special = (tokenizer.convert_tokens_to_ids(t) for t in ("\u2581", "\u2581Paris", "<s>"))
    for reply in ([space, paris], [space, special, special, space, paris], [special, space, paris]):
        text = IncrementalText(decoder(tokenizer))
        for token in reply:
            text.extend([token])
        assert text.final() == decoder(tokenizer)(reply), reply


def test_ids_without_a_tokenizer_read_as_numbers() -> None:
    text = IncrementalText(lambda ids: " ".join(map(str, ids)))
    text.extend([5, 6, 7])
    assert text.text == "5 6 7"


def test_a_generation_reads_as_its_prompt_continued_and_its_stream_shows_that_text(exported: Any) -> None:
    # the tiny Llama program with a SentencePiece-style tokenizer of its vocabulary's size: its ids 3.. are words with
    # and without their space, so what it generates decodes to text whose first word may or may not start with one
    import io

    import etsdk
    from etsdk_hf_static.apps.streaming import TextStream
    from etsdk_hf_static.exporting.tiny import VOCAB
    from etsdk_hf_static.runtime.runner import HfStaticRunner

    tokenizer = sentencepiece_like([f"w{i}" for i in range((VOCAB - 3) // 2)], byte_tokens=False)
    runner = HfStaticRunner(etsdk.load(exported("llama")), tokenizer=tokenizer)
    decode = decoder(tokenizer)
    spaced = 0  # replies whose first word has its space: read alone, they would lose it
    for tried in range(40):  # greedy replies to prompts of two words, until some reply starts with a spaced word
        if tried >= 4 and spaced:
            break
        prompt = tokenizer.encode(f"w{tried} w{tried + 1}")
        conversation = runner.new_conversation()
        out = io.StringIO()
        stream = TextStream(runner.decode_text, out, context=prompt)
        sampling = etsdk.Sampling(temperature=0.0)
        result = conversation.generate(prompt, max_new_tokens=12, sampling=sampling, on_token=stream, stop_at_eos=False)
        stream.finish(result.text)
        ids = list(result.token_ids)
        assert result.text == decode(prompt + ids)[len(decode(prompt)):]  # prompt + text reads as the whole
        assert out.getvalue() == result.text + "\n"  # the stream printed exactly the result's text
        alone = runner.new_conversation().generate(prompt, max_new_tokens=12, sampling=sampling, stop_at_eos=False,
                                                   continues=False)
        assert alone.token_ids == result.token_ids and alone.text == decode(ids)  # a chat reply: text on its own
        spaced += result.text != alone.text
    assert spaced, "no reply started with a spaced word: the case this test is about never ran"
