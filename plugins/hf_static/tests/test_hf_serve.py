"""``etsdk serve``: the official ``openai`` client against a real server process (uvicorn, loopback, a tiny Llama).

The expected tokens come from outside the server: a fresh conversation of the same program in this process (what
``etsdk generate`` runs), and one ``etsdk generate --json`` run. Every loop is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")  # the HTTP client openai and Starlette use
pytest.importorskip("uvicorn")

from etsdk_hf_static.runtime.runner import HfStaticRunner  # noqa: E402

STARTUP_S = 180  # a loaded program on two busy cores
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)/v1")


class Server:
    """An ``etsdk serve`` process: its base URL, its stderr so far, and a stop that says how it exited."""

    def __init__(self, process: subprocess.Popen[str], port: int, log: list[str]) -> None:
        self.process, self.port, self.log = process, port, log
        self.url = f"http://127.0.0.1:{port}"

    def client(self, **options: Any) -> Any:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=options.pop("api_key", "unused"), timeout=120,
                             max_retries=0, **options)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


@contextlib.contextmanager
def serving(program: Path, *args: str, env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """Start ``etsdk serve program --port 0 ARGS`` and wait (bounded) until it listens; stop it after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "etsdk", "serve", str(program), "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )
    log: list[str] = []
    port: list[int] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            log.append(line)
            found = LISTENING.search(line)
            if found:
                port.append(int(found.group(1)))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(STARTUP_S) and port, f"etsdk serve did not start: {''.join(log)[-3000:]}"
        yield Server(process, port[0], log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def _template_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    encoded = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if isinstance(encoded, Mapping) else encoded)


@pytest.fixture(scope="module")
def local(chat_pte: Path) -> HfStaticRunner:
    """The same program, in this process: the reference every reply is checked against."""
    return HfStaticRunner.from_file(chat_pte)


def _greedy(local: HfStaticRunner, ids: Sequence[int], new: int, **sampling: Any) -> tuple[list[int], str]:
    from etsdk import Sampling

    result = local.new_conversation().generate(ids, max_new_tokens=new, sampling=Sampling(**sampling))
    return list(result.token_ids), str(result.text)


@pytest.fixture(scope="module")
def server(chat_pte: Path) -> Iterator[Server]:
    with serving(chat_pte, "--slots", "4") as running:
        yield running


USER = [{"role": "user", "content": "hello there"}]


def test_chat_streamed_and_not_match_generate(server: Server, local: HfStaticRunner, chat_pte: Path) -> None:
    client = server.client()
    reply = client.chat.completions.create(model="chat", messages=USER, max_tokens=6, temperature=0)
    ids = local.chat_prompt_ids(USER)
    tokens, text = _greedy(local, ids, 6)
    assert reply.choices[0].message.content == text
    assert reply.usage.prompt_tokens == len(ids) and reply.usage.completion_tokens == len(tokens)
    assert reply.choices[0].finish_reason == ("length" if len(tokens) == 6 else "stop")
    # the command line's own answer to the same prompt (etsdk generate --chat)
    generated = subprocess.run(
        [sys.executable, "-m", "etsdk", "generate", str(chat_pte), "--chat", "--prompt", USER[0]["content"],
         "--max-new-tokens", "6", "--json"], capture_output=True, text=True, timeout=600,
    )
    assert generated.returncode == 0, generated.stderr[-2000:]
    assert json.loads(generated.stdout.strip().splitlines()[-1])["token_ids"] == tokens
    # streamed: the deltas add up to the same text; include_usage adds a last chunk with no choices
    chunks = list(client.chat.completions.create(
        model="chat", messages=USER, max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True},
    ))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(tokens)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reply.choices[0].finish_reason


