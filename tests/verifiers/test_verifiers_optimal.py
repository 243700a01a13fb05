"""The ``optimal`` verifier (iid drafts): exact output law, acceptance = alpha*, at any V.

Certificates enumerate every draft tuple (small V); the fit diagnostics are checked at
larger V against the closed forms (q_sel overlap = alpha*, layer masses); the sampling path
is checked against the exact path by chi-square.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from scipy import stats

import multidraft as md
from instances import _dirichlet, instances
from multidraft.limits import lp_optimal_acceptance
from multidraft.verifiers.optimal import Optimal

ATOL = 1e-12


def _extra_rows(seed: int):
    """Peaked, flat and near-tie rows on top of tests/instances.py."""
    g = torch.Generator().manual_seed(seed)
    for V in (3, 5, 7):
        p = _dirichlet(V, g, 0.15)
        q = _dirichlet(V, g, 0.15)
        yield f"peaked_V{V}", p, q
        u = torch.full((V,), 1.0 / V, dtype=torch.float64)
        yield f"flat_p_V{V}", u, _dirichlet(V, g, 3.0)
        yield f"flat_both_V{V}", u, u.clone()
        q = p * (1 + 1e-9 * torch.randn(V, generator=g, dtype=torch.float64)).abs()
        yield f"near_tie_V{V}", p, q / q.sum()
        w = torch.ones(V, dtype=torch.float64)
        w[0] = 1 + 1e-12
        yield f"ratio_ties_V{V}", w / w.sum(), _dirichlet(V, g)


def _cases(n, seed, max_v):
    yield from instances(n, seed, max_v=max_v)
    yield from _extra_rows(seed)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_certificate_exact_and_optimal(k):
    v = md.verifiers.get("optimal")
    max_v = 7 if k <= 3 else 5
    worst, checked = 0.0, 0
    for label, p, q in _cases(50 if k <= 3 else 30, 300 + k, max_v):
        law = md.drafts.iid(q, k)
        cert = md.certify(v, p, law)
        a = md.optimal_acceptance(p, law)
        assert cert.max_abs_error <= ATOL, f"K={k} {label}: output law off by {cert.max_abs_error:.3g}"
        assert abs(cert.acceptance - a) <= 1e-9, f"K={k} {label}: acceptance {cert.acceptance} vs alpha* {a}"
        worst = max(worst, cert.max_abs_error)
        checked += 1
    assert checked >= 30


@pytest.mark.parametrize("k", [2, 3, 4])
def test_acceptance_equals_coupling_lp(k):
    v = md.verifiers.get("optimal")
    n_lp = 0
    for label, p, q in _cases(14, 700 + k, 5 if k <= 3 else 4):
        law = md.drafts.iid(q, k)
        lp = lp_optimal_acceptance(p, law)
        cert = md.certify(v, p, law)
        assert abs(cert.acceptance - lp) <= 1e-9, f"K={k} {label}: acceptance {cert.acceptance} vs LP {lp}"
        n_lp += 1
    assert n_lp >= 14


def test_k1_is_single_draft_sd():
    v, naive = md.verifiers.get("optimal"), md.verifiers.get("naive")
    for label, p, q in instances(30, 11):
        d = torch.nonzero(q > 0).reshape(-1, 1)
        P, Q = p.expand(d.shape[0], -1), q.expand(d.shape[0], -1)
        a = v.output_distribution(P, Q, d)
        b = naive.output_distribution(P, Q, d)
        assert torch.allclose(a, b, atol=1e-14, rtol=0), label


def test_fit_closed_forms_at_larger_v():
    g = torch.Generator().manual_seed(5)
    B, V = 6, 3000
    logits = torch.randn(B, V, generator=g, dtype=torch.float64) * 2
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + 0.7 * torch.randn(B, V, generator=g, dtype=torch.float64), -1)
    for k in (2, 4, 8):
        fit = Optimal().fit(p, q, k)
        a = md.optimal_acceptance(p, md.drafts.iid(q, k))
        assert torch.allclose(fit.alpha_star, a, atol=1e-12, rtol=0)
        # q_sel is a distribution whose overlap with p is alpha*
        assert torch.allclose(fit.q_sel.sum(-1), torch.ones(B, dtype=torch.float64), atol=1e-12)
        assert bool((fit.q_sel >= -1e-15).all())
        assert torch.allclose(torch.minimum(p, fit.q_sel).sum(-1), a, atol=1e-12, rtol=0)
        # the fitted rule: r is a distribution, reaches q_sel and alpha*
        assert torch.allclose(fit.r.sum(-1), torch.ones(B, dtype=torch.float64), atol=1e-12)
        assert float(fit.fit_error_max.max()) <= 1e-9
        assert float(fit.shortfall.abs().max()) <= 1e-9
        assert bool((fit.n_layers >= 1).all()) and fit.iterations <= 500


def test_rule_of_a_row_does_not_depend_on_the_batch():
    g = torch.Generator().manual_seed(9)
    V = 500
    p = torch.softmax(torch.randn(5, V, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(5, V, generator=g, dtype=torch.float64) * 2, -1)
    v = Optimal()
    full = v.fit(p, q, 3).r
    for i in range(5):
        alone = v.fit(p[i], q[i], 3).r
        assert torch.equal(full[i], alone)


def test_stopped_fit_is_still_exact_and_reported():
    v = Optimal(max_iter=0)
    seen_short = False
    for label, p, q in instances(25, 21, max_v=6):
        law = md.drafts.iid(q, 3)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            cert = md.certify(v, p, law)
        a = md.optimal_acceptance(p, law)
        assert cert.max_abs_error <= ATOL, label
        assert cert.acceptance <= a + 1e-12
        if a - cert.acceptance > 1e-6:
            seen_short = True
            assert any("below alpha*" in str(x.message) for x in w)
            assert float(v.last_fit.shortfall.max()) > 1e-6
    assert seen_short


def test_per_draft_q_and_bad_input():
    v = md.verifiers.get("optimal")
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    d = torch.tensor([0, 2])
    a = v.output_distribution(p, q, d)
    b = v.output_distribution(p, q.expand(2, 3), d)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="draft_probs"):
        v.output_distribution(p, torch.stack([q, p]), d)
    with pytest.raises(ValueError, match="iid"):
        v.output_distribution(p, q, d, law="wor")
    with pytest.raises(ValueError, match="levels"):
        Optimal(levels=0)
    with pytest.raises(ValueError, match="max_iter"):
        Optimal(max_iter=-1)
    with pytest.raises(ValueError, match="target_probs"):
        v.fit(torch.tensor([0.5, float("nan"), 0.5]), q, 2)
    with pytest.raises(ValueError, match="k"):
        v.fit(p, q, 0)
    assert v.supports("iid") and not v.supports("wor") and not v.supports("independent")


def _chi2_check(p, q, k, n, seed):
    v = md.verifiers.get("optimal")
    g = torch.Generator().manual_seed(seed)
    P = p.expand(n, -1)
    Q = q.expand(n, -1)
    drafts = md.drafts.iid(Q, k).sample(g)
    out = v.verify(P, Q, drafts, generator=g)
    exact = v.output_distribution(P, Q, drafts)
    # marginal over drafts and rule: expected counts are the sum of the exact conditional laws
    exp = exact.sum(0)
    obs = torch.bincount(out.token, minlength=p.numel()).double()
    keep = exp > 5
    chi = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    acc_obs = float((out.accepted_index >= 0).double().mean())
    return stats.chi2.sf(chi, max(dof, 1)), acc_obs, exp / n


def test_sampling_path_matches_exact_path():
    g = torch.Generator().manual_seed(3)
    for k in (1, 2, 4):
        p = _dirichlet(6, g, 0.7)
        q = _dirichlet(6, g, 0.7)
        pval, acc, law = _chi2_check(p, q, k, 20000, 40 + k)
        assert pval > 1e-4, f"K={k}: chi-square p-value {pval}"
        assert torch.allclose(law, p, atol=0.02)


@pytest.mark.slow
def test_sampling_path_matches_exact_path_many():
    g = torch.Generator().manual_seed(4)
    for k in (2, 3, 5, 8):
        p = _dirichlet(40, g, 0.5)
        q = _dirichlet(40, g, 0.5)
        pval, acc, _ = _chi2_check(p, q, k, 40000, 90 + k)
        assert pval > 1e-4, f"K={k}: chi-square p-value {pval}"
        a = md.optimal_acceptance(p, md.drafts.iid(q, k))
        assert abs(acc - a) <= 5 * (a * (1 - a) / 40000) ** 0.5 + 1e-9


def test_rows_repeated_along_the_first_dim_are_fitted_once_with_identical_results():
    """The experiments pass [draws, positions, V] expanded views: the plan is fitted on the
    distinct rows and tiled; exact laws and sampled tokens equal those of the materialised input."""
    g = torch.Generator().manual_seed(1)
    n, V, c, K = 6, 40, 5, 3
    P = torch.softmax(torch.randn(n, V, generator=g, dtype=torch.float64) * 2, -1)
    Q = torch.softmax(torch.log(P) + torch.randn(n, V, generator=g, dtype=torch.float64), -1)
    x = md.drafts.iid(Q, K).sample(g, num_samples=c)  # [c, n, K]
    v = md.verifiers.get("optimal")
    Pc, Qc = P.unsqueeze(0).expand(c, n, V), Q.unsqueeze(0).expand(c, n, V)
    a = v.output_distribution(Pc, Qc, x, law="iid")
    assert v.last_fit.alpha_star.shape == (n,)  # fitted once per distinct row
    b = v.output_distribution(Pc.contiguous(), Qc.contiguous(), x, law="iid")
    assert v.last_fit.alpha_star.shape == (c, n)
    assert torch.equal(a, b)
    ta = v.verify(Pc, Qc, x, torch.Generator().manual_seed(5), law="iid").token
    tb = v.verify(Pc.contiguous(), Qc.contiguous(), x, torch.Generator().manual_seed(5), law="iid").token
    assert torch.equal(ta, tb)
    # one row repeated as a 2-D view [c, V] (a batch of draws at one position): fitted once too
    P1, Q1 = P[0].expand(c, V), Q[0].expand(c, V)
    x1 = md.drafts.iid(Q[0], K).sample(g, num_samples=c)  # [c, K]
    a = v.output_distribution(P1, Q1, x1, law="iid")
    assert v.last_fit.alpha_star.shape == ()
    assert torch.equal(a, v.output_distribution(P1.contiguous(), Q1.contiguous(), x1, law="iid"))
    ta = v.verify(P1, Q1, x1, torch.Generator().manual_seed(5), law="iid").token
    tb = v.verify(P1.contiguous(), Q1.contiguous(), x1, torch.Generator().manual_seed(5), law="iid").token
    assert torch.equal(ta, tb)


def test_k1_shortcut_draws_the_plan_paths_tokens_and_keeps_the_fit():
    """K = 1 verifies without building the plan: for the same generator it returns exactly the
    tokens of the plan path (rejections included; float32 and float64 inputs; batched and
    expanded rows), and ``last_fit`` (computed when read) equals the plan's fit."""
    g = torch.Generator().manual_seed(21)
    v = Optimal()
    for trial in range(12):
        n, V = 1 + trial % 4, (5, 37, 300, 4096)[trial % 4]
        P = torch.softmax(torch.randn(n, V, generator=g, dtype=torch.float64) * 3, -1)
        Q = torch.softmax(torch.log(P) + 1.5 * torch.randn(n, V, generator=g, dtype=torch.float64), -1)
        if trial % 3 == 1:
            P, Q = P.float(), Q.float()
        if trial % 3 == 2:  # the experiments' expanded [draws, positions, V] views
            P, Q = P.unsqueeze(0).expand(3, n, V), Q.unsqueeze(0).expand(3, n, V)
        x = md.drafts.iid(Q, 1).sample(g)
        for seed in range(6):
            a = v._verify_single(P, Q, x, torch.Generator().manual_seed(seed))
            b = v._verify_plan(P, Q, x, torch.Generator().manual_seed(seed))
            assert torch.equal(a, b), (trial, seed)
        ref = v.last_fit  # from the plan path
        tok = v.verify(P, Q, x, torch.Generator().manual_seed(0), law="iid").token
        assert v._last_fit is None  # not fitted by the K = 1 call ...
        fit = v.last_fit  # ... until read
        assert fit is not ref and fit.alpha_star.shape == ref.alpha_star.shape
        assert torch.equal(fit.alpha_star, ref.alpha_star) and torch.equal(fit.r, ref.r)
        assert torch.equal(tok, v._verify_plan(P, Q, x, torch.Generator().manual_seed(0)))
