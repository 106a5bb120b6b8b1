"""The OpenAI wire format of ``etsdk serve``: request bodies checked into typed requests, and the reply bodies.

Every request field is checked before anything is queued: a wrong type, a value out of range, a field this server
does not implement (``n > 1``, ``tools``, images, ``logprobs``) or one OpenAI does not define is a
:class:`RequestError` naming the field (``param``), which the app turns into OpenAI's error body with its status.
Fields OpenAI defines that change nothing here at their default value (``n: 1``, ``logprobs: false``, ``user``)
are accepted. Imports nothing heavy.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "RequestError",
    "Usage",
    "chat_chunk",
    "chat_reply",
    "completion_chunk",
    "completion_reply",
    "error_body",
    "parse_chat",
    "parse_completion",
    "parse_json",
]

#: the largest seed the sampler takes (a 64-bit unsigned integer)
SEED_LIMIT = 2**64


class RequestError(Exception):
    """A request refused before it runs: ``status`` (4xx or 503), OpenAI's error ``type``, the field at fault."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
        kind: str = "invalid_request_error", headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.kind = message, status, param, code, kind
        self.headers = dict(headers or {})


def error_body(error: RequestError) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": error.message, "type": error.kind, "param": error.param, "code": error.code}}


@dataclass(frozen=True, slots=True)
class Options:
    """What a chat or completion request asks of the generation (None: the server's default)."""

    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)  # etsdk.Sampling keyword arguments the request set


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str | None
    messages: tuple[dict[str, str], ...]
    options: Options


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str | None
    prompt: str | tuple[int, ...]
    options: Options
    echo: bool = False


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object (UTF-8); anything else is a 400 saying what was found."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"the request body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RequestError(f"the request body must be a JSON object, found {_kind(value)}")
    return value


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


# ------------------------------------------------------------------ fields

#: fields of both endpoints that map onto etsdk.Sampling, with their checks
_SAMPLING = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "repeat_penalty": (0.0, 10.0),
}
_COMMON = {
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "presence_penalty",
    "frequency_penalty", "top_k", "min_p", "repeat_penalty", "repeat_last_n", "ignore_eos", "n", "user", "logprobs",
    "logit_bias",
}
_CHAT = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "functions",
                   "function_call", "response_format", "parallel_tool_calls", "modalities", "audio", "store", "metadata"}
