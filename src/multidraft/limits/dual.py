r"""Exact optimal acceptance at any vocabulary size through the transport dual.

For any draft law Q over K-tuples and target p (Hu et al. 2025, the dual of the coupling
LP; a max-flow/min-cut argument):

    alpha* = 1 + min_H [ p(H) - Q(all K drafts in H) ]          over token sets H.

* ``iid``: Q(all in H) = q(H)^K.  The objective p(H) - f(q(H)) with f convex is minimised
  by a prefix of the tokens sorted by q/p decreasing (exchange argument; ties are whole
  blocks), so alpha* costs one sort and a prefix scan.
* ``greedy``: Q(all in H) = [T in H] q'(H) with top set T and q' = q restricted to the
  rest and renormalised, so alpha* = p(T) + sum_{x not in T} min(p(x), q'(x)).
* ``wor``: exact fast path in wor.py (Poissonised race: the iid value minus a correction;
  heavy tokens exactly, light ones by prefix power sums; bracketing by monotonicity); the
  token-by-token scan below is the fallback and the test reference.
* ``independent``: certified AM-GM lagrangian bounds (independent.py); the returned value is
  the upper bound, exact where the bounds meet; lattice pruning + branch and bound for rows of
  V <= 64 with a gap.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .._scan import argsort_desc_stable
from .._validate import as_probs64
from ..drafts import DraftLaw
from .independent import independent_bounds
from .wor import wor_prefix_min

__all__ = ["optimal_acceptance", "prefix_order", "dual_objective", "AcceptanceBounds"]

_TRAP_H = 0.25          # trapezoid step in log t
_TAIL = 1e-16           # mass left in each cut tail
_ONE_TOL = 1e-15        # prefixes whose 1 - Q is proven below this count as Q = 1


def _check(p, law):
    if not isinstance(law, DraftLaw):
        raise ValueError(f"law must be a DraftLaw (from multidraft.drafts), got {type(law).__name__}")
    p = as_probs64(p, "p")  # float32 p: renormalised in float64, as in certify
    if p.shape[-1] != law.V:
        raise ValueError(f"p has V = {p.shape[-1]} but the law has V = {law.V}")
    try:
        batch = torch.broadcast_shapes(p.shape[:-1], law.batch_shape)
    except RuntimeError:
        raise ValueError(
            f"p has batch shape {tuple(p.shape[:-1])}, not broadcastable with the law's {tuple(law.batch_shape)}"
        ) from None
    return p.expand(*batch, p.shape[-1]), batch


def prefix_order(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Token order by q/p decreasing: p = 0 < q first (ratio inf), q = 0 last. p, q ``[..., V]``."""
    ratio = torch.nan_to_num_(q / p, nan=0.0, posinf=torch.inf)  # q / 0 = inf for q > 0; 0 / 0 -> 0
    V = ratio.shape[-1]
    return argsort_desc_stable(ratio.reshape(-1, V)).reshape(ratio.shape)  # = torch's stable sort


def dual_objective(p, law, H) -> torch.Tensor:
    """p(H) - Q(all K drafts in H) for a token set H (bool ``[..., V]``), by enumeration (small V)."""
    tuples, probs = law.enumerate()
    H = torch.as_tensor(H, dtype=torch.bool)
    return p.double()[H].sum() - probs[H[tuples].all(-1)].sum()


