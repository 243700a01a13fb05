"""End-to-end decoding on tiny random models: losslessness, KV cache, trees, bad input."""
from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("transformers")

import tiny_models as tm  # noqa: E402

import multidraft as md  # noqa: E402
from multidraft import sampling  # noqa: E402
from multidraft import trees  # noqa: E402
from multidraft.decoding import engine, kv, runners  # noqa: E402

torch.set_num_threads(1)




PROMPTS = [torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[7]]), torch.tensor([[9, 9, 0, 11, 3, 20, 2]])]


def _law_for(v):
    return v.default_law if v.default_law in v.laws else v.laws[0]


def _k_for(v):
    return 1 if v.max_k == 1 else 2


# --- temperature 0: equals target greedy ---------------------------------------------------------
@pytest.mark.parametrize("name", md.verifiers.names())
def test_greedy_equals_target_greedy_every_verifier(pair, name):
    t, d = pair
    v = md.verifiers.get(name)
    law = _law_for(v)
    for ids in PROMPTS[:2]:
        ref = tm.greedy_reference(t, ids, 12)
        r = md.generate(t, d, ids, verifier=name, k=_k_for(v), depth=3, draft_law=law,
                        temperature=0, max_new_tokens=12, generator=1)
        assert r.tokens.tolist() == ref.tolist(), (name, law)
        assert r.new_tokens == 12 and r.target_calls <= 12


@pytest.mark.parametrize("tree", [None, "sequences", [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]])
@pytest.mark.parametrize("law", ["iid", "wor", "greedy"])
def test_greedy_equals_target_greedy_trees_and_laws(pair, tree, law):
    t, d = pair
    ids = PROMPTS[2]
    ref = tm.greedy_reference(t, ids, 15)
    r = md.generate(t, d, ids, verifier="nss", k=2, depth=3, draft_law=law, tree=tree,
                    temperature=0, max_new_tokens=15, generator=0)
    assert r.tokens.tolist() == ref.tolist()


@pytest.mark.parametrize("name,law", [("rrs_wor", "wor"), ("spechub", "greedy"), ("greedy_optimal", "greedy"),
                                      ("specinfer", "iid"), ("nss", "iid")])
def test_verifier_implies_its_law(pair, name, law):
    t, d = pair
    assert md.verifiers.get(name).implied_law(2) == law
    assert engine.Settings.from_args(verifier=name, k=2).law == law
    ids = PROMPTS[0]
    ref = tm.greedy_reference(t, ids, 8)
    r = md.generate(t, d, ids, verifier=name, k=2, depth=2, temperature=0, max_new_tokens=8, generator=0)
    assert r.tokens.tolist() == ref.tolist()


def test_settings_accept_numpy_integers_and_list_means_independent():
    import numpy as np
    s = engine.Settings.from_args(verifier="specinfer", k=np.int64(2), depth=np.int32(3), top_k=np.int64(4),
                              top_p=np.float32(0.9), temperature=np.float64(0.7), max_new_tokens=np.int16(5))
    assert (s.k, s.depth, s.top_k, s.max_new_tokens, s.law) == (2, 3, 4, 5, "iid")
    assert type(s.k) is int and type(s.top_k) is int
    assert engine.Settings.from_args(verifier="specinfer", k=2, draft_temperature=[0.5, 1.0]).law == "independent"
    # a tree whose nodes have one child each: the law is implied at K = 1, so naive works without one
    assert engine.Settings.from_args(verifier="naive", k=2, tree=[[0], [0, 0]]).law == "iid"


def test_greedy_llama_and_target_only():
    t, d = tm.tiny_pair(arch="llama", vocab_size=20, seed=5)
    ids = PROMPTS[0]
    ref = tm.greedy_reference(t, ids, 10)
    for verifier, dr in [(None, None), ("naive", d)]:
        r = md.generate(t, dr, ids, verifier=verifier, k=1, depth=4, temperature=0, max_new_tokens=10, generator=0)
        assert r.tokens.tolist() == ref.tolist()
    base = md.generate(t, None, ids, verifier="none", temperature=0, max_new_tokens=10, generator=0)
    assert base.target_calls == 10 and base.block_efficiency == 1.0 and base.draft_calls == 0
    assert base.tree_tokens == 10                       # the root alone each step


