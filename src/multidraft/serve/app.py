"""The HTTP side of ``multidraft serve``: a FastAPI app with OpenAI's endpoints, run by uvicorn.

``create_app(model, queue_size=..., shutdown_grace_s=...)`` makes the app (its lifespan
starts and stops the :class:`worker.Worker`); ``run_server(model, host, port, ...)`` serves
it until SIGINT or SIGTERM. On SIGTERM (a drain) the server stops accepting connections,
turns ``/ready`` to 503, answers the queued requests with 503 and ``Retry-After``, lets the
requests being decoded finish within the grace period (``--drain-timeout``; then stops them:
finish_reason 'abort'), and returns normally: the process exits 0 without a traceback.

The pieces: :class:`_Endpoints` answers the routes of one app (its model and worker),
:class:`_Call` carries one request through the worker (its job, its events, its JSON or SSE
answer), and the exception handlers below turn every error into OpenAI's error body.
FastAPI is imported only inside the functions that need it (the ``serve`` extra).
"""

import asyncio
import json
import logging
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from .metrics import Metrics, Observe, rule_label
from .protocol import (MAX_BODY_BYTES, APIError, SamplingRequest, TokenizeRequest, error_body, parse_chat,
                       parse_completion, parse_detokenize, parse_json, parse_tokenize)
from .worker import RETRY_AFTER_S, Job, ServedModel, Worker

__all__ = ["create_app", "run_server"]

log = logging.getLogger("multidraft.serve")
_POLL_S = 0.25  # how often a waiting request checks that its client is still there
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def default_max_in_flight(queue_size: int, max_lanes: int) -> int:
    """The default cap on requests in flight: the queue, the lanes, and 16 more being read,
    parsed or tokenized."""
    return queue_size + max_lanes + 16


