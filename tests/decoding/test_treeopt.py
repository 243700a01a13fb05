"""Cost model, acceptance statistics and the tree dynamic program (decoding.treeopt)."""
from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace

import numpy as np
import pytest

from multidraft.decoding.treeopt import (AcceptStats, CostProfile, TreeDP, chain, choose_tree, expected_tokens,
                                         expected_tokens_along, fit_overhead, level_counts, slot_increments, step_seconds,
                                         tree_candidates)
from multidraft.trees import parse_tree


# brute force ---------------------------------------------------------------------------------
def _compositions(total, parts):
    if parts == 1:
        yield (total,)
        return
    for first in range(1, total - parts + 2):
        for rest in _compositions(total - first, parts - 1):
            yield (first,) + rest


def _subtrees(n, depth, ks):
    """Every ordered subtree of exactly n nodes and depth <= depth: lists of child paths (relative)."""
    if n == 1:
        return [[]]
    if depth == 0:
        return []
    out = []
    for k in ks:
        if k > n - 1:
            continue
        for sizes in _compositions(n - 1, k):
            options = [_subtrees(s, depth - 1, ks) for s in sizes]
            for combo in itertools.product(*options):
                paths = []
                for i, sub in enumerate(combo):
                    paths.append([i])
                    paths.extend([[i] + p for p in sub])
                out.append(paths)
    return out


def _brute_best(stats, n, depth):
    best = 1.0
    for m in range(2, n + 1):
        for paths in _subtrees(m, depth, stats.ks):
            best = max(best, expected_tokens(paths, stats))
    return best


def _random_stats(rng, kmax):
    acc = {}
    for k in range(1, kmax + 1):
        w = [rng.random() for _ in range(k + 1)]
        s = sum(w)
        acc[k] = [x / s for x in w[:k]]
    return AcceptStats(acc)


@pytest.mark.parametrize("seed", range(6))
def test_dp_equals_brute_force(seed):
    rng = random.Random(seed)
    stats = _random_stats(rng, 1 + seed % 4)
    dp = TreeDP(stats, max_nodes=6, max_depth=4)
    for depth in range(1, 5):
        for n in range(1, 7):
            paths, e = dp.best(n, depth)
            assert e == pytest.approx(_brute_best(stats, n, depth), abs=1e-12)
            if paths:
                parse_tree(paths)  # a valid shape
            assert len(paths) + 1 <= n and max((len(p) for p in paths), default=0) <= depth
            assert expected_tokens(paths, stats) == pytest.approx(e, abs=1e-12)


def test_dp_restricted_ks_equal_brute_force():
    stats = AcceptStats({1: [0.5], 3: [0.3, 0.2, 0.1]})
    dp = TreeDP(stats, max_nodes=6, max_depth=3)
    for n in range(1, 7):
        paths, e = dp.best(n, 3)
        assert e == pytest.approx(_brute_best(stats, n, 3), abs=1e-12)
        assert all(k in (0, 1, 3) for k in parse_tree(paths).values()) if paths else True


def test_chain_when_single_draft_is_good_and_more_drafts_worthless():
    stats = AcceptStats({1: [0.9], 2: [0.9, 0.0], 3: [0.9, 0.0, 0.0]})
    dp = TreeDP(stats, max_nodes=16, max_depth=8)
    paths, e = dp.best(6, 8)
    assert paths == [[0] * d for d in range(1, 6)]
    assert e == pytest.approx(sum(0.9 ** d for d in range(6)))
    # beyond depth 8 the extra budget is not spent on worthless nodes
    paths, _ = dp.best(16, 8)
    assert paths == [[0] * d for d in range(1, 9)]


def test_wide_when_each_slot_accepts_little():
    stats = AcceptStats({k: [0.15] * k for k in range(1, 5)})
    paths, e = TreeDP(stats, max_nodes=5, max_depth=4).best(5, 4)
    assert paths == [[0], [1], [2], [3]]
    assert e == pytest.approx(1.6)


