"""``logprobs`` / ``top_logprobs`` under speculation: each emitted token's entry is the TARGET's
log-probability (the raw logits' log-softmax, ``decoding.step.TokenLogprobs``), taken from the
verification passes, and equals a plain target forward over prompt + output (float32, 1e-5), at
T = 0 and T = 1, streamed and not, on chat and completions."""
import pytest
import torch

from live_server import MODEL

PROMPT = "hello there"  # the tiny pair accepts drafts on it at T = 0 and T = 1
TOL = 1e-5


def ids_of(live, strings):
    """Token ids of the tiny char-level tokenizer's token strings (special tokens written out)."""
    tok = live.app.state.model.codec.tok
    return [tok.convert_tokens_to_ids(s) for s in strings]


def text_of(strings):
    return "".join(strings[:-1] if strings and strings[-1] == "<eos>" else strings)


def reference(live, prompt_ids, out_ids):
    """The target's log-softmax rows ``[n, V]`` of a plain forward over prompt + output."""
    m = live.app.state.model
    with torch.no_grad():
        z = m.target(torch.tensor([prompt_ids + out_ids])).logits[0].float()  # [T + n, V]
    T = len(prompt_ids)
    return torch.log_softmax(z[T - 1: T - 1 + len(out_ids)], dim=-1)


def check(live, prompt_ids, tokens, chosen, tops, k):
    out = ids_of(live, tokens)
    ref = reference(live, prompt_ids, out)
    assert len(out) >= 1
    want = ref.gather(1, torch.tensor(out)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(chosen, dtype=torch.float32), want, atol=TOL, rtol=0), (chosen, want)
    if k:
        vals, top_ids = ref.topk(k, dim=-1)
        for j, alt in enumerate(tops):
            assert [a[0] for a in alt] == [live.app.state.model.codec.piece(t) for t in top_ids[j].tolist()]
            assert torch.allclose(torch.tensor([a[1] for a in alt]), vals[j], atol=TOL, rtol=0)


def chat_ids(live, msgs):
    return live.app.state.model.codec.chat(msgs)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_completion_logprobs_are_the_targets(client, live, temperature):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=temperature, seed=3,
                                  logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == r.usage.completion_tokens
    assert text_of(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:j]) for j in range(len(lp.tokens))]
    assert r.model_extra["speculative"]["accepted_tokens"] > 0  # drafts were accepted: the tree rows were read
    tops = [sorted(d.items(), key=lambda kv: -kv[1]) for d in lp.top_logprobs]
    assert all(len(d) == 3 for d in lp.top_logprobs)
    check(live, live.app.state.model.codec.encode(PROMPT), lp.tokens, lp.token_logprobs, tops, 3)
    if temperature == 0:  # greedy: each token is the target's argmax
        assert all(t[0][0] == s for t, s in zip(tops, lp.tokens) if s)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_chat_logprobs_streamed_and_not_are_the_targets(client, live, temperature):
    msgs = [{"role": "user", "content": "hello there"}]
    kw = dict(model=MODEL, messages=msgs, max_tokens=24, temperature=temperature, seed=11, logprobs=True,
              top_logprobs=2)
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    check(live, chat_ids(live, msgs), [e.token for e in content], [e.logprob for e in content],
          [[(a.token, a.logprob) for a in e.top_logprobs] for e in content], 2)
    assert all(e.bytes == list(e.token.encode()) for e in content)
    streamed = []
    for ch in client.chat.completions.create(**kw, stream=True):
        if ch.choices and ch.choices[0].logprobs is not None:
            streamed.extend(ch.choices[0].logprobs.content)
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]  # same seed


def test_streamed_completion_and_stop_sequence_count_the_completion_tokens(client, live):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, logprobs=0)
    whole = client.completions.create(**kw)
    text = whole.choices[0].text
    assert len(text) >= 6
    toks, offs = [], []
    for ch in client.completions.create(**kw, stream=True):
        if ch.choices and ch.choices[0].logprobs is not None:
            toks.extend(ch.choices[0].logprobs.tokens)
            offs.extend(ch.choices[0].logprobs.text_offset)
            assert all(d == {} for d in ch.choices[0].logprobs.top_logprobs)
    assert toks == whole.choices[0].logprobs.tokens and offs == whole.choices[0].logprobs.text_offset
    cut = client.completions.create(**kw, stop=text[3:5])
    assert len(cut.choices[0].logprobs.tokens) == cut.usage.completion_tokens == 5


def test_without_logprobs_the_field_is_null(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.choices[0].logprobs is None
