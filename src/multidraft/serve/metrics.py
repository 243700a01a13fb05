"""What operators read: the Prometheus metrics and the per-request log line of one app.

:class:`Metrics` holds the app's own ``prometheus_client.CollectorRegistry`` (never the
process-global one, so several apps in one process do not clash) and renders it for
``GET /metrics`` (``generate_latest``, ``CONTENT_TYPE_LATEST``: Prometheus' text format). The
numbers come from the places the server already reports them, never a second count:

* ``multidraft_requests_total{endpoint, status}`` -- every HTTP request answered, by route and
  status code (counted by :class:`Observe`, the outermost middleware, so a 503 refused before its
  body is read and a 500 count too); ``multidraft_request_latency_seconds{endpoint}`` -- from its
  first byte to the end of its answer (the last byte of a stream), for the two POST endpoints;
* ``multidraft_queue_depth``, ``multidraft_lanes_in_use``, ``multidraft_lanes_max``,
  ``multidraft_requests_in_flight``, ``multidraft_ready`` -- gauges read from ``Worker.status()``
  and the in-flight count at each scrape (what ``/health`` reports);
* per decoded request (``Worker.observe``, from the same ``speculative`` object the response
  carries), labelled by ``rule`` (the registered verification rule, ``Settings.describe()['rule']``;
  ``target`` for the target alone): ``multidraft_generated_tokens_total`` (``new_tokens``),
  ``multidraft_target_calls_total``, ``multidraft_accepted_tokens_total``, the histogram
  ``multidraft_block_efficiency`` (one observation per request), and
  ``multidraft_completion_tokens_total`` (``usage.completion_tokens``) and
  ``multidraft_time_to_first_token_seconds`` (from the request's first byte to the decode step
  that gave its first token). The block efficiency of a rule over a window is
  ``rate(generated_tokens_total) / rate(target_calls_total)``: tokens per target forward, the
  ratio ``decoding.Result.block_efficiency`` reports per request (Leviathan et al. 2023,
  "Fast Inference from Transformers via Speculative Decoding", section 3).

The log line: one JSON object per POST request on the logger ``multidraft.serve.requests``
(:data:`REQUEST_LOG`), written when its answer ends, with the request id (also the response's
``X-Request-Id`` header), endpoint, status, seed, the speculative counters and the latency.
"""
from __future__ import annotations

import json
import logging
import re
import time
import uuid

from .. import _optional

__all__ = ["Metrics", "Observe", "REQUEST_LOG", "route_label", "rule_label"]

REQUEST_LOG = "multidraft.serve.requests"
log = logging.getLogger(REQUEST_LOG)

# seconds: a tiny pair answers in milliseconds, a 1.5B pair on CPU in seconds to minutes
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# tokens per target call: 1 for the target alone, at most depth + 1 per call
EFFICIENCY_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0)

_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ready", "/readyz", "/metrics")
POST_ROUTES = ("/v1/completions", "/v1/chat/completions")
_CLIENT_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")  # an X-Request-Id kept as sent (a load balancer's)


def route_label(path: str) -> str:
    """The ``endpoint`` label of a request path: a route of the app, ``/v1/models/{id}``, or
    ``other`` (so an unknown path cannot grow the label set)."""
    if path in _ROUTES:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    return "other"


def rule_label(spec: dict) -> str:
    """The ``rule`` label of a ``speculative`` object: its rule, or ``target`` for the target alone."""
    return spec.get("rule") or "target"