def create_app(model: ServedModel, *, queue_size: int = 64, shutdown_grace_s: float = 30.0, max_lanes: int = 1,
               max_body_bytes: int = MAX_BODY_BYTES, max_in_flight: int | None = None, api_key: str | None = None,
               worker=None):
    """The ASGI app serving ``model``; ``app.state.worker`` is its worker: a ``Worker`` of
    ``queue_size`` and ``max_lanes`` made here, or ``worker`` when given (a ``replicas.Router``:
    the replicas on Ray behind this one ingress; ``model`` then only tokenizes and describes). A request body longer
    than ``max_body_bytes`` is answered 413 before it is parsed (see ``_body_of``). At most
    ``max_in_flight`` POST requests (default :func:`default_max_in_flight`) are in flight at once,
    from their first byte to the end of their answer (reading, parsing, tokenizing, queued,
    decoding, streaming); one more is answered 503 with ``Retry-After`` before its body is read
    (``_InFlight``), so the memory held by requests is at most ``max_in_flight`` bodies.

    ``app.state.metrics`` is the app's :class:`metrics.Metrics` (its own registry, served at
    ``GET /metrics``), None without ``prometheus_client`` (``/metrics`` is then a 501 naming the
    install command); every request passes :class:`metrics.Observe` (counted, a log line per POST).

    ``api_key``: None (no key), or the key every API route (``/v1/...``, ``/tokenize``,
    ``/detokenize``, ``/infill``) needs as ``Authorization: Bearer KEY`` (``_KeyMiddleware``: 401
    ``invalid_api_key`` before the body is read; ``/health`` and the operators' routes stay open, as
    vLLM's ``--api-key``)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    if max_in_flight is None:
        max_in_flight = default_max_in_flight(queue_size, max_lanes)
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ValueError(f"max_in_flight must be a positive integer, got {max_in_flight!r}")
    if worker is None:
        worker = Worker(model, queue_size, max_lanes)
    endpoints = _Endpoints(model, worker, shutdown_grace_s)
    app = FastAPI(title="multidraft serve", lifespan=endpoints.lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.worker = worker
    app.state.model = model
    in_flight = app.state.in_flight = _InFlight(max_in_flight)
    endpoints.in_flight = in_flight
    from .. import _optional

    metrics = app.state.metrics = Metrics(worker, in_flight) if _optional.available("prometheus_client") else None
    if metrics is not None:
        worker.observe = metrics.decoded
    app.add_middleware(_InFlightMiddleware, count=in_flight)
    if api_key is not None:
        if not isinstance(api_key, str) or not api_key:
            raise ValueError("api_key must be a non-empty string or None")
        app.add_middleware(_KeyMiddleware, key=api_key)
    app.add_middleware(Observe, metrics=metrics)  # added last: the outermost, it sees every answer
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _internal)
    app.get("/health")(endpoints.health)

    async def ready():
        """Readiness (a load balancer's or Kubernetes' readinessProbe): 200 while requests are
        admitted, 503 with ``Retry-After`` while the worker starts, drains (SIGTERM) or has stopped.
        ``/health`` is liveness: 200 whenever the process answers."""
        if worker.ready:
            return {"status": "ready", "model": model.name}
        state = "draining" if worker.draining.is_set() else "starting"
        return JSONResponse({"status": state, "model": model.name}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})

    app.get("/ready")(ready)
    app.get("/readyz")(ready)

    @app.get("/metrics")
    async def metrics_text():
        if metrics is None:
            raise APIError(501, f"/metrics needs prometheus_client: {_optional.hint('prometheus_client')}",
                           type="server_error", code="not_implemented")
        body, kind = metrics.render()
        return Response(body, media_type=kind)

    app.get("/v1/models")(endpoints.models)
    app.get("/v1/models/{model_id:path}")(endpoints.retrieve)

    @app.post("/v1/completions")
    async def completions(request: Request):
        raw = await _body_of(request, max_body_bytes)
        return await endpoints.serve(request, await asyncio.to_thread(_parse, parse_completion, raw))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        raw = await _body_of(request, max_body_bytes)
        return await endpoints.serve(request, await asyncio.to_thread(_parse, parse_chat, raw))

    @app.post("/infill")
    async def infill():
        raise APIError(400, "/infill (fill-in-the-middle) is not supported by this server; send the prompt with "
                            "the model's FIM tokens to /v1/completions", param="/infill", code="unsupported_endpoint")

    @app.post("/tokenize")
    async def tokenize(request: Request):
        raw = await _body_of(request, max_body_bytes)
        return await endpoints.run_tokenizer(endpoints.tokenize, await asyncio.to_thread(_parse, parse_tokenize, raw))

    @app.post("/detokenize")
    async def detokenize(request: Request):
        raw = await _body_of(request, max_body_bytes)
        return await endpoints.run_tokenizer(endpoints.detokenize,
                                             await asyncio.to_thread(_parse, parse_detokenize, raw))

    return app


# --- errors: every one answered with OpenAI's error body ---------------------------------------

async def _api_error(request, exc: APIError):
    from fastapi.responses import JSONResponse

    rec = request.scope.get("multidraft.record")
    if rec is not None:
        rec["error"] = exc.code or exc.type

    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


class _InFlight:
    """The count of POST requests in flight and its cap (one event loop: no lock)."""

    def __init__(self, limit: int):
        self.limit, self.now, self.refused = limit, 0, 0


class _InFlightMiddleware:
    """ASGI middleware: a POST request past ``count.limit`` in flight is answered 503
    ('server_overloaded', ``Retry-After``) at once, its body unread; the others are counted
    from their start to the end of their answer, whatever way it ends (an error, a client gone)."""

    def __init__(self, app, count: _InFlight):
        self.app, self.count = app, count

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        count = self.count
        if count.now >= count.limit:
            count.refused += 1
            err = APIError(503, f"the server is overloaded: {count.limit} requests are in flight; retry later",
                           type="server_error", code="server_overloaded")
            body = json.dumps(err.body()).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(RETRY_AFTER_S).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        count.now += 1
        try:
            await self.app(scope, receive, send)
        finally:
            count.now -= 1


_KEYED = ("/v1/", "/tokenize", "/detokenize", "/infill")  # the routes an api_key guards (by path prefix)


class _KeyMiddleware:
    """ASGI middleware: a request to a guarded route (``_KEYED``) without ``Authorization: Bearer
    KEY`` (compared in constant time) is answered 401 'invalid_api_key', its body unread."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        import hmac

        if scope["type"] != "http" or not scope.get("path", "").startswith(_KEYED):
            return await self.app(scope, receive, send)
        auth = dict(scope.get("headers") or ()).get(b"authorization", b"")
        if auth[:7].lower() == b"bearer " and hmac.compare_digest(auth[7:].strip(), self.key):
            return await self.app(scope, receive, send)
        err = APIError(401, "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'",
                       code="invalid_api_key")
        body = json.dumps(err.body()).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