def test_prompt_cache_gives_the_same_decoding_and_stays_intact(pair):
    t, d = pair
    pc = md.decoding.PromptCache(max_entries=2)
    runs = [("specinfer", 2), ("rrs_wor", 2), ("naive", 1), (None, 1)]
    for ids in PROMPTS[:2]:
        for verifier, k in runs + runs:  # the second round reads the cache after other methods used it
            kw = dict(verifier=verifier, k=k, depth=3, temperature=1.0, max_new_tokens=9)
            ref = md.generate(t, d, ids, generator=5, **kw)
            got = md.generate(t, d, ids, generator=5, prompt_cache=pc, **kw)
            assert got.tokens.tolist() == ref.tokens.tolist()
            assert got.accepted_lengths == ref.accepted_lengths
            assert ref.prefill_seconds > 0 or ids.shape[1] == 1
    # per prompt 8 target lookups and 6 draft lookups (target-only needs no draft), 2 misses each
    assert pc.misses == 4 and pc.hits == 2 * (8 + 6) - 4
    with pytest.raises(ValueError, match="prompt_cache"):
        md.generate(t, d, PROMPTS[0], verifier="nss", max_new_tokens=2, generator=0, prompt_cache={})
    with pytest.raises(ValueError, match="max_entries"):
        md.decoding.PromptCache(0)


def test_draft_equal_to_target_accepts_everything(pair):
    t, _ = pair
    r = md.generate(t, t, PROMPTS[0], verifier="naive", k=1, depth=4, temperature=1.0,
                    max_new_tokens=21, generator=3)
    # with q == p single-draft SD accepts every draft: 5 tokens per target call
    assert r.accepted_lengths[:4] == [4, 4, 4, 4]
    assert r.acceptance_rate == pytest.approx(1.0)
    assert r.block_efficiency == pytest.approx(21 / r.target_calls) and r.target_calls == 5
    assert r.tree_tokens == 4 * 5 + 1                    # root + a chain of 4, then the last token alone


def test_tree_tokens_count_distinct_nodes(pair):
    """Without-replacement drafts never repeat, so a full K-ary tree is scored whole; iid drafts
    of a peaked draft repeat and merge, so their tree is smaller."""
    t, d = pair
    kw = dict(k=2, depth=2, temperature=1.0, max_new_tokens=12, generator=4)
    wor = md.generate(t, d, PROMPTS[0], verifier="rrs_wor", **kw)
    iid = md.generate(t, d, PROMPTS[0], verifier="specinfer", **kw)
    assert wor.tree_tokens <= 7 * wor.target_calls and iid.tree_tokens <= 7 * iid.target_calls
    assert wor.tree_tokens >= 3 * wor.target_calls      # root + 2 distinct children at least, each step
    assert iid.tree_tokens >= 2 * iid.target_calls


def test_eos_stops(pair):
    t, d = pair
    ids = PROMPTS[0]
    ref = tm.greedy_reference(t, ids, 12).tolist()
    eos = ref[4]
    r = md.generate(t, d, ids, verifier="nss", temperature=0, max_new_tokens=12, eos_token_id=eos, generator=0)
    assert r.tokens.tolist() == ref[: ref.index(eos) + 1]
    assert r.stop_reason == "eos"


def test_context_limit_stops():
    t, d = tm.tiny_pair(vocab_size=16, max_pos=12, seed=2)
    r = md.generate(t, d, PROMPTS[0], verifier="nss", k=2, depth=4, temperature=1.0, max_new_tokens=50, generator=0)
    assert r.stop_reason == "context"
    assert PROMPTS[0].shape[1] + r.new_tokens <= 13


