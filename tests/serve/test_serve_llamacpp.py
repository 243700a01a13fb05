"""multidraft serve on the llama.cpp engine (tiny random GGUF files, multidraft.testing): the
T = 0 text is the target's own greedy decoding, a stream gives the same text, and a chat is
rendered by the GGUF's own template, the whole conversation."""
import pytest
import torch

pytest.importorskip("llama_cpp")
openai = pytest.importorskip("openai")

from live_server import start  # noqa: E402


@pytest.fixture(scope="module")
def llama_live(tmp_path_factory):
    yield from _llama_live(tmp_path_factory)


@pytest.fixture(scope="module")
def endless_live(tmp_path_factory):
    """A server that ignores end-of-sequence tokens (every request decodes its max_tokens)."""
    yield from _llama_live(tmp_path_factory, ignore_eos=True)


@pytest.fixture(scope="module")
def twin_live(tmp_path_factory):
    """A server whose draft is the target's twin (the same GGUF): at T = 0 every draft is
    accepted, so the verified trees' rows past the root are read."""
    yield from _llama_live(tmp_path_factory, draft_seed=1)


def _llama_live(tmp_path_factory, draft_seed=2, ignore_eos=False):
    from multidraft.decoding import Settings
    from multidraft.decoding.llamacpp import LlamaCppModel
    from multidraft.serve import ServedModel, TextCodec
    from multidraft.testing import tiny_gguf

    d = tmp_path_factory.mktemp("gguf")
    tf, of = tiny_gguf(d / "t.gguf", seed=1), tiny_gguf(d / "o.gguf", seed=draft_seed)
    t, dr = LlamaCppModel(tf, n_ctx=256, n_threads=1), LlamaCppModel(of, n_ctx=256, n_threads=1)
    model = ServedModel(name="tiny-gguf", engine="llama.cpp", target=t, draft=dr,
                        codec=TextCodec("llama.cpp", t, t, dr), settings=Settings.from_args(verifier="specinfer", k=2,
                                                                                          depth=2),
                        default_max_tokens=16, ignore_eos=ignore_eos)
    srv = start(model, queue_size=4)
    yield srv
    srv.close()
    t.close()
    dr.close()


def test_llama_cpp_greedy_text_and_stream(llama_live):
    from multidraft.decoding import generate

    cl = openai.OpenAI(base_url=llama_live.url + "/v1", api_key="none", max_retries=0, timeout=60)
    m = llama_live.app.state.model
    prompt = [5, 9, 12, 40, 7]
    r = cl.completions.create(model="tiny-gguf", prompt=prompt, max_tokens=20, temperature=0)
    ref = generate(m.target, None, torch.tensor([prompt]), verifier=None, temperature=0.0, max_new_tokens=20,
                   generator=0, eos_token_id=m.codec.eos)
    assert r.usage.completion_tokens == ref.new_tokens
    assert r.choices[0].text == m.codec.decode(ref.tokens.tolist())
    assert r.model_extra["speculative"]["engine"] == "llama.cpp"
    streamed = "".join(c.choices[0].text for c in cl.completions.create(model="tiny-gguf", prompt=prompt, max_tokens=20,
                                                                        temperature=0, stream=True))
    assert streamed == r.choices[0].text