def test_children_of_one_node_get_different_subtree_sizes():
    # slot 0 is much better than slot 1: it should carry the deeper subtree
    stats = AcceptStats({1: [0.8], 2: [0.8, 0.15]})
    paths, e = TreeDP(stats, max_nodes=6, max_depth=4).best(6, 4)
    assert e == pytest.approx(_brute_best(stats, 6, 4), abs=1e-12)
    depth_under = {i: max(len(p) for p in paths if p[0] == i) for i in {p[0] for p in paths}}
    assert depth_under[0] > depth_under.get(1, 0)


@pytest.mark.parametrize("seed", range(3))
def test_monotone_in_budget_and_depth(seed):
    stats = _random_stats(random.Random(100 + seed), 8)
    dp = TreeDP(stats, max_nodes=64, max_depth=8)
    for depth in range(1, 9):
        es = [e for _, e in dp.table(depth)]
        assert all(b >= a - 1e-12 for a, b in zip(es, es[1:]))
    for n in (2, 10, 64):
        es = [dp.best(n, d)[1] for d in range(1, 9)]
        assert all(b >= a - 1e-12 for a, b in zip(es, es[1:]))
    paths, e = dp.best()
    assert len(paths) <= 63 and expected_tokens(paths, stats) == pytest.approx(e, abs=1e-10)


# cost model -----------------------------------------------------------------------------------
def test_cost_profile_interpolation_and_json():
    pr = CostProfile([1, 4, 16], [0.2, 0.5, 2.0], [1, 2], [0.1, 0.12], meta={"cpu": "x"})
    assert pr.target_seconds(1) == pytest.approx(0.2)
    assert pr.target_seconds(2) == pytest.approx(0.3)
    assert pr.target_seconds(10) == pytest.approx(1.25)
    assert pr.target_seconds(20) == pytest.approx(2.5)     # along the last segment
    assert pr.draft_seconds(0) == 0.0 and pr.draft_seconds(4) == pytest.approx(0.16)
    back = CostProfile.from_json(pr.to_json())
    assert back == pr and back.meta == {"cpu": "x"}
    assert pr.target_only_rate() == pytest.approx(5.0)


@pytest.mark.parametrize("bad", [
    dict(target_nodes=[1, 1], target_times=[0.1, 0.2]),
    dict(target_nodes=[0], target_times=[0.1]),
    dict(target_nodes=[1], target_times=[-1.0]),
    dict(target_nodes=[1, 2], target_times=[0.1]),
    dict(target_nodes=[1], target_times=[float("nan")]),
])
def test_cost_profile_rejects_bad_points(bad):
    kw = dict(target_nodes=[1], target_times=[0.1], draft_nodes=[1], draft_times=[0.1])
    kw.update(bad)
    with pytest.raises(ValueError, match="target"):
        CostProfile(**kw)


def test_profile_from_json_names_what_is_missing():
    with pytest.raises(ValueError, match="profile"):
        CostProfile.from_json(json.dumps({"target": {"nodes": [1]}}))
    with pytest.raises(ValueError, match="profile"):
        CostProfile.from_json("{not json")


def test_level_counts_and_step_seconds():
    paths = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    assert level_counts(paths) == [1, 2, 1]
    pr = CostProfile([1, 64], [1.0, 64.0], [1, 8], [0.1, 0.8], per_node_seconds=0.01)
    assert step_seconds(paths, pr) == pytest.approx(7.0 + 0.1 + 0.2 + 0.1 + 0.06)
    assert step_seconds([], pr) == pytest.approx(1.0)


# acceptance statistics --------------------------------------------------------------------
def test_from_records_is_the_empirical_slot_law():
    recs = [(2, 0)] * 5 + [(2, 1)] * 3 + [(2, None)] * 2 + [(3, 2, 1)] + [(3, -1, 0)]
    st = AcceptStats.from_records(recs)
    assert st.accept[2] == (0.5, 0.3) and st.alpha(2) == pytest.approx(0.8)
    assert st.accept[3] == (0.0, 0.0, 0.5)
    assert st.accept[1] == (0.5,) and st.counts[1] == 0 and st.counts[2] == 10   # prefix of k = 2
    assert AcceptStats.from_json(st.to_json()) == st
    with pytest.raises(ValueError, match="slot"):
        AcceptStats.from_records([(2, 2)])
    with pytest.raises(ValueError, match="records"):
        AcceptStats.from_records([])


