"""The contract every registered verifier must meet, checked exactly.

For every verifier, every draft law it supports and K = 1..4: on the corner cases and
random (p, q) with V <= 6, enumerate every draft tuple; the mixed output law equals p to
1e-12, the exact acceptance never exceeds the optimal acceptance alpha*, and the sampling
path (batched ``verify``) matches the exact path (``output_distribution``).
"""
from __future__ import annotations

import pytest
import torch
from scipy import stats

import multidraft as md
from instances import instances, make_law

KINDS = ("iid", "wor", "greedy", "independent")
ATOL = 1e-12


def _cases():
    for name in md.verifiers.names():
        v = md.verifiers.get(name)
        for kind in KINDS:
            for k in range(1, 5):
                if v.supports(kind, k):
                    yield pytest.param(name, kind, k, id=f"{name}-{kind}-K{k}")


CASES = list(_cases())


def _alpha_star(p, law):
    if not hasattr(md, "optimal_acceptance"):
        return None
    return float(md.optimal_acceptance(p, law))


def _run(name, kind, k, n, seed):
    v = md.verifiers.get(name)
    if name == "lp_optimal":
        n = min(n, 12)  # one LP per instance; the limits tests cover more
    if name == "khisti_is" and k >= 3:
        n = min(n, 100)  # a tournament of LPs per tuple batch; bounded for CI
    checked = 0
    for label, p, q in instances(n, seed):
        if kind in ("wor", "greedy") and int((q > 0).sum()) < k:
            continue
        law = make_law(kind, q, k, seed)
        if k > 1 and law.V ** k > 1296 * 6:
            continue
        cert = md.certify(v, p, law)
        assert cert.max_abs_error <= ATOL, f"{name}/{kind}/K={k} on {label}: output law off by {cert.max_abs_error:.3g}"
        assert -ATOL <= cert.acceptance <= 1 + ATOL
        a = _alpha_star(p, law)
        if a is not None:
            assert cert.acceptance <= a + 1e-9, f"{name}/{kind}/K={k} on {label}: acceptance {cert.acceptance} > alpha* {a}"
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("name,kind,k", CASES)
def test_exact_certificate(name, kind, k):
    _run(name, kind, k, n=40, seed=1000 + k)


@pytest.mark.slow
@pytest.mark.parametrize("name,kind,k", CASES)
def test_exact_certificate_many(name, kind, k):
    _run(name, kind, k, n=300, seed=5000 + k)


def test_registry_covers_the_design():
    expected = {"naive", "nss", "specinfer", "rrs_wor", "spectr", "spechub", "khisti_is", "greedy_optimal", "lp_optimal", "optimal"}
    assert set(md.verifiers.names()) == expected
    assert md.verifiers.names()[0] == "naive" and md.verifiers.names()[-1] == "optimal"
    assert hasattr(md, "optimal_acceptance")  # so the harness checks acceptance <= alpha*


def test_naive_acceptance_is_one_minus_tv():
    for label, p, q in instances(60, 11):
        cert = md.certify("naive", p, md.drafts.iid(q, 1))
        tv = 0.5 * float((p - q).abs().sum())
        assert cert.acceptance == pytest.approx(1 - tv, abs=1e-12), label


def _chi2_ok(counts, probs, n, alpha=1e-6):
    """Chi-square goodness of fit; cells with tiny expectation are pooled."""
    exp = probs * n
    big = exp >= 5
    obs_small = float(counts[~big].sum())
    exp_small = float(exp[~big].sum())
    o = torch.cat([counts[big].double(), torch.tensor([obs_small], dtype=torch.float64)])
    e = torch.cat([exp[big], torch.tensor([exp_small], dtype=torch.float64)])
    keep = e > 0
    assert float(o[~keep].sum()) == 0, "a token with zero exact probability was sampled"
    o, e = o[keep], e[keep]
    df = max(int(keep.sum()) - 1, 1)
    chi2 = float(((o - e) ** 2 / e).sum())
    return chi2 <= stats.chi2.ppf(1 - alpha, df), chi2


def _sampling_check(name, kind, k, n, seed):
    v = md.verifiers.get(name)
    if name == "khisti_is" and k >= 3:
        n = min(n, 150_000)  # bounded for CI; still ~4x the fast test's draws
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64) * 1.5, -1)
    q = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64) * 1.5, -1)
    law = make_law(kind, q, k, seed)
    tuples, probs = law.enumerate()
    # (a) conditional on one fixed tuple: samples follow output_distribution(tuple)
    t = tuples[int(probs.argmax())]
    P = p.expand(n, 6)
    Q = law.q.expand(n, *law.q.shape)
    T = t.expand(n, k)
    out = v.output_distribution(p, law.q, t, law=law)
    verdict = v.verify(P, Q, T, generator=g, law=law)
    counts = torch.bincount(verdict.token, minlength=6)
    ok, chi2 = _chi2_ok(counts, out, n)
    assert ok, f"{name}/{kind}/K={k}: verify disagrees with output_distribution (chi2 {chi2:.1f})"
    # accepted_index is the first draft equal to the output token, or -1
    hit = (T == verdict.token.unsqueeze(-1))
    assert bool(((verdict.accepted_index >= 0) == hit.any(-1)).all())
    # (b) drafts drawn from the law: the output follows p
    lawB = make_law(kind, q.expand(n, 6).contiguous(), k, seed) if kind != "independent" else md.drafts.independent(law.q.expand(n, k, 6).contiguous())
    drafts = lawB.sample(g)
    verdict = v.verify(P, lawB.q, drafts, generator=g, law=lawB)
    counts = torch.bincount(verdict.token, minlength=6)
    ok, chi2 = _chi2_ok(counts, p, n)
    assert ok, f"{name}/{kind}/K={k}: output of verify is not distributed as p (chi2 {chi2:.1f})"
    cert = md.certify(v, p, law)
    acc = float((verdict.accepted_index >= 0).double().mean())
    se = (cert.acceptance * (1 - cert.acceptance) / n) ** 0.5
    assert abs(acc - cert.acceptance) <= 5 * se + 1e-9, f"{name}: sampled acceptance {acc} vs exact {cert.acceptance}"


SAMPLING_CASES = [c for c in CASES if c.values[2] in (1, 2, 3)]


@pytest.mark.parametrize("name,kind,k", SAMPLING_CASES)
def test_sampling_path_matches_exact_path(name, kind, k):
    _sampling_check(name, kind, k, n=20_000, seed=77 + k)


@pytest.mark.slow
@pytest.mark.parametrize("name,kind,k", CASES)
def test_sampling_path_matches_exact_path_large(name, kind, k):
    _sampling_check(name, kind, k, n=400_000, seed=991 + k)
