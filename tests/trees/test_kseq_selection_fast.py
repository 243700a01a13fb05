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
    qb = torch.minimum(q, p / rho)  # [G, V]: q beta (0 off q's support)
    miss = 1.0 - qb.sum(-1, keepdim=True)  # [G, 1]
    geo = sum(miss.pow(j) for j in range(k - 1))
    s = qb * geo + miss.pow(k - 1) * q  # [G, V]
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


@pytest.mark.parametrize("V", [3, 64, 5000])
@pytest.mark.parametrize("k", [2, 3, 5])
def test_screened_grid_gives_the_same_bits(V, k, monkeypatch):
    """Above ``SCREEN_V`` the rhos are screened by bounds from a histogram of p / q and only those
    that may be the best are evaluated: the same rho and bits as the whole grid, on ties
    (p = q), zeros of p and of q, and peaked rows (the screen forced on at every V here)."""
    from multidraft.trees import spectr_gbv

    monkeypatch.setattr(spectr_gbv, "SCREEN_V", 0)
    g = torch.Generator().manual_seed(V * 7 + k)
    for trial in range(10):
        z = torch.randn(V, generator=g, dtype=torch.float64) * (1 + trial % 4)
        p = torch.softmax(z, -1)
        q = torch.softmax(z + torch.randn(V, generator=g, dtype=torch.float64) * [0.2, 1.0, 3.0][trial % 3], -1)
        if trial % 5 == 1:
            q = p.clone()
        if trial % 5 == 2:
            p[torch.rand(V, generator=g) < 0.3] = 0.0
            p[0] += 0.1
        if trial % 5 == 3:
            q[torch.rand(V, generator=g) < 0.3] = 0.0
            q[-1] += 0.1
        p, q = p / p.sum(), q / q.sum()
        want, got = grid_formula(p, q, k), kseq_selection_law(p, q, k)
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1]), (V, k, trial)


def test_screen_bounds_hold_the_acceptance_of_every_rho():
    """The screen itself: ``sum min(p, s_rho)`` evaluated directly at every rho lies within the
    histogram's bounds (to rounding), on LM-like rows with q = 0, p = 0, a peaked head and a
    token of p / q = +inf; and the bounds are tight enough to leave few rhos to evaluate."""
    from multidraft.trees.spectr_gbv import SCREEN_TOL, _acceptance_bounds

    g = torch.Generator().manual_seed(5)
    V = 4000
    widths = []
    for trial in range(8):
        k = (2, 3, 4, 8)[trial % 4]
        z = torch.randn(V, generator=g, dtype=torch.float64) * (2 + trial)
        p = torch.softmax(z, -1)
        q = torch.softmax(z + torch.randn(V, generator=g, dtype=torch.float64) * (0.3 + trial % 3), -1)
        q[:50] = 0.0
        if trial % 2:
            p[50:90] = 0.0
            p[90], q[90] = 0.01, 5e-324  # p / q = +inf
        p, q = p / p.sum(), q / q.sum()
        sup = q > 0
        half = math.log(4 * k)
        rho = torch.exp(torch.linspace(-half, half, RHO_POINTS, dtype=torch.float64))
        qs = torch.where(sup, q, torch.ones_like(q))
        beta = torch.where(sup, (p / (rho[:, None] * qs)).clamp(max=1.0), torch.zeros_like(q))
        miss = 1.0 - (q * beta).sum(-1, keepdim=True)
        s = q * beta * sum(miss.pow(j) for j in range(k - 1)) + miss.pow(k - 1) * q
        want = torch.minimum(s, p).sum(-1)
        lo, hi, hmiss = map(torch.from_numpy, _acceptance_bounds(p, q, sup, bool(sup.all()), qs, rho, k))  # host arrays
        assert (lo <= want + 1e-12).all() and (want <= hi + 1e-12).all(), trial
        assert torch.allclose(hmiss, miss[:, 0], rtol=0, atol=1e-14), trial  # 1 - bbar from the histogram
        assert (lo <= hi + 1e-15).all()
        widths.append(int((hi >= lo.max() - SCREEN_TOL).sum()))
    assert max(widths) < RHO_POINTS // 2, widths  # the screen excludes most of the grid


