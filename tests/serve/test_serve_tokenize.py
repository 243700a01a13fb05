"""``POST /tokenize`` and ``POST /detokenize`` (llama-server's and vLLM's shapes) on the tiny pair:
the ids are those a completion prompt is decoded from, round trips, and bad bodies are 4xx with
OpenAI's error object naming the field."""
import pytest

from live_server import MODEL

httpx = pytest.importorskip("httpx")


def post(live, path, body, status=200):
    r = httpx.post(live.url + path, json=body, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def error(live, path, body, status, param):
    err = post(live, path, body, status)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param, err
    assert "\n" not in err["message"]
    return err


def test_tokenize_matches_the_prompt_tokens_and_round_trips(live, client):
    text = "in the beginning god"
    codec = live.app.state.model.codec
    a = post(live, "/tokenize", {"content": text})  # llama-server's shape
    b = post(live, "/tokenize", {"model": MODEL, "prompt": text, "add_special_tokens": True})  # vLLM's
    assert a == b and a["tokens"] == codec.encode(text) and a["count"] == len(a["tokens"])
    assert a["max_model_len"] == codec.context
    r = client.completions.create(model=MODEL, prompt=text, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == a["count"]
    d = post(live, "/detokenize", {"tokens": a["tokens"]})
    assert d["content"] == d["prompt"] == text
    assert post(live, "/detokenize", {"model": MODEL, "tokens": []})["content"] == ""
    plain = post(live, "/tokenize", {"content": text, "add_special": False})["tokens"]
    assert plain == codec.encode(text, add_special_tokens=False)


def test_tokenize_messages_is_the_chat_prompt(live, client):
    msgs = [{"role": "user", "content": "hello there"}]
    t = post(live, "/tokenize", {"messages": msgs})
    assert t["tokens"] == live.app.state.model.codec.chat(msgs)
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == t["count"]


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {}, 400, "content"),
    ("/tokenize", {"content": "a", "prompt": "b"}, 400, "prompt"),
    ("/tokenize", {"content": 3}, 400, "content"),
    ("/tokenize", {"content": "a", "add_special": "yes"}, 400, "add_special"),
    ("/tokenize", {"content": "a", "add_special": True, "add_special_tokens": False}, 400, "add_special_tokens"),
    ("/tokenize", {"content": "a", "with_pieces": True}, 400, "with_pieces"),
    ("/tokenize", {"content": "a", "model": "other"}, 404, "model"),
    ("/tokenize", {"messages": [{"role": "bot", "content": "x"}]}, 400, "messages.[0].role"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "add_special": True}, 400, "add_special"),
    ("/tokenize", {"content": "a", "add_generation_prompt": True}, 400, "add_generation_prompt"),
    ("/tokenize", [1, 2], 400, None),
    ("/detokenize", {}, 400, "tokens"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, True]}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, 32]}, 400, "tokens"),      # V = 32: out of vocabulary
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "model": "other"}, 404, "model"),
    ("/detokenize", {"tokens": [1], "skip_special": True}, 400, "skip_special"),
])
def test_bad_bodies_are_refused_naming_the_field(live, path, body, status, param):
    error(live, path, body, status, param)


def test_a_body_past_the_byte_bound_is_413(live):
    from multidraft.serve.protocol import MAX_BODY_BYTES

    r = httpx.post(live.url + "/tokenize", content=b'{"content": "' + b"a" * MAX_BODY_BYTES + b'"}',
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.post(live.url + "/detokenize", content=b"{nope", timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