def test_completions_stop_max_tokens_and_seed(server: Server, local: HfStaticRunner) -> None:
    client = server.client()
    prompt = "abc"
    ids = local.encode(prompt, bos=True)
    tokens, text = _greedy(local, ids, 12, ignore_eos=True)
    got = client.completions.create(model="chat", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    assert got.choices[0].text == text and got.usage.completion_tokens == 12
    assert got.choices[0].finish_reason == "length"
    # a stop string from the middle of that text: the reply ends before it, finish_reason "stop"
    stop = text[4:6]
    assert stop and text.find(stop) >= 1, text
    stopped = client.completions.create(model="chat", prompt=prompt, max_tokens=12, temperature=0, stop=[stop],
                                        extra_body={"ignore_eos": True})
    assert stopped.choices[0].text == text[: text.find(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    # token-id prompts are taken as they are
    by_ids = client.completions.create(model="chat", prompt=ids, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert by_ids.choices[0].text == _greedy(local, ids, 3, ignore_eos=True)[1]
    # seeded sampling repeats itself, and is the local sampler's draw
    sampled = [
        client.completions.create(model="chat", prompt=prompt, max_tokens=8, temperature=1.0, seed=7,
                                  extra_body={"ignore_eos": True}).choices[0].text
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1] == _greedy(local, ids, 8, temperature=1.0, seed=7, ignore_eos=True)[1]


def test_models_health_and_unknown_model(server: Server) -> None:
    client = server.client()
    assert [m.id for m in client.models.list().data] == ["chat"]
    assert httpx.get(f"{server.url}/health", timeout=30).json()["status"] == "ok"
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="gpt-9", messages=USER, max_tokens=2)
    assert "gpt-9" in str(refused.value) and "chat" in str(refused.value)


def test_four_concurrent_streams_each_get_their_own_reply(chat_pte: Path, local: HfStaticRunner) -> None:
    prompts = ["one two", "three four five", "six", "seven eight nine ten"]
    with serving(chat_pte, "--slots", "4") as fresh:  # empty slots: every reply is a whole-prompt run
        client = fresh.client()
        replies: dict[int, str] = {}
        errors: list[BaseException] = []

        def ask(index: int) -> None:
            try:
                stream = client.completions.create(model="chat", prompt=prompts[index], max_tokens=10, temperature=0,
                                                   stream=True, extra_body={"ignore_eos": True})
                replies[index] = "".join(c.choices[0].text for c in stream if c.choices)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not errors, errors
        for index, prompt in enumerate(prompts):
            assert replies[index] == _greedy(local, local.encode(prompt, bos=True), 10, ignore_eos=True)[1], index
        assert fresh.metrics()["etsdk_completion_tokens_total"] == 40


def test_a_short_request_is_answered_while_a_long_one_streams(server: Server) -> None:
    client = server.client()
    base = server.metrics()["etsdk_completion_tokens_total"]
    long = client.completions.create(model="chat", prompt="x y z", max_tokens=110, temperature=0, stream=True,
                                     stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    received = 0
    short_done_at: int | None = None
    usage = None
    for chunk in long:
        usage = chunk.usage or usage
        received += 1 if chunk.choices and chunk.choices[0].text else 0
        if received == 3 and short_done_at is None:
            short = client.completions.create(model="chat", prompt="q", max_tokens=2, temperature=0,
                                              extra_body={"ignore_eos": True})
            assert short.usage.completion_tokens == 2
            # the long reply was not over when the short one came back: they ran step by step, side by side
            long_so_far = server.metrics()["etsdk_completion_tokens_total"] - base - 2
            assert long_so_far < 110, long_so_far
            short_done_at = received
    assert short_done_at is not None and received > short_done_at  # the long stream went on after the short reply
    assert usage is not None and usage.completion_tokens == 110  # and came to its end


def test_the_second_turn_reuses_the_first_turns_cache(server: Server, local: HfStaticRunner) -> None:
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "how are you"}]
    ids1 = local.chat_prompt_ids(first)
    before = server.metrics()
    with httpx.Client(timeout=120) as http:
        one = http.post(f"{server.url}/v1/chat/completions",
                        json={"model": "chat", "messages": first, "max_tokens": 5, "temperature": 0})
        assert one.status_code == 200, one.text
        reply = one.json()["choices"][0]["message"]["content"]
        second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "and then"}]
        ids2 = local.chat_prompt_ids(second)
        two = http.post(f"{server.url}/v1/chat/completions",
                        json={"model": "chat", "messages": second, "max_tokens": 5, "temperature": 0})
    assert two.status_code == 200, two.text
    cached = int(two.headers["x-etsdk-cached-tokens"])
    prefill = int(two.headers["x-etsdk-prefill-tokens"])
    assert two.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
    # the first turn's prompt is in the cache, and only what follows it was computed again
    assert cached >= len(ids1) - 1, (cached, len(ids1))
    assert prefill == len(ids2) - cached
    assert prefill < len(ids2) - len(ids1) + 8, (prefill, len(ids1), len(ids2))
    after = server.metrics()
    assert after["etsdk_prefix_cache_hits_total"] >= before.get("etsdk_prefix_cache_hits_total", 0) + 1
    # the reply is what a fresh conversation given the whole second prompt answers
    assert two.json()["choices"][0]["message"]["content"] == _greedy(local, ids2, 5)[1]


