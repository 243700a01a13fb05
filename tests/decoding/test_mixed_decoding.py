"""Mixed trees in the decoder (issue 39 items 2 and 5): free sources' chains beside the draft
model's tree, verified by the walk free drafts first under the model's own law (any verifier). T = 0
equals the target's greedy text; T = 1 the two-token law is the target's (chi-square); the caches
stay the committed text's; the settings refuse the sequence-level rules."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import tiny_models as tm  # noqa: E402

import multidraft as md  # noqa: E402
from multidraft import sampling  # noqa: E402
from multidraft.decoding import ArgumentError, Settings, engine, kv, runners  # noqa: E402
from multidraft.decoding.batch import generate_batch  # noqa: E402

torch.set_num_threads(1)

REPEATS = torch.tensor([[3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8, 3, 4, 5]])  # prompt lookup has a match


# --- settings ------------------------------------------------------------------------------------
def test_settings_sources_and_the_models_walk():
    s = Settings.from_args(verifier="khisti_is", k=2, depth=3, sources="model,lookup,suffix")
    assert [src.name for src in s.sources] == ["model", "lookup", "suffix"]
    assert s.describe()["sources"] == ["model", "lookup", "suffix"] and s.mixed
    assert s.rule.law == "iid" and s.law == "iid"  # the walk's law is the model's own draft law
    assert s.max_nodes == s.shape.max_nodes() + s.free_nodes and s.free_nodes == 8 + 16
    assert Settings.from_args(**Settings.args_of(s.describe())) == s
    assert s.derive(temperature=0.5, draft_temperature=0.7).draft_temps == (0.7,)
    first = Settings.from_args(verifier="specinfer", k=2, depth=3, sources="lookup,model")
    assert first.draft_temps == (1.0,) and first.mixed
    plain = Settings.from_args(verifier="specinfer", k=2, depth=3)
    assert not plain.mixed and plain.rule.law == "iid" and plain.max_nodes == plain.shape.max_nodes()
    assert Settings.from_args(verifier=None, sources="model,lookup").target_alone  # the target alone reads no source


@pytest.mark.parametrize("kw,arg", [
    (dict(rule="traversal"), "rule"), (dict(rule="block", k=1), "rule"), (dict(rule="univer"), "rule"),
    (dict(rule="gbv"), "rule"), (dict(verifier="optimal", draft_law="wor"), "draft_law"),
])
def test_settings_refuse_what_cannot_verify_mixed_trees(kw, arg):
    with pytest.raises(ArgumentError) as info:
        Settings.from_args(**{"k": 2, "depth": 2, **kw}, sources="model,lookup")
    assert info.value.arg == arg and "\n" not in str(info.value)
    if arg == "rule":  # the reason is the rule's own (trees.MIXED_REFUSALS, the one table)
        from multidraft.trees import MIXED_REFUSALS

        assert MIXED_REFUSALS[kw["rule"]] in str(info.value)


@pytest.mark.parametrize("verifier,law,k", [("optimal", "iid", 4), ("spectr", "iid", 2), ("rrs_wor", "wor", 3),
                                            ("greedy_optimal", "greedy", 2), ("spechub", "greedy", 2),
                                            ("lp_optimal", "wor", 2), ("khisti_is", "independent", 2)])
def test_settings_take_every_walk_with_sources(verifier, law, k):
    """Free drafts first: every token-level verifier verifies mixed trees under its own law."""
    s = Settings.from_args(verifier=verifier, k=k, depth=2, draft_law=law, sources="model,lookup")
    assert s.mixed and s.rule.law == law and s.verifier.name == verifier


# --- T = 0: the target's greedy text ----------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(k=2, depth=3), dict(k=2, depth=2, tree="sequences"), dict(k=1, depth=2),
                                dict(k=2, depth=3, tree="dynamic"),
                                dict(k=2, depth=2, draft_temperature=[0.5, 1.5])])
def test_greedy_mixed_equals_target_greedy(pair, kw):
    t, d = pair
    ref = tm.greedy_reference(t, REPEATS, 20).tolist()
    for src, v in (("model,lookup", "specinfer"), ("model,lookup,suffix", "khisti_is")):
        r = md.generate(t, d, REPEATS, verifier=v, temperature=0, max_new_tokens=20, generator=0, sources=src, **kw)
        assert r.tokens.tolist() == ref, (kw, src)
        assert max(r.draft_depths) > kw["depth"]  # the copied chain went past the model's depth


@pytest.mark.parametrize("verifier,kw", [("optimal", dict(k=2, depth=3)), ("optimal", dict(k=2, depth=2, tree="sequences")),
                                         ("rrs_wor", dict(k=2, depth=2, draft_law="wor")),
                                         ("greedy_optimal", dict(k=2, depth=2, draft_law="greedy"))])
def test_greedy_mixed_equals_target_greedy_every_walk(pair, verifier, kw):
    """T = 0 with prompt lookup under the walks the independent law could not take (optimal, wor)."""
    t, d = pair
    ref = tm.greedy_reference(t, REPEATS, 20).tolist()
    r = md.generate(t, d, REPEATS, verifier=verifier, temperature=0, max_new_tokens=20, generator=0,
                    sources="model,lookup", **kw)
    assert r.tokens.tolist() == ref
    assert max(r.draft_depths) > kw["depth"]  # the copied chain went past the model's depth


def test_mixed_batch_lanes_equal_generate(pair):
    t, d = pair
    s = Settings.from_args(verifier="specinfer", k=2, depth=2, temperature=1.0, max_new_tokens=12,
                           sources="model,lookup,suffix")
    prompts = [REPEATS, torch.tensor([[1, 2, 1, 2, 1]])]
    got = generate_batch(t, d, prompts, s, generator=[3, 4])
    for ids, seed, res in zip(prompts, (3, 4), got):
        one = md.generate(t, d, ids, s, generator=seed)
        assert res.tokens.tolist() == one.tokens.tolist()


@pytest.mark.parametrize("paced", [False, True])
def test_mixed_caches_after_many_steps_equal_fresh_prefill(pair, paced):
    """Free-only nodes are never fed to the draft model: the draft cache holds a prefix of the
    committed text and ``pending`` the rest, as without free sources; also when a cost profile
    paces the depth to 0 (the model does not draft; the chains alone at the root)."""
    from multidraft.decoding.treeopt import CostProfile

    t, d = pair
    settings = Settings.from_args(verifier="specinfer", k=2, depth=2, temperature=1.0, draft_temperature=0.7,
                                  max_new_tokens=30, sources="model,lookup,suffix")
    eos = engine._check_models(t, d, REPEATS, settings, None)
    cost = CostProfile((1, 2, 40), (1.0, 2.0, 40.0), (1,), (0.01,)) if paced else None
    step = engine.DecoderStep(runners.runner_for(t), runners.runner_for(d), settings, torch.Generator().manual_seed(5),
                              cost=cost)
    dec = engine._Decoder(step, engine.decode_context(t, d), eos=eos)
    with torch.inference_mode():
        res = dec.run(REPEATS)
        full = REPEATS[0].tolist() + res.tokens.tolist()
        assert max(res.draft_depths) > 2
        if paced:
            assert step.pace.chosen[0] > 0  # some steps drafted nothing with the model
        committed = full[:-1]
        tr, dr = step.target_runner, step.draft_runner
        for model, cache, n in [(t, tr.cache, len(committed)), (d, dr.cache, dr.base)]:
            assert kv.cache_length(cache) == n
            fresh = kv.new_cache(model)
            model(input_ids=torch.tensor([full[:n]]), cache=fresh, use_cache=True)
            for a, b in zip(cache.layers, fresh.layers):
                torch.testing.assert_close(a.keys, b.keys, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(a.values, b.values, atol=1e-4, rtol=1e-4)
        assert full[dr.base: len(committed)] == step.pending


def test_step_tree_has_free_only_nodes_unfed(pair):
    t, d = pair
    s = Settings.from_args(verifier="specinfer", k=1, depth=1, temperature=1.0, sources="model,lookup")
    step = engine.DecoderStep(runners.runner_for(t), runners.runner_for(d), s, torch.Generator().manual_seed(0))
    with torch.inference_mode():
        step.prefill(REPEATS)
        tree = step.serve(step.draft(int(REPEATS[0, -1]), 1, limit=4))
    assert tree.law == "iid"  # the model's law: free drafts need no q rows
    free = [nd for nd in tree.nodes[1:] if nd.slot is None]
    deepest = max(range(len(tree)), key=lambda i: tree.nodes[i].depth)
    assert tree.prefix(deepest) == (6, 7, 8, 3)  # the lookup chain, lookup's depth 8 cut by the step's limit
    assert all(nd.fed == -1 for nd in free) and tree.nodes[0].free >= 1
    assert tree.nodes[0].q.ndim == 1 and len(tree.nodes[0].drafts) == 1 + tree.nodes[0].free


# --- T = 1: the law of the first two tokens ------------------------------------------------------------
def _two_token_law(t, ids):
    with torch.no_grad():
        p1 = sampling.process_logits(t(input_ids=ids).logits[0, -1], 1.0).double()
        V = p1.numel()
        ext = torch.cat([ids.expand(V, -1), torch.arange(V).view(V, 1)], 1)
        p2 = sampling.process_logits(t(input_ids=ext).logits[:, -1], 1.0).double()
    return (p1.unsqueeze(1) * p2).flatten()  # [V*V]


def _chi2_pvalue(counts, probs) -> float:
    from scipy.stats import chi2

    assert float(counts[probs == 0].sum()) == 0, "a token of target probability 0 was produced"
    exp = probs * counts.sum()
    bins_o, bins_e, acc_o, acc_e = [], [], 0.0, 0.0
    for i in torch.argsort(exp).tolist():  # merge the smallest cells until each expects >= 5
        if float(exp[i]) == 0:
            continue
        acc_o += float(counts[i])
        acc_e += float(exp[i])
        if acc_e >= 5:
            bins_o.append(acc_o)
            bins_e.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:
        bins_o[-1] += acc_o
        bins_e[-1] += acc_e
    stat = sum((o - e) ** 2 / e for o, e in zip(bins_o, bins_e))
    return float(chi2.sf(stat, max(1, len(bins_e) - 1)))


def _mixed_law_case(small_pair, n, seed, **kw):
    t, d = small_pair
    ids = torch.tensor([[1, 5, 2, 6, 1, 5, 2, 6, 1, 5]])  # lookup proposes 2, 6, 1, 5, ...
    V = t.config.vocab_size
    exact = _two_token_law(t, ids)
    s = Settings.from_args(temperature=1.0, max_new_tokens=3, sources="model,lookup", **kw)
    counts = torch.zeros(V * V, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    copied = 0
    for _ in range(n):
        r = md.generate(t, d, ids, s, generator=g)
        y = r.tokens.tolist()
        counts[y[0] * V + y[1]] += 1
        copied += max(r.draft_depths) > kw["depth"]
    assert copied == n  # the lookup chain was in every first tree
    assert _chi2_pvalue(counts, exact) > 1e-3


@pytest.mark.slow
def test_two_token_law_mixed_lookup(small_pair):
    """~15 s on a loaded 2-core machine."""
    _mixed_law_case(small_pair, 300, 21, verifier="specinfer", k=2, depth=1, draft_temperature=1.4)


@pytest.mark.slow
@pytest.mark.parametrize("verifier,kw", [("khisti_is", dict(k=2, depth=1)), ("specinfer", dict(k=2, depth=1,
                                                                                               tree="sequences")),
                                         ("lp_optimal", dict(k=2, depth=1, draft_law="greedy")),
                                         ("optimal", dict(k=2, depth=1)), ("rrs_wor", dict(k=2, depth=1, draft_law="wor"))])
def test_two_token_law_mixed_lookup_slow(small_pair, verifier, kw):
    """~15 s each on a loaded 2-core machine."""
    _mixed_law_case(small_pair, 500, 22, verifier=verifier, draft_temperature=1.3, **kw)


def test_batch_lanes_share_a_suffix_index(pair):
    """``BatchDecoder(index=SuffixIndex())``: each finished lane's output joins the shared index
    (the server's cross-request suffix source); the text stays the target's greedy text."""
    from multidraft.decoding.batch import BatchDecoder
    from multidraft.decoding.sources import SuffixIndex

    t, d = pair
    index = SuffixIndex()
    bd = BatchDecoder(t, d, max_lanes=1, index=index)
    s = Settings.from_args(verifier="specinfer", k=2, depth=2, temperature=0, max_new_tokens=10,
                           sources="model,suffix")
    ref = tm.greedy_reference(t, REPEATS, 10).tolist()
    for _ in range(2):
        lane = bd.add(REPEATS, s, generator=0)
        res = bd.run()
        assert res[lane].tokens.tolist() == ref
    assert len(index) > 0


def test_no_match_keeps_the_models_tree_and_law(pair):
    """A step whose free sources propose nothing verifies the model's tree under the model's own law
    (the walk as without sources)."""
    t, d = pair
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 9]])  # no repeated n-gram: prompt lookup proposes nothing
    for verifier, law in (("specinfer", "iid"), ("rrs_wor", "wor")):
        s = Settings.from_args(verifier=verifier, k=2, depth=2, draft_law=law, temperature=1.0, sources="model,lookup")
        step = engine.DecoderStep(runners.runner_for(t), runners.runner_for(d), s, torch.Generator().manual_seed(0))
        with torch.inference_mode():
            step.prefill(ids)
            tree = step.serve(step.draft(int(ids[0, -1]), 2, limit=8))
        assert all(nd.free == 0 for nd in tree.nodes)
        assert tree.law == law and s.rule.law == law
