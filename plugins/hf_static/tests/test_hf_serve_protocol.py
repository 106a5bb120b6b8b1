"""``etsdk serve``'s request checks and counters, without a server: every refusal names its field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from etsdk_hf_static.apps.serve.command import loopback
from etsdk_hf_static.apps.serve.metrics import Metrics
from etsdk_hf_static.apps.serve.protocol import RequestError, parse_chat, parse_completion, parse_json

S, VOCAB = 128, 100
USER = [{"role": "user", "content": "hi"}]


def _refused(body: dict[str, Any], *, chat: bool = True) -> RequestError:
    with pytest.raises(RequestError) as refused:
        parse_chat(body, S) if chat else parse_completion(body, S, VOCAB)
    return refused.value


def test_a_full_chat_request_is_read_into_sampling_fields() -> None:
    parsed = parse_chat(
        {"model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
         "max_tokens": 20, "max_completion_tokens": 10, "temperature": 0.5, "top_p": 0.9, "top_k": 4, "min_p": 0.1,
         "seed": -1, "stop": "x", "stream": True, "stream_options": {"include_usage": True}, "n": 1, "user": "u",
         "presence_penalty": 0.5, "frequency_penalty": 0.25, "repeat_penalty": 1.1, "ignore_eos": True},
        S,
    )
    assert parsed.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"})
    assert parsed.options.max_tokens == 10 and parsed.options.stream and parsed.options.include_usage
    assert parsed.options.sampling == {
        "temperature": 0.5, "top_p": 0.9, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": 0.25,
        "repeat_penalty": 1.1, "top_k": 4, "ignore_eos": True, "seed": 2**64 - 1, "stop": ("x",),
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": USER, "n": 2}, "n"),
        ({"messages": USER, "tools": [{"type": "function"}]}, "tools"),
        ({"messages": USER, "logprobs": True}, "logprobs"),
        ({"messages": USER, "response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": USER, "colour": "blue"}, "colour"),
        ({"messages": USER, "max_tokens": S}, "max_tokens"),
        ({"messages": USER, "max_tokens": True}, "max_tokens"),
        ({"messages": USER, "temperature": 2.5}, "temperature"),
        ({"messages": USER, "top_p": 0}, "top_p"),
        ({"messages": USER, "seed": 2**64}, "seed"),
        ({"messages": USER, "stop": ["a"] * 17}, "stop"),
        ({"messages": USER, "stream": 1}, "stream"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, "messages[0]"),
        ({"messages": []}, "messages"),
        ({"model": ["m"], "messages": USER}, "model"),
    ],
)
def test_chat_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    error = _refused(body)
    assert error.status == 400 and error.param == param and error.message


def test_completion_prompts_text_or_ids() -> None:
    assert parse_completion({"prompt": "abc"}, S, VOCAB).prompt == "abc"
    assert parse_completion({"prompt": [1, 2, 3]}, S, VOCAB).prompt == (1, 2, 3)
    assert parse_completion({"prompt": ["abc"]}, S, VOCAB).prompt == "abc"  # one prompt in an array
    for prompt in ("", [], [VOCAB], [1, True], 7, ["a", "b"]):
        assert _refused({"prompt": prompt}, chat=False).param == "prompt"
    assert _refused({"prompt": "a", "best_of": 2}, chat=False).param == "best_of"


def test_bodies_that_are_not_json_objects() -> None:
    for body, words in ((b"\xff", "not UTF-8"), (b"{", "not valid JSON"), (b"[1]", "JSON object, found an array"),
                        (b'{"t": NaN}', "not valid JSON"), (b"[" * 50000 + b"]" * 50000, "not valid JSON")):
        with pytest.raises(RequestError) as refused:
            parse_json(body)
        assert words in refused.value.message and refused.value.status == 400
    assert parse_json(json.dumps({"a": 1}).encode()) == {"a": 1}


def test_loopback_addresses() -> None:
    assert all(loopback(h) for h in ("127.0.0.1", "localhost", "::1", "127.1.2.3"))
    assert not any(loopback(h) for h in ("0.0.0.0", "::", "192.168.1.2", "example.com"))


def test_metrics_text_is_prometheus() -> None:
    metrics = Metrics()
    metrics.count("completion_tokens_total", 3)
    metrics.observe("time_to_first_token_seconds", 0.5)
    metrics.set("slots", 2)
    metrics.request("/health", 200)
    text = metrics.text()
    assert "etsdk_completion_tokens_total 3\n" in text and "etsdk_slots 2\n" in text
    assert "etsdk_time_to_first_token_seconds_count 1\n" in text
    assert 'etsdk_requests_total{route="/health",code="200"} 1\n' in text
    assert "# TYPE etsdk_queue_depth gauge\n" in text
