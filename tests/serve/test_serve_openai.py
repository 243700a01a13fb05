"""multidraft serve through the official ``openai`` client against a real uvicorn server:
completions, chat (the chat template), streaming, seeds, stop sequences, usage and the
speculative statistics; at T = 0 the text is the target's greedy decoding."""
import pytest
import torch

from live_server import MODEL

PROMPT = "in the beginning god"


def greedy_text(live, prompt_ids, n):
    import tiny_models as tm

    m = live.app.state.model
    toks = tm.greedy_reference(m.target, torch.tensor([prompt_ids]), n, eos_token_id=0)
    return m.codec.decode(toks.tolist()), len(toks)


def test_models_and_health(client, live):
    import httpx

    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]
    h = httpx.get(live.url + "/health").json()
    assert h["status"] == "ok" and h["model"] == MODEL


def test_completion_temperature_zero_is_the_targets_greedy_text(client, live):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0)
    ids = live.app.state.model.codec.encode(PROMPT)
    want, n = greedy_text(live, ids, 30)
    assert r.choices[0].text == want
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == n
    assert r.usage.total_tokens == len(ids) + n
    assert r.choices[0].finish_reason == ("stop" if n < 30 else "length")
    spec = r.model_extra["speculative"]
    assert spec["verifier"] == "specinfer" and spec["k"] == 2 and spec["depth"] == 3 and spec["tree"] is None
    assert spec["rule"] == "token_walk" and spec["sources"] == ["model"] and spec["temperature"] == 0.0
    assert {k: v for k, v in spec.items() if k in live.app.state.model.settings.describe()} == \
        live.app.state.model.settings.derive(temperature=0.0, draft_temperature=0.0, top_p=None,
                                             max_new_tokens=30).describe()  # the request's settings, one schema
    assert spec["target_calls"] >= 1 and spec["block_efficiency"] == pytest.approx(n / spec["target_calls"])
    if n == 30:  # no eos: each step gave its accepted drafts plus one token
        assert spec["accepted_tokens"] + spec["target_calls"] == n


def test_chat_uses_the_chat_template(client, live):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0)
    m = live.app.state.model
    ids = m.codec.tok("system be brief\nuser hello there\nassistant ", add_special_tokens=False)["input_ids"]
    assert r.usage.prompt_tokens == len(ids)
    want, n = greedy_text(live, ids, 20)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want
    assert r.usage.completion_tokens == n and r.model_extra["speculative"]["target_calls"] >= 1


def test_seed_reproduces_and_a_drawn_seed_is_reported(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=25, temperature=1.0, top_p=0.95)
    a = client.completions.create(seed=1234, **kw)
    b = client.completions.create(seed=1234, **kw)
    assert a.choices[0].text == b.choices[0].text and a.model_extra["seed"] == 1234
    texts = {client.completions.create(seed=s, **kw).choices[0].text for s in range(4)}
    assert len(texts) > 1  # the seed matters
    c = client.completions.create(**kw)
    seed = c.model_extra["seed"]
    assert isinstance(seed, int)
    assert client.completions.create(seed=seed, **kw).choices[0].text == c.choices[0].text


def test_stream_yields_the_same_text_in_several_chunks(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=1.0, seed=7, extra_body={"top_k": 20})
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == full.choices[0].text
    assert sum(1 for t in texts if t) >= 2  # emitted step by step, not at the end
    fin = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(fin) == 1 and fin[0].choices[0].finish_reason == full.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert fin[0].model_extra["speculative"]["target_calls"] == full.model_extra["speculative"]["target_calls"]


def test_chat_stream(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "say something"}], max_tokens=30, seed=3)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences_are_cut_from_the_text(client, stream):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0)
    text = client.completions.create(**kw).choices[0].text
    assert len(text) >= 8
    stop = text[5:7]
    cut = text[: text.find(stop)]
    if stream:
        chunks = list(client.completions.create(stop=[stop, "zzzzz"], stream=True, **kw))
        got = "".join(c.choices[0].text for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        r = client.completions.create(stop=stop, **kw)
        got, finish = r.choices[0].text, r.choices[0].finish_reason
    assert got == cut and finish == "stop"


def test_target_alone_server_matches_greedy_too():
    """--verifier none (the 'speculation off' column of the load benchmark) decodes the same T = 0 text."""
    openai = pytest.importorskip("openai")
    from live_server import start, tiny_served

    srv = start(tiny_served(verifier=None), queue_size=4)
    try:
        cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
        r = cl.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0)
        want, n = greedy_text(srv, srv.app.state.model.codec.encode(PROMPT), 20)
        assert r.choices[0].text == want
        spec = r.model_extra["speculative"]
        assert spec["rule"] is None and spec["verifier"] is None and spec["sources"] == []
        assert spec["target_calls"] == n and spec["accepted_tokens"] == 0
    finally:
        srv.close()