def test_from_alphas_spreads_increments():
    st = AcceptStats.from_alphas([0.6, 0.75, 0.7])
    assert st.accept[1] == pytest.approx((0.6,))
    assert st.accept[2] == pytest.approx((0.6, 0.15))
    assert st.accept[3] == pytest.approx((0.6, 0.1, 0.0))   # capped at alpha_3, still sums to it
    assert st.alpha(3) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="alpha"):
        AcceptStats.from_alphas([1.5])


def test_accept_stats_validation():
    with pytest.raises(ValueError, match="entries"):
        AcceptStats({2: [0.5]})
    with pytest.raises(ValueError, match="sums"):
        AcceptStats({2: [0.6, 0.6]})
    with pytest.raises(ValueError, match="statistics"):
        expected_tokens([[0], [1]], AcceptStats({1: [0.5]}))


# the chooser -------------------------------------------------------------------------------
def test_target_only_when_every_node_costs_a_full_forward():
    one = 0.22
    pr = CostProfile(list(range(1, 65)), [one * n for n in range(1, 65)], [1, 8], [0.1, 0.3])
    st = AcceptStats.from_alphas([0.7, 0.8, 0.85, 0.88])
    c = choose_tree(pr, st)
    assert not c.pays and c.speedup < 1
    assert c.target_only_tokens_per_s == pytest.approx(1 / one)
    # even with free drafting: E[tokens] <= n nodes, so n forwards never beat n single ones
    pr0 = CostProfile(list(range(1, 65)), [one * n for n in range(1, 65)], [1], [1e-9])
    assert not choose_tree(pr0, st).pays


def test_chooser_pays_when_verify_is_cheap():
    pr = CostProfile([1, 64], [0.1, 0.12], [1, 8], [0.01, 0.012])
    st = AcceptStats.from_alphas([0.8, 0.9])
    c = choose_tree(pr, st, max_nodes=32, max_depth=6)
    assert c.pays and c.speedup > 2
    t = c.tree
    assert t.nodes <= 32 and t.depth <= 6
    assert t.expected_tokens == pytest.approx(expected_tokens(t.paths, st))
    assert t.tokens_per_s == pytest.approx(t.expected_tokens / step_seconds(t.paths, pr))
    # no (budget, depth) best tree is faster
    dp = TreeDP(st, 32, 6)
    for d in range(1, 7):
        for n in range(2, 33):
            p, e = dp.best(n, d)
            assert e / step_seconds(p, pr) <= t.tokens_per_s * (1 + 1e-9)
    json.dumps(c.to_dict())


def test_engine_node_log_matches_accepted_lengths():
    pytest.importorskip("transformers")
    import tiny_models as tm

    from multidraft.decoding import generate

    t, d = tm.tiny_pair(vocab_size=32, seed=2)
    ids = tm.tiny_tokenizer()("hello", return_tensors="pt")["input_ids"]
    log: list = []
    res = generate(t, d, ids, verifier="specinfer", tree=[[0], [1], [0, 0], [0, 0, 0]], temperature=1.0,
                   max_new_tokens=20, generator=3, node_log=log)
    assert log and all(len(r) == 3 for r in log)
    assert sum(r[1] is not None for r in log) == sum(res.accepted_lengths)
    assert {r[0] for r in log} <= {1, 2} and all(r[1] is None or 0 <= r[1] < r[0] for r in log)
    st = AcceptStats.from_records(log)
    assert set(st.ks) <= {1, 2} and all(0 <= st.alpha(k) <= 1 for k in st.ks)
    with pytest.raises(ValueError, match="node_log"):
        generate(t, d, ids, verifier="specinfer", max_new_tokens=2, generator=0, node_log=())


