"""``optimal`` on the targets a mixed tree's free drafts leave (issue 39, item 4).

After a copied token is refused the walk verifies the model's drafts against the residual target,
p with that token zeroed. On such rows a layer can hold one token with a large share of the
layer's draft mass (the draft's favourite, now above every other ratio or just below the
zeroed one), and the level race's fixed point sits at kinks of the placement: the fit crept for
the whole ``max_iter`` at three level counts (about 1,100 Newton steps, 0.3-0.6 s a node at
V = 151,936, against ~7 ms on p itself). The fit now stops a unit whose residual has not halved
for ``STALL_STOP`` steps and tries fractions of each Newton step (a line search). These tests
count the fit's steps (never time) and certify the output law at 1e-12 on the affected rows.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import multidraft as md
import multidraft.verifiers.optimal as O
from instances import _dirichlet, instances
from multidraft.verifiers._optimal_np import STALL_STOP

ATOL = 1e-12
V_FULL = 151_936


def _zipf_rows(n, V, seed=0):
    """The synthetic rows of ``benchmarks/node_cost.py`` (``synthetic_rows``): target [n, V] and draft
    [n, V] float32 probabilities, Zipf exponent 0.8..1.6 across rows, the draft a noisy copy."""
    g = torch.Generator().manual_seed(seed)
    ps, qs = [], []
    r = torch.arange(1, V + 1, dtype=torch.float64)
    for i in range(n):
        s = 0.8 + 0.8 * i / max(1, n - 1)
        base = -s * r.log() + 0.3 * torch.randn(V, generator=g, dtype=torch.float64)
        perm = torch.randperm(V, generator=g)
        t = torch.empty(V, dtype=torch.float64).scatter_(0, perm, base)
        d = t + 0.5 * torch.randn(V, generator=g, dtype=torch.float64)
        ps.append(torch.softmax(t.float(), -1))
        qs.append(torch.softmax(d.float(), -1))
    return torch.stack(ps), torch.stack(qs)


def test_fit_of_the_argmax_zeroed_row_stops_at_its_stall():
    """The row measured in issue 39 (node_cost's synthetic row 4 of 6, Zipf 1.44, K = 4, the target's
    argmax zeroed): every fit ran to its cap before (iterations 500), now each stops at its stall,
    and the acceptance is not below what the capped fit reached (unit shortfall 2.3e-4)."""
    P, Q = _zipf_rows(6, V_FULL)
    p, q = P[4].clone(), Q[4]
    p[p.argmax()] = 0.0
    p = p / p.sum()
    v = O.Optimal()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the lumped tail's and the stopped fit's reports
        fit = v.fit(p, q, 4)
        assert int(v.fit(P[4], q, 4).iterations) < 2 * STALL_STOP  # p itself converges as before
    assert fit.iterations < O.DEFAULT_MAX_ITER // 4, fit.iterations  # 500 before: three fits to their cap
    assert fit.iterations <= STALL_STOP + 16
    unit = fit.unit_fit
    assert float(unit.shortfall) <= 2.5e-4  # the capped fits reached 2.3e-4; the stop keeps it
    assert float(unit.acceptance) <= float(unit.alpha_star) + 1e-12


def _affected_rows(seed):
    """(label, p, q) with p zero where the draft puts its most mass: the target's argmax zeroed,
    the draft's argmax zeroed in p, two of the draft's top tokens zeroed, subnormal masses."""
    g = torch.Generator().manual_seed(seed)
    for i, (_, p, q) in enumerate(instances(12, seed, max_v=6)):
        if p.numel() < 3 or int((p > 0).sum()) < 3:
            continue
        for label, tok in (("p_argmax", p.argmax()), ("q_argmax", q.argmax()), ("q_top2", q.topk(2).indices)):
            pz = p.clone()
            pz[tok] = 0.0
            yield f"{label}_zeroed_{i}", pz / pz.sum(), q
    for V in (4, 5):
        p, q = _dirichlet(V, g, 0.3), _dirichlet(V, g, 0.3)
        q[0] = q.max() * 3.0  # one heavy draft token, zeroed in the target
        q = q / q.sum()
        pz = p.clone()
        pz[0] = 0.0
        yield f"heavy_q_atom_zeroed_V{V}", pz / pz.sum(), q
        sub = p.clone()
        sub[1] = 5e-320  # subnormal target masses beside a zeroed one
        sub[2] = 3e-310
        sub[0] = 0.0
        yield f"subnormal_p_V{V}", sub / sub.sum(), q
        qs = q.clone()
        qs[-1] = 4e-320  # a subnormal draft mass
        yield f"subnormal_q_V{V}", pz / pz.sum(), qs / qs.sum()


@pytest.mark.parametrize("k,route", [(2, "numpy"), (3, "numpy"), (4, "numpy"), (3, "torch")])
def test_certificates_on_zeroed_and_subnormal_targets(k, route, monkeypatch):
    """Exact output law (1e-12) and acceptance alpha* on the affected rows, both routes, the exact
    scan and the lumped rule (a tiny head at small V)."""
    monkeypatch.setattr(O, "NUMPY_ON_CPU", route == "numpy")
    exact, lumped = O.Optimal(), O.Optimal(head=2, bin_bits=1, exact_below=0, warn_lump=1.0)
    checked = 0
    for label, p, q in _affected_rows(40 + k):
        if p.numel() > (4 if k == 4 else 5):
            continue  # V^K tuples enumerated
        law = md.drafts.iid(q, k)
        a = md.optimal_acceptance(p, law)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ce = md.certify(exact, p, law)
            cl = md.certify(lumped, p, law)
        assert ce.max_abs_error <= ATOL, f"K={k} {label}: output law off by {ce.max_abs_error:.3g}"
        assert cl.max_abs_error <= ATOL, f"K={k} {label} (lumped): output law off by {cl.max_abs_error:.3g}"
        assert abs(ce.acceptance - a) <= 1e-9, f"K={k} {label}: acceptance {ce.acceptance} vs alpha* {a}"
        assert cl.acceptance <= a + 1e-12
        checked += 1
    assert checked >= 15


def test_lumped_warning_once_per_verifier_and_its_bound_not_recomputed(monkeypatch):
    """On flat rows the cheap lumping bound is above ``warn_lump`` at every node; the exact bound (a
    sort of V) is read until the warning is given, once per verifier, and not after (counted)."""
    reads = []
    real = O.LumpedFit.gap_bound.fget
    monkeypatch.setattr(O.LumpedFit, "gap_bound", property(lambda self: reads.append(1) or real(self)))
    g = torch.Generator().manual_seed(7)
    for _ in range(50):  # rows whose coarse lumping loses more than warn_lump (test_optimal_lumped's setting)
        p, q = _dirichlet(6, g, 1.0), _dirichlet(6, g, 1.0)
        v = O.Optimal(head=1, bin_bits=0, exact_below=0, warn_lump=1e-3)
        dr = md.drafts.iid(q, 2).sample(torch.Generator().manual_seed(0))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            v.verify(p, q, dr, generator=torch.Generator().manual_seed(1))
        if any("lumped tail" in str(x.message) for x in w):
            break
    else:
        pytest.fail("no row of the coarse lumping warned")
    n = len(reads)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for s in range(5):
            v.verify(p, q, dr, generator=torch.Generator().manual_seed(s))
    assert not any("lumped tail" in str(x.message) for x in w)
    assert len(reads) == n  # the O(V) bound was not read again
    assert float(v.last_fit.gap_bound) > 1e-3  # and stays readable