def _mask_from_prefix(order: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Bool ``[..., V]``: tokens among the first n[...] of each row's order."""
    V = order.shape[-1]
    ranks = torch.arange(V, device=order.device).expand_as(order)
    inprefix = ranks < n.unsqueeze(-1)
    return torch.zeros_like(inprefix).scatter(-1, order, inprefix)


def iid_scan(p, q, K):
    """``(alpha*, H*)`` of K i.i.d. drafts from q against p ``[..., V]``: the sorted prefix scan
    (DESIGN, "The optimal verifier at any V"), one sort and one cumulative sum over V."""
    order = prefix_order(p, q)
    cp = torch.cumsum(p.gather(-1, order), -1)
    cq = torch.cumsum(q.gather(-1, order), -1).clamp(max=1.0)
    g = cp - cq**K
    gmin, arg = g.min(-1)
    best = gmin.clamp(max=0.0)
    n = torch.where(gmin < 0, arg + 1, torch.zeros_like(arg))
    return 1.0 + best, _mask_from_prefix(order, n)


def _greedy(p, law):
    K = law.k
    if K == 1:
        return iid_scan(p, law._q64().expand_as(p), 1)
    T = law.top_set().expand(*p.shape[:-1], K - 1)
    qr = law.rest_probs().expand_as(p)
    inT = torch.zeros_like(p, dtype=torch.bool).scatter(-1, T, True)
    alpha = p.gather(-1, T).sum(-1) + torch.where(inT, 0.0, torch.minimum(p, qr)).sum(-1)
    H = inT | (qr > p)
    return alpha.clamp(max=1.0), H


# ---- without replacement ---------------------------------------------------------------
def _wor_bounds(P, Qd, K):
    """Sorted masses, prefix sums and the candidate prefixes of the without-replacement dual.

    P, Qd ``[B, V]``. Returns order, cp, qs, r (q outside each prefix), cand (bool: not excluded
    by q(H)^K >= Q(H) >= prod_i (q(H) - M_i)/(1 - M_i)), one (bool: 1 - Q(H) <= 1e-15 proven),
    upper_g ``[B]`` (an achievable value).
    """
    B, V = P.shape
    order = prefix_order(P, Qd)
    ps = P.gather(-1, order)
    qs = Qd.gather(-1, order)
    cp = torch.cumsum(ps, -1)
    # mass outside each prefix, as a suffix sum (no cancellation near 1)
    r = torch.flip(torch.cumsum(torch.flip(qs, [-1]), -1), [-1])
    r = torch.cat([r[:, 1:], torch.zeros(B, 1, dtype=r.dtype)], -1).clamp(min=0.0)  # r[n-1] = q(outside H_n)
    cq = (1.0 - r).clamp(0.0, 1.0)  # q(H_n), only in the upper bound q(H)^K
    # q mass outside the top i tokens (i = 0..K-1) as sums of nonnegative terms: 1 - cumsum
    # of the top masses cancels to 0 when the rest is tiny (q = [1, 1e-310, 1e-310])
    top, top_idx = torch.topk(Qd, K - 1, dim=-1)  # [B, K-1]
    rest = Qd.scatter(-1, top_idx, 0.0).sum(-1, keepdim=True)  # [B, 1]: q outside the top K-1
    tail = torch.flip(torch.cumsum(torch.flip(top, [-1]), -1), [-1])  # [B, K-1]: sum_{j >= i} top_j
    out_top = torch.cat([tail + rest, rest], -1)  # [B, K]: q outside the top i, i = 0..K-1
    # bounds on Q along prefixes: lower = prod_i (q(H) - M_i)/(1 - M_i) = prod_i (1 - r/(1 - M_i))+,
    # upper = q(H)^K
    lowQ = torch.ones_like(r)
    for i in range(K):  # one [B, V] factor at a time; 0/0 (nothing outside) -> nan -> 1
        lowQ.mul_((1.0 - r / out_top[:, i : i + 1]).nan_to_num_(nan=1.0).clamp_(0.0, 1.0))
    lowQ = torch.where(r <= 0, torch.ones_like(lowQ), lowQ)
    upper_g = (cp - lowQ).amin(-1).clamp(max=0.0)  # an achievable value (upper bound on the min)
    lower_g = cp - cq**K                            # g(n) >= this
    cand = lower_g <= upper_g.unsqueeze(-1) + 1e-15
    cand &= qs > 0  # adding a q = 0 token only adds p
    # prefixes proven to have Q within _ONE_TOL of 1: 1 - Q <= sum_i r/(1 - M_i) <= K r/(1 - M_{K-1})
    one = (r <= 0) | (K * r <= _ONE_TOL * out_top[:, -1:])
    return order, ps, qs, cp, r, cand, one, upper_g


def _wor(p, law):
    """alpha* without replacement: bounds, then the exact fast path of wor.py on the candidates
    (rows it cannot take: the token-by-token scan below)."""
    K = law.k
    q = law._q64().expand_as(p)
    if K == 1:
        return iid_scan(p, q, 1)
    batch = p.shape[:-1]
    V = p.shape[-1]
    P = p.reshape(-1, V)
    Qd = q.reshape(-1, V)
    order, ps, qs, cp, r, cand, one, upper_g = _wor_bounds(P, Qd, K)
    lam = torch.cumsum(qs, -1)
    g, slow = wor_prefix_min(ps, qs, cp, r, lam, cand & ~one, upper_g, K)
    g = torch.where(one & cand, cp - 1.0, g)
    gmin, arg = g.min(-1)
    n = torch.where(gmin < 0, arg + 1, torch.zeros_like(arg))
    alpha = 1.0 + gmin.clamp(max=0.0)
    H = _mask_from_prefix(order, n)
    if slow:
        a_s, H_s = _wor_scan(P[slow], Qd[slow], K)
        alpha[slow] = a_s
        H[slow] = H_s
    return alpha.reshape(batch), H.reshape(*batch, V)


def _wor_scan(P, Qd, K):
    """The token-by-token Poisson-binomial scan over all candidate prefixes (P, Qd ``[B, V]``, K >= 2)."""
    B, V = P.shape
    order, ps, qs, cp, r, cand, one, upper_g = _wor_bounds(P, Qd, K)
    idx = torch.arange(V).expand(B, V)
    n_max = int(torch.where(cand, idx + 1, torch.zeros_like(idx)).amax()) if V else 0
    g = torch.full((B, V), math.inf, dtype=torch.float64)
    if n_max > 0:
        need = cand[:, :n_max] & ~one[:, :n_max]
        rr = torch.where(need, r[:, :n_max], torch.ones_like(r[:, :n_max]))
        r_min = float(rr.amin()) if bool(need.any()) else 1.0
        # the grid lives in s = log t: every product x t is formed as exp(log x + s), so tiny
        # (subnormal) masses give t up to ~1e322 without overflow
        s_lo = (math.log(_TAIL) + math.lgamma(K + 2)) / (K + 1)
        s_hi = math.log(-math.log(_TAIL)) - math.log(r_min)
        s = torch.arange(s_lo, s_hi + _TRAP_H, _TRAP_H, dtype=torch.float64)  # [M]
        Mn = s.numel()
        logq = qs.log()  # [B, V]; log 0 = -inf gives q t = 0
        logr = r.log()
        state = torch.zeros(B, Mn, K + 1, dtype=torch.float64)  # P(N_H(t) = j), j < K; [K]: P(N >= K)
        state[..., 0] = 1.0
        gvals = []
        chunk = max(1, (1 << 21) // max(1, B * Mn))
        for n0 in range(0, n_max, chunk):
            n1 = min(n_max, n0 + chunk)
            qt = torch.exp(logq[:, n0:n1].unsqueeze(-1) + s)  # [B, C, M]
            E = torch.exp(-qt)  # P(token not arrived by t)
            F = -torch.expm1(-qt)  # P(arrived), accurate for tiny q t
            reached = torch.empty(B, n1 - n0, Mn, dtype=torch.float64)
            for c in range(n1 - n0):
                e = E[:, c].unsqueeze(-1)
                f = F[:, c].unsqueeze(-1)
                state[..., K:] += state[..., K - 1 : K] * f  # absorbing: K or more arrived
                state[..., 1:K] = state[..., 1:K] * e + state[..., : K - 1] * f
                state[..., :1] *= e
                reached[:, c] = state[..., K]
            lrt = logr[:, n0:n1].unsqueeze(-1) + s  # [B, C, M]: log(r t)
            rt = torch.exp(lrt)
            w = torch.exp(lrt - rt) * _TRAP_H  # density r t e^{-r t} of the first arrival outside H, in s
            Qn = (w * reached.clamp(0.0, 1.0)).sum(-1) + torch.exp(-rt[..., -1])
            gvals.append(cp[:, n0:n1] - Qn.clamp(0.0, 1.0))
        gex = torch.cat(gvals, -1)
        gex = torch.where(one[:, :n_max], cp[:, :n_max] - 1.0, gex)
        g[:, :n_max] = torch.where(cand[:, :n_max], gex, g[:, :n_max])
    g = torch.where(one & cand, cp - 1.0, g)
    gmin, arg = g.min(-1)
    n = torch.where(gmin < 0, arg + 1, torch.zeros_like(arg))
    alpha = 1.0 + gmin.clamp(max=0.0)
    return alpha, _mask_from_prefix(order, n)


# ---- independent drafts: exact submodular minimisation -------------------------------
def _indep_row(p, qs):
    """min_H p(H) - prod_j qs_j(H) for one row. p [V], qs [K, V]. Returns (value, H bool [V])."""
    V = p.shape[-1]
    qT = qs.T.contiguous()  # [V, K]

    def f(mask):
        return p[mask].sum() - qT[mask].sum(0).prod()

    def marg_lower(c, xs):  # Delta(x | set with sums c), xs [n]
        return p[xs] - ((c + qT[xs]).prod(-1) - c.prod())

    def marg_upper(c, xs):  # Delta(x | upper set minus x)
        return p[xs] - (c.prod() - (c - qT[xs]).clamp_min(0.0).prod(-1))

    def prune(A, Bm):
        while True:
            U = (Bm & ~A).nonzero().squeeze(-1)
            if U.numel() == 0:
                return A, Bm, U
            cA = qT[A].sum(0)
            cB = qT[Bm].sum(0)
            add = marg_lower(cA, U) < 0
            drop = marg_upper(cB, U) > 0
            if not bool(add.any()) and not bool(drop.any()):
                return A, Bm, U
            A = A.clone()
            Bm = Bm.clone()
            A[U[add]] = True
            Bm[U[drop & ~add]] = False

    # incumbent: the best sorted prefix by the mean draft distribution (or the empty set)
    best_mask = torch.zeros(V, dtype=torch.bool)
    best = torch.tensor(0.0, dtype=torch.float64)
    order = prefix_order(p, qs.mean(0))
    gpre = torch.cumsum(p[order], 0) - torch.cumsum(qT[order], 0).prod(-1)
    i = int(gpre.argmin())
    if float(gpre[i]) < 0.0:
        best = gpre[i]
        best_mask = _mask_from_prefix(order, torch.tensor(i + 1))
    stack = [(torch.zeros(V, dtype=torch.bool), torch.ones(V, dtype=torch.bool))]
    nodes = 0
    while stack:
        A, Bm = stack.pop()
        A, Bm, U = prune(A, Bm)
        nodes += 1
        fA = f(A)
        if fA < best:
            best, best_mask = fA, A
        if U.numel() == 0:
            continue
        fB = f(Bm)
        if fB < best:
            best, best_mask = fB, Bm
        cB = qT[Bm].sum(0)
        mu = marg_upper(cB, U)
        if float(fA + mu.clamp(max=0.0).sum()) >= float(best) - 1e-15:
            continue
        x = U[int(mu.argmin())]
        A2 = A.clone()
        A2[x] = True
        B2 = Bm.clone()
        B2[x] = False
        stack.append((A, B2))
        stack.append((A2, Bm))
    return best.clamp(max=0.0), best_mask


EXACT_INDEPENDENT_MAX_V = 64  # rows with a duality gap left: exact branch and bound up to this V


def _independent(p, law):
    """Returns (alpha [...], H, lower [...], upper [...], exact bool [...]): certified bounds by the
    AM-GM lagrangian (independent.py); rows whose bounds do not meet (gap > 1e-12) and with
    V <= EXACT_INDEPENDENT_MAX_V are solved exactly by the branch and bound."""
    qs = law._q64()
    K, V = qs.shape[-2], qs.shape[-1]
    batch = p.shape[:-1]
    if K == 1:
        a, H = iid_scan(p, qs[..., 0, :].expand_as(p), 1)
        return a, H, a, a, torch.ones_like(a, dtype=torch.bool)
    P = p.reshape(-1, V)
    Q = qs.expand(*batch, K, V).reshape(-1, K, V)
    lower, upper, H, gap = independent_bounds(P, Q)
    exact = gap <= 1e-12
    same = (Q == Q[:, :1]).all(-1).all(-1)
    for i in range(P.shape[0]):
        if bool(same[i]):
            # identical draft distributions: the law is iid, whose sorted-prefix rule is exact
            v, m = iid_scan(P[i], Q[i, 0], K)
            v = v - 1.0
        elif not bool(exact[i]) and V <= EXACT_INDEPENDENT_MAX_V:
            v, m = _indep_row(P[i], Q[i])
        else:
            continue
        upper[i], lower[i], H[i], exact[i] = v, v, m, True
    alpha = (1.0 + upper).clamp(0.0, 1.0)
    lo = (1.0 + lower).clamp(0.0, 1.0)
    lo = torch.where(exact, alpha, lo)
    return (alpha.reshape(batch), H.reshape(*batch, V), lo.reshape(batch), alpha.reshape(batch),
            exact.reshape(batch))


class AcceptanceBounds(NamedTuple):
    """alpha* with its certificate: ``lower <= alpha* <= upper``; ``value`` is ``upper`` (the dual
    value of the returned set); ``exact`` where the bounds meet (to rounding, 1e-12)."""

    value: object
    lower: object
    upper: object
    exact: object


def optimal_acceptance(p, law: DraftLaw, *, return_set: bool = False, return_bounds: bool = False):
    """alpha* = 1 + min_H [p(H) - Q(all K drafts in H)] for the law, any V.

    Exact (error < 1e-12) for iid, greedy and wor. For ``independent`` the value is the upper
    bound 1 + f(H) of a set H, certified against a lower bound (AM-GM lagrangian, see
    limits/independent.py): the two meet (exact) on most rows; otherwise alpha* lies in
    ``[lower, value]`` (``return_bounds=True``), and small V (<= 64) is solved exactly.

    p is ``[..., V]`` (broadcast against the law's batch shape). Returns a float for an
    unbatched problem, else a float64 tensor ``[...]``; with ``return_set=True`` also the set H
    (bool ``[..., V]``), a certificate: ``1 + p(H) - Q(all in H)`` is the returned value; with
    ``return_bounds=True`` an ``AcceptanceBounds(value, lower, upper, exact)`` in place of the value
    (floats / bool for an unbatched problem, tensors otherwise).
    """
    p, batch = _check(p, law)
    lower = upper = exact = None
    if law.kind == "iid":
        alpha, H = iid_scan(p, law._q64().expand_as(p), law.k)
    elif law.kind == "greedy":
        alpha, H = _greedy(p, law)
    elif law.kind == "wor":
        alpha, H = _wor(p, law)
    elif law.kind == "independent":
        alpha, H, lower, upper, exact = _independent(p, law)
    else:  # pragma: no cover
        raise ValueError(f"law: unknown draft law kind {law.kind!r}")
    alpha = alpha.clamp(0.0, 1.0)
    out = float(alpha) if len(batch) == 0 else alpha
    if return_bounds:
        if lower is None:
            lower, upper, exact = alpha, alpha, torch.ones_like(alpha, dtype=torch.bool)
        if len(batch) == 0:
            out = AcceptanceBounds(float(alpha), float(lower), float(upper), bool(exact))
        else:
            out = AcceptanceBounds(alpha, lower, upper, exact)
    return (out, H) if return_set else out
