"""What operators read: ``GET /metrics`` parsed by the Prometheus client's own parser (its counters
and histograms equal to the requests sent and to the ``speculative`` objects answered), readiness
(``/ready``), the one JSON log line per request, and a drain refusing new work with Retry-After."""
import json
import logging

import pytest

from live_server import MODEL, start, tiny_served

httpx = pytest.importorskip("httpx")
parser = pytest.importorskip("prometheus_client.parser")


def scrape(live) -> dict:
    """``/metrics`` as {(sample name, frozenset of labels): value}, parsed by prometheus_client."""
    r = httpx.get(live.url + "/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    out = {}
    for fam in parser.text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def fresh():
    """A server of its own (its own registry: the counts start at zero)."""
    srv = start(tiny_served(), queue_size=8, shutdown_grace_s=5)
    yield srv
    srv.close()


def test_metrics_count_the_requests_and_the_speculative_objects(fresh, caplog):
    caplog.set_level(logging.INFO, logger="multidraft.serve.requests")
    url = fresh.url
    spec, usage, ids = [], [], []
    with httpx.Client(timeout=60) as c:
        for seed in (1, 2):
            r = c.post(url + "/v1/completions", json={"model": MODEL, "prompt": "in the", "max_tokens": 12,
                                                      "temperature": 1.0, "seed": seed})
            assert r.status_code == 200
            spec.append(r.json()["speculative"]), usage.append(r.json()["usage"])
            ids.append(r.headers["x-request-id"])
            assert r.json()["id"] == "cmpl-" + ids[-1]
        chunks = []
        with c.stream("POST", url + "/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 10, "seed": 5,
                "stream": True, "stream_options": {"include_usage": True}}) as r:
            assert r.status_code == 200
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        spec.append(chunks[-1]["speculative"]), usage.append(chunks[-1]["usage"])
        bad = c.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 0},
                     headers={"X-Request-Id": "lb-42.a"})  # a load balancer's id is kept
        assert bad.status_code == 400 and bad.headers["x-request-id"] == "lb-42.a"
        missing = c.post(url + "/v1/completions", json={"model": "nope", "prompt": "x"})
        assert missing.status_code == 404
    m = scrape(fresh)
    req = "multidraft_requests_total"
    assert value(m, req, endpoint="/v1/completions", status="200") == 2
    assert value(m, req, endpoint="/v1/chat/completions", status="200") == 1
    assert value(m, req, endpoint="/v1/completions", status="400") == 1
    assert value(m, req, endpoint="/v1/completions", status="404") == 1
    lat = "multidraft_request_latency_seconds_count"
    assert value(m, lat, endpoint="/v1/completions") == 4 and value(m, lat, endpoint="/v1/chat/completions") == 1
    assert value(m, "multidraft_time_to_first_token_seconds_count") == 3
    assert value(m, "multidraft_time_to_first_token_seconds_bucket", le="+Inf") == 3
    rule = spec[0]["rule"]
    assert rule == "token_walk" and all(s["rule"] == rule for s in spec)
    # the counters are the sums of what the responses said: one source of the numbers
    assert value(m, "multidraft_target_calls_total", rule=rule) == sum(s["target_calls"] for s in spec) > 0
    assert value(m, "multidraft_accepted_tokens_total", rule=rule) == sum(s["accepted_tokens"] for s in spec)
    assert value(m, "multidraft_generated_tokens_total", rule=rule) == sum(s["new_tokens"] for s in spec)
    assert value(m, "multidraft_completion_tokens_total", rule=rule) == sum(u["completion_tokens"] for u in usage)
    assert value(m, "multidraft_block_efficiency_count", rule=rule) == 3
    assert value(m, "multidraft_block_efficiency_sum", rule=rule) == pytest.approx(
        sum(s["block_efficiency"] for s in spec), rel=1e-12)
    for s in spec:
        assert s["block_efficiency"] == pytest.approx(s["new_tokens"] / s["target_calls"], rel=1e-12)
    # the gauges: idle now
    assert value(m, "multidraft_queue_depth") == 0 and value(m, "multidraft_lanes_in_use") == 0
    assert value(m, "multidraft_lanes_max") == 1 and value(m, "multidraft_ready") == 1
    assert value(m, "multidraft_requests_in_flight") == 0
    # one JSON line per POST request, with its id, seed and counters
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "multidraft.serve.requests"]
    assert len(lines) == 5 and all(line["event"] == "request" for line in lines)
    ok = [line for line in lines if line["status"] == 200]
    assert [line["id"] for line in ok[:2]] == ids and [line["seed"] for line in ok] == [1, 2, 5]
    for line, s, u in zip(ok, spec, usage):
        assert line["target_calls"] == s["target_calls"] and line["accepted_tokens"] == s["accepted_tokens"]
        assert line["completion_tokens"] == u["completion_tokens"] and line["prompt_tokens"] == u["prompt_tokens"]
        assert line["rule"] == rule and line["latency_s"] > 0 and line["error"] is None
    assert [(line["status"], line["error"]) for line in lines if line["status"] != 200] == \
        [(400, "invalid_value"), (404, "model_not_found")]
    assert [line["id"] for line in lines if line["status"] == 400] == ["lb-42.a"]
    assert len({line["id"] for line in lines}) == 5


