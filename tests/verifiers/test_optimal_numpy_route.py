"""The numpy route of ``optimal`` on CPU rows (issue 27): plan, unit rows, head and race.

On CPU, ``optimal`` plans rows of at most ``NP_PLAN_MAX`` entries (every small-V row and the
unit rows of the lumped rule) with ``_optimal_np`` and runs the race in numpy; the torch route
stays for GPU rows and long rows. Both are the same rule: these tests check that they give the
same plan (order, layers, placement; r to rounding), the same tokens for the same generator, that
the torch route still certifies at 1e-12 on CPU (it is what a GPU runs), and the head selection.
"""
from __future__ import annotations

import pytest
import torch

import multidraft as md
import multidraft.verifiers.optimal as O
from instances import _dirichlet, instances

ATOL = 1e-12


def _zipf_pair(V, g, s=1.1):
    """An LM-like pair: Zipf-headed p at random ranks, q a noisy tempered copy (distinct ratios)."""
    rank = torch.randperm(V, generator=g).double() + 1.0
    lp = -s * rank.log() + 0.3 * torch.randn(V, generator=g, dtype=torch.float64)
    lq = 0.9 * lp + 0.5 * torch.randn(V, generator=g, dtype=torch.float64)
    return torch.softmax(lp, -1), torch.softmax(lq, -1)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_numpy_plan_equals_torch_plan(k):
    g = torch.Generator().manual_seed(100 + k)
    rows = [(p, q) for _, p, q in instances(30, 5 + k, max_v=9)]
    rows += [_zipf_pair(V, g) for V in (50, 300, 2000)]
    same_lo = 0
    for p, q in rows:
        P, Q = p.reshape(1, -1), q.reshape(1, -1)
        a = O._plan(P, Q, k, 32, 500, 1e-13, route="torch")
        b = O._plan(P, Q, k, 32, 500, 1e-13, route="numpy")
        for name in ("order", "rank", "bnd_flat"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        # the two routes round the fixed-point map differently (and search with np.searchsorted
        # instead of binary lifting), so a fit may stop at another point within its tolerance (a
        # stalled unit stops at FLOOR_TOL_FACTOR * tol = 1e-9 of level mass): r agrees to that,
        # the acceptance too (both at alpha*), and each r is the exact law of its own placement
        same_lo += int(torch.equal(a.lo, b.lo))
        assert float((a.r_sorted - b.r_sorted).abs().max()) <= 1e-9
        assert float((a.fit.acceptance - b.fit.acceptance).abs().max()) <= 1e-9
        assert float(b.fit.shortfall.max()) <= 1e-9 and float(b.fit.shortfall.min()) >= -1e-12
        assert torch.equal(a.fit.alpha_star, b.fit.alpha_star)
        assert a.fit.n_fitted.tolist() == b.fit.n_fitted.tolist() and a.fit.n_layers.tolist() == b.fit.n_layers.tolist()
    assert same_lo >= 0.8 * len(rows)


def _lumped_pairs():
    g = torch.Generator().manual_seed(3)
    pairs = [_zipf_pair(6000, g, s) for s in (0.9, 1.3, 1.8)]  # V = 6,000 > exact_below: lumped
    return torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs])


def _plans(monkeypatch, v, P, Q, k):
    out = []
    for flag in (True, False):
        monkeypatch.setattr(O, "NUMPY_ON_CPU", flag)
        p64, _, plan = v._make_plan(P, Q, k)
        out.append((p64, plan))  # this route's plan
    return out


def test_race_is_the_same_on_both_routes(monkeypatch):
    """Given one plan, the numpy race draws exactly the torch race's tokens and rejections for the
    same generator: lumped and exact plans, from either route, K = 2..6, every seed."""
    P, Q = _lumped_pairs()
    v = O.Optimal(warn_lump=1.0)
    small = (P[:, :7] / P[:, :7].sum(-1, keepdim=True), Q[:, :7] / Q[:, :7].sum(-1, keepdim=True))
    for p, q in ((P, Q), small):
        for k in (2, 3, 6):
            for p64, plan in _plans(monkeypatch, v, p, q, k):
                for seed in range(6):
                    D = md.drafts.iid(q, k).sample(torch.Generator().manual_seed(seed))
                    a = v._race_torch(p64, plan, D, torch.Generator().manual_seed(seed))
                    b = v._race_numpy(p64, plan, D, torch.Generator().manual_seed(seed))
                    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), (k, seed)


