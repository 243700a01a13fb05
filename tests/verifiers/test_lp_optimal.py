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
