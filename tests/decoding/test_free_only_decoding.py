"""Free-only decoding (issue 39: the "lookup alone" and "suffix alone" rows): ``sources`` without
'model' draft with the free sources alone, no draft model at all (vLLM's ``ngram`` method,
transformers' ``prompt_lookup_num_tokens``). T = 0 equals the target's greedy text; T = 1 the
two-token law is the target's (chi-square); the draft model is never run; the settings refuse the
draft model's arguments."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import tiny_models as tm  # noqa: E402

import multidraft as md  # noqa: E402
from multidraft.decoding import ArgumentError, Settings, engine, runners  # noqa: E402
from multidraft.decoding.batch import BatchDecoder, generate_batch  # noqa: E402

from test_mixed_decoding import REPEATS, _chi2_pvalue, _two_token_law  # noqa: E402

torch.set_num_threads(1)

FREE = ("lookup", "suffix", "lookup,suffix")


class _Refuses(torch.nn.Module):
    """A 'draft model' whose every forward fails: a free-only decode must never call it."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.config = model.config

    def forward(self, *a, **kw):
        raise AssertionError("the draft model was run")

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)


# --- settings ------------------------------------------------------------------------------------
@pytest.mark.parametrize("src", FREE)
def test_settings_free_only(src):
    s = Settings.from_args(sources=src, temperature=0.5, max_new_tokens=9)
    names = src.split(",")
    assert s.free_only and not s.uses_draft and not s.target_alone and s.mixed
    assert s.draft_model is None and s.draft_temps == () and s.shape is None and s.tree_law is None
    d = s.describe()
    assert d["sources"] == names and d["rule"] == "token_walk" and d["verifier"] is None
    assert d["k"] == 0 and d["depth"] == 0 and d["law"] is None and d["draft_temperature"] is None
    assert s.max_nodes == 1 + s.free_nodes == 1 + sum({"lookup": 8, "suffix": 16}[n] for n in names)
    assert Settings.from_args(**Settings.args_of(d)) == s
    assert s.derive(temperature=0.0).free_only and s.derive(temperature=0.0).temperature == 0.0
    back = s.derive(sources="model," + src)  # the model's defaults come back with it
    assert back.uses_draft and back.k == 2 and back.depth == 4 and back.verifier.name == "specinfer"
    assert Settings.from_args(verifier="optimal", k=3, depth=2).derive(sources=src) == s.derive(temperature=1.0,
                                                                                                 max_new_tokens=128)
    assert Settings.from_args(verifier=None, sources=src).target_alone  # verifier=None: the target alone


@pytest.mark.parametrize("kw,arg", [
    (dict(verifier="specinfer"), "verifier"), (dict(k=2), "k"), (dict(depth=3), "depth"),
    (dict(draft_law="iid"), "draft_law"), (dict(tree="sequences"), "tree"), (dict(draft_temperature=0.7), "draft_temperature"),
    (dict(max_nodes=8), "max_nodes"), (dict(min_gain=0.1), "min_gain"), (dict(rule="block"), "rule"),
    (dict(rule="traversal"), "rule"),
])
def test_settings_refuse_the_draft_models_arguments(kw, arg):
    with pytest.raises(ArgumentError) as info:
        Settings.from_args(sources="lookup", **kw)
    assert info.value.arg == arg and "\n" not in str(info.value) and "model" in str(info.value)


def test_settings_take_the_walk_by_name():
    assert Settings.from_args(sources="suffix", rule="token_walk").free_only


# --- T = 0: the target's greedy text, no draft model ---------------------------------------------------
@pytest.mark.parametrize("src", FREE)
def test_greedy_free_only_equals_target_greedy(pair, src):
    t, d = pair
    ref = tm.greedy_reference(t, REPEATS, 20).tolist()
    r = md.generate(t, _Refuses(d), REPEATS, temperature=0, max_new_tokens=20, generator=0, sources=src)
    assert r.tokens.tolist() == ref
    assert r.draft_calls == 0 and max(r.draft_depths) >= 2  # copies were verified ...
    assert r.target_calls < 20  # ... and accepted: fewer target calls than tokens
    assert set(r.source_stats) == set(src.split(","))
    none = md.generate(t, None, REPEATS, temperature=0, max_new_tokens=20, generator=0, sources=src)
    assert none.tokens.tolist() == ref and none.target_calls == r.target_calls  # the draft given or not: one decode


