"""``multidraft serve --max-lanes N``: concurrent requests share the models' forward passes
(continuous batching in the worker's ``BatchDecoder``) and each request's text is the one it gets
alone with the same seed (tiny float32 pair: batch shapes move logits by ~1e-6, see
tests/decoding/test_batch_decoding.py for the law test that covers what equality cannot)."""
import threading

import pytest

from live_server import MODEL, start, tiny_served

# (seed, temperature, max_tokens, stop): different settings side by side
REQUESTS = [(11, 1.0, 20, ()), (12, 0.0, 14, ()), (13, 1.0, 9, ()), (14, 0.7, 24, ()),
            (15, 1.0, 17, ("zz",)), (16, 0.0, 6, ()), (17, 1.0, 22, ()), (18, 1.0, 12, ())]
PROMPT = "in the beginning god"


def _jobs(model, collect):
    from multidraft.serve.worker import Job

    ids = model.codec.encode(PROMPT)
    jobs = []
    for i, (seed, temp, n, stop) in enumerate(REQUESTS):
        s = model.request_settings(dict(temperature=temp, top_p=None, top_k=None), n)
        jobs.append(Job(list(ids), s, seed, stop, emit=lambda ev, i=i: collect(i, ev)))
    return jobs


def _run_worker(model, max_lanes):
    """Every request queued before the worker starts (so the first admission fills the lanes);
    returns ({i: done payload}, target forwards counted by a hook)."""
    from multidraft.serve.worker import Worker

    done, errors, finished = {}, {}, threading.Event()

    def collect(i, ev):
        if ev[0] == "done":
            done[i] = ev[1]
        elif ev[0] == "error":
            errors[i] = ev[1]
        if len(done) + len(errors) == len(REQUESTS):
            finished.set()

    forwards = [0]
    hook = model.target.register_forward_hook(lambda *a: forwards.__setitem__(0, forwards[0] + 1))
    w = Worker(model, queue_size=16, max_lanes=max_lanes)
    try:
        for job in _jobs(model, collect):
            w.submit(job)
        w.start()
        assert finished.wait(300), "not every request was answered"
    finally:
        w.stop()
        hook.remove()
    assert not errors, errors
    return done, forwards[0]


@pytest.fixture(scope="module")
def model():
    return tiny_served()


def test_lanes_share_forwards_and_each_request_keeps_its_text(model):
    alone, f1 = _run_worker(model, 1)
    together, f4 = _run_worker(model, 4)
    for i in range(len(REQUESTS)):
        a, b = alone[i], together[i]
        assert b["tokens"] == a["tokens"], f"request {i} (seed {REQUESTS[i][0]}) changed beside others"
        assert b["text"] == a["text"] and b["finish_reason"] == a["finish_reason"]
        assert b["speculative"]["target_calls"] == a["speculative"]["target_calls"]
    # one lane: a prefill and one target forward per decoding step per request; four lanes share the steps
    steps = sum(a["speculative"]["target_calls"] for a in alone.values())
    assert f1 == len(REQUESTS) + steps
    assert f4 < f1 - 10, (f4, f1)


def test_worker_rejects_bad_max_lanes(model):
    from multidraft.serve.worker import Worker

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_lanes"):
            Worker(model, max_lanes=bad)


def test_concurrent_clients_through_http(model):
    openai = pytest.importorskip("openai")
    srv = start(model, queue_size=16, shutdown_grace_s=5, max_lanes=4)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        out: dict = {}

        def ask(i):
            seed, temp, n, stop = REQUESTS[i]
            r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=n, temperature=temp, seed=seed,
                                          stop=list(stop) or None)
            out[i] = r

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(REQUESTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert sorted(out) == list(range(len(REQUESTS)))
        alone, _ = _run_worker(model, 1)
        for i, r in out.items():
            assert r.choices[0].text == alone[i]["text"]
            assert r.usage.completion_tokens == alone[i]["completion_tokens"]
        import httpx

        st = httpx.get(srv.url + "/health").json()
        assert st["max_lanes"] == 4 and st["served"] == len(REQUESTS) and st["lanes"] == 0
    finally:
        srv.close()


def test_shutdown_answers_every_lane_and_every_queued_request(model):
    """drain + stop with four lanes decoding and four requests queued: the lanes end with
    finish_reason 'abort' (or finish), the queued ones get 503; nobody waits forever."""
    from multidraft.serve.worker import Job, Worker

    events: dict = {}
    started = threading.Event()
    ids = model.codec.encode(PROMPT)

    def collect(i, ev):
        if ev[0] == "delta":
            started.set()
        else:
            events[i] = ev

    w = Worker(model, queue_size=16, max_lanes=4)
    for i in range(8):
        s = model.request_settings(dict(temperature=1.0, top_p=None, top_k=None), 200)
        w.submit(Job(list(ids), s, 100 + i, (), emit=lambda ev, i=i: collect(i, ev)))
    w.start()
    assert started.wait(60)
    w.drain(0.0)
    w.stop(timeout=60)
    assert sorted(events) == list(range(8))
    kinds = [ev[0] for ev in events.values()]
    done = [ev[1] for ev in events.values() if ev[0] == "done"]
    errors = [ev[1] for ev in events.values() if ev[0] == "error"]
    assert len(done) >= 1 and all(d["finish_reason"] in ("abort", "length", "stop") for d in done), kinds
    assert all(e.status == 503 for e in errors), [(e.status, e.message) for e in errors]
    assert w.status()["lanes"] == 0