def test_same_tokens_on_both_routes(monkeypatch):
    """End to end, lumped rows (V = 6,000 > exact_below) and small rows, one node and a batch:
    the numpy route draws the torch route's tokens for the same generator wherever the two fits
    place the drafted units alike. Where a fit stopped elsewhere (module notes: a layer of units at
    another offset, r equal to 1e-9, each placement exact) another draft may win the race; this
    test names those rows and requires the placements, not the tokens, to be what differs."""
    P, Q = _lumped_pairs()
    v = O.Optimal(warn_lump=1.0)
    compared = 0
    for k in (2, 3, 6):
        (_, pa), (_, pb) = _plans(monkeypatch, v, P, Q, k)
        assert torch.equal(pa.hidx, pb.hidx)  # both heads in token order (a unit's index breaks ties)
        for seed in range(6):
            x = md.drafts.iid(Q, k).sample(torch.Generator().manual_seed(seed))
            u_lev = torch.rand(3, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            ia = O.Optimal._draft_info_numpy(pa, x.numpy())
            ib = O.Optimal._draft_info_numpy(pb, x.numpy())
            # a row races alike when its drafts' layers and levels (lo, and which side of f its
            # uniform falls) agree on both plans; r of a drafted unit agrees to 1e-9 everywhere
            alike = [bool((ia[0][i] == ib[0][i]).all() and (ia[1][i] == ib[1][i]).all()
                          and ((u_lev[i].numpy() < ia[2][i]) == (u_lev[i].numpy() < ib[2][i])).all()) for i in range(3)]
            assert max(abs(ia[3] - ib[3]).max(), 0.0) <= 1e-9
            out = []
            for flag in (True, False):
                monkeypatch.setattr(O, "NUMPY_ON_CPU", flag)
                batch = v.verify(P, Q, x, torch.Generator().manual_seed(seed), law="iid").token
                one = v.verify(P[seed % 3], Q[seed % 3], x[seed % 3], torch.Generator().manual_seed(seed), law="iid").token
                small = v.verify(P[0, :7] / P[0, :7].sum(), Q[0, :7] / Q[0, :7].sum(), x[0] % 7,
                                 torch.Generator().manual_seed(seed), law="iid", validate=False).token
                out.append((batch, one, small))
            (ba, oa, sa), (bb, ob, sb) = out
            assert torch.equal(sa, sb), (k, seed)  # small rows: exact plans, placed alike
            for i in range(3):
                if alike[i]:
                    compared += 1
                    assert ba[i] == bb[i], (k, seed, i)
            if alike[seed % 3]:
                assert oa == ob, (k, seed)
    assert compared >= 0.8 * 3 * 3 * 6, compared  # most rows are placed alike


@pytest.mark.parametrize("k", [2, 3])
def test_torch_route_still_certifies(monkeypatch, k):
    """The torch route (the one a GPU runs) on CPU: output law = p at 1e-12, exact and lumped."""
    monkeypatch.setattr(O, "NUMPY_ON_CPU", False)
    for v in (O.Optimal(), O.Optimal(head=2, bin_bits=1, exact_below=0, warn_lump=1.0)):
        for label, p, q in instances(12, 40 + k, max_v=6):
            cert = md.certify(v, p, md.drafts.iid(q, k))
            assert cert.max_abs_error <= ATOL, label


def test_head_is_the_top_h_with_lowest_ids_on_ties():
    g = torch.Generator().manual_seed(9)
    P, Q = zip(*[_zipf_pair(20000, g, s) for s in (0.8, 1.2, 2.5)])
    P, Q = torch.stack(P), torch.stack(Q)
    for h in (1, 7, 64, 500):
        ref = torch.topk(P + Q, h, dim=-1).indices.sort(-1).values  # distinct values: the set is unique
        assert torch.equal(O._head_numpy(P, Q, h), ref)
    flat = torch.full((2, 10), 0.1, dtype=torch.float64)
    flat[1, 3] = 0.2  # one token above, then a nine-way tie: the lowest ids complete the head
    flat[1] /= flat[1].sum()
    assert O._head_numpy(flat, flat, 3).tolist() == [[0, 1, 2], [0, 1, 3]]
    tiny = torch.full((1, 5000), 1.0 / 5000, dtype=torch.float64)  # every value below each cut-off
    assert O._head_numpy(tiny, tiny, 4).tolist() == [[0, 1, 2, 3]]


def test_numpy_route_is_row_independent():
    """A row's plan is the same alone and inside a batch (the route plans row by row)."""
    g = torch.Generator().manual_seed(4)
    rows = [_dirichlet(8, g, 0.4) for _ in range(6)]
    P, Q = torch.stack(rows[:3]), torch.stack(rows[3:])
    both = O._plan(P, Q, 3, 32, 500, 1e-13, route="numpy")
    for i in range(3):
        one = O._plan(P[i : i + 1], Q[i : i + 1], 3, 32, 500, 1e-13, route="numpy")
        assert torch.equal(one.r_sorted[0], both.r_sorted[i]) and torch.equal(one.lo[0], both.lo[i])
