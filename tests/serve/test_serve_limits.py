"""The bounds of multidraft serve on what a client sends (issue 41): a body's bytes (413 by its
Content-Length, and by the bytes received before any parsing), its JSON nesting, strings that
are not valid Unicode, NaN and huge numbers (400, never a 500); prompts tokenized off the
event loop, so ``/health`` answers while one is being tokenized."""
import asyncio
import json
import socket
import threading

import pytest

from live_server import MODEL, start, tiny_served

httpx = pytest.importorskip("httpx")

GOOD = {"model": MODEL, "prompt": "in the beginning", "max_tokens": 2}


def error(r, status, code="__any__", param="__any__"):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code != "__any__":
        assert err["code"] == code, err
    if param != "__any__":
        assert err["param"] == param, err
    return err


def post_raw(live, raw: bytes, path="/v1/completions"):
    return httpx.post(live.url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)


def ok(live):
    r = httpx.post(live.url + "/v1/completions", json=GOOD, timeout=60)
    assert r.status_code == 200, r.text


def test_a_200_mb_content_length_is_refused_before_its_body_is_read(live):
    from multidraft.serve.protocol import MAX_BODY_BYTES

    host, port = live.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 200000000\r\n\r\n" + b"{" + b" " * 1000)  # the rest is never sent
        head = b""
        while b"\r\n\r\n" not in head:
            got = s.recv(65536)
            assert got, head
            head += got
    status = head.split(b"\r\n", 1)[0]
    assert b" 413 " in status, head
    body = json.loads(head.split(b"\r\n\r\n", 1)[1].decode() or "{}") if b"content-length: 0" not in head.lower() \
        else None
    if body:  # the whole error object came in the first read
        assert body["error"]["code"] == "request_too_large" and str(MAX_BODY_BYTES) in body["error"]["message"]
    ok(live)


def test_a_chunked_body_is_counted_and_refused_as_it_arrives():
    """No Content-Length: the app reads at most the limit (and one chunk) of a 200 MB body, then answers 413."""
    pytest.importorskip("fastapi")
    from multidraft.serve import create_app

    app = create_app(tiny_served(), max_body_bytes=1 << 20)
    chunk = b" " * (1 << 16)
    pulled = [0]
    sent = []

    async def receive():
        if pulled[0] >= 200_000_000:
            return {"type": "http.request", "body": b"", "more_body": False}
        pulled[0] += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"x"), (b"content-type", b"application/json"), (b"transfer-encoding", b"chunked")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    asyncio.run(app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 413
    assert pulled[0] <= (1 << 20) + len(chunk)
    err = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["error"]
    assert err["code"] == "request_too_large" and str(1 << 20) in err["message"]


@pytest.mark.parametrize("depth,refused", [(5, False), (31, False), (32, True), (1000, True), (100_000, True)])
def test_json_nesting_is_bounded(live, depth, refused):
    """The body object is the first of the 32 levels."""
    raw = b'{"model": "tiny", "prompt": "x", "metadata": ' + b"[" * depth + b"]" * depth + b"}"
    err = error(post_raw(live, raw), 400)
    assert ("nests arrays and objects deeper than 32" in err["message"]) == refused, err
    if not refused:  # parsed: the schema refuses it, naming the field
        assert err["param"] == "metadata"


@pytest.mark.parametrize("raw,path", [
    (b'{"model": "tiny", "prompt": "\\ud800"}', "/v1/completions"),
    (b'{"model": "tiny", "prompt": "ok \\udfff then"}', "/v1/completions"),
    (b'{"model": "tiny", "\\ud800": 1}', "/v1/completions"),
    (b'{"model": "tiny", "prompt": "x", "stop": ["\\ud83d"]}', "/v1/completions"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udc00x"}]}', "/v1/chat/completions"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
     "/v1/chat/completions"),
])
def test_a_string_that_is_not_unicode_is_a_400(live, raw, path):
    err = error(post_raw(live, raw, path), 400, "invalid_unicode")
    assert "not valid Unicode" in err["message"]
    ok(live)


def test_a_valid_surrogate_pair_is_served(live):
    raw = b'{"model": "tiny", "prompt": "in the \\ud83d\\ude00", "max_tokens": 1}'
    assert post_raw(live, raw).status_code == 200


@pytest.mark.parametrize("raw,code,param", [
    (b'{"model": "tiny", "prompt": "x", "temperature": NaN}', "invalid_json", None),
    (b'{"model": "tiny", "prompt": "x", "temperature": Infinity}', "invalid_json", None),
    (b'{"model": "tiny", "prompt": "x", "top_p": -Infinity}', "invalid_json", None),
    (b'{"model": "tiny", "prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", "invalid_json", None),
    (b'{"model": "tiny", "prompt": "x", "temperature": 1' + b"0" * 400 + b"}", None, "temperature"),
    (b'{"model": "tiny", "prompt": "x", "top_p": 1e999}', None, "top_p"),
    (b'{"model": "tiny", "prompt": "x", "max_tokens": 1e999}', None, "max_tokens"),
    (b'{"model": "tiny", "prompt": [1e999]}', None, "prompt"),
])
def test_nan_and_huge_numbers_are_a_400(live, raw, code, param):
    error(post_raw(live, raw), 400, code if code else "__any__", param if param else "__any__")


def test_a_refused_value_is_quoted_short(live):
    err = error(httpx.post(live.url + "/v1/completions", json={**GOOD, "stop": "x" * 10 ** 5, "n": "y" * 10 ** 5},
                           timeout=60), 400, param="n")
    assert len(err["message"]) < 300


def test_a_prompt_of_token_ids_past_the_context_is_refused(live):
    r = httpx.post(live.url + "/v1/completions", json={**GOOD, "prompt": [10 ** 9] * 300_000}, timeout=60)
    error(r, 400, "context_length_exceeded", "prompt")


def test_health_answers_while_a_prompt_is_being_tokenized():
    """The tokenizer is held mid-prompt; /health and a malformed request are still answered."""
    model = tiny_served()
    codec = model.codec
    entered, release = threading.Event(), threading.Event()
    encode = codec.encode

    def held_encode(text):
        if text == "hold":
            entered.set()
            assert release.wait(60)
        return encode(text)

    codec.encode = held_encode
    srv = start(model, queue_size=4, shutdown_grace_s=5)
    try:
        answer = {}
        t = threading.Thread(target=lambda: answer.update(r=httpx.post(
            srv.url + "/v1/completions", json={**GOOD, "prompt": "hold"}, timeout=60)))
        t.start()
        assert entered.wait(60)
        h = httpx.get(srv.url + "/health", timeout=30)
        assert h.status_code == 200 and h.json()["status"] == "ok"
        error(post_raw(srv, b"{bad"), 400, "invalid_json")
        assert not release.is_set() and t.is_alive()  # the prompt was still being tokenized
        release.set()
        t.join(60)
        assert answer["r"].status_code == 200, answer["r"].text
    finally:
        release.set()
        srv.close()


def test_a_prompt_that_cannot_fit_is_refused_before_the_tokenizer_runs():
    """The tiny pair (context 256) with the tiny GGUFs' byte-level BPE tokenizer (no token longer
    than B = 13 bytes): a prompt of 13 * 256 bytes or more cannot fit whatever its tokens, and is
    refused naming the limit with the tokenizer never called; a shorter one that still does not
    fit is refused by the exact count after tokenizing."""
    import tiny_models as tm
    from multidraft.serve import TextCodec

    model = tiny_served()
    model.codec = codec = TextCodec("transformers", model.target, tm.tiny_bpe_tokenizer(), model.draft)
    assert codec.bound.bytes_per_token == 13 and codec.context == 256
    calls = []
    for name in ("encode", "encode_chat_text"):
        inner = getattr(codec, name)
        setattr(codec, name, lambda text, inner=inner, name=name: calls.append(name) or inner(text))
    srv = start(model, queue_size=4, shutdown_grace_s=5)
    try:
        post = lambda path, body: httpx.post(srv.url + path, json={"model": MODEL, **body}, timeout=60)  # noqa: E731
        for prompt in ("x" * (13 * 256), "<|endoftext|>" * 256, "\u00e9" * 13 * 128, "y" * 10 ** 6):
            err = error(post("/v1/completions", {"prompt": prompt}), 400, "context_length_exceeded", "prompt")
            assert "maximum context length is 256 tokens" in err["message"] and "at least" in err["message"]
            assert "more than 13 bytes" in err["message"]
        msgs = [{"role": "user", "content": "z" * 13 * 256}]
        err = error(post("/v1/chat/completions", {"messages": msgs}), 400, "context_length_exceeded", "messages")
        assert "at least" in err["message"]
        assert calls == []  # nothing was tokenized
        # under the bound but over the context: the exact count after tokenizing
        err = error(post("/v1/completions", {"prompt": "x" * 300}), 400, "context_length_exceeded", "prompt")
        assert "the prompt has 300 tokens" in err["message"] and calls == ["encode"]
        err = error(post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 300}]}), 400,
                    "context_length_exceeded", "messages")
        assert "at least" not in err["message"] and calls == ["encode", "encode_chat_text"]
    finally:
        srv.close()