def test_a_client_that_disconnects_frees_its_slot(chat_pte: Path) -> None:
    with serving(chat_pte, "--slots", "1", "--queue", "0") as single:
        with httpx.Client(timeout=120) as http:
            with http.stream("POST", f"{single.url}/v1/completions",
                             json={"prompt": "a", "max_tokens": 120, "stream": True, "ignore_eos": True}) as stream:
                assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
                lines = stream.iter_lines()
                got = [next(lines) for _ in range(4)]
                assert any(line.startswith("data: ") for line in got)
                # the only slot is busy and the queue holds none: another request is refused now, with Retry-After
                busy = http.post(f"{single.url}/v1/completions", json={"prompt": "b", "max_tokens": 2})
                assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text
                assert busy.json()["error"]["code"] == "server_busy"
            # the connection is closed mid-stream: within a few steps the slot is free again
            deadline = time.monotonic() + 60
            while True:
                answer = http.post(f"{single.url}/v1/completions", json={"prompt": "b", "max_tokens": 2, "ignore_eos": True})
                if answer.status_code == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 2
        metrics = single.metrics()
        assert metrics["etsdk_cancelled_total"] == 1
        assert metrics["etsdk_completion_tokens_total"] < 120  # the abandoned reply stopped early


def _hostile(context_length: int) -> list[tuple[str, bytes, dict[str, str]]]:
    """(route, body, headers) of requests that must all be refused with a 4xx."""
    chat, completions = "/v1/chat/completions", "/v1/completions"
    user = [{"role": "user", "content": "hi"}]
    cases: list[tuple[str, Any]] = [
        (chat, b"{"), (chat, b"not json"), (chat, b""), (chat, b"[]"), (chat, b"null"), (chat, b'"text"'),
        (chat, b"\xff\xfe\xfa"), (chat, b'{"messages": "\xc3\x28"}'), (chat, b"[" * 100000 + b"]" * 100000),
        (chat, {"messages": user, "max_tokens": 10**30}), (chat, {"messages": user, "max_tokens": -1}),
        (chat, {"messages": user, "max_tokens": "5"}), (chat, {"messages": user, "max_tokens": context_length + 5}),
        (chat, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}'),
        (chat, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'),
        (chat, {"messages": user, "temperature": "hot"}), (chat, {"messages": user, "temperature": 3}),
        (chat, {"messages": user, "top_p": 0}), (chat, {"messages": user, "seed": 2**70}), (chat, {"messages": user, "seed": 1.5}),
        (chat, {"messages": user, "stop": [1, 2]}), (chat, {"messages": user, "stop": [""]}), (chat, {"messages": user, "stream": "yes"}),
        (chat, {"messages": user, "n": 2}), (chat, {"messages": user, "tools": [{"type": "function"}]}),
        (chat, {"messages": user, "logprobs": True}), (chat, {"messages": user, "frobnicate": 1}),
        (chat, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
        (chat, {"messages": [{"role": "wizard", "content": "hi"}]}), (chat, {"messages": [{"role": "user"}]}),
        (chat, {"messages": []}), (chat, {"messages": [1]}), (chat, {"model": 5, "messages": user}),
        (chat, {"model": "other", "messages": user}), (chat, {"messages": [{"role": "user", "content": "w " * 400}]}),
        (chat, {"messages": user, "stream_options": {"include_usage": "yes"}}),
        (completions, {"prompt": ""}), (completions, {"prompt": 5}), (completions, {"prompt": [10**9]}),
        (completions, {"prompt": [1, True]}), (completions, {"prompt": "a", "echo": True}),
        (completions, {"prompt": "a", "best_of": 3}), (completions, {"prompt": "a", "suffix": "z"}),
        (completions, {"prompt": "a", "max_tokens": 0}),
        (chat, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1' + b"0" * 400 + b"}"),
        (chat, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 400 + b"}"),
        (chat, b'{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}'),
        (chat, b'{"\\ud800": 1, "messages": [{"role": "user", "content": "hi"}]}'),
        (chat, b'{"messages": [{"role": "user", "content": "hi", "\\udfff": 2}]}'),
        (completions, b'{"prompt": "\\ud800\\udfff\\ud800"}'),
    ]
    out = []
    for route, body in cases:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        out.append((route, data, {"content-type": "application/json"}))
    out.append((chat, b"x" * (10 * 1024 * 1024), {"content-type": "application/json"}))  # 10 MB: 413
    return out


def test_five_hundred_hostile_requests_get_4xx_and_the_server_still_answers(server: Server, local: HfStaticRunner) -> None:
    cases = _hostile(local.metadata.context_length)
    statuses: dict[int, int] = {}
    with httpx.Client(timeout=60) as http:
        for index in range(500):
            route, body, headers = cases[index % len(cases)]
            answer = http.post(f"{server.url}{route}", content=body, headers=headers)
            assert 400 <= answer.status_code < 500, (index % len(cases), answer.status_code, answer.text[:300])
            if len(body) < 1 << 20:
                error = answer.json()["error"]
                assert error["message"] and error["type"], answer.text
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
        assert statuses.get(413, 0) >= 1 and statuses.get(404, 0) >= 1 and statuses.get(400, 0) >= 400
        # a body over the limit sent in chunks, without a Content-Length: refused once the limit is passed
        chunked = http.post(f"{server.url}/v1/chat/completions", content=(b"x" * 65536 for _ in range(32)))
        assert chunked.status_code == 413, chunked.text
        assert http.get(f"{server.url}/health").status_code == 200
        ok = http.post(f"{server.url}/v1/completions", json={"prompt": "a", "max_tokens": 2, "ignore_eos": True})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        # a prompt that leaves room for fewer tokens than asked: the fix names the request's field, not a flag
        S = local.metadata.context_length
        tight = http.post(f"{server.url}/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": S - 1})
        error = tight.json()["error"]
        assert tight.status_code == 400 and error["code"] == "context_length_exceeded", tight.text
        assert f"fewer new tokens (max_tokens {S - 3})" in error["message"] and "--max-new-tokens" not in error["message"]


def test_a_public_bind_needs_an_api_key_and_the_key_is_checked(chat_pte: Path) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "etsdk", "serve", str(chat_pte), "--host", "0.0.0.0", "--port", "0"],
        capture_output=True, text=True, timeout=300, env={k: v for k, v in os.environ.items() if k != "ETSDK_API_KEY"},
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "--api-key" in refused.stderr and "0.0.0.0" in refused.stderr
    with serving(chat_pte, "--api-key", "s3cret") as keyed:
        assert httpx.get(f"{keyed.url}/health", timeout=30).status_code == 200  # /health needs no key
        with pytest.raises(openai.AuthenticationError):
            keyed.client(api_key="wrong").models.list()
        for route in ("/v1/models", "/metrics"):
            assert httpx.get(f"{keyed.url}{route}", timeout=30).status_code == 401
        reply = keyed.client(api_key="s3cret").completions.create(model="chat", prompt="a", max_tokens=2,
                                                                  extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 2
        # a second server on the same port: one line, before the program loads
        taken = subprocess.run(
            [sys.executable, "-m", "etsdk", "serve", str(chat_pte), "--port", str(keyed.port)],
            capture_output=True, text=True, timeout=300,
        )
        assert taken.returncode == 2 and f"cannot listen on 127.0.0.1:{keyed.port}" in taken.stderr, taken.stderr[-2000:]


def test_sigterm_drains_the_request_in_flight_and_slots_survive_a_restart(
    chat_pte: Path, local: HfStaticRunner, tmp_path: Path
) -> None:
    sessions = tmp_path / "slots"
    first = [{"role": "user", "content": "remember me"}]
    with serving(chat_pte, "--slots", "2", "--session-dir", str(sessions)) as running:
        client = running.client()
        reply = client.chat.completions.create(model="chat", messages=first, max_tokens=4, temperature=0)
        stream = client.completions.create(model="chat", prompt="z", max_tokens=60, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        chunks = iter(stream)
        next(chunks)
        running.process.send_signal(signal.SIGTERM)
        rest = list(chunks)  # the stream in flight finishes after the signal
        assert rest and rest[-1].choices[0].finish_reason == "length"
        assert running.stop() == 0, "".join(running.log)[-2000:]
        assert any("SIGTERM: finishing the requests in flight" in line for line in running.log)
    assert sorted(p.name for p in sessions.iterdir()) == ["slot-0.safetensors", "slot-1.safetensors"]
    with serving(chat_pte, "--slots", "2", "--session-dir", str(sessions)) as again:
        assert any("restored slot 0" in line for line in again.log), "".join(again.log)
        second = [*first, {"role": "assistant", "content": reply.choices[0].message.content},
                  {"role": "user", "content": "again"}]
        with httpx.Client(timeout=120) as http:
            answer = http.post(f"{again.url}/v1/chat/completions",
                               json={"messages": second, "max_tokens": 3, "temperature": 0})
        assert answer.status_code == 200, answer.text
        # the restarted server continues the chat from its saved slot: the first turn is not computed again
        assert int(answer.headers["x-etsdk-cached-tokens"]) >= len(local.chat_prompt_ids(first)) - 1
        assert answer.json()["choices"][0]["message"]["content"] == _greedy(local, local.chat_prompt_ids(second), 3)[1]


def test_a_prefix_held_by_a_busy_slot_is_forked_not_waited_for(server: Server, local: HfStaticRunner) -> None:
    client = server.client()
    shared = "a shared beginning that is long"
    before = server.metrics()
    long = client.completions.create(model="chat", prompt=shared, max_tokens=80, temperature=0, stream=True,
                                     extra_body={"ignore_eos": True})
    chunks = iter(long)
    next(chunks)  # the long request holds its slot now, its prompt written
    with httpx.Client(timeout=120) as http:
        answer = http.post(f"{server.url}/v1/completions",
                           json={"prompt": shared + " and more", "max_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert answer.status_code == 200, answer.text
    rest = list(chunks)
    assert rest[-1].choices[0].finish_reason == "length"
    ids = local.encode(shared, bos=True)
    assert int(answer.headers["x-etsdk-cached-tokens"]) >= len(ids) - 1  # the busy slot's prompt rows, copied
    after = server.metrics()
    assert after["etsdk_slot_forks_total"] == before.get("etsdk_slot_forks_total", 0) + 1
    assert answer.json()["choices"][0]["text"] == _greedy(local, local.encode(shared + " and more", bos=True), 3,
                                                          ignore_eos=True)[1]


def test_the_app_serves_again_when_its_host_starts_it_again(chat_pte: Path, tmp_path: Path) -> None:
    # create_app's app in an ASGI host of its own (uvicorn, started twice in this process): the second start runs the
    # lifespan again, and the engine starts anew with the slots the first one saved (its prompt is a prefix hit)
    import socket

    import uvicorn
    from etsdk_hf_static.apps.serve import ServeConfig, create_app

    app = create_app(chat_pte, ServeConfig(slots=1, session_dir=tmp_path, drain_seconds=10))
    body = {"model": "chat", "prompt": "hello there", "max_tokens": 4, "temperature": 0}
    replies = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        host = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
        thread = threading.Thread(target=host.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 120
        while not host.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.started, "uvicorn did not start the app"
        try:
            with httpx.Client(timeout=120) as http:
                reply = http.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
        finally:
            host.should_exit = True
            thread.join(60)
        assert not thread.is_alive() and reply.status_code == 200, reply.text
        replies.append(reply)
    assert replies[1].json()["choices"][0]["text"] == replies[0].json()["choices"][0]["text"]
    assert int(replies[0].headers["x-etsdk-cached-tokens"]) == 0
    assert int(replies[1].headers["x-etsdk-cached-tokens"]) > 0  # the slot saved at the first stop came back
    assert (tmp_path / "slot-0.safetensors").is_file()
