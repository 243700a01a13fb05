"""khisti_is, spechub and greedy_optimal: closed forms, optimality gaps, sampling vs exact path."""
from __future__ import annotations

import itertools

import numpy as np

import pytest
import torch
from scipy import stats

import multidraft as md
from multidraft.verifiers import khisti_is as KI
from instances import instances


def _greedy_closed_form(p, q, k):
    law = md.drafts.greedy(q, k)
    T = law.top_set()
    qr = law.rest_probs()
    off = torch.ones_like(p, dtype=torch.bool)
    off[T] = False
    return float(p[T].sum() + torch.minimum(p, qr)[off].sum())


def _alpha_k2_iid(p, q):
    """alpha* = min over token sets S of 1 + p(S) - q(S)^2 (Khisti et al.), by brute force."""
    V = p.numel()
    best = 1.0
    for r in range(1, V + 1):
        for S in itertools.combinations(range(V), r):
            idx = list(S)
            best = min(best, 1 + float(p[idx].sum()) - float(q[idx].sum()) ** 2)
    return best


def _random(V, seed, alpha=1.0):
    g = torch.Generator().manual_seed(seed)
    e = (-torch.rand(V, generator=g, dtype=torch.float64).clamp_min(1e-300).log()) ** (1 / alpha)
    return e / e.sum()


def test_greedy_optimal_matches_closed_form():
    n = 0
    for label, p, q in instances(60, 21):
        for k in (1, 2, 3):
            if int((q > 0).sum()) < k:
                continue
            cert = md.certify("greedy_optimal", p, md.drafts.greedy(q, k))
            assert cert.max_abs_error <= 1e-12, label
            assert cert.acceptance == pytest.approx(_greedy_closed_form(p, q, k), abs=1e-12), (label, k)
            n += 1
    assert n > 100


def test_spechub_at_most_greedy_optimal():
    n = 0
    for label, p, q in instances(60, 22):
        if int((q > 0).sum()) < 2:
            continue
        law = md.drafts.greedy(q, 2)
        hub = md.certify("spechub", p, law)
        opt = md.certify("greedy_optimal", p, law)
        assert hub.max_abs_error <= 1e-12, label
        assert hub.acceptance <= opt.acceptance + 1e-12, label
        n += 1
    assert n > 40


def test_khisti_k2_reaches_optimum_with_full_lp():
    v = KI.KhistiIS(s=6)
    gaps = []
    for label, p, q in instances(40, 23):
        cert = md.certify(v, p, md.drafts.iid(q, 2))
        a = _alpha_k2_iid(p, q)
        assert cert.max_abs_error <= 1e-12, label
        assert cert.acceptance <= a + 1e-9, label
        gaps.append(a - cert.acceptance)
    # the full LP on all tokens is the optimal selection (LP tolerance only)
    assert max(gaps) <= 1e-6, max(gaps)


@pytest.mark.parametrize("s", [1, 2, 3])
@pytest.mark.parametrize("k", [2, 3])
def test_khisti_truncated_lp_is_exact_and_below_optimum(s, k):
    v = KI.KhistiIS(s=s)
    for label, p, q in instances(12, 30 + s + 10 * k):
        qs = torch.stack([q if j % 2 == 0 else _random(q.numel(), 7 + j, 0.5) for j in range(k)])
        for law in (md.drafts.iid(q, k), md.drafts.independent(qs)):
            cert = md.certify(v, p, law)
            assert cert.max_abs_error <= 1e-12, (label, s, k)
            if k == 2 and law.kind == "iid":
                assert cert.acceptance <= _alpha_k2_iid(p, q) + 1e-9, label