def test_chat_renders_the_conversation_with_the_gguf_template(llama_live):
    import httpx

    m = llama_live.app.state.model
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    r = httpx.post(llama_live.url + "/v1/chat/completions", timeout=60,
                   json={"model": "tiny-gguf", "messages": msgs, "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    text = m.target.chat_prompt(msgs)
    assert all(x["content"] in text for x in msgs)
    assert r.json()["usage"]["prompt_tokens"] == len(m.target.tokenize(text))


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_whose_tree_cannot_fit_the_context_is_a_400_at_admission(llama_live, stream):
    """prompt + max_tokens fit the context, with one step's draft tree they do not: refused with
    a 400 before the stream starts (not HTTP 200 and an error event), not counted as a failure."""
    import httpx

    from multidraft.decoding.batch import LlamaBatchRunner

    m = llama_live.app.state.model
    ctx, tree = m.codec.context, LlamaBatchRunner.handles(m.settings)
    prompt = [5, 9, 12, 40, 7]
    body = {"model": "tiny-gguf", "prompt": prompt, "max_tokens": ctx - len(prompt), "temperature": 0,
            "stream": stream}
    before = httpx.get(llama_live.url + "/health").json()
    r = httpx.post(llama_live.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    assert f"at most {ctx - len(prompt) - tree} here" in err["message"]
    ok = httpx.post(llama_live.url + "/v1/completions", timeout=60, json={**body, "max_tokens": 8, "stream": False})
    assert ok.status_code == 200, ok.text
    after = httpx.get(llama_live.url + "/health").json()
    assert after["failed"] == before["failed"] == 0 and after["served"] == before["served"] + 1


def test_a_default_max_tokens_is_cut_to_the_room_the_tree_leaves(llama_live):
    import httpx

    from multidraft.decoding.batch import LlamaBatchRunner

    m = llama_live.app.state.model
    ctx, tree = m.codec.context, LlamaBatchRunner.handles(m.settings)
    prompt = list(range(1, ctx - tree - 3 + 1))  # room for 3 tokens beside the tree (default max_tokens 16)
    r = httpx.post(llama_live.url + "/v1/completions", timeout=60,
                   json={"model": "tiny-gguf", "prompt": prompt, "temperature": 0, "stop": None})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 3


def test_a_request_after_a_direct_generate_on_the_served_models_answers(endless_live):
    """``generate`` called on the served pair's llama.cpp target and draft between two requests
    (the context handed back and forth, ``LlamaCppModel.hold``): the next request, one that needs
    nearly every KV cell, answers 200 with the text the same request had before. Before, the
    generate's prefix stayed in the cells, unknown to the lanes, and that request was a 500
    ('failed to find a memory slot')."""
    import httpx

    from multidraft.decoding import generate
    from multidraft.decoding.batch import LlamaBatchRunner

    m = endless_live.app.state.model
    prompt = [5, 9, 12, 40, 7]
    room = m.codec.context - len(prompt) - LlamaBatchRunner.handles(m.settings)
    body = {"model": "tiny-gguf", "prompt": prompt, "max_tokens": room, "temperature": 0}
    first = httpx.post(endless_live.url + "/v1/completions", json=body, timeout=120)
    assert first.status_code == 200 and first.json()["usage"]["completion_tokens"] == room, first.text
    long = torch.tensor([[1 + i % 200 for i in range(150)]])
    assert generate(m.target, m.draft, long, m.settings.derive(max_new_tokens=60), generator=0).new_tokens == 60
    assert generate(m.target, None, long, verifier=None, max_new_tokens=60, generator=0).new_tokens == 60
    again = httpx.post(endless_live.url + "/v1/completions", json=body, timeout=120)
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    assert httpx.get(endless_live.url + "/health").json()["failed"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_llama_cpp_logprobs_are_the_targets(twin_live, stream):
    """The logprobs of a T = 0 completion (the target's greedy tokens) are the target's log-softmax
    of a plain chain forward over prompt + output (llama.cpp float32: 1e-4, the kernels reduce in
    a batch-shape dependent order, ``docs/guide/decoding.md`` "Batches")."""
    from multidraft.decoding import generate
    from multidraft.decoding.runners import runner_for

    cl = openai.OpenAI(base_url=twin_live.url + "/v1", api_key="none", max_retries=0, timeout=60)
    m = twin_live.app.state.model
    prompt = [5, 9, 12, 40, 7]
    kw = dict(model="tiny-gguf", prompt=prompt, max_tokens=12, temperature=0, logprobs=2)
    if stream:
        got = [lp for c in cl.completions.create(**kw, stream=True) if c.choices and c.choices[0].logprobs
               for lp in c.choices[0].logprobs.token_logprobs]
    else:
        r = cl.completions.create(**kw)
        got = r.choices[0].logprobs.token_logprobs
        assert len(got) == r.usage.completion_tokens and r.model_extra["speculative"]["accepted_tokens"] > 0
    out = generate(m.target, None, torch.tensor([prompt]), verifier=None, temperature=0.0, max_new_tokens=12,
                   generator=0, eos_token_id=m.codec.eos).tokens.tolist()
    run = runner_for(m.target)
    run.prefill(torch.tensor([prompt[:-1]]))
    chain = [prompt[-1]] + out[:-1]
    z = run.extend(chain, list(range(-1, len(chain) - 1))).float()  # [n, V]
    want = torch.log_softmax(z, dim=-1).gather(1, torch.tensor(out)[:, None])[:, 0]
    assert len(got) == len(out)
    assert torch.allclose(torch.tensor(got), want, atol=1e-4, rtol=0), (got, want)