def test_no_match_is_a_plain_target_step(pair):
    """Nothing to copy: every step is one target call emitting one token, the target alone's text
    and calls (at T = 1 with the same generator too: the no-match step draws from p as the target alone)."""
    t, _ = pair
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 9]])  # no repeated n-gram
    alone = md.generate(t, None, ids, verifier=None, temperature=1.0, max_new_tokens=1, generator=4)
    r = md.generate(t, None, ids, sources="lookup", temperature=1.0, max_new_tokens=1, generator=4)
    assert r.tokens.tolist() == alone.tokens.tolist() and r.target_calls == 1 and r.draft_depths == [0]
    r = md.generate(t, None, ids, sources="lookup", temperature=0, max_new_tokens=6, generator=0)
    assert r.tokens.tolist() == tm.greedy_reference(t, ids, 6).tolist()


def test_free_only_step_has_no_draft_runner_and_free_only_nodes(pair):
    t, _ = pair
    s = Settings.from_args(sources="lookup", temperature=1.0)
    step = engine.DecoderStep(runners.runner_for(t), None, s, torch.Generator().manual_seed(0))
    with torch.inference_mode():
        step.prefill(REPEATS)
        tree = step.serve(step.draft(int(REPEATS[0, -1]), 0, limit=4))
    assert tree.prefix(len(tree) - 1) == (6, 7, 8, 3)  # the lookup chain, cut by the step's limit
    assert all(nd.q is None and nd.fed == -1 and nd.free == len(nd.drafts) for nd in tree.nodes)


def test_batch_lanes_and_generate_batch_run_no_draft(pair):
    t, d = pair
    s = Settings.from_args(sources="lookup,suffix", temperature=1.0, max_new_tokens=12)
    prompts = [REPEATS, torch.tensor([[1, 2, 1, 2, 1]])]
    got = generate_batch(t, _Refuses(d), prompts, s, generator=[3, 4])
    for ids, seed, res in zip(prompts, (3, 4), got):
        assert res.tokens.tolist() == md.generate(t, None, ids, s, generator=seed).tokens.tolist()
    bd = BatchDecoder(t, None)  # no draft model: a free-only lane is admitted
    lane = bd.add(REPEATS, s.derive(temperature=0.0), generator=0)
    assert bd.run()[lane].tokens.tolist() == tm.greedy_reference(t, REPEATS, 12).tolist()


def test_custom_generate_free_only(pair):
    t, _ = pair
    ids = REPEATS
    out = t.generate(ids, custom_generate=md.custom_generate, sources="lookup", do_sample=False,
                     max_new_tokens=10, pad_token_id=0)
    ref = t.generate(ids, do_sample=False, max_new_tokens=10, pad_token_id=0)
    assert torch.equal(out, ref)


# --- T = 1: the law of the first two tokens ------------------------------------------------------------
@pytest.mark.slow
def test_two_token_law_lookup_alone(small_pair):
    """Prompt lookup alone at T = 1 (the copy is accepted with probability p(x), else a token is
    drawn from p with x zeroed): the first two tokens' law is the target's. ~10 s on a loaded 2-core machine."""
    t, _ = small_pair
    ids = torch.tensor([[1, 5, 2, 6, 1, 5, 2, 6, 1, 5]])  # lookup proposes 2, 6, 1, 5, ...
    V = t.config.vocab_size
    exact = _two_token_law(t, ids)
    s = Settings.from_args(temperature=1.0, max_new_tokens=2, sources="lookup")
    counts = torch.zeros(V * V, dtype=torch.float64)
    g = torch.Generator().manual_seed(31)
    n = 1000
    for _ in range(n):
        r = md.generate(t, None, ids, s, generator=g)
        y = r.tokens.tolist()
        counts[y[0] * V + y[1]] += 1
        assert r.draft_depths[0] >= 1  # the lookup chain was in every first tree
    assert _chi2_pvalue(counts, exact) > 1e-3