def test_khisti_truncation_costs_little_and_beats_single_draft():
    # peaked, realistic pairs: q a tempered perturbation of p
    g = torch.Generator().manual_seed(5)
    for i in range(10):
        logits = torch.randn(6, generator=g, dtype=torch.float64) * 2
        p = torch.softmax(logits, -1)
        q = torch.softmax((logits + 0.5 * torch.randn(6, generator=g, dtype=torch.float64)) / 1.2, -1)
        full = md.certify(KI.KhistiIS(s=6), p, md.drafts.iid(q, 2)).acceptance
        trunc = md.certify(KI.KhistiIS(s=3), p, md.drafts.iid(q, 2)).acceptance
        single = 1 - 0.5 * float((p - q).abs().sum())
        assert trunc <= full + 1e-9
        assert full >= single - 1e-9


def test_khisti_topk_path_with_ties(monkeypatch):
    # force the topk + tie-repair branch on a small vocabulary, with tied scores
    monkeypatch.setattr(KI, "SORT_V", 2)
    p = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.1, 0.1], dtype=torch.float64)
    q = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.3, 0.3], dtype=torch.float64)
    for s in (1, 2, 3, 5):
        for k in (2, 3):
            cert = md.certify(KI.KhistiIS(s=s), p, md.drafts.iid(q, k))
            assert cert.max_abs_error <= 1e-12, (s, k)


def _chi2(counts, probs, n):
    exp = probs * n
    big = exp >= 5
    o = torch.cat([counts[big].double(), counts[~big].double().sum().reshape(1)])
    e = torch.cat([exp[big], exp[~big].sum().reshape(1)])
    assert float(o[e <= 0].sum()) == 0, "sampled a token of exact probability 0"
    o, e = o[e > 0], e[e > 0]
    chi2 = float(((o - e) ** 2 / e).sum())
    return chi2 <= stats.chi2.ppf(1 - 1e-6, max(o.numel() - 1, 1)), chi2


def _sampling_vs_exact(name, law_fn, k, n, seed, **kw):
    v = KI.KhistiIS(**kw) if name == "khisti_is" else md.verifiers.get(name)
    g = torch.Generator().manual_seed(seed)
    V = 8
    p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, -1)
    q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, -1)
    law = law_fn(q, k)
    tuples, probs = law.enumerate()
    for t in tuples[probs.argsort(descending=True)[:2]]:
        out = v.output_distribution(p, law.q, t, law=law)
        verdict = v.verify(p.expand(n, V), law.q.expand(n, *law.q.shape), t.expand(n, k), generator=g, law=law)
        ok, chi2 = _chi2(torch.bincount(verdict.token, minlength=V), out, n)
        assert ok, f"{name} K={k} tuple {t.tolist()}: chi2 {chi2:.1f}"


CASES = [
    ("khisti_is", md.drafts.iid, 2, {"s": 3}),
    ("khisti_is", md.drafts.iid, 3, {"s": 2}),
    ("khisti_is", md.drafts.iid, 2, {"s": 8}),
    ("khisti_is", md.drafts.iid, 3, {"s": 4, "mass": 0.5}),
    ("khisti_is", md.drafts.iid, 3, {"s": 2, "off": "rank"}),
    ("spechub", md.drafts.greedy, 2, {}),
    ("greedy_optimal", md.drafts.greedy, 3, {}),
]