# --- temperature > 0: the law of the first two tokens ----------------------------------------------
def _exact_two_token_law(t, ids, temperature, top_k=None, top_p=None):
    with torch.no_grad():
        p1 = sampling.process_logits(t(input_ids=ids).logits[0, -1], temperature, top_k, top_p).double()
        V = p1.numel()
        ext = torch.cat([ids.expand(V, -1), torch.arange(V).view(V, 1)], 1)
        p2 = sampling.process_logits(t(input_ids=ext).logits[:, -1], temperature, top_k, top_p).double()
    return (p1.unsqueeze(1) * p2).flatten()  # [V*V], index y1*V + y2


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    from scipy.stats import chi2

    n = counts.sum()
    exp = probs * n
    assert float(counts[probs == 0].sum()) == 0, "a token of target probability 0 was produced"
    order = torch.argsort(exp)
    # merge the smallest cells until every bin expects >= 5
    bins_o, bins_e, acc_o, acc_e = [], [], 0.0, 0.0
    for i in order.tolist():
        if float(exp[i]) == 0:
            continue
        acc_o += float(counts[i]); acc_e += float(exp[i])
        if acc_e >= 5:
            bins_o.append(acc_o); bins_e.append(acc_e); acc_o = acc_e = 0.0
    if acc_e > 0:
        bins_o[-1] += acc_o; bins_e[-1] += acc_e
    stat = sum((o - e) ** 2 / e for o, e in zip(bins_o, bins_e))
    return float(chi2.sf(stat, max(1, len(bins_e) - 1)))


def _empirical_two_token(t, d, ids, n, seed, **kw):
    V = t.config.vocab_size
    counts = torch.zeros(V * V, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        r = md.generate(t, d, ids, max_new_tokens=3, generator=g, **kw)
        y = r.tokens.tolist()
        counts[y[0] * V + y[1]] += 1
    return counts


def _law_case(small_pair, n, seed, **kw):
    t, d = small_pair
    ids = torch.tensor([[1, 5, 2]])
    exact = _exact_two_token_law(t, ids, kw.get("temperature", 1.0), kw.get("top_k"), kw.get("top_p"))
    counts = _empirical_two_token(t, d, ids, n, seed, **kw)
    pv = _chi2_pvalue(counts, exact)
    assert pv > 1e-3, (kw, pv)


def test_two_token_law_multidraft_fast(small_pair):
    # iid drafts with duplicates (V = 8), depth-2 tree, recovered and bonus tokens all exercised
    _law_case(small_pair, 300, 11, verifier="nss", k=3, depth=2, draft_law="iid",
              temperature=1.0, draft_temperature=1.4)


def test_two_token_law_optimal_fast(small_pair):
    # the optimal verifier through the decoder: its fitted selection law at every tree node
    _law_case(small_pair, 300, 13, verifier="optimal", k=3, depth=2, temperature=1.0, draft_temperature=1.3)


def test_two_token_law_single_draft_fast(small_pair):
    _law_case(small_pair, 300, 12, verifier="naive", k=1, depth=2, temperature=0.8, draft_temperature=1.2)


SLOW_CASES = []
for _name in md.verifiers.names():
    _v = md.verifiers.get(_name)
    for _law in _v.laws:
        if _law == "independent" or (_v.max_k == 1 and _law != _law_for(_v)):
            continue  # independent: covered below; at K = 1 every law is the same
        SLOW_CASES.append((_name, _law))


@pytest.mark.slow
@pytest.mark.parametrize("name,law", SLOW_CASES)
def test_two_token_law_every_verifier_slow(small_pair, name, law):
    v = md.verifiers.get(name)
    _law_case(small_pair, 1200, 100 + len(name), verifier=name, k=_k_for(v), depth=2, draft_law=law,
              temperature=1.0, draft_temperature=1.5)


@pytest.mark.slow
@pytest.mark.parametrize("verifier,kw", [
    ("specinfer", dict(tree="sequences", k=3, draft_law="iid")),
    ("rrs_wor", dict(tree=[[0], [1], [0, 0], [0, 1], [1, 0]], k=2, draft_law="wor")),
    ("specinfer", dict(k=2, draft_temperature=[0.7, 1.6])),
    ("specinfer", dict(k=2, draft_law="iid", top_k=5, top_p=0.9)),
])
def test_two_token_law_trees_and_processing_slow(small_pair, verifier, kw):
    if verifier not in md.verifiers.names():
        verifier = "nss"
    _law_case(small_pair, 1200, 7, verifier=verifier, depth=2, temperature=1.0, **kw)


# --- KV cache and tree attention ------------------------------------------------------------
def _plain_last_logits(model, seq):
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]


