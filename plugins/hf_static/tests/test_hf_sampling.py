"""Sampling and stopping without an exported program: ``etsdk.Sampling``'s fields, ``choose``, the penalties, stop
strings and ``ignore_eos`` through a real :class:`Conversation` over a scripted fake program, and the text stream."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from etsdk import GenerationError, Sampling
from etsdk_hf_static.apps.streaming import TextStream, decode_rate
from etsdk_hf_static.metadata import HfStaticMetadata
from etsdk_hf_static.runtime.conversation import Conversation
from etsdk_hf_static.runtime.sampling import choose, generator_for, penalize
from etsdk_hf_static.runtime.stops import cut_at_stop, find_stop, held_back

# --------------------------------------------------------------------------- etsdk.Sampling


def test_the_defaults_are_todays_sampling() -> None:
    default = Sampling()
    assert default == Sampling(0.0, 1.0, None)  # positional order of the first three fields kept
    assert default.greedy and not default.penalized
    assert (default.top_k, default.min_p, default.repeat_penalty, default.repeat_last_n) == (0, 0.0, 1.0, 64)
    assert (default.presence_penalty, default.frequency_penalty, default.stop, default.ignore_eos) == (0.0, 0.0, (), False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.top_k = 3  # type: ignore[misc]


def test_stop_is_normalised_to_a_tuple() -> None:
    assert Sampling(stop=["a", "bc"]).stop == ("a", "bc")
    assert Sampling(stop="\n").stop == ("\n",)  # one string is one stop string, not its characters
    assert hash(Sampling(stop=["a"])) == hash(Sampling(stop=("a",)))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": -1}, r"top_k must be an integer >= 0"),
        ({"top_k": 2.5}, r"top_k must be an integer >= 0"),
        ({"top_k": True}, r"top_k must be an integer >= 0"),
        ({"min_p": -0.1}, r"min_p must be in \[0, 1\]"),
        ({"min_p": 1.5}, r"min_p must be in \[0, 1\]"),
        ({"min_p": float("nan")}, r"min_p must be in \[0, 1\]"),
        ({"repeat_penalty": 0.0}, r"repeat_penalty must be a finite number > 0"),
        ({"repeat_penalty": float("inf")}, r"repeat_penalty must be a finite number > 0"),
        ({"repeat_penalty": "1.1"}, r"repeat_penalty must be a number"),
        ({"presence_penalty": float("nan")}, r"presence_penalty must be a finite number"),
        ({"frequency_penalty": float("-inf")}, r"frequency_penalty must be a finite number"),
        ({"repeat_last_n": -2}, r"repeat_last_n must be an integer >= -1"),
        ({"stop": ["ok", ""]}, r"stop\[1\] must be a non-empty string"),
        ({"stop": [3]}, r"stop\[0\] must be a non-empty string"),
        ({"stop": 3}, r"stop must be a sequence of strings"),
        ({"ignore_eos": 1}, r"ignore_eos must be True or False"),
    ],
)
def test_bad_values_name_the_field_and_its_range(options: dict[str, Any], message: str) -> None:
    with pytest.raises(GenerationError, match=message):
        Sampling(**options)


# --------------------------------------------------------------------------- choose


def _old_choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """The sampler before top_k, min_p and the penalties existed (temperature, top_p, seeded draw)."""
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs[before >= sampling.top_p] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def _rows(count: int, vocab: int = 50) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(vocab, generator=generator) * 3 for _ in range(count)]


@pytest.mark.parametrize("options", [{"temperature": 0.7}, {"temperature": 1.3, "top_p": 0.8}], ids=["t", "t+top_p"])
def test_the_default_new_options_keep_todays_draws(options: dict[str, float]) -> None:
    sampling = Sampling(**options, seed=5)
    new, old = generator_for(sampling), torch.Generator().manual_seed(5)
    assert new is not None
    rows = _rows(40)
    assert [choose(row, sampling, new, history=[1, 2, 3]) for row in rows] == [_old_choose(row, sampling, old) for row in rows]


def test_greedy_with_the_defaults_is_argmax_whatever_the_history() -> None:
    for row in _rows(20):
        assert choose(row, Sampling(), None, history=list(range(50))) == int(torch.argmax(row))


def test_top_k_1_equals_greedy() -> None:
    for seed in range(10):
        sampling = Sampling(temperature=1.5, top_k=1, seed=seed)
        generator = generator_for(sampling)
        assert [choose(row, sampling, generator) for row in _rows(20)] == [int(torch.argmax(row)) for row in _rows(20)]
    wide = Sampling(temperature=1.5, top_k=50, seed=0)  # every token kept: the plain sampler's draws
    generator, old = generator_for(wide), torch.Generator().manual_seed(0)
    assert [choose(row, wide, generator) for row in _rows(20)] == [_old_choose(row, wide, old) for row in _rows(20)]


def test_top_k_samples_only_among_the_k_most_likely() -> None:
    row = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    sampling = Sampling(temperature=100.0, top_k=3, seed=1)  # nearly uniform: every kept token comes up
    generator = generator_for(sampling)
    assert {choose(row, sampling, generator) for _ in range(300)} == {0, 1, 2}


def test_min_p_drops_the_unlikely_tokens() -> None:
    row = torch.tensor([3.0, 2.9, 0.0, -1.0])  # p(1)/p(0) = e^-0.1 ~ 0.90, p(2)/p(0) ~ 0.05
    sampling = Sampling(temperature=1.0, min_p=0.5, seed=2)
    generator = generator_for(sampling)
    assert {choose(row, sampling, generator) for _ in range(300)} == {0, 1}
    only_max = Sampling(temperature=1.0, min_p=1.0, seed=2)
    generator = generator_for(only_max)
    assert {choose(row, only_max, generator) for _ in range(50)} == {0}


def test_penalties_follow_llama_cpp() -> None:
    logits = torch.tensor([2.0, 1.0, -1.0, 0.5, 3.0])
    history = [0, 2, 2, 1]
    repeat = penalize(logits, history, Sampling(repeat_penalty=2.0))
    # seen tokens: a positive logit divided, a negative one multiplied; unseen ones untouched
    assert repeat.tolist() == [1.0, 0.5, -2.0, 0.5, 3.0]
    counted = penalize(logits, history, Sampling(presence_penalty=0.5, frequency_penalty=0.25))
    assert counted.tolist() == pytest.approx([2.0 - 0.5 - 0.25, 1.0 - 0.5 - 0.25, -1.0 - 0.5 - 0.5, 0.5, 3.0])
    last_one = penalize(logits, history, Sampling(repeat_penalty=2.0, repeat_last_n=1))  # only token 1 is recent
    assert last_one.tolist() == [2.0, 0.5, -1.0, 0.5, 3.0]
    everything = penalize(logits, history, Sampling(repeat_penalty=2.0, repeat_last_n=-1))
    assert everything.tolist() == repeat.tolist()
    assert not Sampling(repeat_penalty=2.0, repeat_last_n=0).penalized
    assert logits.tolist() == [2.0, 1.0, -1.0, 0.5, 3.0]  # the caller's row is never changed


def test_a_repeat_penalty_changes_the_greedy_choice() -> None:
    row = torch.tensor([0.0, 4.0, 3.0])
    assert choose(row, Sampling(), None, history=[1]) == 1
    assert choose(row, Sampling(repeat_penalty=1.5), None, history=[1]) == 2  # 4 / 1.5 < 3
    assert choose(row, Sampling(repeat_penalty=1.5), None, history=[0]) == 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_penalized_non_finite_logits_are_an_error(bad: float) -> None:
    row = torch.tensor([1.0, bad, 0.0])
    with pytest.raises(GenerationError, match="non-finite logits"):
        choose(row, Sampling(repeat_penalty=1.3), None, history=[0])


# --------------------------------------------------------------------------- a conversation over a scripted program

CHARS = "abcdef"
EOS = 3


class _Session:
    def __init__(self) -> None:
        self.state = {"c0": torch.zeros((), dtype=torch.long)}

    def tensor(self, name: str) -> torch.Tensor:
        return self.state[name]

    def check_owner(self, program: object) -> None:
        pass

    def reset(self) -> None:
        self.state["c0"].zero_()


class _Method:
    """Logits of each row from its token alone: after t, token (t+1) % 4 by far (3 is EOS), then the escape token 4."""

    def execute(self, inputs: Sequence[torch.Tensor], *, session: object) -> list[torch.Tensor]:
        table = torch.zeros(len(CHARS), len(CHARS))
        for token in range(len(CHARS)):
            table[token, (token + 1) % 4] = 5.0
            table[token, 4] = 3.0
        table[4] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 5.0])
        table[5] = torch.tensor([5.0, 0.0, 0.0, 0.0, 0.0, 0.0])
        ids = inputs[0]
        return [table[ids[0]].unsqueeze(0)]


class _Program:
    def new_session(self) -> _Session:
        return _Session()


class _Runner:
    """What a Conversation uses of its runner, over :class:`_Method` (a 6-token vocabulary, one layer)."""

    def __init__(self, *, tokenizer: bool = True) -> None:
        self.metadata = HfStaticMetadata(
            context_length=64, prefill_length=4, vocab_size=len(CHARS), layers=1, kv_heads=1, head_dim=1, eos_ids=(EOS,)
        )
        self.program = _Program()
        self.methods = {"prefill": _Method(), "decode": _Method()}
        self.tokenizer = object() if tokenizer else None

    def decode_text(self, ids: Sequence[int]) -> str:
        return "".join(CHARS[i] for i in ids)


def _generate(sampling: Sampling | None = None, new: int = 8, runner: Any = None, **options: Any) -> Any:
    conversation = Conversation(runner or _Runner())  # type: ignore[arg-type]
    return conversation.generate([0], max_new_tokens=new, sampling=sampling, **options)


def test_eos_stops_and_ignore_eos_goes_past_it() -> None:
    stopped = _generate()
    assert (stopped.token_ids, stopped.stopped, stopped.text) == ((1, 2, 3), "eos", "bcd")
    past = _generate(Sampling(ignore_eos=True))
    assert (past.token_ids, past.stopped) == ((1, 2, 3, 0, 1, 2, 3, 0), "length")
    assert past.token_ids == _generate(stop_at_eos=False).token_ids  # the keyword the runner always had


def test_a_stop_string_stops_and_the_text_ends_before_it() -> None:
    streamed: list[int] = []
    result = _generate(Sampling(ignore_eos=True, stop=("da",)), new=12, on_token=streamed.append)
    assert result.stopped == "stop"
    assert result.token_ids == (1, 2, 3, 0) == tuple(streamed)  # the token completing the stop string was generated
    assert result.text == "bc"
    early = _generate(Sampling(ignore_eos=True, stop=("zz", "cd", "bcda")), new=12)  # the earliest match wins
    assert (early.token_ids, early.text) == ((1, 2, 3), "b")
    none = _generate(Sampling(ignore_eos=True, stop=("zz",)), new=5)
    assert (none.stopped, none.text) == ("length", "bcdab")


def test_stop_strings_need_a_tokenizer() -> None:
    with pytest.raises(GenerationError, match="stop strings need the tokenizer"):
        _generate(Sampling(stop=("a",)), runner=_Runner(tokenizer=False))


def test_a_repeat_penalty_breaks_a_greedy_loop() -> None:
    looping = _generate(Sampling(ignore_eos=True), new=8)
    assert looping.token_ids == (1, 2, 3, 0, 1, 2, 3, 0)
    # the prompt's 0 is in the window: after 3, token 0 drops to 5 / 2 < 3 and the escape token 4 wins
    penalized = _generate(Sampling(ignore_eos=True, repeat_penalty=2.0), new=8)
    assert penalized.token_ids[:5] == (1, 2, 3, 4, 5)
    assert penalized.token_ids != looping.token_ids
    # a window of one token forgets the prompt: the loop comes back
    short = _generate(Sampling(ignore_eos=True, repeat_penalty=2.0, repeat_last_n=1), new=8)
    assert short.token_ids == looping.token_ids


def test_one_token_has_no_decode_rate() -> None:
    one = _generate(new=1)
    assert one.decode_steps == 0 and one.to_json()["decode_tokens_per_s"] is None
    assert decode_rate(one) == "decode n/a (one token: no decode step)"
    three = _generate()
    assert three.decode_steps == 2 and isinstance(three.to_json()["decode_tokens_per_s"], float)
    assert decode_rate(three).startswith("decode ") and decode_rate(three).endswith(" tokens/s")
    assert three.to_json()["text"] == "bcd"


# --------------------------------------------------------------------------- stop strings in the stream


def test_find_stop_and_held_back() -> None:
    assert find_stop("hello world", ["wor", "lo"]) == 3
    assert find_stop("hello world", ["xyz"]) is None
    assert find_stop("abcab", ["ab"], start=4) == 3  # a match completed by the last character
    assert find_stop("abcab", ["ab"], start=5) is None  # everything was searched before
    assert held_back("the end of", ["of the"]) == 2
    assert held_back("the end", ["of the"]) == 0
    assert held_back("abc", ["c", "bcd"]) == 2
    assert cut_at_stop("one. two.", ["."]) == "one"


def _stream(text: str, stops: Sequence[str]) -> tuple[list[str], TextStream, io.StringIO]:
    out = io.StringIO()
    stream = TextStream(lambda ids: "".join(text[i] for i in ids), out, stops)
    seen = []
    for index in range(len(text)):
        stream(index)
        seen.append(out.getvalue())
    return seen, stream, out


def test_the_stream_never_prints_a_stop_string() -> None:
    seen, stream, out = _stream("Hello User: more", ["User:"])
    assert "U" not in "".join(seen) and out.getvalue() == "Hello "
    stream.finish()
    assert out.getvalue() == "Hello \n"


def test_the_stream_shows_a_held_back_start_once_it_is_no_stop_string() -> None:
    seen, stream, out = _stream("a Us b", ["User:"])
    assert seen[2] == "a " and seen[3] == "a "  # "U", "Us" may start "User:"
    assert seen[4] == "a Us "  # " " shows it is not one
    stream.finish("a Us b")
    assert out.getvalue() == "a Us b\n"


def test_an_error_after_the_echo_starts_a_new_line() -> None:
    out = io.StringIO()
    stream = TextStream(lambda ids: "x" * len(ids), out)
    stream.echo("Once upon a time")
    assert stream.line_open
    stream.end_line()
    stream.end_line()  # once
    assert out.getvalue() == "Once upon a time\n"


# --------------------------------------------------------------------------- etsdk generate's early refusal


def test_the_early_refusal_counts_and_words_without_torch() -> None:
    """``etsdk generate`` refuses before the program loads with the runner's own check (``fitting``), and the
    command module imports no torch for it."""
    import subprocess
    import sys

    code = (
        "import sys; import etsdk_hf_static.apps.commands, etsdk_hf_static.runtime.fitting as f; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "print(f.does_not_fit(0, 20, 20, 31, f.context_fixes(0, 20, 20, 31)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("20 prompt token(s) + 20 new token(s) = 40 cache rows, but the program's context length S is 31")
    assert "--max-new-tokens 11" in result.stdout


# --------------------------------------------------------------------------- the one generation loop, step by step


def test_a_generation_runs_one_call_per_advance_and_matches_generate() -> None:
    conversation = Conversation(_Runner())  # type: ignore[arg-type]
    generation = conversation.begin([0, 1, 2, 0, 1], max_new_tokens=6, sampling=Sampling(ignore_eos=True))
    assert conversation.position == 0 and generation.prompt_rows == 5  # planned, nothing run
    steps = []
    while not generation.done:
        steps.append(generation.advance())
    # a full prefill chunk (T=4) chooses nothing, the padded tail chooses the first token, then one decode per token
    assert steps[0] is None and all(t is not None for t in steps[1:]) and len(steps) == 1 + 6
    assert generation.stopped == "length" and tuple(steps[1:]) == generation.result().token_ids
    fresh = Conversation(_Runner()).generate([0, 1, 2, 0, 1], max_new_tokens=6, sampling=Sampling(ignore_eos=True))  # type: ignore[arg-type]
    assert fresh.token_ids == generation.result().token_ids and fresh.text == generation.result().text
    with pytest.raises(GenerationError, match="stopped"):
        generation.advance()


def test_one_generation_at_a_time_and_cancel_keeps_what_was_chosen() -> None:
    conversation = Conversation(_Runner())  # type: ignore[arg-type]
    generation = conversation.begin([0, 1, 2, 0, 1, 2], max_new_tokens=5, sampling=Sampling(ignore_eos=True))
    assert generation.advance() is None  # the first chunk only
    for refused in (lambda: conversation.begin([1]), lambda: conversation.rewind(1), lambda: conversation.prefill([1])):
        with pytest.raises(GenerationError, match="a generation is under way"):
            refused()
    generation.cancel()  # the prompt's unwritten tail is forgotten: the conversation holds what its rows hold
    assert generation.stopped == "cancelled" and conversation.tokens == (0, 1, 2, 0) and conversation.position == 4
    again = conversation.begin([2], max_new_tokens=2, sampling=Sampling(ignore_eos=True))
    while not again.done:
        again.advance()
    assert conversation.tokens == (0, 1, 2, 0, 2, *again.tokens)
    # an exception from on_token (Ctrl-C) ends the generation; the tokens chosen stay and the conversation goes on
    def interrupt(token: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        conversation.generate([1], max_new_tokens=3, on_token=interrupt)
    assert conversation.generate([1], max_new_tokens=1).token_ids


def test_keep_prefix_rewinds_to_the_shared_tokens() -> None:
    conversation = Conversation(_Runner())  # type: ignore[arg-type]
    conversation.generate([0, 1, 2, 0, 1], max_new_tokens=3, sampling=Sampling(ignore_eos=True))
    held = conversation.tokens
    kept = conversation.keep_prefix([*held[:6], 5, 5])
    assert kept == 6 and conversation.tokens == held[:6] and conversation.position == 5  # the last kept one pending
    assert conversation.keep_prefix(held[:6]) == 5  # at least one token of the request is left to run
    assert conversation.keep_prefix([4, 4]) == 0 and conversation.tokens == ()