@pytest.mark.parametrize("name,law_fn,k,kw", CASES, ids=[f"{c[0]}-K{c[2]}-{c[3]}" for c in CASES])
def test_sampling_path_matches_exact_path(name, law_fn, k, kw):
    _sampling_vs_exact(name, law_fn, k, 10_000, 3 + k, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("name,law_fn,k,kw", CASES, ids=[f"{c[0]}-K{c[2]}-{c[3]}" for c in CASES])
def test_sampling_path_matches_exact_path_large(name, law_fn, k, kw):
    _sampling_vs_exact(name, law_fn, k, 200_000, 99 + k, **kw)


def test_khisti_batched_rows_differ():
    # a batch of different (p, q) rows in one call: each row's output law is exact
    g = torch.Generator().manual_seed(4)
    B, V, K = 5, 7, 3
    p = torch.softmax(torch.randn(B, V, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(B, V, generator=g, dtype=torch.float64) * 2, -1)
    v = KI.KhistiIS(s=3)
    d = md.drafts.iid(q, K).sample(g)
    out = v.output_distribution(p, q, d)
    assert out.shape == (B, V)
    assert torch.allclose(out.sum(-1), torch.ones(B, dtype=torch.float64), atol=1e-12)
    for b in range(B):
        assert torch.allclose(out[b], v.output_distribution(p[b], q[b], d[b]), atol=1e-12)
    tok = v.verify(p, q, d, generator=g).token
    assert tok.shape == (B,)


def test_bad_input_names_the_argument():
    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    with pytest.raises(ValueError, match="law"):
        md.verifiers.get("spechub").verify(p, q, torch.tensor([0, 1, 2]), generator=0, law="greedy")  # K = 3
    with pytest.raises(ValueError, match="law"):
        md.verifiers.get("spechub").verify(p, q, torch.tensor([0, 1]), generator=0, law="iid")
    with pytest.raises(ValueError, match="law"):
        md.verifiers.get("greedy_optimal").output_distribution(p, q, torch.tensor([0, 1]), law="wor")
    with pytest.raises(ValueError, match="law"):
        md.verifiers.get("khisti_is").verify(p, q, torch.tensor([0, 1]), generator=0, law="greedy")
    with pytest.raises(ValueError, match="drafts"):
        md.verifiers.get("greedy_optimal").verify(p, q, torch.tensor([0, 0]), generator=0, law="greedy")
    with pytest.raises(ValueError, match="s "):
        KI.KhistiIS(s=0)
    with pytest.raises(ValueError, match="mass"):
        KI.KhistiIS(mass=0.0)
    with pytest.raises(ValueError, match="off"):
        KI.KhistiIS(off="max")
    with pytest.raises(ValueError, match="solver"):
        KI.KhistiIS(solver="simplex")
    assert not md.verifiers.get("spechub").supports("greedy", 3)
    assert md.verifiers.get("khisti_is").supports("independent", 4)


# --- issue 12 item 9: off-S rule, LP tie-break, S by mass --------------------------------


def _step_acceptance(v, p, q, K):
    """sum_y min(p(y), q_I(y)): the accept step's exact acceptance (no tuple sampling)."""
    plan = v._plan(p[None], q[None], K)
    qi = v._q_inf_full(q[None], plan, torch.arange(1), K)[0]
    assert abs(float(qi.sum()) - 1) <= 1e-12
    return float(torch.minimum(p, qi).sum())


def _flat(V, seed):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(V, generator=g, dtype=torch.float64) * 0.5
    return torch.softmax(lp, -1), torch.softmax(lp + 0.5 * torch.randn(V, generator=g, dtype=torch.float64), -1)


@pytest.mark.parametrize("k,old_max,new_min", [(2, 0.72, 0.85), (4, 0.55, 0.88)])
def test_khisti_flat_rows_importance_rule_beats_rank_rule(k, old_max, new_min):
    # flat rows: S holds almost no mass, so the off-S rule decides. Measured (V = 2000, seed 0):
    # rank rule 0.690 (K=2) / 0.509 (K=4), importance weights 0.886 / 0.956
    p, q = _flat(2000, 0)
    old = _step_acceptance(KI.KhistiIS(off="rank", solver="lp"), p, q, k)
    new = _step_acceptance(KI.KhistiIS(), p, q, k)
    assert old <= old_max and new >= new_min, (old, new)
    assert new <= float(md.optimal_acceptance(p, md.drafts.iid(q, k))) + 1e-12


def test_khisti_lex_tournament_reaches_alpha_star_without_truncation():
    # s >= V, K = 3: with the lexicographically optimal split at every match the tournament
    # reached alpha* on every instance; HiGHS's vertex (the old code) falls short on some
    # (instance random_26_V6: 6.9e-4 below alpha*)
    worst = {"lex": 0.0, "lp": 0.0}
    for label, p, q in instances(40, 77):
        law = md.drafts.iid(q, 3)
        a = float(md.optimal_acceptance(p, law))
        for solver in worst:
            cert = md.certify(KI.KhistiIS(s=law.V, solver=solver), p, law)
            assert cert.max_abs_error <= 1e-12, label
            worst[solver] = max(worst[solver], a - cert.acceptance)
    assert worst["lex"] <= 1e-9, worst
    assert worst["lp"] >= 1e-4, worst  # the test has power: the old solver misses


def test_khisti_lex_split_is_an_lp_optimum_and_unique():
    g = torch.Generator().manual_seed(12)
    for t in range(60):
        n = 2 + t % 7
        def law(scale):
            x = torch.rand(n, generator=g, dtype=torch.float64) ** 3
            return x / x.sum() * scale
        pS, rS, tS = law(0.9), law(0.8), law(0.7)
        if t % 5 == 0:
            pS[0] = 0.0
        args = (pS[None], rS[None], (1 - rS.sum())[None], tS[None], (1 - tS.sum())[None])
        _, m_lp = KI._solve_stage(*args, solver="lp")
        W, m_lex = KI._solve_stage(*args, solver="lex")
        v_lp = float(torch.minimum(pS, m_lp[0]).sum())
        v_lex = float(torch.minimum(pS, m_lex[0]).sum())
        assert v_lex >= v_lp - 1e-12, (t, v_lp, v_lex)
        # unique in m: the same law on S whatever order the tokens come in
        perm = torch.randperm(n, generator=g)
        _, m_perm = KI._solve_stage(*(x[:, perm] if x.ndim == 2 and x.shape[-1] == n else x for x in args), solver="lex")
        assert torch.allclose(m_perm[0], m_lex[0, perm], atol=1e-12, rtol=0), t


def test_khisti_degenerate_lp_same_law_under_permutation():
    # tied tokens (equal p and q) make the stage LPs degenerate; q_I must be permutation-equivariant
    p = torch.tensor([0.2, 0.2, 0.2, 0.15, 0.15, 0.1], dtype=torch.float64)
    q = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.3, 0.1], dtype=torch.float64)
    v = KI.KhistiIS(s=6)
    base = None
    g = torch.Generator().manual_seed(0)
    for j in range(6):
        perm = torch.randperm(6, generator=g) if j else torch.arange(6)
        for k in (3, 4):
            plan = v._plan(p[perm][None], q[perm][None], k)
            qi = v._q_inf_full(q[perm][None], plan, torch.arange(1), k)[0]
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(6)
            if base is None or k not in base:
                base = (base or {}) | {k: qi[inv]}
            assert torch.allclose(qi[inv], base[k], atol=1e-12, rtol=0), (j, k)
            cert = md.certify(v, p[perm], md.drafts.iid(q[perm], k))
            assert cert.max_abs_error <= 1e-12


