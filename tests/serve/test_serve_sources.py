"""Free draft sources in ``multidraft serve`` (issue 39): a request's ``sources`` (prompt lookup,
the suffix index) keeps the target's greedy text at T = 0; the server's one ``SuffixIndex`` is
shared by the requests (a second identical request proposes the first one's output from it),
bounded by its own cap; the response names the sources and counts each one's proposals."""
import json

import httpx
import pytest
import torch

from live_server import MODEL, start, tiny_served

PROMPT = "in the beginning god"


@pytest.fixture(scope="module")
def live():
    """A server of its own: its suffix index starts empty here."""
    srv = start(tiny_served(), queue_size=8, shutdown_grace_s=5)
    yield srv
    srv.close()


def post(live, **kw):
    body = dict(model=MODEL, prompt=PROMPT, max_tokens=40, **{"temperature": 0, **kw})
    r = httpx.post(live.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def index_of(live) -> dict:
    return httpx.get(live.url + "/health").json()["suffix_index"]


def test_sources_keep_the_greedy_text_and_the_shared_index_proposes_an_earlier_output(live):
    import tiny_models as tm

    m = live.app.state.model
    ids = m.codec.encode(PROMPT)
    want = m.codec.decode(tm.greedy_reference(m.target, torch.tensor([ids]), 40, eos_token_id=0).tolist())
    plain = post(live)
    assert plain["choices"][0]["text"] == want and plain["speculative"]["source_stats"] == {}
    looked = post(live, sources=["model", "lookup"])
    assert looked["choices"][0]["text"] == want
    assert looked["speculative"]["sources"] == ["model", "lookup"]
    assert set(looked["speculative"]["source_stats"]) == {"lookup"}
    assert index_of(live)["outputs"] == 0  # lookup reads the request's own text only
    first = post(live, sources="model,suffix")
    assert first["choices"][0]["text"] == want and first["speculative"]["sources"] == ["model", "suffix"]
    n = first["usage"]["completion_tokens"]
    assert index_of(live) == {"outputs": 1, "tokens": n, "max_tokens": m.index.max_tokens}
    second = post(live, sources=["model", "suffix"])
    assert second["choices"][0]["text"] == want
    a, b = first["speculative"]["source_stats"]["suffix"], second["speculative"]["source_stats"]["suffix"]
    # the second request copies the first one's output from the shared index: every proposed
    # token of the copy is the greedy text's, and far fewer target calls are needed
    assert b["accepted"] > a["accepted"] and b["accepted"] >= n - 8
    assert second["speculative"]["target_calls"] < first["speculative"]["target_calls"] // 2
    assert index_of(live)["outputs"] == 2


def test_a_stream_with_sources_gives_the_same_text(live):
    body = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
                sources=["model", "lookup", "suffix"])
    text = []
    with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text.append(json.loads(line[6:])["choices"][0]["text"])
    assert "".join(text) == post(live)["choices"][0]["text"]


def test_a_free_only_request_keeps_the_greedy_text_without_the_draft(live):
    """A request's ``sources`` without 'model' (free-only decoding): the free sources alone draft,
    no draft model runs, the text stays the target's greedy text; at T = 1 it is accepted too (no
    draft temperature follows the request's temperature)."""
    want = post(live)["choices"][0]["text"]
    free = post(live, sources=["lookup", "suffix"])
    assert free["choices"][0]["text"] == want
    spec = free["speculative"]
    assert spec["sources"] == ["lookup", "suffix"] and spec["verifier"] is None and spec["k"] == 0
    assert set(spec["source_stats"]) == {"lookup", "suffix"}
    hot = post(live, sources="lookup", temperature=1.0, seed=3)
    assert hot["speculative"]["sources"] == ["lookup"] and hot["speculative"]["temperature"] == 1.0


@pytest.mark.parametrize("sources,words", [(["model", "bogus"], "unknown draft source"),
                                           (["suffix", "suffix"], "twice"), ("model,model", "twice")])
