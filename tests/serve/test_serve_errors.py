"""Bad requests to multidraft serve: each answered with a 4xx and OpenAI's error object while
the server keeps serving; a client that leaves mid-stream; 100 requests at once."""
import asyncio
import time

import pytest

from live_server import MODEL, start, tiny_served

httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def busy():
    """A server that never stops at eos (long decodes on demand) with a queue of 4 (and room for
    200 requests in flight: the queue, not the in-flight cap, refuses here; the cap's own test is
    in test_serve_limits.py)."""
    srv = start(tiny_served(ignore_eos=True), queue_size=4, shutdown_grace_s=5, max_in_flight=200)
    yield srv
    srv.close()


def openai_error(r, status, param="__any__", code="__any__"):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param != "__any__":
        assert err["param"] == param, err
    if code != "__any__":
        assert err["code"] == code, err
    return err


def ok(url):
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "and the", "max_tokens": 5}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


GOOD = {"model": MODEL, "prompt": "in the beginning", "max_tokens": 4}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize("path,body,status,param,code", [
    ("/v1/completions", {**GOOD, "model": "gpt-4"}, 404, "model", "model_not_found"),
    ("/v1/completions", {k: v for k, v in GOOD.items() if k != "model"}, 400, "model", None),
    ("/v1/completions", {**GOOD, "max_tokens": -1}, 400, "max_tokens", None),
    ("/v1/completions", {**GOOD, "max_tokens": 0}, 400, "max_tokens", None),
    ("/v1/completions", {**GOOD, "max_tokens": 10 ** 12}, 400, "max_tokens", "context_length_exceeded"),
    ("/v1/completions", {**GOOD, "max_tokens": "ten"}, 400, "max_tokens", None),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 10 ** 6}, 400, "max_completion_tokens",
     "context_length_exceeded"),  # the field the client sent (issue 41)
    ("/v1/completions", {**GOOD, "prompt": "a" * 300}, 400, "prompt", "context_length_exceeded"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "a" * 300}]}, 400, "messages",
     "context_length_exceeded"),
    ("/v1/completions", {**GOOD, "temperature": 2.5}, 400, "temperature", None),
    ("/v1/completions", {**GOOD, "temperature": -0.1}, 400, "temperature", None),
    ("/v1/completions", {**GOOD, "top_p": 0}, 400, "top_p", None),
    ("/v1/completions", {**GOOD, "top_k": -5}, 400, "top_k", None),
    ("/v1/completions", {**GOOD, "foo": 1}, 400, "foo", "unknown_parameter"),
    ("/v1/completions", {**GOOD, "sources": ["lookup", "lookup"]}, 400, "sources", None),  # a decode extension, checked by Settings
    ("/v1/completions", {**GOOD, "sources": 3}, 400, "sources", None),
    ("/v1/chat/completions", {**CHAT, "bar": None}, 400, "bar", "unknown_parameter"),
    ("/v1/completions", {**GOOD, "n": 2}, 400, "n", None),
    ("/v1/completions", {**GOOD, "presence_penalty": 0.5}, 400, "presence_penalty", "unsupported_parameter"),
    ("/v1/completions", {**GOOD, "logprobs": 21}, 400, "logprobs", "invalid_value"),
    ("/v1/completions", {**GOOD, "logprobs": True}, 400, "logprobs", "invalid_type"),
    ("/v1/chat/completions", {**CHAT, "logprobs": 3}, 400, "logprobs", "invalid_type"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 3}, 400, "top_logprobs", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": -1}, 400, "top_logprobs", "invalid_value"),
    ("/v1/completions", {**GOOD, "stop": [1, 2]}, 400, "stop", None),
    ("/v1/completions", {**GOOD, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    ("/v1/completions", {**GOOD, "seed": 2 ** 70}, 400, "seed", None),
    ("/v1/completions", {**GOOD, "prompt": ["one", "two"]}, 400, "prompt", None),
    ("/v1/completions", {**GOOD, "prompt": [1, 99]}, 400, "prompt", None),
    ("/v1/completions", {**GOOD, "stream_options": {"include_usage": True}}, 400, "stream_options", None),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages", None),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.[0].role", None),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages.[0].content", "unsupported_parameter"),
])
def test_bad_request_is_a_4xx_with_an_openai_error(live, path, body, status, param, code):
    r = httpx.post(live.url + path, json=body, timeout=60)
    openai_error(r, status, param, code if code is not None else "__any__")


def test_a_request_names_its_draft_sources(live):
    r = httpx.post(live.url + "/v1/completions", json={**GOOD, "sources": ["model"], "seed": 3}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["speculative"]["sources"] == ["model"]


def test_malformed_bodies_and_routes(live):
    for raw in (b"{bad json", b"", b"\xff\xfe", b"[1, 2]", b'"text"', b"null"):
        openai_error(httpx.post(live.url + "/v1/completions", content=raw, timeout=60), 400)
    openai_error(httpx.post(live.url + "/v1/chat/completions", content=b"{", timeout=60), 400, None, "invalid_json")
    openai_error(httpx.get(live.url + "/v1/nothing", timeout=60), 404)
    openai_error(httpx.get(live.url + "/v1/completions", timeout=60), 405)
    ok(live.url)


def test_the_openai_client_raises_its_own_errors(client, live):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="x", temperature=3)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    ok(live.url)


def test_client_that_leaves_mid_stream_is_stopped_and_the_server_goes_on(busy):
    w = busy.app.state.worker
    before = dict(w.status())
    body = {"model": MODEL, "prompt": "in", "max_tokens": 240, "stream": True, "seed": 1}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", busy.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            assert '"text"' in first
        # leaving the block closes the connection mid-stream
    t0 = time.monotonic()
    while w.status()["cancelled"] == before["cancelled"]:
        assert time.monotonic() - t0 < 60, w.status()
        time.sleep(0.05)
    st = w.status()
    assert st["served"] == before["served"] and st["cancelled"] == before["cancelled"] + 1
    ok(busy.url)


def test_a_hundred_requests_at_once_are_answered_or_refused_with_429(busy):
    async def one(c, i):
        body = {"model": MODEL, "prompt": "in the beginning", "max_tokens": 6, "seed": 1000 + i, "temperature": 1.0}
        r = await c.post(busy.url + "/v1/completions", json=body)
        return i, r

    async def all_at_once():
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=120, limits=limits) as c:
            return await asyncio.gather(*(one(c, i) for i in range(100)))

    results = asyncio.run(all_at_once())
    assert len(results) == 100
    served = refused = 0
    for i, r in results:
        if r.status_code == 200:
            d = r.json()
            assert d["seed"] == 1000 + i  # matched to its own request
            assert d["usage"]["completion_tokens"] == 6 and d["choices"][0]["finish_reason"] == "length"
            served += 1
        else:
            openai_error(r, 429, None, "rate_limit_exceeded")
            refused += 1
    assert served >= 1 and refused >= 1 and served + refused == 100
    # a served request's text is the one its seed gives alone
    i, r = next((i, r) for i, r in results if r.status_code == 200)
    again = httpx.post(busy.url + "/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": "in the beginning", "max_tokens": 6, "seed": 1000 + i,
                             "temperature": 1.0}).json()
    assert again["choices"][0]["text"] == r.json()["choices"][0]["text"]
    ok(busy.url)
