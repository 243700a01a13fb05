"""What a client meets (issue 40, item 5), through the official ``openai`` client: usage once per
stream (only in the include_usage chunk, as OpenAI), ``continuous_usage_stats`` honoured (vLLM's:
the usage so far in every chunk), ``models.retrieve``, a message's ``name`` rendered or refused,
an oversized ``max_completion_tokens`` named, and ``completion_tokens`` after a stop sequence
counting the returned tokens only."""
import json

import httpx
import pytest
import torch

from live_server import MODEL

PROMPT = "in the beginning god"


def chunks_of(live, body: dict) -> list[dict]:
    out = []
    with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                out.append(json.loads(line[6:]))
    return out


def test_usage_is_sent_once_per_stream(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=1.0, seed=11)
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    with_usage = [c for c in chunks if c.usage is not None]
    assert len(with_usage) == 1 and with_usage[0] is chunks[-1] and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens  # a client's sum counts it once
    fin = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(fin) == 1 and fin[0].model_extra["speculative"]["target_calls"] >= 1
    plain = list(client.completions.create(stream=True, **kw))
    assert all(c.usage is None for c in plain)


def test_continuous_usage_stats_give_the_usage_so_far_in_every_chunk(live):
    body = dict(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=1.0, seed=11)
    full = httpx.post(live.url + "/v1/completions", json=body, timeout=60).json()
    chunks = chunks_of(live, {**body, "stream": True,
                              "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert all("usage" in c for c in chunks)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == full["usage"]["completion_tokens"] and counts[0] >= 1
    assert all(c["usage"]["prompt_tokens"] == full["usage"]["prompt_tokens"] for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-2]["choices"][0]["finish_reason"] is not None
    only = chunks_of(live, {**body, "stream": True, "stream_options": {"continuous_usage_stats": True}})
    assert all("usage" in c for c in only) and only[-1]["choices"]  # no usage chunk without include_usage


def test_a_stream_option_that_is_not_a_boolean_is_a_400(live):
    body = dict(model=MODEL, prompt=PROMPT, stream=True, stream_options={"continuous_usage_stats": "yes"})
    r = httpx.post(live.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.continuous_usage_stats"


def test_models_retrieve(client):
    import openai

    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model" and m.owned_by == "multidraft"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"


def test_a_message_name_is_rendered_or_refused(client, live):
    import openai

    msgs = [{"role": "user", "content": "hello", "name": "ann"}]
    with pytest.raises(openai.BadRequestError) as err:  # the tiny template has no use for a name
        client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4)
    assert err.value.body["param"] == "messages.[0].name" and err.value.body["code"] == "unsupported_parameter"
    tok = live.app.state.model.codec.tok
    before = tok.chat_template
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}{% if m.name %} {{ m.name }}{% endif %} "
                         "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant {% endif %}")
    try:
        named = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4)
        plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}],
                                               max_tokens=4)
    finally:
        tok.chat_template = before
    ids = tok("user ann hello\nassistant ", add_special_tokens=False)["input_ids"]
    assert named.usage.prompt_tokens == len(ids) == plain.usage.prompt_tokens + len(tok(" ann")["input_ids"])


def test_an_oversized_max_completion_tokens_is_named(client):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_completion_tokens=10 ** 6)
    assert err.value.body["param"] == "max_completion_tokens" and err.value.body["code"] == "context_length_exceeded"
    assert "max_completion_tokens" in err.value.body["message"] and "max_tokens " not in err.value.body["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_completion_tokens_after_a_stop_sequence_count_the_returned_tokens(live, stream):
    import tiny_models as tm

    m = live.app.state.model
    ids = m.codec.encode(PROMPT)
    toks = tm.greedy_reference(m.target, torch.tensor([ids]), 40, eos_token_id=0).tolist()
    text = m.codec.decode(toks)
    # the tiny pair's greedy steps emit one token each: the suffix source (after a first request
    # has filled the shared index) makes steps of many tokens, so a stop falls inside a step
    warm = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, sources=["model", "suffix"])
    assert httpx.post(live.url + "/v1/completions", json=warm, timeout=60).json()["choices"][0]["text"] == text
    checked = 0
    for at in (4, 9, 15, 22):  # stop sequences inside the greedy text, at several draft-step offsets
        stop = text[at:at + 2]
        if text.find(stop) != at:
            continue
        need = next(n for n in range(1, len(toks) + 1) if stop in m.codec.decode(toks[:n]))
        body = dict(warm, stop=stop)
        if stream:
            chunks = chunks_of(live, {**body, "stream": True, "stream_options": {"include_usage": True}})
            got, usage = "".join(c["choices"][0]["text"] for c in chunks if c["choices"]), chunks[-1]["usage"]
        else:
            r = httpx.post(live.url + "/v1/completions", json=body, timeout=60).json()
            got, usage = r["choices"][0]["text"], r["usage"]
        assert got == text[:at] and usage["completion_tokens"] == need, (at, stop)
        checked += 1
    assert checked >= 2