def test_tree_pass_matches_plain_forward_of_each_path(pair):
    t, _ = pair
    prompt = [3, 1, 4, 1, 5]
    shape = trees.TreeShape.from_args([[0], [1], [2], [0, 0], [0, 1], [2, 0], [0, 1, 0]], 3, 3)
    with torch.inference_mode():
        run = runners.HFRunner(t)
        run.prefill(torch.tensor([prompt[:-1]]))
        tree = trees.DraftTree(shape, prompt[-1], 3, 1)
        for i, toks in [(0, [7, 8, 7]), (1, [2, 9])]:  # duplicate 7: one child node
            tree.add_drafts(i, toks)
        tree.add_drafts(3, [10])  # node 3 is token 2 under token 7; ids follow creation order
        logits = engine.score_tree(run, tree)
        assert kv.cache_length(run.cache) == len(prompt) - 1 + len(tree)
        for i in range(len(tree)):
            seq = prompt + [tree.nodes[j].token for j in tree.path_to(i)]
            torch.testing.assert_close(logits[i], _plain_last_logits(t, seq), atol=1e-4, rtol=1e-4)
        # compaction to the path root -> node 3 -> its child, then one more plain step
        leaf = tree.nodes[3].child[10]
        path = tree.path_to(leaf)
        run.commit([0] + path)
        seq = prompt + [tree.nodes[j].token for j in path]
        assert kv.cache_length(run.cache) == len(seq) == run.base
        nxt = run.extend([5], [-1])[-1]
        torch.testing.assert_close(nxt, _plain_last_logits(t, seq + [5]), atol=1e-4, rtol=1e-4)
        # a second tree level over uncommitted entries (the draft's use): [6] under 5, [1, 2] under 6
        lv = run.extend([6], [0])
        lv2 = run.extend([1, 2], [1, 1])
        torch.testing.assert_close(lv[0], _plain_last_logits(t, seq + [5, 6]), atol=1e-4, rtol=1e-4)
        for r, tk in enumerate([1, 2]):
            torch.testing.assert_close(lv2[r], _plain_last_logits(t, seq + [5, 6, tk]), atol=1e-4, rtol=1e-4)
        run.commit([0, 1, 3])
        assert kv.cache_length(run.cache) == len(seq) + 3 == run.base
        nxt = run.extend([4], [-1])[-1]
        torch.testing.assert_close(nxt, _plain_last_logits(t, seq + [5, 6, 2, 4]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tree", [None, "sequences"])
def test_caches_after_many_steps_equal_fresh_prefill(pair, tree):
    t, d = pair
    ids = PROMPTS[0]
    g = torch.Generator().manual_seed(5)
    settings = engine.Settings.from_args(verifier="nss", k=2, depth=3, draft_law="iid", tree=tree, temperature=1.0,
                                     draft_temperature=0.7, max_new_tokens=25)
    eos = engine._check_models(t, d, ids, settings, None)
    step = engine.DecoderStep(runners.runner_for(t), runners.runner_for(d), settings, g)
    dec = engine._Decoder(step, engine.decode_context(t, d), eos=eos)
    with torch.inference_mode():
        res = dec.run(ids)
        full = ids[0].tolist() + res.tokens.tolist()
        assert res.target_calls > 3
        committed = full[:-1]  # the last token is the next root, not yet cached
        tr, dr = step.target_runner, step.draft_runner
        for model, cache, n in [(t, tr.cache, len(committed)), (d, dr.cache, dr.base)]:
            assert kv.cache_length(cache) == n
            fresh = kv.new_cache(model)
            model(input_ids=torch.tensor([full[:n]]), cache=fresh, use_cache=True)
            for a, b in zip(cache.layers, fresh.layers):
                torch.testing.assert_close(a.keys, b.keys, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(a.values, b.values, atol=1e-4, rtol=1e-4)
        assert dr.base + len(step.pending) == len(committed)
        assert full[dr.base: len(committed)] == step.pending


# --- trees -----------------------------------------------------------------------------------
def test_parse_tree_and_full_tree():
    assert trees.full_tree(2, 2) == [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]
    ch = trees.parse_tree([[0], [1], [0, 0]])
    assert ch == {(): 2, (0,): 1, (1,): 0, (0, 0): 0}
    for bad in ([[0, 0]], [[1]], [[0], [0]], [[-1]], [], "x", [[0.5]]):
        with pytest.raises(ValueError, match="tree"):
            trees.parse_tree(bad) if not isinstance(bad, str) else trees.TreeShape.from_args(bad, 2, 2)


def test_sequences_trie_merges_duplicates():
    shape = trees.TreeShape.from_args("sequences", 3, 2)
    tr = trees.DraftTree(shape, 0, 2, 3)
    new = tr.add_drafts(0, [5, 6, 5])
    assert len(new) == 2 and tr.nodes[0].drafts == [5, 6, 5]
    a = tr.nodes[0].child[5]
    assert tr.nodes[a].cols == (0, 2) and tr.n_children(a) == 2  # two sequences continue through 5
    assert tr.draft_cols(a, 2) == (0, 2)


# --- bad input ---------------------------------------------------------------------------------
def test_bad_input_errors(pair):
    t, d = pair
    ids = PROMPTS[0]
    kw = dict(max_new_tokens=3, generator=0)
    cases = [
        (dict(verifier="nope"), "verifier"),
        (dict(draft_law="bogus"), "draft_law"),
        (dict(k=0), "k must"),
        (dict(depth=0), "depth"),
        (dict(temperature=-0.5), "temperature"),
        (dict(draft_temperature=-1.0), "draft_temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(verifier="naive", k=2), "naive"),
        (dict(verifier="rrs_wor", draft_law="iid"), "laws that work with 2 drafts: wor"),
        (dict(verifier="spechub", k=3), "k: verifier .spechub."),
        (dict(k=True), "k must"),
        (dict(tree=[[1]]), "tree"),
        (dict(draft_temperature=[1.0, 2.0, 3.0]), "draft_temperature"),
    ]
    for extra, word in cases:
        with pytest.raises(ValueError, match=word):
            md.generate(t, d, ids, **{**kw, **extra})
    with pytest.raises(ValueError, match="generator"):
        md.generate(t, d, ids, max_new_tokens=3)
    with pytest.raises(ValueError, match="draft"):
        md.generate(t, None, ids, verifier="nss", **kw)
    other = tm.tiny_model(vocab_size=30)
    with pytest.raises(ValueError, match="vocabulary"):
        md.generate(t, other, ids, verifier="nss", **kw)
    with pytest.raises(ValueError, match="input_ids"):
        md.generate(t, d, torch.zeros(1, 300, dtype=torch.long), verifier="nss", **kw)
    with pytest.raises(ValueError, match="input_ids"):
        md.generate(t, d, torch.zeros(2, 3, dtype=torch.long), verifier="nss", **kw)
    with pytest.raises(ValueError, match="input_ids"):
        md.generate(t, d, torch.tensor([[1, 99]]), verifier="nss", **kw)


def test_lazy_import_does_not_pull_transformers():
    import subprocess

    code = "import sys, multidraft; assert 'transformers' not in sys.modules; print(callable(multidraft.generate))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


# --- CLI ---------------------------------------------------------------------------------------
def test_cli_decode_json_and_errors(saved_pair, capsys):
    import json

    from multidraft.cli import main

    t, tok, target_dir, draft_dir = saved_pair
    base = ["decode", "--prompt", "hellothere", "--target", str(target_dir), "--draft", str(draft_dir),
            "--dtype", "float32", "--quiet", "--ignore-eos", "--max-new-tokens", "8"]
    assert main(base + ["--verifier", "nss", "--k", "2", "--depth", "2", "--json", "--temperature", "0"]) == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("text", "new_tokens", "target_calls", "block_efficiency", "acceptance_rate", "seconds", "tokens_per_s", "seed", "settings"):
        assert key in obj
    assert obj["new_tokens"] == 8 and obj["settings"]["verifier"] == "nss"
    ids = tok("hellothere", return_tensors="pt")["input_ids"]
    ref = tm.greedy_reference(t, ids, 8)
    assert obj["text"] == tok.decode(ref.tolist(), skip_special_tokens=True)
    assert main(base + ["--verifier", "none"]) == 0
    capsys.readouterr()
    for bad in (["--verifier", "bogus"], ["--k", "0"], ["--temperature", "-1"], ["--draft-law", "iid", "--tree", "[[1]]"]):
        assert main(base + bad) == 2
        err = capsys.readouterr().err
        assert "error" in err and "Traceback" not in err