def test_slot_increments_are_from_alphas_at_every_position():
    rng = np.random.default_rng(3)
    al = {k: rng.uniform(0.2, 0.99, size=50) for k in (1, 2, 4)}
    slots = slot_increments(al)
    for t in range(50):
        st = AcceptStats.from_alphas({k: float(a[t]) for k, a in al.items()})
        for k in al:
            assert slots[k][t] == pytest.approx(st.accept[k], abs=1e-15)
            assert slots[k][t].sum() == pytest.approx(al[k][t], abs=1e-12)
    with pytest.raises(ValueError, match="same number"):
        slot_increments({1: np.ones(3), 2: np.ones(4)})
    with pytest.raises(ValueError, match="probabilities"):
        slot_increments({1: np.array([0.5, 1.2])})


def test_expected_tokens_along_constant_rows_is_the_positional_model():
    st = AcceptStats.from_alphas([0.7, 0.8, 0.85])
    slots = {k: np.tile(np.array(v), (40, 1)) for k, v in st.accept.items()}
    dp = TreeDP(st, 20, 5)
    for n in (2, 5, 9, 20):
        paths, e = dp.best(n, 5)
        assert expected_tokens_along(paths, slots) == pytest.approx(e, abs=1e-12)
    assert expected_tokens_along([], slots) == 1.0


def test_expected_tokens_along_keeps_correlation():
    # acceptance 1, 1, 0, 0 along four positions: a depth-2 chain starts at t = 0 (1 + 1 + 1) and
    # t = 1 (1 + 1 + 0): mean 2.5, where the positional model with the mean 0.5 says 1.75
    slots = {1: np.array([[1.0], [1.0], [0.0], [0.0]])}
    chain = [[0], [0, 0]]
    assert expected_tokens_along(chain, slots) == pytest.approx(2.5)
    assert expected_tokens(chain, AcceptStats({1: [0.5]})) == pytest.approx(1.75)
    # a 2-draft root: slot 1 adds only where slot 0 failed
    slots2 = slot_increments({1: np.array([1.0, 0.0, 0.5]), 2: np.array([1.0, 0.6, 0.9])})
    assert expected_tokens_along([[0], [1]], slots2) == pytest.approx(1 + (1.0 + 0.6) / 2)
    with pytest.raises(ValueError, match="positions"):
        expected_tokens_along(chain, {1: np.array([[0.5], [0.5]])})
    with pytest.raises(ValueError, match="statistics"):
        expected_tokens_along([[0], [1]], {1: np.ones((5, 1))})


# profile statistics, chains among the candidates, the along model -------------------------------
def test_with_statistic_recomputes_every_point_from_the_samples():
    samples = {"target": {"1": [0.07, 0.095, 0.071, 0.094], "4": [0.13, 0.128, 0.133, 0.2]},
               "draft": {"1": [0.013, 0.02, 0.014], "8": [0.05, 0.06, 0.058]}}
    pr = CostProfile([1, 4], [0.07, 0.128], [1, 8], [0.013, 0.05], meta={"statistic": "min", "samples": samples})
    assert pr.statistic == "min"
    med = pr.with_statistic("median")
    assert med.target_times == pytest.approx((0.0825, 0.1315)) and med.draft_times == pytest.approx((0.014, 0.058))
    assert med.statistic == "median" and med.meta["samples"] == samples and pr.statistic == "min"
    mean = pr.with_statistic("mean")
    assert mean.target_seconds(1) == pytest.approx(0.0825) and mean.draft_seconds(8) == pytest.approx(0.056)
    assert pr.with_statistic("min").target_times == pr.target_times
    assert pr.with_statistic("stored") is pr and CostProfile([1], [0.1], [1], [0.01]).with_statistic("stored").statistic is None
    again = CostProfile.from_json(med.to_json())
    assert again.target_times == med.target_times and again.statistic == "median"
    with pytest.raises(ValueError, match="statistic must be one of median, mean, min"):
        pr.with_statistic("max")
    with pytest.raises(ValueError, match="no timed samples"):
        CostProfile([1], [0.1], [1], [0.01]).with_statistic("median")
    bad = CostProfile([1, 4], [0.07, 0.128], [1, 8], [0.013, 0.05],
                      meta={"samples": {"target": {"1": [0.07]}, "draft": samples["draft"]}})
    with pytest.raises(ValueError, match=r"meta.samples.target has no samples for n = \[4\]"):
        bad.with_statistic("median")


