"""A fuzzer over the request schema of multidraft serve (issue 41): bodies from a seeded
generator (wrong types, huge numbers, NaN and Infinity literals, nested junk, strings that
are not valid Unicode, missing and extra fields, broken bytes) against the app serving the
tiny pair in process. Every answer is one of the documented statuses, never a 500, and
every error is OpenAI's well-formed error object; the server still serves afterwards."""
import json
import random

import pytest

from live_server import MODEL, tiny_served

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

# 200 served, 400 refused, 404 unknown model, 413 body too long, 429 queue full
STATUSES = {200, 400, 404, 413, 429}
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n",
          "stream", "stream_options", "stop", "seed", "user", "presence_penalty", "frequency_penalty", "logit_bias",
          "logprobs", "echo", "best_of", "suffix", "sources", "top_logprobs", "response_format", "tools",
          "tool_choice", "metadata", "store", "service_tier"]
ATOMS = [None, True, False, 0, 1, 2, -1, 3, 2 ** 31, 2 ** 63, 2 ** 64, -(2 ** 63) - 1, 10 ** 30, 10 ** 400, 0.5,
         1.0, 1.5, -0.0, 2.0000001, 1e308, -1e308, 5e-324, float("nan"), float("inf"), float("-inf"), "", "a",
         "tiny", "text", "none", "auto", "user", "system", "\ud800", "x\udfffy", "\x00", "\u202e\ufeff", "é" * 40,
         "model", "lookup", "[DONE]", "\n\n", "data: x"]


def junk(rng: random.Random, depth: int = 0):
    """A random JSON-ish value: an atom, a list or an object of junk (up to 6 levels)."""
    r = rng.random()
    if depth >= 6 or r < 0.55:
        return rng.choice(ATOMS)
    if r < 0.7:
        return rng.randrange(-5, 300)
    if r < 0.85:
        return [junk(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    keys = FIELDS + ["role", "content", "type", "text", "name", "include_usage", "\ud83d", ""]
    return {rng.choice(keys): junk(rng, depth + 1) for _ in range(rng.randrange(0, 4))}


def valid(rng: random.Random) -> tuple[str, dict]:
    """A request that is served: a completion or a chat of one token."""
    body = {"model": MODEL, "max_tokens": 1, "seed": rng.randrange(1000)}
    if rng.random() < 0.3:
        body["temperature"] = rng.choice([0, 0.7, 1.0])
    if rng.random() < 0.2:
        body["stream"] = True
    if rng.random() < 0.5:
        return "/v1/completions", {**body, "prompt": rng.choice(["in the", "and", [3, 4, 5], ["so"]])}
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": rng.choice(["hi", "the end"])}]}


def body(rng: random.Random) -> tuple[str, bytes]:
    """One fuzzed request: a path and its raw body."""
    path, b = valid(rng)
    r = rng.random()
    if r < 0.08:
        return path, json.dumps(junk(rng)).encode()  # not an object, or an object of junk
    for _ in range(rng.randrange(2, 5)):
        m = rng.random()
        if m < 0.25 and b:
            b.pop(rng.choice(sorted(b)))  # a missing field
        elif m < 0.75:
            b[rng.choice(FIELDS)] = junk(rng)  # a field of any type
        elif m < 0.85:
            b[rng.choice(["messages", "prompt", "stop"])] = [junk(rng) for _ in range(rng.randrange(6))]
        else:
            b[rng.choice(["x", "\ud800", "Model", " model", "functions", "prompt\x00"])] = junk(rng)  # an extra field
    for k in ("max_tokens", "max_completion_tokens"):  # a valid budget costs only decode time: keep it short
        if type(b.get(k)) is int and 1 < b[k] < 256:
            b[k] = 1
    raw = json.dumps(b).encode()  # NaN and Infinity literals, \ud800 escapes as they come
    r = rng.random()
    if r < 0.04:
        raw = raw[:rng.randrange(len(raw) + 1)]  # cut short
    elif r < 0.07:
        i = rng.randrange(len(raw) + 1)
        raw = raw[:i] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4))) + raw[i:]  # broken bytes
    elif r < 0.09:
        depth = rng.choice([33, 200, 5000, 100000])
        raw = raw[:-1] + b', "stop": ' + b"[" * depth + b"]" * depth + b"}"  # nested too deep
    return path, raw


def well_formed(r):
    assert r.status_code in STATUSES, (r.status_code, r.text[:300])
    if r.status_code != 200:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str) and err["message"]
        assert err["type"] != "server_error", err
        assert err["param"] is None or isinstance(err["param"], str)
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        for ev in events[:-1]:
            assert "error" not in json.loads(ev), ev
    else:
        d = r.json()
        assert d["usage"]["completion_tokens"] >= 1 and len(d["choices"]) == 1


async def _fuzz(n: int, seed: int) -> dict:
    import httpx

    from multidraft.serve import create_app

    rng = random.Random(seed)
    seen: dict[int, int] = {}
    app = create_app(tiny_served(default_max_tokens=1), queue_size=8, max_body_bytes=64 * 1024)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fuzz") as c:
            for _ in range(n):
                path, raw = body(rng)
                r = await c.post(path, content=raw, headers={"content-type": "application/json"})
                seen[r.status_code] = seen.get(r.status_code, 0) + 1
                well_formed(r)
            big = await c.post("/v1/completions", content=b'{"prompt": "' + b"a" * (64 * 1024) + b'"}')
            well_formed(big)
            assert big.status_code == 413
            ok = await c.post("/v1/completions", json={"model": MODEL, "prompt": "in the", "max_tokens": 2})
            assert ok.status_code == 200, ok.text
            assert (await c.get("/health")).json()["status"] == "ok"
    return seen


def fuzz(n: int, seed: int) -> dict:
    """The statuses of ``n`` fuzzed requests (seeded by ``seed``) to the app, each checked by ``well_formed``."""
    import asyncio

    return asyncio.run(_fuzz(n, seed))


def test_fuzzed_bodies_are_never_a_500():
    seen = fuzz(3000, seed=41)
    assert seen.get(200, 0) >= 30 and seen.get(400, 0) >= 1000, seen  # the generator reaches both sides


@pytest.mark.slow
def test_fuzzed_bodies_are_never_a_500_long():
    seen = fuzz(5000, seed=4141)
    assert seen.get(200, 0) >= 100, seen
