"""The ceiling: optimal_acceptance against the LPs, closed forms, monotonicity, bad input."""
from __future__ import annotations

import itertools

import pytest
import torch

import multidraft as md
from multidraft import drafts as D
from multidraft.limits import (
    dual_objective,
    is_lp_optimal_acceptance,
    k2_optimal_acceptance,
    lp_optimal_acceptance,
    optimal_acceptance,
    unit_acceptance_possible,
)

from instances import instances, make_law

KINDS = ("iid", "wor", "greedy", "independent")


def brute_min(p, law):
    """1 + min over all 2^V sets H of p(H) - Q(all in H), by enumeration."""
    tuples, probs = law.enumerate()
    V = p.shape[-1]
    best = 0.0
    for bits in itertools.product([False, True], repeat=V):
        H = torch.tensor(bits)
        best = min(best, float(p[H].sum() - probs[H[tuples].all(-1)].sum()))
    return 1.0 + best


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_dual_equals_lp(kind, K):
    n = 0
    for label, p, q in instances(60 if K <= 2 else 30, 100 + 7 * K + len(kind), max_v=7 if K <= 2 else 5):
        law = make_law(kind, q, K, seed=K)
        if law is None:
            continue
        a, H = optimal_acceptance(p, law, return_set=True)
        assert isinstance(a, float)
        lp = lp_optimal_acceptance(p, law)
        assert a == pytest.approx(lp, abs=1e-9), (label, a, lp)
        # the set is a certificate: its dual value is alpha*
        assert 1.0 + float(dual_objective(p, law, H)) == pytest.approx(a, abs=1e-12), label
        n += 1
    assert n >= 15


@pytest.mark.parametrize("kind", KINDS)
def test_importance_sampling_lp_equals_coupling_lp(kind):
    for label, p, q in instances(15, 7, max_v=5):
        for K in (2, 3):
            law = make_law(kind, q, K, seed=1)
            if law is None:
                continue
            assert is_lp_optimal_acceptance(p, law) == pytest.approx(lp_optimal_acceptance(p, law), abs=1e-8), label


def test_k1_is_one_minus_tv_and_p_eq_q_is_one():
    for label, p, q in instances(40, 3):
        tv = 0.5 * float((p - q).abs().sum())
        for kind in KINDS:
            law = make_law(kind, q, 1)
            assert optimal_acceptance(p, law) == pytest.approx(1 - tv, abs=1e-12), (kind, label)
        for kind in ("iid", "wor", "greedy"):
            for K in (2, 3):
                law = make_law(kind, p, K)
                if law is not None:
                    assert optimal_acceptance(p, law) == pytest.approx(1.0, abs=1e-12), (kind, label)


def test_monotone_in_k_and_wor_beats_iid():
    g = torch.Generator().manual_seed(11)
    for _ in range(60):
        V = int(torch.randint(3, 40, (1,), generator=g))
        p = torch.rand(V, generator=g, dtype=torch.float64) ** 3
        q = torch.rand(V, generator=g, dtype=torch.float64) ** 3
        p, q = p / p.sum(), q / q.sum()
        prev = {k: 0.0 for k in KINDS}
        for K in range(1, min(V, 6) + 1):
            a_iid = optimal_acceptance(p, D.iid(q, K))
            a_wor = optimal_acceptance(p, D.without_replacement(q, K))
            a_gr = optimal_acceptance(p, D.greedy(q, K))
            assert a_wor >= a_iid - 1e-12
            for kind, a in (("iid", a_iid), ("wor", a_wor), ("greedy", a_gr)):
                assert a >= prev[kind] - 1e-12, (kind, K)
                prev[kind] = a


def test_sorted_prefix_exact_for_wor_vs_brute_force():
    g = torch.Generator().manual_seed(5)
    for _ in range(80):
        V = int(torch.randint(3, 8, (1,), generator=g))
        K = int(torch.randint(2, min(V, 4) + 1, (1,), generator=g))
        q = torch.rand(V, generator=g, dtype=torch.float64) ** 4
        p = torch.rand(V, generator=g, dtype=torch.float64) ** 4
        law = D.without_replacement(q / q.sum(), K)
        p = p / p.sum()
        assert optimal_acceptance(p, law) == pytest.approx(brute_min(p, law), abs=1e-12)