async def _http_error(request, exc):  # starlette's HTTPException: no route, wrong method
    from fastapi.responses import JSONResponse

    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    msg = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
    return JSONResponse(error_body(msg, kind, None, None), status_code=exc.status_code)


async def _validation_error(request, exc):  # not reached: bodies are parsed by protocol.py
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(str(exc), "invalid_request_error"), status_code=400)


async def _internal(request, exc):
    from fastapi.responses import JSONResponse

    log.exception("unhandled error")
    return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "server_error", None, "internal_error"),
                        status_code=500)


async def _body_of(request, limit: int) -> bytes:
    """The bytes of ``request``'s body; APIError 413 when they pass ``limit``: refused by the
    Content-Length header before any byte is read, else by the count of the bytes received
    (a chunked body), so a long body never sits in memory."""
    try:
        length = int(request.headers.get("content-length", "0"))
    except ValueError:  # the server checks the header (uvicorn: 400); the count below still holds
        length = 0
    if length > limit:
        raise _too_large(limit, length)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int, length: int | None = None) -> APIError:
    size = "" if length is None else f" ({length} bytes)"
    return APIError(413, f"the request body{size} is longer than this server's limit of {limit} bytes",
                    code="request_too_large")


def _parse(parse, raw: bytes):
    """``parse`` (``parse_completion`` or ``parse_chat``) of the JSON body ``raw``; run off the event loop."""
    return parse(parse_json(raw))


# --- the endpoints of one app ------------------------------------------------------------------