def test_candidates_hold_every_chain_and_the_dp_trees():
    st = AcceptStats.from_alphas([0.6, 0.9, 0.95])
    cands = tree_candidates(st, 12, 5)
    keys = [tuple(map(tuple, p)) for p, _ in cands]
    assert len(keys) == len(set(keys))
    for d in range(1, 6):
        assert tuple(tuple([0] * j) for j in range(1, d + 1)) in keys
    dp = [tuple(map(tuple, p)) for p, _ in TreeDP(st, 12, 5).candidates()]
    assert set(dp) <= set(keys)
    for p, e in cands:
        assert e == pytest.approx(expected_tokens(p, st), abs=1e-12)
    # chains need k = 1 statistics
    assert all(any(len(x) == 1 and x[0] == 1 for x in p) for p, _ in tree_candidates(AcceptStats({2: [0.5, 0.2]}), 6, 3))


def test_choose_tree_along_prefers_chains_on_runs_of_easy_tokens():
    # runs of 12 easy tokens (acceptance 1) and 12 hard ones (0.1): the positional model sees the
    # mean 0.55 everywhere and keeps the tree one level deep (2 drafts at the root); rated along
    # the text, a chain goes on through the easy runs: depth 4, 2.94 tokens a step, not 1.65
    a1 = np.array(([1.0] * 12 + [0.1] * 12) * 20)
    a2 = np.minimum(1.0, a1 + 0.2)
    pr = CostProfile([1, 64], [0.1, 0.1 + 63 * 0.004], [1, 8], [0.02, 0.03])
    st = AcceptStats.from_alphas({1: float(a1.mean()), 2: float(a2.mean())})
    pos = choose_tree(pr, st, 16, 8)
    along = choose_tree(pr, st, 16, 8, along={1: a1, 2: a2})
    assert pos.model == "positional" and along.model == "along" and along.to_dict()["acceptance_model"] == "along"
    slots = slot_increments({1: a1, 2: a2})
    assert along.tree.expected_tokens == pytest.approx(expected_tokens_along(along.tree.paths, slots))
    for paths, _ in tree_candidates(st, 16, 8):      # the best of the candidates under the along model
        rate = expected_tokens_along(paths, slots) / step_seconds(paths, pr)
        assert rate <= along.tree.tokens_per_s * (1 + 1e-9)
    assert pos.tree.paths == [[0], [1]] and pos.tree.expected_tokens == pytest.approx(1.65)
    assert along.tree.depth == 4 and along.tree.expected_tokens == pytest.approx(2.9448, abs=1e-4)
    assert along.speedup > pos.speedup
    with pytest.raises(ValueError, match=r"no per-position acceptances for k = \[2\]"):
        choose_tree(pr, st, 16, 8, along={1: a1})


def test_with_statistic_not_strict_keeps_a_profile_without_samples():
    pr = CostProfile([1], [0.1], [1], [0.01])
    assert pr.with_statistic("median", strict=False) is pr
    with pytest.raises(ValueError, match="statistic must be one of"):
        pr.with_statistic("p90", strict=False)


# the decoder's own time per step and per node ----------------------------------------------
def _overhead_runs(profile, a, b, depths=(0, 2, 4), steps=(64, 30, 20)):
    bare = profile.without_overhead()
    return [{"depth": d, "steps": s, "seconds": s * (step_seconds(chain(d), bare) + a + b * d)}
            for d, s in zip(depths, steps)]