def test_each_app_has_its_own_registry(fresh, live):
    """Two apps in one process: the module's shared server counts none of ``fresh``'s requests."""
    assert fresh.app.state.metrics.registry is not live.app.state.metrics.registry
    before = value(scrape(fresh), "multidraft_requests_total", endpoint="/health", status="200")
    httpx.get(live.url + "/health")
    assert value(scrape(fresh), "multidraft_requests_total", endpoint="/health", status="200") == before
    assert value(scrape(live), "multidraft_requests_total", endpoint="/health", status="200") >= 1


def test_ready_then_draining():
    """``/ready`` is 200 while requests are admitted; once draining (what SIGTERM starts) it is
    503, a new request is 503 ``server_shutting_down`` with Retry-After, ``/health`` stays 200."""
    srv = start(tiny_served(), queue_size=4, shutdown_grace_s=1)
    try:
        r = httpx.get(srv.url + "/ready")
        assert r.status_code == 200 and r.json()["status"] == "ready"
        assert httpx.get(srv.url + "/readyz").status_code == 200
        srv.app.state.worker.drain(1.0)
        r = httpx.get(srv.url + "/ready")
        assert r.status_code == 503 and r.json()["status"] == "draining" and r.headers["retry-after"] == "1"
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "in the", "max_tokens": 4})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "server_shutting_down"
        h = httpx.get(srv.url + "/health")
        assert h.status_code == 200 and h.json()["status"] == "shutting_down"
        m = scrape(srv)
        assert value(m, "multidraft_ready") == 0
        assert value(m, "multidraft_requests_total", endpoint="/v1/completions", status="503") == 1
    finally:
        srv.close()


def test_metrics_without_prometheus_client_is_a_501(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    srv = start(tiny_served(), queue_size=4, shutdown_grace_s=1)
    try:
        assert srv.app.state.metrics is None
        r = httpx.get(srv.url + "/metrics")
        assert r.status_code == 501 and "pip install -e '.[serve]'" in r.json()["error"]["message"]
        assert httpx.get(srv.url + "/ready").status_code == 200
    finally:
        srv.close()


def test_gauges_while_a_request_decodes_and_one_waits():
    """The worker held inside its first decode step (the text decoder blocks): the gauges read one
    lane in use, one request queued and two in flight, as ``/health`` does."""
    import threading
    import time

    srv = start(tiny_served(), queue_size=4, shutdown_grace_s=1)
    codec = srv.app.state.model.codec
    entered, release = threading.Event(), threading.Event()
    decode = codec.decode

    def held(ids):
        entered.set()
        release.wait(30)
        return decode(ids)

    codec.decode = held  # an instance attribute: read by the worker when it admits a request
    answers = []

    def post(seed):
        answers.append(httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": "in the", "max_tokens": 4, "seed": seed}))

    threads = [threading.Thread(target=post, args=(s,)) for s in (1, 2)]
    try:
        threads[0].start()
        assert entered.wait(30)
        threads[1].start()
        for _ in range(600):
            if httpx.get(srv.url + "/health").json()["queued"] == 1:
                break
            time.sleep(0.05)
        m = scrape(srv)
        assert value(m, "multidraft_lanes_in_use") == 1 and value(m, "multidraft_queue_depth") == 1
        assert value(m, "multidraft_requests_in_flight") == 2 and value(m, "multidraft_ready") == 1
        assert value(m, "multidraft_time_to_first_token_seconds_count") == 0
        release.set()
        for t in threads:
            t.join(60)
        m = scrape(srv)
        assert value(m, "multidraft_time_to_first_token_seconds_count") == 2
        assert value(m, "multidraft_lanes_in_use") == 0 and value(m, "multidraft_queue_depth") == 0
    finally:
        release.set()
        for t in threads:
            t.join(60)
        srv.close()
    assert [a.status_code for a in answers] == [200, 200]


def test_request_id_is_the_clients_when_it_is_plain():
    from multidraft.serve.metrics import request_id

    assert request_id([(b"x-request-id", b"abc-1:2.3_x")]) == "abc-1:2.3_x"
    for bad in (b"", b"a b", b"x" * 65, b'{"json": 1}', b"caf\xc3\xa9"):
        made = request_id([(b"x-request-id", bad)])
        assert len(made) == 24 and int(made, 16) >= 0
