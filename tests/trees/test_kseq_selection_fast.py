"""``trees.kseq_selection_law`` (SpecTr-GBV's selection) one rho at a time gives the same bits as
the whole-grid formula of its module notes (the real-tree study runs it at V = 151,936)."""
from __future__ import annotations

import math

import pytest
import torch

from multidraft.trees import kseq_selection_law
from multidraft.trees.spectr_gbv import RHO_POINTS


def grid_formula(p, q, k):
    """The selection law on the whole [G, V] grid of rho, as the module notes write it."""
    q = q / q.sum()
    sup = q > 0
    if k == 1:
        return q, torch.ones_like(q)
    half = math.log(4 * k)
    rho = torch.exp(torch.linspace(-half, half, RHO_POINTS, dtype=torch.float64)).unsqueeze(1)  # [G, 1]
    qs = torch.where(sup, q, torch.ones_like(q))
    beta = torch.where(sup, (p / (rho * qs)).clamp(max=1.0), torch.zeros_like(q))  # [G, V]
    miss = 1.0 - (q * beta).sum(-1, keepdim=True)  # [G, 1]
    geo = sum(miss.pow(j) for j in range(k - 1))
    s = q * beta * geo + miss.pow(k - 1) * q  # [G, V]
    best = int(torch.argmax(torch.minimum(s, p).sum(-1)))
    return s[best], beta[best]


@pytest.mark.parametrize("V", [2, 3, 5, 64, 3000])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_same_bits_as_the_grid_formula(V, k):
    g = torch.Generator().manual_seed(V * 10 + k)
    for trial in range(12):
        p = torch.rand(V, generator=g, dtype=torch.float64) ** 3
        q = torch.rand(V, generator=g, dtype=torch.float64) ** 3
        if trial % 3 == 1:
            q[torch.rand(V, generator=g) < 0.4] = 0.0  # q = 0 where p > 0
            q[0] += 0.5
        if trial % 3 == 2:
            q = p.clone()  # p = q: every rho >= 1 accepts everything (a tie: the first wins)
        p, q = p / p.sum(), q / q.sum()
        want, got = grid_formula(p, q, k), kseq_selection_law(p, q, k)
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1]), (V, k, trial)
        # and the law is a distribution that the coins and the drafts' law define
        assert abs(float(got[0].sum()) - 1.0) <= 1e-12