@pytest.mark.parametrize("k", [2, 3, 5])
def test_lazy_selection_reads_the_laws_entries(k):
    """``kseq_selection`` (what ``verify`` reads) above ``SCREEN_V``: where the screen leaves one rho,
    a ``KSeqSelection`` whose coins at any tokens are the bits of the whole law's, whose entries
    equal the law's to rounding (its 1 - bbar comes from the screen's histogram), and whose
    ``row()`` is the law itself; otherwise the law in full."""
    from multidraft.trees.spectr_gbv import KSeqSelection, kseq_selection

    g = torch.Generator().manual_seed(k)
    V, lazy = 6000, 0
    for trial in range(8):
        z = torch.randn(V, generator=g, dtype=torch.float64) * (1 + trial)
        p = torch.softmax(z, -1)
        q = torch.softmax(z + torch.randn(V, generator=g, dtype=torch.float64) * 0.5, -1)
        if trial % 2:
            q[:40] = 0.0
            p[40:60] = 0.0
        p, q = p / p.sum(), q / q.sum()
        want_s, want_beta = kseq_selection_law(p, q, k)
        sel = kseq_selection(p, q, k)
        xs = torch.topk(q, 5).indices.tolist() + [60, V - 1]
        idx = torch.as_tensor(xs)
        assert torch.equal(sel.key[idx], want_beta[idx]) and torch.equal(sel.key[torch.arange(V)], want_beta)
        if isinstance(sel, KSeqSelection):
            lazy += 1
            for x in xs:
                assert sel.at(x) == pytest.approx(float(want_s[x]), rel=1e-13, abs=1e-17), (trial, x)
        assert torch.equal(sel.row(), want_s)
    assert lazy >= 4  # the screen leaves one rho on most such rows


@pytest.mark.parametrize("k", [2, 3])
def test_a_heavy_token_in_a_straddled_bin_is_summed_exactly(k):
    """One token carrying almost all of p and q (as on real code rows: p 0.997, q 0.990) sits in the
    bin a breakpoint falls in at several rhos; its bin's bound alone left 2-4 rhos in the race.
    Where more than one rho passes, the screen sums the straddled bins token by token: the
    candidates' bounds close to their acceptance and one rho is left, the exact best."""
    from multidraft.trees.spectr_gbv import SCREEN_TOL, _acceptance_bounds

    g = torch.Generator().manual_seed(11 + k)
    V, one = 6000, 0
    for trial in range(6):
        p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 2, -1)
        q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 2, -1)
        head_p, head_q = 0.997 - 0.002 * trial, 0.990 - 0.01 * trial
        p = torch.cat([torch.tensor([head_p], dtype=torch.float64), p[1:] / p[1:].sum() * (1 - head_p)])
        q = torch.cat([torch.tensor([head_q], dtype=torch.float64), q[1:] / q[1:].sum() * (1 - head_q)])
        half = math.log(4 * k)
        rho = torch.exp(torch.linspace(-half, half, RHO_POINTS, dtype=torch.float64))
        beta = (p / (rho[:, None] * q)).clamp(max=1.0)
        miss = 1.0 - (q * beta).sum(-1, keepdim=True)
        s = q * beta * sum(miss.pow(j) for j in range(k - 1)) + miss.pow(k - 1) * q
        want = torch.minimum(s, p).sum(-1)
        lo, hi, _ = map(torch.from_numpy, _acceptance_bounds(p, q, q > 0, True, q, rho, k))
        assert (lo <= want + 1e-12).all() and (want <= hi + 1e-12).all(), trial
        cand = torch.nonzero(hi >= lo.max() - SCREEN_TOL).flatten()
        assert int(torch.argmax(want)) in cand.tolist()
        if cand.numel() == 1:
            one += 1
        else:  # a true near-tie: the candidates' bounds are their acceptance to rounding
            assert torch.allclose(lo[cand], want[cand], atol=1e-13) and torch.allclose(hi[cand], want[cand], atol=1e-13)
    assert one >= 4