def test_independent_prefix_rule_fails_but_exact_minimum_is_found():
    # a counterexample to the sorted-prefix rule (any single order by mean q / p)
    p = torch.tensor([8.6209e-01, 8.4360e-02, 5.2882e-02, 6.6836e-04], dtype=torch.float64)
    qs = torch.tensor([[8.3338e-01, 8.9073e-03, 1.5709e-01, 6.1816e-04],
                       [1.3353e-01, 2.1703e-02, 5.0381e-02, 7.9438e-01],
                       [1.0171e-01, 4.5492e-01, 4.2521e-02, 4.0085e-01]], dtype=torch.float64)
    p, qs = p / p.sum(), qs / qs.sum(-1, keepdim=True)
    law = D.independent(qs)
    exact = brute_min(p, law)
    order = md.limits.prefix_order(p, qs.mean(0))
    tuples, probs = law.enumerate()
    prefix_best = 1.0 + min(
        0.0, min(float(dual_objective(p, law, torch.zeros(4, dtype=torch.bool).index_fill(0, order[:n], True))) for n in range(1, 5))
    )
    assert prefix_best > exact + 1e-3
    assert optimal_acceptance(p, law) == pytest.approx(exact, abs=1e-12)
    assert optimal_acceptance(p, law) == pytest.approx(lp_optimal_acceptance(p, law), abs=1e-9)


def test_independent_vs_brute_force_random():
    g = torch.Generator().manual_seed(9)
    for _ in range(150):
        V = int(torch.randint(2, 8, (1,), generator=g))
        K = int(torch.randint(2, 4, (1,), generator=g))
        e = float(torch.rand(1, generator=g)) * 6
        qs = torch.rand(K, V, generator=g, dtype=torch.float64) ** e
        p = torch.rand(V, generator=g, dtype=torch.float64) ** e
        law = D.independent(qs / qs.sum(-1, keepdim=True))
        p = p / p.sum()
        assert optimal_acceptance(p, law) == pytest.approx(brute_min(p, law), abs=1e-12)


def test_k2_closed_form_and_unit_acceptance():
    for label, p, q in instances(40, 21):
        lp = lp_optimal_acceptance(p, D.iid(q, 2))
        assert k2_optimal_acceptance(p, q) == pytest.approx(lp, abs=1e-9), label
        for k in (1, 2, 3):
            assert unit_acceptance_possible(p, q, k) == (lp_optimal_acceptance(p, D.iid(q, k)) >= 1 - 1e-9), (label, k)
    # p uniform on 3 tokens, q = (1/3, x, 2/3 - x): acceptance 1 exactly on an interval of x
    p = torch.full((3,), 1 / 3, dtype=torch.float64)
    ones = []
    for x in torch.linspace(0.01, 0.65, 65, dtype=torch.float64):
        q = torch.tensor([1 / 3, float(x), 2 / 3 - float(x)], dtype=torch.float64)
        a = k2_optimal_acceptance(p, q)
        lp = lp_optimal_acceptance(p, D.iid(q, 2))
        assert a == pytest.approx(lp, abs=1e-9)
        assert unit_acceptance_possible(p, q, 2) == (lp >= 1 - 1e-9)
        ones.append(unit_acceptance_possible(p, q, 2))
    # p(S) >= q(S)^2 for all S holds iff every single q and pair sum passes: x in [1/3 - c, 1/3 + c]
    assert any(ones) and not all(ones)
    idx = [i for i, o in enumerate(ones) if o]
    assert idx == list(range(idx[0], idx[-1] + 1))  # one interval
    assert ones[32]  # x = 1/3 (q == p)