def test_fit_overhead_recovers_a_per_step_and_a_per_node_term():
    pr = CostProfile([1, 8], [0.07, 0.12], [1, 4], [0.013, 0.03])
    per_step, per_node = fit_overhead(pr, _overhead_runs(pr, 0.008, 0.0009))
    assert per_step == pytest.approx(0.008, abs=1e-12) and per_node == pytest.approx(0.0009, abs=1e-12)
    # a profile that already carries an overhead is fitted on its models' time alone
    assert fit_overhead(replace(pr, per_step_seconds=1.0, per_node_seconds=1.0),
                        _overhead_runs(pr, 0.008, 0.0009)) == pytest.approx((0.008, 0.0009))
    # both terms stay >= 0: a negative slope gives the mean residual, a negative intercept the fit through 0
    assert fit_overhead(pr, _overhead_runs(pr, 0.02, -0.002)) == pytest.approx((0.02 - 0.002 * 2, 0.0))
    ps, pn = fit_overhead(pr, _overhead_runs(pr, -0.004, 0.003))
    assert ps == 0.0 and pn == pytest.approx(sum(d * (-0.004 + 0.003 * d) for d in (2, 4)) / 20)
    assert fit_overhead(pr, _overhead_runs(pr, -0.01, 0.0)) == (0.0, 0.0)
    assert fit_overhead(pr, _overhead_runs(pr, 0.005, 0.0, depths=(3,), steps=(10,))) == pytest.approx((0.005, 0.0))
    for bad in ([], [{"depth": 1}], [{"depth": -1, "steps": 1, "seconds": 1.0}], [{"depth": 0, "steps": 0, "seconds": 1.0}]):
        with pytest.raises(ValueError, match="overhead"):
            fit_overhead(pr, bad)


def test_overhead_enters_every_step_and_the_target_alone():
    pr = CostProfile([1, 64], [1.0, 64.0], [1, 8], [0.1, 0.8], per_node_seconds=0.01, per_step_seconds=0.25)
    paths = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    assert step_seconds(paths, pr) == pytest.approx(7.0 + 0.1 + 0.2 + 0.1 + 0.06 + 0.25)
    assert step_seconds([], pr) == pytest.approx(1.25) and pr.target_only_rate() == pytest.approx(1 / 1.25)
    assert CostProfile.from_json(pr.to_json()) == pr
    old = json.loads(pr.to_json())
    del old["per_step_seconds"]  # a profile written before the term existed
    assert CostProfile.from_dict(old).per_step_seconds == 0.0
    for bad in (-0.1, float("nan"), "x"):
        with pytest.raises(ValueError, match="per_step_seconds"):
            CostProfile([1], [0.1], [1], [0.01], per_step_seconds=bad)
    assert chain(0) == [] and chain(3) == [[0], [0, 0], [0, 0, 0]]


def test_with_statistic_fits_the_overhead_again_against_its_points():
    samples = {"target": {"1": [0.07, 0.09, 0.08], "8": [0.12, 0.14, 0.13]},
               "draft": {"1": [0.013, 0.02, 0.015], "4": [0.03, 0.04, 0.035]}}
    pr = CostProfile([1, 8], [0.07, 0.12], [1, 4], [0.013, 0.03], meta={"statistic": "min", "samples": samples})
    runs = _overhead_runs(pr.with_statistic("median"), 0.01, 0.001)
    pr = replace(pr, meta={**pr.meta, "overhead": {"runs": runs}})
    med = pr.with_statistic("median")
    assert (med.per_step_seconds, med.per_node_seconds) == pytest.approx((0.01, 0.001))
    mn = pr.with_statistic("min")  # faster points leave more of the same decodes to the decoder
    assert mn.per_step_seconds > med.per_step_seconds
    for d in (0, 2, 4):
        wall = next(r["seconds"] / r["steps"] for r in runs if r["depth"] == d)
        assert step_seconds(chain(d), med) == pytest.approx(wall)


def test_a_per_step_cost_favours_deeper_chains():
    """A cost every step pays, the target alone included, is amortised over more tokens by a
    deeper chain: with verification free and a draft level at half a target forward, the
    chooser keeps depth 2 without it and goes deeper with it."""
    stats = AcceptStats.from_alphas({1: 0.8})
    pr = CostProfile([1, 64], [1.0, 1.0], [1, 8], [0.5, 0.5])
    assert choose_tree(pr, stats, max_nodes=16, max_depth=8).tree.paths == chain(2)
    heavy = choose_tree(replace(pr, per_step_seconds=5.0), stats, max_nodes=16, max_depth=8)
    rate = {d: (1 - 0.8 ** (d + 1)) / 0.2 / (1.0 + 0.5 * d + 5.0) for d in range(1, 9)}  # E[tokens] / seconds
    assert max(rate, key=rate.get) == 6
    assert heavy.tree.paths == chain(6) and heavy.target_only_tokens_per_s == pytest.approx(1 / 6.0)