class Metrics:
    """The Prometheus metrics of one app (module docstring); ``worker`` a ``Worker``, ``in_flight``
    the app's in-flight count (``.now``, ``.limit``)."""

    def __init__(self, worker, in_flight):
        prom = _optional.require("prometheus_client")
        self._prom = prom
        r = self.registry = prom.CollectorRegistry(auto_describe=True)
        self.requests = prom.Counter("multidraft_requests", "HTTP requests answered, by endpoint and status code",
                                     ["endpoint", "status"], registry=r)
        self.latency = prom.Histogram("multidraft_request_latency_seconds",
                                      "Completion requests: seconds from the first byte to the end of the answer",
                                      ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = prom.Histogram("multidraft_time_to_first_token_seconds",
                                   "Seconds from a request's first byte to the decode step giving its first token",
                                   buckets=TTFT_BUCKETS, registry=r)
        self.generated = prom.Counter("multidraft_generated_tokens", "Tokens decoded (speculative.new_tokens)",
                                      ["rule"], registry=r)
        self.completion = prom.Counter("multidraft_completion_tokens", "Completion tokens (usage.completion_tokens)",
                                       ["rule"], registry=r)
        self.target_calls = prom.Counter("multidraft_target_calls", "Target forward passes (speculative.target_calls)",
                                         ["rule"], registry=r)
        self.accepted = prom.Counter("multidraft_accepted_tokens",
                                     "Draft tokens accepted (speculative.accepted_tokens)", ["rule"], registry=r)
        self.efficiency = prom.Histogram("multidraft_block_efficiency",
                                         "Per request: tokens decoded per target call (speculative.block_efficiency)",
                                         ["rule"], buckets=EFFICIENCY_BUCKETS, registry=r)

        def gauge(name, doc, read):
            prom.Gauge(name, doc, registry=r).set_function(read)

        gauge("multidraft_queue_depth", "Requests waiting for a lane", lambda: worker.status()["queued"])
        gauge("multidraft_lanes_in_use", "Lanes decoding a request", lambda: worker.status()["lanes"])
        gauge("multidraft_lanes_max", "Lanes of the batch decoder (--max-lanes)", lambda: worker.max_lanes)
        gauge("multidraft_requests_in_flight", "POST requests in flight (read, queued, decoding, streaming)",
              lambda: in_flight.now)
        gauge("multidraft_ready", "1 when the server admits requests (GET /ready is 200), else 0",
              lambda: float(worker.ready))

    def render(self) -> tuple[bytes, str]:
        """The exposition (Prometheus' text format) and its content type."""
        return self._prom.generate_latest(self.registry), self._prom.CONTENT_TYPE_LATEST

    def answered(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        if endpoint in POST_ROUTES:
            self.latency.labels(endpoint).observe(seconds)

    def decoded(self, job, done: dict) -> None:
        """One decoded request (from the worker thread): ``done`` is the result the response is made of."""
        spec = done["speculative"]
        rule = rule_label(spec)
        self.generated.labels(rule).inc(spec["new_tokens"])
        self.completion.labels(rule).inc(done["completion_tokens"])
        self.target_calls.labels(rule).inc(spec["target_calls"])
        self.accepted.labels(rule).inc(spec["accepted_tokens"])
        if spec["target_calls"]:
            self.efficiency.labels(rule).observe(spec["block_efficiency"])
        if done.get("first_token_at") is not None:
            self.ttft.observe(done["first_token_at"] - job.arrived)


def request_id(headers) -> str:
    """The request's id: its ``X-Request-Id`` header where it is 1 to 64 of ``[A-Za-z0-9._:-]``
    (as a load balancer or proxy sets it, so its logs and ours join), else 24 random hex digits."""
    for name, val in headers:
        if name == b"x-request-id" and _CLIENT_ID.fullmatch(val):
            return val.decode()
    return uuid.uuid4().hex[:24]


class Observe:
    """ASGI middleware, the outermost of the app: gives every request a record
    (``scope['multidraft.record']``: its ``id`` (:func:`request_id`), sent back as ``X-Request-Id``,
    and what the endpoint adds: seed, counters), counts it in ``metrics`` (when given) once its
    answer ends, and writes the one log line of a POST request (module docstring)."""

    def __init__(self, app, metrics: Metrics | None):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        rec = scope["multidraft.record"] = {"id": request_id(scope.get("headers", ())), "t0": t0}
        status = [500]

        async def observed(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
                msg = {**msg, "headers": [*msg.get("headers", ()), (b"x-request-id", rec["id"].encode())]}
            await send(msg)

        try:
            await self.app(scope, receive, observed)
        finally:
            seconds = time.perf_counter() - t0
            endpoint = route_label(scope.get("path", ""))
            if self.metrics is not None:
                self.metrics.answered(endpoint, status[0], seconds)
            if scope.get("method") == "POST":
                _log_line(rec, endpoint, status[0], seconds)


def _log_line(rec: dict, endpoint: str, status: int, seconds: float) -> None:
    line = {"event": "request", "id": rec["id"], "endpoint": endpoint, "status": status,
            "seed": rec.get("seed"), "prompt_tokens": rec.get("prompt_tokens"),
            "completion_tokens": rec.get("completion_tokens"), "finish_reason": rec.get("finish_reason"),
            "rule": rec.get("rule"), "target_calls": rec.get("target_calls"),
            "accepted_tokens": rec.get("accepted_tokens"), "block_efficiency": rec.get("block_efficiency"),
            "latency_s": round(seconds, 6), "error": rec.get("error")}
    log.info(json.dumps(line, separators=(",", ":")))