def test_bad_sources_are_a_400_naming_the_field(live, sources, words):
    r = httpx.post(live.url + "/v1/completions", json=dict(model=MODEL, prompt=PROMPT, sources=sources), timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "sources"
    assert words in r.json()["error"]["message"]


def test_the_shared_index_is_bounded_by_its_cap():
    from multidraft.decoding.sources import SuffixIndex

    srv = start(tiny_served(index=SuffixIndex(max_tokens=50)), queue_size=4, shutdown_grace_s=5)
    try:
        for _ in range(3):
            post(srv, sources=["model", "suffix"])
        ix = index_of(srv)
        assert ix["max_tokens"] == 50 and 0 < ix["tokens"] <= 50 and ix["outputs"] == 1
    finally:
        srv.close()


def _served_by_cli(monkeypatch, argv):
    """The ``ServedModel`` that ``multidraft serve ARGV`` builds on the tiny pair (its models loaded
    through a stand-in ``load_models`` that gives the draft only where asked, as ``load_pair`` with
    ``draft=False``), and the ``draft`` argument each load got; nothing listens."""
    pytest.importorskip("transformers")
    import tiny_models as tm
    import multidraft.serve as serve
    from live_server import CHAT_TEMPLATE
    from multidraft.cli import _args, main

    t, d = tm.tiny_pair(vocab_size=32, seed=4)
    tok = tm.tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    asked, served = [], {}

    def load(engine, **kw):
        asked.append(kw["draft"])
        return t, (None if kw["draft"] is False else d), tok

    monkeypatch.setattr(_args, "load_models", load)
    monkeypatch.setattr(serve, "run_server", lambda model, **kw: served.setdefault("model", model) and 0)
    assert main(["serve", "--engine", "transformers", "--port", "0", "--model-name", MODEL,
                 "--log-level", "error"] + argv) == 0
    return served["model"], asked


def test_a_free_only_server_loads_no_draft_and_keeps_the_greedy_text(monkeypatch):
    """``serve --sources lookup,suffix``: no draft model is loaded or held (``load_models`` asked
    with ``draft=False``, the served pair's draft None), requests decode the target's greedy text at
    T = 0 with the free sources, and a request naming 'model' is a 400 naming ``sources``."""
    import tiny_models as tm

    model, asked = _served_by_cli(monkeypatch, ["--sources", "lookup,suffix", "--temperature", "0"])
    assert asked == [False] and model.draft is None and model.settings.free_only
    assert model.describe()["sources"] == ["lookup", "suffix"]
    srv = start(model, queue_size=4, shutdown_grace_s=5)
    try:
        ids = model.codec.encode(PROMPT)
        want = model.codec.decode(tm.greedy_reference(model.target, torch.tensor([ids]), 40, eos_token_id=0).tolist())
        for _ in range(2):  # the second request reads the first one's output from the shared index
            got = post(srv)
            assert got["choices"][0]["text"] == want
            spec = got["speculative"]
            assert spec["sources"] == ["lookup", "suffix"] and spec["draft_calls"] == 0
        assert spec["source_stats"]["suffix"]["accepted"] > 0
        assert post(srv, sources=["lookup"])["choices"][0]["text"] == want
        for sources in (["model", "lookup"], "model"):
            r = httpx.post(srv.url + "/v1/completions", json=dict(model=MODEL, prompt=PROMPT, sources=sources),
                           timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == "sources", r.text
            assert "loaded no draft model" in r.json()["error"]["message"]
        assert httpx.get(srv.url + "/health").json()["failed"] == 0
    finally:
        srv.close()


def test_a_server_with_the_model_source_loads_the_draft(monkeypatch):
    """``serve --sources model,lookup``: the draft is loaded and held (its requests may still name
    free sources alone)."""
    model, asked = _served_by_cli(monkeypatch, ["--sources", "model,lookup", "--temperature", "0"])
    assert asked == [None] and model.draft is not None and model.settings.uses_draft


def test_a_free_only_server_with_tree_auto_cuts_the_free_chains_by_the_profile(monkeypatch, tmp_path):
    """``serve --sources lookup,suffix --tree auto --profile FILE``: no draft model and no warm-up,
    the settings stay free-only and the profile paces every request's copied chains
    (``decoding.sources.budget``): the text stays the target's greedy text, and where every tree
    token costs a whole pass the sources propose fewer tokens than on a server without a profile."""
    import tiny_models as tm
    from multidraft.decoding.treeopt import CostProfile

    prof = tmp_path / "steep.json"
    prof.write_text(CostProfile(list(range(1, 65)), [float(n) for n in range(1, 65)], [1, 8], [1e-3, 2e-3]).to_json())
    proposed = {}
    for name, extra in (("auto", ["--tree", "auto", "--profile", str(prof)]), ("plain", [])):
        model, asked = _served_by_cli(monkeypatch, ["--sources", "lookup,suffix", "--temperature", "0"] + extra)
        assert asked == [False] and model.draft is None and model.settings.free_only
        assert (model.cost_profile is not None) == (name == "auto")
        srv = start(model, queue_size=4, shutdown_grace_s=5)
        try:
            ids = model.codec.encode(PROMPT)
            want = model.codec.decode(tm.greedy_reference(model.target, torch.tensor([ids]), 40,
                                                          eos_token_id=0).tolist())
            got = post(srv)
            assert got["choices"][0]["text"] == want and got["speculative"]["sources"] == ["lookup", "suffix"]
            proposed[name] = sum(s["proposed"] for s in got["speculative"]["source_stats"].values())
        finally:
            srv.close()
    assert proposed["plain"] > proposed["auto"] > 0