def test_health_answers_while_a_large_prompt_and_a_long_generation_are_in_flight():
    """A 256 KiB prompt (allowed: under the 4 MiB body limit; the tiny tokenizer has no byte bound,
    so it is tokenized, then refused by the exact count) and a streamed generation in its lane
    run at once; /health answers while both are in flight: the generation is held inside its
    first step (the worker thread blocked) and the large request after its real tokenization, so
    neither can have finished when /health's answer arrives."""
    model = tiny_served(ignore_eos=True)
    codec = model.codec
    encode, decode = codec.encode, codec.decode
    entered, tokenized, release = threading.Event(), threading.Event(), threading.Event()
    stepping = threading.Event()
    big = "in the beginning " * (256 * 1024 // 17)

    def slow_encode(text):
        if len(text) < len(big):
            return encode(text)
        entered.set()
        ids = encode(text)  # the real work, in the tokenizing thread
        tokenized.set()
        assert release.wait(60)
        return ids

    def held_decode(ids):
        if not stepping.is_set():
            stepping.set()
            assert release.wait(60)  # the worker thread is inside the generation's first step
        return decode(ids)

    codec.encode, codec.decode = slow_encode, held_decode
    srv = start(model, queue_size=4, shutdown_grace_s=5)
    answers = {}
    try:
        gen = threading.Thread(target=lambda: answers.update(gen=httpx.post(
            srv.url + "/v1/completions", json={**GOOD, "max_tokens": 64, "stream": True}, timeout=60)))
        gen.start()
        assert stepping.wait(60)
        large = threading.Thread(target=lambda: answers.update(large=httpx.post(
            srv.url + "/v1/completions", json={**GOOD, "prompt": big}, timeout=60)))
        large.start()
        assert entered.wait(60)
        h = httpx.get(srv.url + "/health", timeout=30)
        assert h.status_code == 200 and h.json()["status"] == "ok" and h.json()["running"], h.text
        assert large.is_alive() and gen.is_alive() and "large" not in answers and "gen" not in answers
        release.set()
        large.join(60)
        gen.join(60)
        error(answers["large"], 400, "context_length_exceeded", "prompt")
        assert answers["gen"].status_code == 200 and "[DONE]" in answers["gen"].text
    finally:
        release.set()
        srv.close()


def test_requests_in_flight_are_capped_with_a_503_and_retry_after():
    """max_in_flight = 2: two requests held in the tokenizer fill it; a third POST is answered 503
    with Retry-After and OpenAI's error body at once, its body unread, while /health still
    answers; the count returns to 0 whatever way requests end (served, refused with a 400,
    refused for load), and a 429 for a full queue carries Retry-After too."""
    model = tiny_served()
    codec = model.codec
    encode = codec.encode
    inside, release = threading.Semaphore(0), threading.Event()

    def held_encode(text):
        if text.startswith("hold"):
            inside.release()
            assert release.wait(60)
        return encode(text)

    codec.encode = held_encode
    srv = start(model, queue_size=4, shutdown_grace_s=5, max_in_flight=2)
    answers = []
    try:
        held = [threading.Thread(target=lambda p=p: answers.append(httpx.post(
            srv.url + "/v1/completions", json={**GOOD, "prompt": p}, timeout=60))) for p in ("hold a", "hold b")]
        for t in held:
            t.start()
        assert inside.acquire(timeout=60)  # one request in the tokenizer, the other waiting for it
        h = httpx.get(srv.url + "/health", timeout=30).json()
        while h["in_flight"] < 2:
            h = httpx.get(srv.url + "/health", timeout=30).json()
        assert h["max_in_flight"] == 2
        r = httpx.post(srv.url + "/v1/completions", json=GOOD, timeout=30)
        err = error(r, 503, "server_overloaded")
        assert r.headers["retry-after"] == "1" and "2 requests are in flight" in err["message"]
        error(post_raw(srv, b"{" + b" " * 10 ** 6), 503, "server_overloaded")  # refused before it is read
        h = httpx.get(srv.url + "/health", timeout=30).json()
        assert h["status"] == "ok" and h["in_flight"] == 2 and h["overloaded"] == 2
        release.set()
        for t in held:
            t.join(60)
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        for _ in range(3):  # errors leave the count as they found it
            error(post_raw(srv, b"{bad"), 400, "invalid_json")
        ok(srv)
        assert httpx.get(srv.url + "/health", timeout=30).json()["in_flight"] == 0
    finally:
        release.set()
        srv.close()


def test_a_full_queue_is_a_429_with_retry_after():
    from multidraft.serve import APIError, Worker
    from multidraft.serve.worker import Job

    worker = Worker(tiny_served(), queue_size=1)
    job = lambda: Job([1], None, 0, (), lambda ev: None)  # noqa: E731 (never decoded: the worker is not started)
    worker.submit(job())
    with pytest.raises(APIError) as info:
        worker.submit(job())
    exc = info.value
    assert exc.status == 429 and exc.headers == {"Retry-After": "1"} and exc.code == "rate_limit_exceeded"


def test_max_in_flight_is_checked():
    pytest.importorskip("fastapi")
    from multidraft.serve import create_app

    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_in_flight"):
            create_app(tiny_served(), max_in_flight=bad)