class _Endpoints:
    """The routes of one app over its ``model`` and ``worker``; ``lifespan`` starts and stops the worker."""

    def __init__(self, model: ServedModel, worker: Worker, shutdown_grace_s: float):
        self.model, self.worker, self.shutdown_grace_s = model, worker, shutdown_grace_s
        self.in_flight: _InFlight | None = None
        self.created = int(time.time())
        # prompts are tokenized in this thread (the lifespan's), off the event loop, one at a time
        # (a tokenizer is not safe to share between threads: transformers' fast ones raise
        # "Already borrowed")
        self.tokenizing = ThreadPoolExecutor(1, thread_name_prefix="multidraft-tokenize")
        self.tokenizing.shutdown()

    @asynccontextmanager
    async def lifespan(self, app):
        model, worker = self.model, self.worker
        worker.start()
        self.tokenizing = ThreadPoolExecutor(1, thread_name_prefix="multidraft-tokenize")
        log.info("serving %s (%s) with %s", model.name, model.engine, json.dumps(model.describe()))
        try:
            yield
        finally:
            worker.drain(self.shutdown_grace_s)
            self.tokenizing.shutdown(wait=False, cancel_futures=True)
            await asyncio.to_thread(worker.stop, self.shutdown_grace_s + 5)
            log.info("worker stopped: %s", json.dumps(worker.status()))

    async def health(self):
        flight = self.in_flight
        return {"status": "shutting_down" if self.worker.draining.is_set() else "ok", "model": self.model.name,
                **self.worker.status(),
                **({} if flight is None else {"in_flight": flight.now, "max_in_flight": flight.limit,
                                              "overloaded": flight.refused})}

    def _card(self) -> dict:
        model = self.model
        return {"id": model.name, "object": "model", "created": self.created, "owned_by": "multidraft",
                "speculative": model.describe(), "context_length": model.codec.context}

    async def models(self):
        return {"object": "list", "data": [self._card()]}

    async def retrieve(self, model_id: str):
        """``GET /v1/models/{id}`` (the client's ``models.retrieve``): the model object; 404 for another id."""
        if model_id != self.model.name:
            raise APIError(404, f"The model `{model_id}` does not exist; this server serves `{self.model.name}`",
                           param="model", code="model_not_found")
        return self._card()

    async def run_tokenizer(self, fn, arg):
        """``fn(arg)`` in the ``tokenizing`` thread (the tokenizer is used by one thread only)."""
        try:
            fut = asyncio.get_running_loop().run_in_executor(self.tokenizing, fn, arg)
        except RuntimeError:  # the executor is shut: the app's lifespan has ended
            raise APIError(503, "the server is shutting down", type="server_error", code="server_shutting_down") \
                from None
        return await fut

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model.name:
            raise APIError(404, f"The model `{name}` does not exist; this server serves `{self.model.name}`",
                           param="model", code="model_not_found")

    def tokenize(self, req: TokenizeRequest) -> dict:
        """``POST /tokenize`` (llama-server's ``content`` / vLLM's ``prompt`` or ``messages``): the token
        ids a completion prompt (or chat) of this text is decoded from (``add_special: false``: without
        the tokenizer's special tokens), their ``count`` and the context (``max_model_len``)."""
        self.check_model(req.model)
        codec = self.model.codec
        if req.messages is not None:
            ids = codec.chat(req.messages)
        else:
            ids = codec.encode(req.text, add_special_tokens=req.add_special is not False)
        return {"tokens": ids, "count": len(ids), "max_model_len": codec.context}

    def detokenize(self, arg: tuple) -> dict:
        """``POST /detokenize``: the text of token ids (``content``, llama-server's; ``prompt``, vLLM's);
        an id outside the vocabulary is a 400 on ``tokens``."""
        model, tokens = arg
        self.check_model(model)
        V = _vocab(self.model)
        bad = [t for t in tokens if not 0 <= t < V]
        if bad:
            raise APIError(400, f"tokens holds token ids outside the vocabulary [0, {V}): {bad[:5]}",
                           param="tokens", code="invalid_value")
        text = self.model.codec.decode(tokens)
        return {"content": text, "prompt": text}

    async def serve(self, request, req: SamplingRequest):
        """Answer ``req`` (parsed from ``request``): one JSON body, or an SSE stream when ``req.stream``."""
        from fastapi.responses import StreamingResponse

        rec = request.scope.get("multidraft.record") or {"id": uuid.uuid4().hex[:24], "t0": time.perf_counter()}
        rec["seed"] = req.seed
        if self.worker.draining.is_set():  # refused before the prompt is tokenized
            raise APIError(503, "the server is shutting down", type="server_error", code="server_shutting_down",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        try:
            prepared = asyncio.get_running_loop().run_in_executor(self.tokenizing, self.prepare, req)
        except RuntimeError:  # the executor is shut: the app's lifespan has ended
            raise APIError(503, "the server is shutting down", type="server_error", code="server_shutting_down",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        ids, max_tokens = await prepared
        rec["prompt_tokens"] = len(ids)
        settings = self.fit(req, ids, self.settings(req, max_tokens))
        call = _Call(request, req, ids, settings, rec)
        self.worker.submit(call.job)  # 429 / 503 raised here, before any byte is sent
        rid = ("cmpl-" if req.endpoint == "completions" else "chatcmpl-") + rec["id"]
        head = {"id": rid, "created": int(time.time()), "model": self.model.name, "seed": req.seed,
                "system_fingerprint": "multidraft"}
        if not req.stream:
            return await call.whole(head)
        return StreamingResponse(call.sse(head), media_type="text/event-stream", headers=_SSE_HEADERS)

    def settings(self, req: SamplingRequest, max_tokens: int):
        """The model's decode settings with ``req``'s changes; a bad value is APIError 400 on its request field."""
        try:
            return self.model.request_settings(req.settings_changes(), max_tokens)
        except ValueError as exc:
            arg = getattr(exc, "arg", None)
            param = {"max_new_tokens": req.max_tokens_param}.get(arg, arg)
            raise APIError(400, str(exc), param=param, code="invalid_value") from None

    def fit(self, req: SamplingRequest, ids: list[int], settings):
        """``settings`` where a lane of them fits the context alone, else APIError 400
        'context_length_exceeded' now, before anything is sent (a stream is not answered 200 and
        then an error event). On llama.cpp a lane holds its prompt, ``max_tokens`` and one step's
        uncommitted tree in the KV cells (``LlamaBatchRunner.cells``); a request without
        ``max_tokens`` has its default cut to the room left."""
        if self.model.engine != "llama.cpp":
            return settings
        from ..decoding.batch import LlamaBatchRunner

        ctx, tree = self.model.codec.context, LlamaBatchRunner.handles(settings)
        room = ctx - len(ids) - tree
        if settings.max_new_tokens <= room:
            return settings
        if req.max_tokens is None and room >= 1:
            return self.settings(req, room)
        param = req.max_tokens_param
        raise APIError(400, f"This model's maximum context length is {ctx} tokens. However, this request may need "
                            f"{len(ids) + settings.max_new_tokens + tree} ({len(ids)} in the prompt, "
                            f"{settings.max_new_tokens} in the completion, {tree} for one speculative step's draft "
                            f"tree). Please reduce the prompt or {param}"
                            + (f" (at most {room} here)." if room >= 1 else "."),
                       param=param if room >= 1 else ("messages" if req.endpoint == "chat" else "prompt"),
                       code="context_length_exceeded")

    def prepare(self, req: SamplingRequest) -> tuple[list[int], int]:
        """The prompt's token ids and the completion's token budget; APIError 404/400 when ``req`` can't be served.
        Runs in the ``tokenizing`` thread, never on the event loop."""
        model = self.model
        if req.model != model.name:
            raise APIError(404, f"The model `{req.model}` does not exist; this server serves `{model.name}`",
                           param="model", code="model_not_found")
        ids, param = self.prompt_ids(req)
        if not ids:
            raise APIError(400, "the prompt encodes to no tokens", param=param, code="invalid_value")
        ctx = model.codec.context
        if len(ids) >= ctx:
            raise APIError(400, f"This model's maximum context length is {ctx} tokens, but the prompt has {len(ids)} "
                                f"tokens. Please reduce the length of the prompt.", param=param,
                           code="context_length_exceeded")
        room = ctx - len(ids)
        if req.max_tokens is None:
            default = 16 if req.endpoint == "completions" else model.default_max_tokens
            return ids, min(default, room)
        if req.max_tokens > room:
            raise APIError(400, f"This model's maximum context length is {ctx} tokens. However, you requested "
                                f"{len(ids) + req.max_tokens} tokens ({len(ids)} in the prompt, {req.max_tokens} in "
                                f"the completion). Please reduce the prompt or {req.max_tokens_param} (at most {room} "
                                f"here).",
                           param=req.max_tokens_param, code="context_length_exceeded")
        return ids, req.max_tokens

    def measure(self, text: str, param: str) -> None:
        """APIError 400 'context_length_exceeded' when ``text`` cannot fit the context whatever the
        tokenizer makes of it: its lower bound ``codec.min_tokens(text)`` (bytes / the most bytes
        a token covers, ``datasets.ByteBound``) reaches the context. Checked before the tokenizer
        runs; ``prepare`` checks the exact count after it."""
        codec = self.model.codec
        n, ctx = codec.min_tokens(text), codec.context
        if n >= ctx:
            bound = codec.bound
            raise APIError(400, f"This model's maximum context length is {ctx} tokens, but the prompt has at least {n} "
                                f"tokens ({bound.text_bytes(text)} bytes of text; no token of this model covers more "
                                f"than {bound.bytes_per_token} bytes). Please reduce the length of the prompt.",
                           param=param, code="context_length_exceeded")

    def prompt_ids(self, req: SamplingRequest) -> tuple[list[int], str]:
        """``req``'s prompt as token ids, and the request field it came from ('messages' or 'prompt')."""
        codec = self.model.codec
        if req.endpoint == "chat":
            text = codec.chat_text(req.prompt)
            self.measure(text, "messages")
            return codec.encode_chat_text(text), "messages"
        if isinstance(req.prompt, str):
            self.measure(req.prompt, "prompt")
            return codec.encode(req.prompt), "prompt"
        if len(req.prompt) >= codec.context:  # measured before the ids are read: prepare refuses it
            return list(req.prompt), "prompt"
        V = _vocab(self.model)
        bad = [t for t in req.prompt if not 0 <= t < V]
        if bad:
            raise APIError(400, f"prompt holds token ids outside the vocabulary [0, {V}): {bad[:5]}",
                           param="prompt", code="invalid_value")
        return list(req.prompt), "prompt"


# --- one request through the worker ------------------------------------------------------------

class _Call:
    """One request on its way through the worker: its :class:`Job`, the queue of the job's events
    (filled from the worker thread), and its answer, whole (``whole``) or streamed (``sse``)."""

    def __init__(self, request, req: SamplingRequest, ids: list[int], settings, rec: dict):
        self.request, self.req, self.ids, self.rec = request, req, ids, rec
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.job = Job(ids, settings, req.seed, req.stop, self.emit, arrived=rec["t0"],
                       logprobs=req.logprobs)
        self.offset = 0  # completions' logprobs: the text offset of the next token

    def record(self, done: dict) -> None:
        """The request's record (``metrics.Observe``'s log line) gets ``done``'s counters."""
        spec = done["speculative"]
        self.rec.update(completion_tokens=done["completion_tokens"], finish_reason=done["finish_reason"],
                        rule=rule_label(spec), target_calls=spec["target_calls"],
                        accepted_tokens=spec["accepted_tokens"], block_efficiency=spec["block_efficiency"])

    def emit(self, ev):  # from the worker thread
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, ev)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def next_event(self):
        """The job's next event, or None once the client has gone away (the job is then cancelled)."""
        while True:
            try:
                return await asyncio.wait_for(self.events.get(), _POLL_S)
            except asyncio.TimeoutError:
                if await self.request.is_disconnected():
                    self.job.cancel.set()
                    return None

    def usage(self, done) -> dict:
        return self._usage(done["completion_tokens"])

    def _usage(self, n: int) -> dict:
        return {"prompt_tokens": len(self.ids), "completion_tokens": n, "total_tokens": len(self.ids) + n}

    async def whole(self, head: dict):
        """The JSON response once the job is done (499 if the client went away first)."""
        from fastapi.responses import JSONResponse

        try:
            entries = []
            while True:
                ev = await self.next_event()
                if ev is None:  # the client went away; the worker stops this request
                    self.rec["error"] = "client_disconnected"
                    return JSONResponse(error_body("client disconnected", "invalid_request_error"), 499)
                if ev[0] == "error":
                    raise ev[1]
                if ev[0] == "delta":
                    entries.extend(ev[3] or ())
                    continue
                done = ev[1]
                self.record(done)
                break
        finally:
            self.job.cancel.set()  # a no-op once done; stops the decode if this task was cancelled
        lp = self.logprobs(entries + (done["logprobs"] or [])) if self.req.logprobs is not None else None
        return JSONResponse({**head, **_full(self.req, done, lp), "usage": self.usage(done),
                             "speculative": done["speculative"]})

    def logprobs(self, entries: list | None):
        """The response's ``logprobs`` of the chat entries ``entries`` (``worker.logprob_entries``):
        a chat's ``{"content": entries, "refusal": None}``; a completion's ``{"tokens",
        "token_logprobs", "top_logprobs", "text_offset"}`` (offsets run on across a stream's chunks)."""
        if entries is None:
            return None
        if self.req.endpoint == "chat":
            return {"content": entries, "refusal": None}
        offsets = []
        for e in entries:
            offsets.append(self.offset)
            self.offset += len(e["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets}

    async def sse(self, head: dict):
        """The server-sent events: (chat) the role chunk, a chunk per delta, the finish_reason chunk
        (with the ``speculative`` statistics), (include_usage) the usage chunk (no choices), then
        [DONE]; an error event is sent as its body, then [DONE]. As OpenAI's, the usage is in the
        usage chunk only (a client adding up the chunks' usage counts it once), unless
        ``continuous_usage_stats`` (vLLM's) asks for the usage so far in every chunk."""
        req = self.req
        every = req.continuous_usage

        def so_far(n: int) -> dict:
            return {"usage": self._usage(n)} if every else {}

        try:
            if req.endpoint == "chat":
                yield _sse({**head, "object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}], **so_far(0)})
            n = 0
            while True:
                ev = await self.next_event()
                if ev is None:
                    self.rec["error"] = "client_disconnected"
                    return
                if ev[0] == "delta":
                    n = ev[2]
                    yield _sse({**head, **_chunk(req, ev[1], None, self.logprobs(ev[3])), **so_far(n)})
                elif ev[0] == "error":
                    self.rec["error"] = ev[1].code or ev[1].type
                    yield _sse(ev[1].body())
                    yield "data: [DONE]\n\n"
                    return
                else:
                    done = ev[1]
                    self.record(done)
                    last = {**head, **_chunk(req, None, done["finish_reason"], self.logprobs(done["logprobs"])),
                            **so_far(done["completion_tokens"]), "speculative": done["speculative"]}
                    yield _sse(last)
                    if req.include_usage:
                        yield _sse({**head, "object": last["object"], "choices": [], "usage": self.usage(done),
                                    "speculative": done["speculative"]})
                    yield "data: [DONE]\n\n"
                    return
        finally:
            self.job.cancel.set()


def _vocab(model: ServedModel) -> int:
    from ..decoding.runners import model_vocab_size

    return model_vocab_size(model.target, "target")


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _full(req: SamplingRequest, done: dict, logprobs=None) -> dict:
    if req.endpoint == "completions":
        return {"object": "text_completion", "choices": [
            {"index": 0, "text": done["text"], "logprobs": logprobs, "finish_reason": done["finish_reason"]}]}
    return {"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": done["text"]}, "logprobs": logprobs,
         "finish_reason": done["finish_reason"]}]}


def _chunk(req: SamplingRequest, text, finish, logprobs=None) -> dict:
    if req.endpoint == "completions":
        return {"object": "text_completion", "choices": [
            {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}]}
    delta = {} if text is None else {"content": text}
    return {"object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}


def run_server(model: ServedModel, *, host: str = "127.0.0.1", port: int = 8000, queue_size: int = 64,
               shutdown_grace_s: float = 30.0, log_level: str = "info", max_lanes: int = 1,
               max_body_bytes: int = MAX_BODY_BYTES, max_in_flight: int | None = None,
               api_key: str | None = None, worker=None) -> int:
    """Serve ``model`` (through ``worker`` when given, see ``create_app``) until SIGINT or SIGTERM (see the module docstring); returns 0 after a
    SIGTERM or a clean stop. Logging goes through the ``logging`` configuration of the caller
    (uvicorn's own configuration is not installed). Requests in flight are capped by the app
    (``create_app``: 503 with Retry-After); open connections by uvicorn's ``limit_concurrency``
    at ``2 * max_in_flight + 32`` (its own plain 503, a backstop: idle keep-alive connections
    close after 5 s)."""
    import uvicorn

    if max_in_flight is None:
        max_in_flight = default_max_in_flight(queue_size, max_lanes)
    app = create_app(model, queue_size=queue_size, shutdown_grace_s=shutdown_grace_s, max_lanes=max_lanes,
                     max_body_bytes=max_body_bytes, max_in_flight=max_in_flight, api_key=api_key, worker=worker)
    worker: Worker = app.state.worker

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if not worker.draining.is_set():
                st = worker.status()
                log.info("draining: %d requests decoding may take %g s; %d queued are answered 503; /ready is 503",
                         st["lanes"], shutdown_grace_s, st["queued"])
            super().handle_exit(sig, frame)
            worker.drain(shutdown_grace_s)  # refuse and answer the queue now; the running request has the grace

    # loop and http fixed: uvicorn would pick uvloop / httptools when installed (ray[serve] brings both),
    # and the server's behaviour (bad requests, disconnects, signals) must not depend on what is installed
    cfg = uvicorn.Config(app, host=host, port=port, log_config=None, log_level=log_level, lifespan="on",
                         loop="asyncio", http="h11",
                         timeout_graceful_shutdown=shutdown_grace_s + 5, access_log=log_level == "debug",
                         limit_concurrency=2 * max_in_flight + 32)
    server = _Server(cfg)
    # uvicorn re-raises the signal that stopped it once it has shut down; for SIGTERM (a
    # service manager's stop) that would end the process by the signal after a clean shutdown,
    # so SIGTERM is a no-op outside the server and the process exits 0. SIGINT keeps the
    # command line's behaviour ("interrupted", 130).
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
