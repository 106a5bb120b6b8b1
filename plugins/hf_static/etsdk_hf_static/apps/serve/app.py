"""The ASGI application of ``etsdk serve``: OpenAI's routes over the :class:`~.engine.Engine` (Starlette).

:func:`create_app` makes it from a program path or a loaded model; mount it in any ASGI host, or run several
processes of it behind one (each with its own program and slots). Routes: ``POST /v1/chat/completions``,
``POST /v1/completions`` (both streamed as server-sent events with ``"stream": true``), ``GET /v1/models``,
``GET /health``, ``GET /metrics``. With an API key every route but ``/health`` needs ``Authorization: Bearer KEY``.

Every request is checked before it is queued (:mod:`~.protocol`): the body's size (413), JSON and fields (400),
the model name (404), room in the context (400, ``context_length_exceeded``). A client that disconnects cancels its
request: the engine stops it before its next step and frees the slot.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from etsdk import EtsdkError, GenerationError, Sampling

from etsdk_hf_static.apps.serve import protocol
from etsdk_hf_static.apps.serve.engine import Engine, Job, Outcome, Started
from etsdk_hf_static.apps.serve.metrics import Metrics
from etsdk_hf_static.apps.serve.protocol import RequestError, Usage
from etsdk_hf_static.runtime.fitting import context_fixes, does_not_fit, rows_needed

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from etsdk_hf_static.runtime.model import LoadedModel

__all__ = ["MISSING_EXTRA", "ServeConfig", "create_app"]

#: the error when the server's web dependencies are not installed
MISSING_EXTRA = "etsdk serve needs Starlette and uvicorn: pip install 'etsdk-hf-static[serve]'"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """How the server runs. ``sampling``: the defaults of fields a request leaves out (greedy unless set)."""

    slots: int = 1
    queue: int = 16
    api_key: str | None = None
    model_name: str | None = None  # default: the program's file stem
    max_body_bytes: int = 1 << 20
    session_dir: Path | None = None
    sampling: Sampling = Sampling()
    drain_seconds: float = 30.0


def create_app(program: str | Path | LoadedModel, config: ServeConfig | None = None) -> Starlette:
    """The ASGI app serving ``program`` (a ``.pte`` path, or a loaded hf_static runner / model).

    The engine starts with the app (its lifespan) and stops with it: in-flight requests finish (up to
    ``config.drain_seconds``), ``config.session_dir`` gets the slots. A host may run the lifespan again: the engine
    starts anew (its slots loaded from ``config.session_dir`` when given). Needs ``etsdk-hf-static[serve]``.
    """
    try:
        from starlette.applications import Starlette
        from starlette.routing import Route
    except ImportError:
        raise EtsdkError(MISSING_EXTRA) from None
    config = config or ServeConfig()
    if isinstance(program, (str, Path)):
        from etsdk_hf_static.runtime.runner import HfStaticRunner

        model: LoadedModel = HfStaticRunner.from_file(program)
    else:
        model = program
    name = config.model_name or model.program.path.stem
    metrics = Metrics()
    engine = Engine(model, slots=config.slots, queue=config.queue, metrics=metrics, session_dir=config.session_dir,
                    log=lambda line: print(f"etsdk serve: {line}", file=sys.stderr, flush=True))
    metrics.set("slots", engine.slots)
    server = _Server(model, engine, metrics, config, name)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start(again=True)  # a host that runs the lifespan again (a restart of its server) gets a new engine
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, engine.stop, config.drain_seconds)

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", server.chat, methods=["POST"]),
            Route("/v1/completions", server.completions, methods=["POST"]),
            Route("/v1/models", server.models, methods=["GET"]),
            Route("/health", server.health, methods=["GET"]),
            Route("/metrics", server.metrics_text, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.model_name = name
    return app


class _Server:
    def __init__(self, model: LoadedModel, engine: Engine, metrics: Metrics, config: ServeConfig, name: str) -> None:
        self.model, self.engine, self.metrics, self.config, self.name = model, engine, metrics, config, name
        self.created = protocol.now()

    # ------------------------------------------------------------------ routes

    async def health(self, request: Request) -> Response:
        alive = self.engine.alive
        return self._json(request, {"status": "ok" if alive else "unavailable", "slots": self.engine.slots,
                                    "slots_busy": int(self.metrics.value("slots_busy"))}, 200 if alive else 503)

    async def models(self, request: Request) -> Response:
        try:
            self._authorize(request)
        except RequestError as error:
            return self._error(request, error)
        return self._json(request, protocol.models_list(self.name, self.created), 200)

    async def metrics_text(self, request: Request) -> Response:
        from starlette.responses import PlainTextResponse

        try:
            self._authorize(request)
        except RequestError as error:
            return self._error(request, error)
        self.metrics.request("/metrics", 200)
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")

    async def chat(self, request: Request) -> Response:
        try:
            self._authorize(request)
            body = await self._body(request)
            parsed = protocol.parse_chat(body, self.model.metadata.context_length)
            self._check_model(parsed.model)
            ids = await self._tokenize(lambda: self.model.chat_prompt_ids(list(parsed.messages)), "messages")
            job_options = parsed.options
        except RequestError as error:
            return self._error(request, error)
        return await self._run(request, ids, job_options, chat=True)

    async def completions(self, request: Request) -> Response:
        try:
            self._authorize(request)
            body = await self._body(request)
            parsed = protocol.parse_completion(body, self.model.metadata.context_length, self.model.metadata.vocab_size)
            self._check_model(parsed.model)
            if isinstance(parsed.prompt, str):
                text = parsed.prompt
                ids = await self._tokenize(lambda: self.model.encode(text, bos=True), "prompt")
            else:
                ids = list(parsed.prompt)
            if parsed.echo:
                raise RequestError("'echo' is not supported by this server", param="echo")
        except RequestError as error:
            return self._error(request, error)
        return await self._run(request, ids, parsed.options, chat=False)

    async def _tokenize(self, work: Callable[[], list[int]], param: str) -> list[int]:
        """``work()`` (the tokenizer) on a worker thread, so a long prompt never stalls the event loop; whatever
        the tokenizer or the template raises is the request's fault (a 400 naming ``param``)."""
        try:
            return await asyncio.get_running_loop().run_in_executor(None, work)
        except GenerationError as exc:
            raise RequestError(str(exc), param=param) from None
        except Exception as exc:  # a tokenizer's own error on text it cannot take (lone surrogates, ...)
            raise RequestError(f"the tokenizer could not encode '{param}': {type(exc).__name__}", param=param) from None

    # ------------------------------------------------------------------ one request

    async def _run(self, request: Request, ids: list[int], options: protocol.Options, *, chat: bool) -> Response:
        route = request.url.path
        try:
            job = self._job(ids, options, chat=chat)
        except RequestError as error:
            return self._error(request, error)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def emit(event: tuple[str, Any]) -> None:  # on the engine's thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                job.cancel()

        job.emit = emit
        try:
            self.engine.submit(job)
        except RequestError as error:
            return self._error(request, error)
        rid = protocol.new_id("chatcmpl" if chat else "cmpl")
        created = protocol.now()
        if options.stream:
            return await self._stream(request, job, events, rid, created, chat=chat, include_usage=options.include_usage)
        try:
            while True:
                kind, value = await self._next(request, events, job)
                if kind in ("start", "text"):
                    continue  # the outcome has the text
                if kind == "error":
                    return self._error(request, value)
                outcome: Outcome = value
                break
        except _Gone:
            return self._gone(route, job)
        except BaseException:  # cancelled (the server's drain ran out): the generation stops with the request
            job.cancel()
            raise
        usage = Usage(outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)
        make = protocol.chat_reply if chat else protocol.completion_reply
        reply = make(rid, self.name, created, outcome.text, outcome.stopped, usage)
        return self._json(request, reply, 200, headers=self._headers(outcome))

    async def _next(self, request: Request, events: asyncio.Queue[tuple[str, Any]], job: Job) -> tuple[str, Any]:
        """The next event of ``job``; :class:`_Gone` when the client disconnected first (polled every 100 ms)."""
        while True:
            try:
                return await asyncio.wait_for(events.get(), timeout=0.1)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    raise _Gone from None

    async def _stream(
        self, request: Request, job: Job, events: asyncio.Queue[tuple[str, Any]], rid: str, created: int, *,
        chat: bool, include_usage: bool,
    ) -> Response:
        from starlette.responses import StreamingResponse

        # the start decides the status: an error before it (no room, the server stopping) is an error response
        route = request.url.path
        try:
            start = await self._next(request, events, job)
            if start[0] == "error":
                return self._error(request, start[1])
            first = await self._next(request, events, job)  # a long prefill: the client may leave meanwhile
        except _Gone:
            return self._gone(route, job)
        except BaseException:
            job.cancel()
            raise

        def sse(obj: Any) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        async def body() -> AsyncIterator[str]:
            ended, status = False, 200
            try:
                if chat:
                    yield sse(protocol.chat_chunk(rid, self.name, created, {"role": "assistant", "content": ""}))
                event = first
                while True:
                    kind, value = event
                    if kind == "text":
                        yield sse(protocol.chat_chunk(rid, self.name, created, {"content": value}) if chat
                                  else protocol.completion_chunk(rid, self.name, created, value))
                    elif kind == "error":
                        status = value.status
                        yield sse(protocol.error_body(value))
                        break
                    else:
                        outcome: Outcome = value
                        reason = protocol.finish_reason(outcome.stopped)
                        yield sse(protocol.chat_chunk(rid, self.name, created, {}, reason) if chat
                                  else protocol.completion_chunk(rid, self.name, created, "", reason))
                        if include_usage:
                            usage = Usage(outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)
                            yield sse(protocol.chat_chunk(rid, self.name, created, None, usage=usage) if chat
                                      else protocol.completion_chunk(rid, self.name, created, None, usage=usage))
                        break
                    event = await events.get()
                yield "data: [DONE]\n\n"
                ended = True
            finally:
                if not ended:  # the client went away (the response was cancelled): stop the generation
                    job.cancel()
                self.metrics.request(route, status if ended else 499)

        return StreamingResponse(
            body(), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **self._headers(start[1])},
        )

    # ------------------------------------------------------------------ checks

    def _gone(self, route: str, job: Job) -> Response:
        """The client left before its reply: stop the generation (499, nginx's "client closed request")."""
        from starlette.responses import Response as Plain

        job.cancel()
        self.metrics.request(route, 499)
        return Plain(status_code=499)

    def _job(self, ids: list[int], options: protocol.Options, *, chat: bool) -> Job:
        meta = self.model.metadata
        S = meta.context_length
        if not ids:
            raise RequestError("the prompt renders to no tokens", param="messages")
        room = S - len(ids)
        new = options.max_tokens if options.max_tokens is not None else room
        if room < 1 or rows_needed(0, len(ids), new) > S:
            fixes = context_fixes(0, len(ids), max(new, 1), S, new_tokens_knob="max_tokens")
            raise RequestError(does_not_fit(0, len(ids), max(new, 1), S, fixes), param="messages",
                               code="context_length_exceeded")
        fields = {**_fields(self.config.sampling), **options.sampling}
        try:
            sampling = Sampling(**fields)
        except GenerationError as exc:
            raise RequestError(str(exc)) from None
        if sampling.stop and self.model.tokenizer is None:
            raise RequestError("'stop' needs the tokenizer saved beside the program", param="stop")
        return Job(tuple(ids), new, sampling, emit=lambda event: None, continues=not chat)

    def _authorize(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise RequestError("a valid API key is needed: Authorization: Bearer KEY", status=401,
                               kind="authentication_error", code="invalid_api_key")

    async def _body(self, request: Request) -> dict[str, Any]:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise RequestError(f"the request body is larger than {limit} bytes", status=413)
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise RequestError(f"the request body is larger than {limit} bytes", status=413)
        return protocol.parse_json(bytes(data))

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.name:
            raise RequestError(f"the model '{model[:100]}' does not exist here: this server serves '{self.name}'",
                               status=404, param="model", code="model_not_found")

    # ------------------------------------------------------------------ responses

    def _headers(self, start: Outcome | Started) -> dict[str, str]:
        """What the prefix cache did for the request: prompt tokens reused, prompt rows computed, the slot."""
        return {"X-Etsdk-Cached-Tokens": str(start.cached_tokens), "X-Etsdk-Prefill-Tokens": str(start.prefill_tokens),
                "X-Etsdk-Slot": str(start.slot)}

    def _json(self, request: Request, body: Mapping[str, Any], status: int, headers: Mapping[str, str] | None = None) -> Response:
        from starlette.responses import Response as Raw

        self.metrics.request(request.url.path if request.url.path in _ROUTES else "other", status)
        # ASCII JSON: text a client sent back in a message (a lone surrogate) cannot break the encoding
        return Raw(json.dumps(dict(body)), status_code=status, headers=dict(headers or {}), media_type="application/json")

    def _error(self, request: Request, error: RequestError) -> Response:
        return self._json(request, protocol.error_body(error), error.status, headers=error.headers)


_ROUTES = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"}


class _Gone(Exception):
    """The client disconnected while its request waited or ran."""


def _fields(sampling: Sampling) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(sampling, f.name) for f in fields(sampling)}