@pytest.mark.parametrize("kw", [{"off": "rank"}, {"mass": 0.6, "s": 4}, {"solver": "lp"}])
@pytest.mark.parametrize("k", [2, 3])
def test_khisti_options_are_exact(kw, k):
    v = KI.KhistiIS(**kw)
    for label, p, q in instances(10, 50 + k):
        qs = torch.stack([q if j % 2 == 0 else _random(q.numel(), 3 + j, 0.5) for j in range(k)])
        for law in (md.drafts.iid(q, k), md.drafts.independent(qs)):
            cert = md.certify(v, p, law)
            assert cert.max_abs_error <= 1e-12, (label, kw, k)


def test_khisti_mass_prefix():
    # S = the shortest score prefix with p(S) >= mass, capped at s
    p = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05], dtype=torch.float64)
    q = torch.full((5,), 0.2, dtype=torch.float64)
    for mass, n in ((0.5, 1), (0.6, 2), (0.85, 3), (1.0, 4)):
        plan = KI.KhistiIS(s=4, mass=mass)._plan(p[None], q[None], 2)
        assert int(plan.active.sum()) == n, (mass, plan.active)


def test_khisti_single_row_plan_equals_the_batched_plan_and_top_set_has_no_sort():
    """The decoder's one-row calls skip the distinct-row search of the LP stages and read the
    cached ratio matrix: the plan of a row alone equals its plan inside a batch (bit for bit),
    the matrix is the one the formula gives and stays unmodified, and the LP token set at large
    V (bf16-rounded scores, ties at the boundary) is the first s of the stable sort."""
    g = torch.Generator().manual_seed(17)
    V, K = 6000, 4  # above SORT_V: the topk route
    for trial in range(4):
        logits = (torch.randn(V, generator=g) * 3).bfloat16().float()
        p = torch.softmax(logits, -1).double()
        q = torch.softmax((logits + torch.randn(V, generator=g)) / 1.2, -1).double()
        v = KI.KhistiIS()
        one = v._plan(p.unsqueeze(0), q.unsqueeze(0), K)
        other = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
        both = v._plan(torch.stack([other, p, p]), torch.stack([other, q, q]), K)
        assert torch.equal(one.S[0], both.S[1]) and torch.equal(one.mS[0], both.mS[1])
        for W1, W3 in zip(one.Ws, both.Ws):
            assert torch.equal(W1[0], W3[1])
        score = p - q * q
        ref = torch.sort(score, dim=-1, descending=True, stable=True).indices[:10]
        assert torch.equal(KI._top_set(score.unsqueeze(0), 10)[0], ref)
    c = torch.arange(KI._R_C, dtype=torch.float64)
    W = KI._ratio_matrix("cpu")
    assert W is KI._ratio_matrix(torch.device("cpu"))
    assert torch.equal(W, torch.sigmoid((c.unsqueeze(-1) - c) * (np.log(2.0) / KI._R_PER)))


