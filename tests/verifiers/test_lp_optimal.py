"""lp_optimal: lossless, reaches alpha*, sampling path matches the exact path."""
from __future__ import annotations

import pytest
import torch

import multidraft as md
from multidraft import drafts as D
from multidraft.limits import lp_optimal_acceptance, optimal_acceptance, solve_coupling

from instances import instances, make_law


@pytest.mark.parametrize("kind", ["iid", "wor", "greedy", "independent"])
def test_lossless_and_reaches_alpha_star(kind):
    v = md.verifiers.get("lp_optimal")
    n = 0
    for label, p, q in instances(12, 31, max_v=5):
        for K in (1, 2, 3):
            law = make_law(kind, q, K, seed=3)
            if law is None:
                continue
            cert = md.certify(v, p, law)
            assert cert.max_abs_error <= 1e-12, (label, K)
            assert cert.acceptance == pytest.approx(optimal_acceptance(p, law), abs=1e-9), (label, K)
            n += 1
    assert n > 30


def test_solution_marginals_and_tiny_probabilities():
    # probabilities near 1e-15 on both sides: the inequality form never reports infeasible
    p = torch.tensor([1 - 2e-15, 1e-15, 1e-15, 0.0], dtype=torch.float64)
    q = torch.tensor([1e-15, 0.5, 0.5 - 2e-15, 1e-15], dtype=torch.float64)
    law = D.iid(q / q.sum(), 3)
    sol = solve_coupling(p / p.sum(), law)
    assert torch.all(sol.matched >= 0)
    assert torch.all(sol.matched.sum(-1) <= sol.probs + 1e-18)
    assert torch.all(sol.matched.sum(0) <= p + 1e-18)
    assert sol.acceptance == pytest.approx(optimal_acceptance(p, law), abs=1e-9)


def test_coupling_rows_are_laws_without_a_top_up():
    """Issue 41: ``coupling_rows`` gives every tuple a law inside the support of p (it returned
    rows short of 1 where the projection filled every column, and lp_optimal topped them up)."""
    from multidraft.limits import coupling_rows

    p = torch.tensor([1 - 2e-15, 1e-15, 1e-15, 0.0], dtype=torch.float64)
    q = torch.tensor([1e-15, 0.5, 0.5 - 2e-15, 1e-15], dtype=torch.float64)
    cases = [(p / p.sum(), D.iid(q / q.sum(), 3))]
    short = [  # p (q ignored) whose rows under the iid K = 2 law of q = p came back short by 2e-12 to 5e-12
        ([0.015663323777735553, 0.9804967548725853, 0.0037647366925601, 7.518465711928668e-05],
         [0.0, 6.0660324048936514e-05, 0.9759667755970751, 0.023972564078876]),
        ([0.025301594727026706, 0.02560454603138455, 0.008418830459867683, 0.00033475925410711893, 0.940340269527614],
         [0.6634127703645447, 0.16242976898673628, 0.0008430324305757819, 0.002672252213159522, 0.17064217600498355]),
        ([0.9795502065115615, 0.016711090768345854, 0.0037387027200927125],
         [0.9414543132692988, 0.019038154394114257, 0.0395075323365869]),
    ]
    for pp, qq in short:
        pt = torch.tensor(pp, dtype=torch.float64)
        cases += [(pt, D.iid(pt, 2)), (pt, D.iid(torch.tensor(qq, dtype=torch.float64), 2))]
    for label, pp, qq in instances(20, 7, max_v=5):
        cases += [(pp, D.iid(qq, 2)), (pp, D.iid(pp, 2))]
    for pp, law in cases:
        sol = solve_coupling(pp, law)
        rows = coupling_rows(sol)
        assert float((rows.sum(-1) - 1).abs().max()) <= 1e-12
        assert bool((rows[:, pp == 0] == 0).all())


def test_verify_matches_output_distribution():
    v = md.verifiers.get("lp_optimal")
    p = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    law = D.without_replacement(q, 2)
    drafts = torch.tensor([[3, 2]] * 40000)
    P = p.expand(40000, 4)
    Q = q.expand(40000, 4)
    out = v.verify(P, Q, drafts, generator=0, law=law)
    freq = torch.bincount(out.token, minlength=4).double() / 40000
    exact = v.output_distribution(p.unsqueeze(0), q.unsqueeze(0), drafts[:1], law=law)[0]
    se = (exact * (1 - exact) / 40000).sqrt().clamp_min(1e-9)
    assert torch.all((freq - exact).abs() <= 5 * se + 1e-12)
    assert torch.all(out.accepted_index[out.token == 3] == 0)


def test_lp_cache_and_reference_value():
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    # K = 1: 1 - TV = 0.75
    assert lp_optimal_acceptance(p, D.iid(q, 1)) == pytest.approx(0.75, abs=1e-12)
    a = solve_coupling(p, D.iid(q, 2))
    assert solve_coupling(p, D.iid(q, 2)) is a
