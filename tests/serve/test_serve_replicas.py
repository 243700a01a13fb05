"""``multidraft serve --replicas``: two replicas of the tiny pair on a local Ray behind the one
ingress (serve/replicas.py). Requests spread over both, every one is answered, the same seed
gives the same text on either, and a killed replica's requests are retried (nothing sent yet)
or answered with a retryable error (text already sent). Slow: a local Ray and two replica
processes start once for the module (bounded: each wait below has a deadline)."""
import functools
import json
import threading
import time

import pytest

from live_server import MODEL, LiveServer, slow_tiny_served

# one xdist worker runs the tests that start a local Ray (with tests/experiments/test_distributed.py's):
# a second local Ray started beside it could be found and joined (ray.init's address None)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("local_ray")]
httpx = pytest.importorskip("httpx")
pytest.importorskip("ray")


@pytest.fixture(scope="module")
def rep():
    import ray

    from multidraft.serve import create_app
    from multidraft.serve.replicas import Router, connect

    connect(num_cpus=2)
    try:
        load = functools.partial(slow_tiny_served, 0.02)
        router = Router(load, 2, queue_size=8, max_lanes=1, threads=1)
        srv = LiveServer(create_app(slow_tiny_served(0.0), queue_size=8, shutdown_grace_s=5, worker=router))
        t0 = time.monotonic()
        while httpx.get(srv.url + "/ready").status_code != 200:
            assert time.monotonic() - t0 < 120, "the replicas did not become ready"
            time.sleep(0.2)
        yield srv, router
        srv.close()
    finally:
        ray.shutdown()


def _complete(url, seed, max_tokens=8, prompt="ab"):
    return httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                                                    "seed": seed, "temperature": 1.0}, timeout=60)


def test_health_lists_each_replica_ready(rep):
    srv, _ = rep
    h = httpx.get(srv.url + "/health").json()
    assert [r["replica"] for r in h["replicas"]] == [0, 1]
    assert {r["state"] for r in h["replicas"]} == {"ready"}
    assert len({r["pid"] for r in h["replicas"]}) == 2  # two processes


def test_bad_requests_and_disconnects_as_on_one_process(rep):
    srv, router = rep
    r = httpx.post(srv.url + "/v1/completions", json={"model": "other", "prompt": "ab"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "ab", "max_tokens": 10 ** 6},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    before = router.counts["cancelled"]
    with httpx.stream("POST", srv.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": "ab", "max_tokens": 200, "seed": 3, "stream": True}) as r:
        next(r.iter_lines())  # the first chunk, then the client goes away
    t0 = time.monotonic()
    while router.counts["cancelled"] == before:  # the replica stops the lane: finish 'abort', counted cancelled
        assert time.monotonic() - t0 < 20, "the replica did not stop the abandoned stream"
        time.sleep(0.05)
    assert all(h.in_flight == 0 for h in router.replicas)


def test_requests_spread_over_both_and_every_one_is_answered(rep):
    srv, router = rep
    out = [None] * 8

    def one(i):
        out[i] = _complete(srv.url, seed=i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None and r.status_code == 200 for r in out), [r and r.status_code for r in out]
    served = [r.json()["speculative"]["replica"] for r in out]
    assert set(served) == {0, 1}
    assert all(r.json()["usage"]["completion_tokens"] >= 1 for r in out)
    assert sum(h["served"] for h in httpx.get(srv.url + "/health").json()["replicas"]) >= 8
    # /metrics reads the replicas' counters, as the one process's (Prometheus' own parser)
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text)}
    completion = sum(s.value for s in fams["multidraft_completion_tokens"].samples if s.name.endswith("_total"))
    assert completion >= sum(r.json()["usage"]["completion_tokens"] for r in out)
    ttft = [s for s in fams["multidraft_time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert ttft and ttft[0].value >= 8


def test_same_seed_same_text_on_either_replica(rep):
    srv, _ = rep
    answers = [_complete(srv.url, seed=1234, max_tokens=16).json() for _ in range(4)]  # ties go round-robin
    assert {a["speculative"]["replica"] for a in answers} == {0, 1}
    assert len({a["choices"][0]["text"] for a in answers}) == 1
    # a stream gives the same text, as the tokens come
    with httpx.stream("POST", srv.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": "ab", "max_tokens": 16, "seed": 1234, "temperature": 1.0, "stream": True}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events) == answers[0]["choices"][0]["text"]
    assert len(events) >= 2  # several chunks, not one at the end


def test_a_killed_replica_has_its_requests_retried_or_answered_503(rep):
    import ray

    srv, router = rep
    ev_first = threading.Event()
    streamed: dict = {}

    def stream():  # a long stream: in flight on one replica when that replica is killed
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=60, json={
                "model": MODEL, "prompt": "ab", "max_tokens": 200, "seed": 5, "temperature": 1.0,
                "stream": True, "stop": None}) as r:
            streamed["status"] = r.status_code
            lines = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    ev_first.set()
            streamed["lines"] = lines

    ts = threading.Thread(target=stream)
    ts.start()
    assert ev_first.wait(30)
    victim = next(h for h in router.replicas if h.in_flight)
    others: list = [None] * 4

    def one(i):
        others[i] = _complete(srv.url, seed=100 + i, max_tokens=24)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    while victim.in_flight < 2 and time.monotonic() - t0 < 10:  # some are queued behind the stream
        time.sleep(0.01)
    assert victim.in_flight >= 2
    ray.kill(victim.actor)
    ts.join(60)
    for t in threads:
        t.join(60)
    # the stream had sent text: it ends with a retryable error event, then [DONE]
    assert streamed["status"] == 200 and streamed["lines"][-1] == "[DONE]"
    err = json.loads(streamed["lines"][-2])["error"]
    assert err["code"] == "replica_failed"
    # the queued ones had sent nothing: retried on the live replica (or 503 with Retry-After), none lost
    for r in others:
        assert r is not None and (r.status_code == 200 or (r.status_code == 503 and "retry-after" in r.headers))
    ok = [r.json()["speculative"]["replica"] for r in others if r.status_code == 200]
    assert ok and set(ok) == {1 - victim.index}
    assert router.counts["retried"] >= 1
    h = httpx.get(srv.url + "/health").json()
    assert h["replicas"][victim.index]["state"] == "dead"
    assert httpx.get(srv.url + "/ready").status_code == 200  # one replica still serves
    assert _complete(srv.url, seed=9).json()["speculative"]["replica"] == 1 - victim.index


def test_drain_lets_running_requests_finish_and_refuses_new_ones(rep):
    """Last (it drains the module's server): a drain (SIGTERM's) across the replicas lets a running
    stream finish within the grace, refuses a new request with 503 and turns /ready to 503."""
    srv, router = rep
    with httpx.stream("POST", srv.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": "ab", "max_tokens": 40, "seed": 8, "stream": True}) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        router.drain(10.0)
        rest = [line[6:] for line in lines if line.startswith("data: ")]
    assert json.loads(first[6:])["choices"][0]["text"] is not None
    assert rest[-1] == "[DONE]" and json.loads(rest[-2])["choices"][0]["finish_reason"] == "length"
    r = _complete(srv.url, seed=1)
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down" and "retry-after" in r.headers
    assert httpx.get(srv.url + "/ready").status_code == 503