def test_khisti_lex_decomposition_matches_bvls_and_is_never_worse():
    # the decomposition route of the lex split (_lex_decomp_row) against BVLS on random
    # stages with peaked and tiny masses: its realised law is feasible (a split of the pairs),
    # its objective sum m^2 / w is never above BVLS's, and the two laws agree to 1e-9
    import numpy as np

    rng = np.random.default_rng(3)
    n = 10
    a, b = np.triu_indices(n, 1)
    for t in range(60):
        conc = rng.choice([0.1, 1.0, 5.0], 3)
        p = rng.dirichlet(np.ones(n) * conc[0]) * rng.uniform(0.05, 1)
        r = rng.dirichlet(np.ones(n) * conc[1]) * rng.uniform(0.05, 1)
        tt = rng.dirichlet(np.ones(n) * conc[2]) * rng.uniform(0.05, 1)
        fixed = r * tt + r * (1 - tt.sum()) + (1 - r.sum()) * tt
        M = r[a] * tt[b] + r[b] * tt[a]
        f, ok = KI._lex_decomp_row(p, M, fixed, a, b)
        assert ok, t
        assert (f >= 0).all() and (f <= M).all()
        m = fixed + np.bincount(a, f, n) + np.bincount(b, M - f, n)
        d = 1.0 / np.sqrt(np.maximum(p, KI._P_FLOOR))
        from scipy.optimize import lsq_linear

        E = np.zeros((n, a.size))
        E[a, np.arange(a.size)] = 1.0
        E[b, np.arange(a.size)] -= 1.0
        base = fixed + np.bincount(b, M, n)
        res = lsq_linear(d[:, None] * E, -d * base, bounds=(0.0, M), method="bvls", tol=1e-15)
        f0 = np.clip(res.x, 0.0, M)
        m0 = fixed + np.bincount(a, f0, n) + np.bincount(b, M - f0, n)
        w = np.maximum(p, KI._P_FLOOR)
        assert (m * m / w).sum() <= (m0 * m0 / w).sum() * (1 + 1e-12), t
        # equal laws, or BVLS stopped short of the optimum (its tolerance; seen on tiny masses)
        assert np.abs(m - m0).max() <= 1e-9 or (m * m / w).sum() < (m0 * m0 / w).sum(), t