def test_batched_matches_unbatched():
    g = torch.Generator().manual_seed(2)
    B, V, K = 5, 30, 3
    p = torch.rand(B, V, generator=g, dtype=torch.float64) ** 2
    q = torch.rand(B, V, generator=g, dtype=torch.float64) ** 2
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    qs = torch.rand(B, K, V, generator=g, dtype=torch.float64) ** 2
    qs = qs / qs.sum(-1, keepdim=True)
    for law, row in (
        (D.iid(q, K), lambda i: D.iid(q[i], K)),
        (D.without_replacement(q, K), lambda i: D.without_replacement(q[i], K)),
        (D.greedy(q, K), lambda i: D.greedy(q[i], K)),
        (D.independent(qs), lambda i: D.independent(qs[i])),
    ):
        a, H = optimal_acceptance(p, law, return_set=True)
        assert a.shape == (B,) and H.shape == (B, V)
        for i in range(B):
            assert float(a[i]) == pytest.approx(optimal_acceptance(p[i], row(i)), abs=1e-12)
    assert md.optimal_acceptance is optimal_acceptance


def test_bad_input_names_the_argument():
    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    law = D.iid(q, 2)
    with pytest.raises(ValueError, match="p"):
        optimal_acceptance(torch.tensor([0.5, float("nan"), 0.5]), law)
    with pytest.raises(ValueError, match="p"):
        optimal_acceptance(torch.tensor([0.5, 0.6, 0.2], dtype=torch.float64), law)
    with pytest.raises(ValueError, match="V"):
        optimal_acceptance(torch.tensor([0.5, 0.5], dtype=torch.float64), law)
    with pytest.raises(ValueError, match="law"):
        optimal_acceptance(q, "iid")
    with pytest.raises(ValueError, match="batch"):
        optimal_acceptance(torch.full((2, 3), 1 / 3, dtype=torch.float64), D.iid(torch.full((4, 3), 1 / 3, dtype=torch.float64), 2))
    with pytest.raises(ValueError, match="k"):
        D.iid(q, 0)
    with pytest.raises(ValueError, match="k"):
        D.without_replacement(q, 4)  # K > V
    with pytest.raises(ValueError, match="k"):
        unit_acceptance_possible(q, q, 0)
    with pytest.raises(ValueError, match="q"):
        k2_optimal_acceptance(q, torch.tensor([0.5, 0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match="law"):
        lp_optimal_acceptance(q, D.iid(torch.full((2, 3), 1 / 3, dtype=torch.float64), 2))


def test_large_v_runs_and_respects_bounds():
    g = torch.Generator().manual_seed(4)
    V = 2000
    logits = torch.randn(2, V, generator=g, dtype=torch.float64) * 3
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits / 1.3 + 0.5 * torch.randn(2, V, generator=g, dtype=torch.float64), -1)
    for K in (2, 4):
        a_iid = optimal_acceptance(p, D.iid(q, K))
        a_wor = optimal_acceptance(p, D.without_replacement(q, K))
        a_ind = optimal_acceptance(p, D.independent(q.unsqueeze(1).expand(2, K, V)))
        assert torch.all(a_wor >= a_iid - 1e-12)
        assert torch.allclose(a_ind, a_iid, atol=1e-12)  # independent with equal q_j is iid
        assert torch.all(a_iid <= 1) and torch.all(a_iid >= 1 - 0.5 * (p - q).abs().sum(-1) - 1e-12)


# ---- the fast paths (issue 12): wor by the Poissonised race, independent by certified bounds --
def _random_pair(g, V, e):
    q = torch.rand(V, generator=g, dtype=torch.float64) ** e
    p = torch.rand(V, generator=g, dtype=torch.float64) ** e
    return p / p.sum(), q / q.sum()


def test_fast_wor_equals_brute_force_and_lp_on_hundreds_of_instances():
    g = torch.Generator().manual_seed(31)
    for i in range(300):
        V = int(torch.randint(2, 8, (1,), generator=g))
        K = int(torch.randint(2, min(V, 4) + 1, (1,), generator=g))
        p, q = _random_pair(g, V, float(torch.rand(1, generator=g)) * 8)
        law = D.without_replacement(q, K)
        a, H = optimal_acceptance(p, law, return_set=True)
        assert a == pytest.approx(brute_min(p, law), abs=1e-12), (i, p.tolist(), q.tolist(), K)
        assert 1.0 + float(dual_objective(p, law, H)) == pytest.approx(a, abs=1e-12)
        if i % 6 == 0:
            assert a == pytest.approx(lp_optimal_acceptance(p, law), abs=1e-9)


@pytest.mark.parametrize("V", [200, 2000])
def test_fast_wor_equals_the_token_by_token_scan_at_moderate_v(V):
    from multidraft.limits.dual import _wor_scan

    g = torch.Generator().manual_seed(V)
    logits = torch.randn(6, V, generator=g, dtype=torch.float64) * 2.5
    for sharp in (0.7, 1.0, 3.0):  # flat to peaked rows
        p = torch.softmax(logits * sharp, -1)
        q = torch.softmax((logits / 1.3 + 0.6 * torch.randn(6, V, generator=g, dtype=torch.float64)) * sharp, -1)
        for K in (2, 3, 5, 8):
            law = D.without_replacement(q, K)
            fast = optimal_acceptance(p, law)
            ref, _ = _wor_scan(p, law._q64(), K)
            assert torch.allclose(fast, ref, atol=1e-12, rtol=0), (sharp, K, float((fast - ref).abs().max()))
            assert torch.all(fast >= optimal_acceptance(p, D.iid(q, K)) - 1e-12)


def test_independent_bounds_contain_the_exact_value_on_hundreds_of_instances():
    from multidraft.limits.independent import independent_bounds

    g = torch.Generator().manual_seed(17)
    n_exact = 0
    for i in range(300):
        V = int(torch.randint(2, 8, (1,), generator=g))
        K = int(torch.randint(2, 5, (1,), generator=g))
        e = float(torch.rand(1, generator=g)) * 6
        qs = torch.rand(K, V, generator=g, dtype=torch.float64) ** e
        qs = qs / qs.sum(-1, keepdim=True)
        p = torch.rand(V, generator=g, dtype=torch.float64) ** e
        p = p / p.sum()
        law = D.independent(qs)
        exact = brute_min(p, law)
        lo, up, H, gap = independent_bounds(p.unsqueeze(0), qs.unsqueeze(0))
        assert float(lo) <= exact - 1 + 1e-12 and exact - 1 <= float(up) + 1e-12, i
        assert 1.0 + float(dual_objective(p, law, H[0])) == pytest.approx(1.0 + float(up), abs=1e-12)
        if float(gap) <= 1e-12:
            n_exact += 1
            assert 1.0 + float(up) == pytest.approx(exact, abs=1e-12)
        b = optimal_acceptance(p, law, return_bounds=True)
        assert b.exact and b.value == pytest.approx(exact, abs=1e-12)  # small V: exact always
        if i % 10 == 0:
            assert b.value == pytest.approx(lp_optimal_acceptance(p, law), abs=1e-9)
    assert n_exact >= 150  # the bounds meet on most instances


def test_independent_bounds_at_moderate_v_against_branch_and_bound():
    from multidraft.limits.dual import _indep_row

    g = torch.Generator().manual_seed(8)
    V = 300
    base = torch.randn(V, generator=g, dtype=torch.float64) * 2
    p = torch.softmax(base, -1)
    for K in (2, 3, 4):
        temps = torch.linspace(1.0, 1.6, K, dtype=torch.float64)
        qs = torch.softmax(base / temps.unsqueeze(-1) + 0.2 * torch.randn(K, V, generator=g, dtype=torch.float64), -1)
        b = optimal_acceptance(p, D.independent(qs), return_bounds=True)
        v, _ = _indep_row(p, qs)
        assert b.lower - 1e-12 <= 1.0 + float(v) <= b.upper + 1e-12
        if b.upper < 1.0:  # known limitation: at alpha* = 1 (empty minimiser) a duality gap can remain
            assert b.upper - b.lower <= 1e-4, (K, b)
        if b.exact:
            assert b.value == pytest.approx(1.0 + float(v), abs=1e-12)


def test_return_bounds_for_the_exact_laws():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    for kind in ("iid", "wor", "greedy"):
        b = optimal_acceptance(p, D.make(kind, q, 2), return_bounds=True)
        assert b.exact is True and b.lower == b.upper == b.value == optimal_acceptance(p, D.make(kind, q, 2))
    P = p.expand(3, 3)
    b = optimal_acceptance(P, D.independent(torch.stack([q, p]).expand(3, 2, 3)), return_bounds=True)
    assert b.value.shape == (3,) and bool(b.exact.all()) and bool((b.lower <= b.upper).all())