_COMPLETION = _COMMON | {"prompt", "echo", "suffix", "best_of"}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def _number(body: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{name}' must be a number, found {_kind(value)}", param=name)
    if not low <= value <= high:  # before any float conversion: an integer of 400 digits is out of range, not an error
        raise RequestError(f"'{name}' must be in [{low:g}, {high:g}], found {value!r}", param=name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{name}' must be an integer, found {_kind(value)}", param=name)
    if not low <= value <= high:
        raise RequestError(f"'{name}' must be in [{low}, {high}], found {value}", param=name)
    return value


def _refuse(body: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(f"unknown field(s): {', '.join(ascii(u)[:80] for u in unknown[:5])}", param=ascii(unknown[0])[1:-1][:80])
    if body.get("n") not in (None, 1):
        raise RequestError("'n' must be 1: this server returns one choice per request", param="n")
    if body.get("logprobs") not in (None, False, 0):
        raise RequestError("'logprobs' is not supported by this server", param="logprobs")
    for name in ("tools", "functions", "logit_bias", "audio", "modalities", "suffix", "top_logprobs"):
        if body.get(name) not in (None, [], {}):
            raise RequestError(f"'{name}' is not supported by this server", param=name)
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none"):
            raise RequestError(f"'{name}' is not supported by this server", param=name)
    if body.get("best_of") not in (None, 1):
        raise RequestError("'best_of' must be 1", param="best_of")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise RequestError("'response_format' other than {\"type\": \"text\"} is not supported by this server",
                           param="response_format")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise RequestError(f"'user' must be a string, found {_kind(body['user'])}", param="user")


def _options(body: Mapping[str, Any], context_length: int, *, chat: bool) -> Options:
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise RequestError(f"'model' must be a string, found {_kind(body['model'])}", param="model")
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_tokens = None
    for name in names:
        value = _integer(body, name, 1, context_length - 1)
        if value is not None:
            max_tokens = value if max_tokens is None else min(max_tokens, value)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError(f"'stream' must be a boolean, found {_kind(stream)}", param="stream")
    include_usage = False
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage", "include_obfuscation"}:
            raise RequestError("'stream_options' must be an object with 'include_usage'", param="stream_options")
        include_usage = stream_options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise RequestError("'stream_options.include_usage' must be a boolean", param="stream_options")
    sampling: dict[str, Any] = {}
    for name, (low, high) in _SAMPLING.items():
        number = _number(body, name, low, high)
        if number is not None:
            sampling[name] = number
    if "repeat_penalty" in sampling and sampling["repeat_penalty"] <= 0:
        raise RequestError("'repeat_penalty' must be > 0", param="repeat_penalty")
    if "temperature" in sampling and 0 < sampling["temperature"] < 1e-6:
        sampling["temperature"] = 0.0  # as greedy as it gets; etsdk.Sampling refuses a temperature below 1e-6
    if sampling.get("top_p", 1.0) == 0.0:
        raise RequestError("'top_p' must be in (0, 1]", param="top_p")
    top_k = _integer(body, "top_k", 0, 1 << 31)
    if top_k is not None:
        sampling["top_k"] = top_k
    repeat_last_n = _integer(body, "repeat_last_n", -1, context_length)
    if repeat_last_n is not None:
        sampling["repeat_last_n"] = repeat_last_n
    ignore_eos = body.get("ignore_eos")
    if ignore_eos is not None:
        if not isinstance(ignore_eos, bool):
            raise RequestError(f"'ignore_eos' must be a boolean, found {_kind(ignore_eos)}", param="ignore_eos")
        sampling["ignore_eos"] = ignore_eos
    seed = _integer(body, "seed", -(2**63), SEED_LIMIT - 1)
    if seed is not None:
        sampling["seed"] = seed % SEED_LIMIT  # OpenAI's seeds are signed 64-bit; the sampler's unsigned
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
            raise RequestError("'stop' must be a non-empty string or an array of at most 16 of them", param="stop")
        if any(len(s) > 1024 for s in stops):
            raise RequestError("'stop' strings are at most 1024 characters", param="stop")
        sampling["stop"] = tuple(stops)
    return Options(max_tokens=max_tokens, stream=stream, include_usage=include_usage, sampling=sampling)


#: roles a message may have; "developer" is OpenAI's newer name for "system"
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _content(message: Mapping[str, Any], index: int) -> str:
    content = message.get("content")
    where = f"messages[{index}].content"
    if isinstance(content, str):
        return content
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise RequestError(f"'{where}' parts must be objects with a 'type'", param=where)
            if part["type"] != "text":
                raise RequestError(
                    f"'{where}' has a part of type {part['type'][:40]!r}: this server takes text only (no images or audio)",
                    param=where,
                )
            if not isinstance(part.get("text"), str):
                raise RequestError(f"'{where}' text parts need a string 'text'", param=where)
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"'{where}' must be a string or an array of text parts, found {_kind(content)}", param=where)


def parse_chat(body: Mapping[str, Any], context_length: int) -> ChatRequest:
    """A ``/v1/chat/completions`` body as a :class:`ChatRequest`, or a :class:`RequestError`."""
    _refuse(body, _CHAT)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(f"'messages' must be a non-empty array, found {_kind(messages)}", param="messages")
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(f"'messages[{index}]' must be an object, found {_kind(message)}", param=f"messages[{index}]")
        role = message.get("role")
        if role == "tool" or message.get("tool_calls") or "function_call" in message:
            raise RequestError(f"'messages[{index}]': tool messages and calls are not supported by this server",
                               param=f"messages[{index}]")
        if not isinstance(role, str) or role not in _ROLES:
            raise RequestError(
                f"'messages[{index}].role' must be one of system, developer, user, assistant, found {str(role)[:40]!r}",
                param=f"messages[{index}].role",
            )
        extra = set(message) - {"role", "content", "name"}
        if extra:
            raise RequestError(f"'messages[{index}]' has unknown field(s): {', '.join(ascii(e) for e in sorted(extra)[:5])}",
                               param=f"messages[{index}]")
        out.append({"role": _ROLES[role], "content": _content(message, index)})
    return ChatRequest(body.get("model"), tuple(out), _options(body, context_length, chat=True))


def parse_completion(body: Mapping[str, Any], context_length: int, vocab_size: int) -> CompletionRequest:
    """A ``/v1/completions`` body as a :class:`CompletionRequest`, or a :class:`RequestError`."""
    _refuse(body, _COMPLETION)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in an array: one choice
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in prompt):
            raise RequestError(
                f"'prompt' must be a string or an array of token ids in 0..{vocab_size - 1} (one prompt per request)",
                param="prompt",
            )
        prompt = tuple(prompt)
    elif not isinstance(prompt, str) or not prompt:
        raise RequestError(f"'prompt' must be a non-empty string, found {_kind(prompt)}", param="prompt")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise RequestError(f"'echo' must be a boolean, found {_kind(echo)}", param="echo")
    return CompletionRequest(body.get("model"), prompt, _options(body, context_length, chat=False), echo=echo)


# ------------------------------------------------------------------ replies


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def finish_reason(stopped: str) -> str:
    """OpenAI's finish reason for a generation's ``stopped``: ``"length"`` or ``"stop"``."""
    return "length" if stopped in ("length", "context") else "stop"


def chat_reply(rid: str, model: str, created: int, text: str, stopped: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                     "finish_reason": finish_reason(stopped)}],
        "usage": usage.to_json(),
    }


def chat_chunk(
    rid: str, model: str, created: int, delta: dict[str, Any] | None, finish: str | None = None,
    usage: Usage | None = None,
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    chunk: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                             "choices": choices}
    if usage is not None:
        chunk["usage"] = usage.to_json()
    return chunk


def completion_reply(rid: str, model: str, created: int, text: str, stopped: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(stopped)}],
        "usage": usage.to_json(),
    }


def completion_chunk(
    rid: str, model: str, created: int, text: str | None, finish: str | None = None, usage: Usage | None = None
) -> dict[str, Any]:
    choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    chunk: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": model,
                             "choices": choices}
    if usage is not None:
        chunk["usage"] = usage.to_json()
    return chunk


def now() -> int:
    return int(time.time())


def models_list(model: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "etsdk"}]}
