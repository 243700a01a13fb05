r"""Exact alpha* for drafts without replacement at full vocabulary size (fast path).

alpha* = 1 + min_n [P_n - Q(H_n)] over the prefixes H_n of the tokens sorted by q/p
decreasing, Q(H) = P(all K draws without replacement land in H). Through the exponential
race (token x arrives at T_x ~ Exp(q_x); r = q(outside H), lam = q(H)) and its Poissonised
version (the iid law: arrivals in H form a Poisson process of rate lam):

    Q(H) = (lam / (lam + r))^K - int_0^inf r e^{-rt} [P(N_H(t) < K) - Pois_{lam t}(< K)] dt

(the first term is the iid value q(H)^K; the bracket vanishes like t^K at 0 and both of its
terms decay at large t). ``P(N_H(t) = j), j < K`` is a Poisson binomial, the z^j
coefficients of prod_{x in H} (e^{-q_x t} + z (1 - e^{-q_x t})), split per row by a
threshold tau = THETA / T (T the last quadrature node):

* heavy tokens (q > tau, at most 1/tau of them): the product taken token by token in
  nonnegative arithmetic, stored after every heavy token along the prefix order;
* light tokens (q t <= THETA at every node): in the truncated ring R[z]/z^K,
  prod (1 + z w_x) = exp(sum_m (-1)^{m+1} z^m p_m / m), p_m = sum_x w_x^m, w_x = e^{q_x t} - 1,
  and p_m(t) = sum_{k=m}^{D} a_{m,k} t^k S_k with S_k = sum_x q_x^k (prefix sums, one cumsum
  per power) and a_{m,k} the Taylor coefficients of (e^y - 1)^m, so no work per token and
  node. With w <= e^THETA - 1 the alternating log series costs at most a factor
  (1 + 2w)^K of rounding (forward error analysis of the exp recursion).

Only prefixes that can hold the minimum are evaluated: candidates come from the bounds
q(H)^K >= Q(H) >= prod_i (q(H) - M_i)/(1 - M_i); then bracketing by monotonicity
(Q(H_n) <= Q(H_m) for n < m, so g(n) >= P_n - min(q(H_n)^K, Q(H_m)) for the next evaluated m)
prunes candidates in rounds, so only a few dozen prefixes per row get the exact value.

Error bound on alpha* (float64; see docs/guide/optimal_acceptance.md): trapezoid rule in s = log t
with step h = 1/4 on an integrand analytic and bounded in |Im s| < pi/2: O(e^{-pi^2/h}) < 1e-16;
lower cut (t < t_lo) <= t_lo^{K+1}/(K+1)! <= 1e-17; upper cut at T: <= e^{-rT} max(P(N_H(T)<K),
Pois(<K)) <= 1e-17 (Chernoff, checked per candidate); series truncation <= 1e-18 relative;
rounding <= (1 + 2(e^THETA - 1))^K * 8 K * 2^-53 * (number of nodes) < 2e-13. Total < 5e-13.
"""
from __future__ import annotations

import math

import torch

__all__ = ["wor_prefix_min", "THETA", "H_STEP"]

THETA = 0.125     # light tokens: q t <= THETA at every node
H_STEP = 0.125    # trapezoid step in s = log t
_TAIL = 1e-17     # each cut tail
_MARGIN = 1e-12   # pruning margin (> twice the evaluation error bound)
HEAVY_MAX = 4096  # rows needing more heavy tokens fall back to the token-by-token scan
_ROUND = 48       # prefixes evaluated per bracketing round and row


def _series_degree(K: int) -> int:
    # tail of (e^y-1)^m = y^m sum_i c_i y^i with c_i <= m^i/i!: sum_{i>I} (m THETA)^i / i! < 1e-18
    m = max(1, K - 1)
    i, term, tail = 0, 1.0, 0.0
    while True:
        i += 1
        term *= m * THETA / i
        if term < 1e-19:
            return m + i
        tail += term


_COEF: dict = {}


def _stirling(K: int, D: int) -> torch.Tensor:
    """a[m-1, k] = [y^k] (e^y - 1)^m, m = 1..K-1, k = 0..D (float64 [K-1, D+1])."""
    key = (K, D)
    if key not in _COEF:
        e1 = torch.zeros(D + 1, dtype=torch.float64)
        for k in range(1, D + 1):
            e1[k] = 1.0 / math.factorial(k)
        rows, cur = [], e1.clone()
        for m in range(1, K):
            rows.append(cur.clone())
            nxt = torch.zeros(D + 1, dtype=torch.float64)
            for k in range(D + 1):
                if cur[k] != 0:
                    nxt[k:] += cur[k] * e1[: D + 1 - k]
            cur = nxt
        _COEF[key] = torch.stack(rows) if rows else torch.zeros(0, D + 1, dtype=torch.float64)
    return _COEF[key]


def _pois_below(x: torch.Tensor, K: int) -> torch.Tensor:
    """P(Poisson(x) < K), x >= 0, in nonnegative arithmetic."""
    term = torch.exp(-x)
    tot = term.clone()
    for j in range(1, K):
        term = term * x / j
        tot = tot + term
    return tot


def _choose_T(qs, rr, lam, cand_idx, K):
    """Smallest T = 2^i (i >= 3) whose cut tail is <= _TAIL at every candidate prefix of the row.
    Returns (T, heavy bool [V]) or None when the row needs more than HEAVY_MAX heavy tokens."""
    r = rr[cand_idx]
    la = lam[cand_idx]
    qs = qs[: int(cand_idx.max()) + 1]
    for i in range(3, 64):
        T = float(2.0**i)
        tau = THETA / T
        heavy = qs > tau
        if int(heavy.sum()) > HEAVY_MAX:
            return None
        light_mass = torch.cumsum(torch.where(heavy, 0.0, qs), 0)[cand_idx]
        nh = torch.cumsum(heavy.double(), 0)[cand_idx]
        # Chernoff: P(N < K) <= e^{K-1} E e^{-N} <= e^{K-1} exp(-(1 - 1/e) mu), mu = sum (1 - e^{-q T})
        mu = (1.0 - THETA / 2) * T * light_mass + nh * (-math.expm1(-tau * T))
        b1 = (K - 1) - (1.0 - math.exp(-1.0)) * mu
        b2 = torch.log(_pois_below(la * T, K).clamp_min(1e-300))
        lb = torch.maximum(b1.clamp(max=0.0), b2) - r * T + torch.log1p(r * T)  # (1 + rT) e^{-rT} max(...)
        if bool((lb <= math.log(_TAIL)).all()):
            return T, heavy
    return None


def _row_eval(ps_row, qs_row, rr, lam, cp, cand_idx, K, T, heavy):
    """Exact Q(H_n) at the prefixes n (0-based last index) in cand_idx; returns a closure."""
    n_hi = int(cand_idx.max()) + 1
    qs = qs_row[:n_hi]
    hv = heavy[:n_hi]
    tau = THETA / T
    s_lo = (math.log(_TAIL) + math.lgamma(K + 2)) / (K + 1)
    s = torch.arange(s_lo, math.log(T) + 1e-12, H_STEP, dtype=torch.float64)  # [M]
    t = torch.exp(s)
    # heavy states along the prefix: hs[i] = coefficients z^0..z^{K-1} after i heavy tokens
    hq = qs[hv]
    Mn = t.numel()
    hs = torch.zeros(hq.numel() + 1, Mn, K, dtype=torch.float64)
    st = torch.zeros(Mn, K, dtype=torch.float64)
    st[:, 0] = 1.0
    hs[0] = st
    if hq.numel():
        qt = hq.unsqueeze(-1) * t  # [nh, M]
        E = torch.exp(-qt)
        F = -torch.expm1(-qt)
        for i in range(hq.numel()):
            nxt = st * E[i].unsqueeze(-1)
            nxt[:, 1:] += st[:, :-1] * F[i].unsqueeze(-1)
            st = nxt
            hs[i + 1] = st
    hcount = torch.cumsum(hv.long(), 0)  # heavy tokens among the first n+1
    # light power sums, normalised: S_k / tau^k = sum (q/tau)^k over light tokens of the prefix
    D = _series_degree(K)
    x = torch.where(hv, 0.0, qs / tau)  # [n_hi], in [0, 1]
    A = _stirling(K, D)  # [K-1, D+1]
    # basis[k, i] = (tau t_i)^k, k = 1..D
    y = (tau * t).unsqueeze(0) ** torch.arange(1, D + 1, dtype=torch.float64).unsqueeze(-1)  # [D, M]
    Bm = (A[:, 1:].unsqueeze(-1) * y.unsqueeze(0)).permute(1, 2, 0).reshape(D, Mn * (K - 1))  # [D, M*(K-1)]
    light_mass = torch.cumsum(torch.where(hv, 0.0, qs), 0)
    # prefix power sums of the light tokens (q/tau)^k, k = 1..D, at the prefixes of the window
    # [lo, n_hi): the tokens before it as one sum per power, the window as cumsums (all terms >= 0)
    lo = int(cand_idx.min())
    PW = torch.empty(n_hi - lo, D, dtype=torch.float64)
    xb, xw = x[:lo].clone(), x[lo:].clone()
    pb, pwn = xb.clone(), xw.clone()
    for k in range(D):
        if k:
            pb.mul_(xb)
            pwn.mul_(xw)
        PW[:, k] = torch.cumsum(pwn, 0) + pb.sum()

    def evaluate(idx):  # idx: LongTensor [n] of prefix end indices
        pm = (PW[idx - lo] @ Bm).reshape(-1, Mn, K - 1)  # [n, M, K-1]: p_m(t)
        Lt = light_mass[idx].unsqueeze(-1) * t  # [n, M]
        g = [torch.exp(-Lt)]
        for j in range(1, K):
            acc = torch.zeros_like(Lt)
            for m in range(1, j + 1):
                sgn = 1.0 if m % 2 == 1 else -1.0
                acc = acc + sgn * pm[..., m - 1] * g[j - m]
            g.append(acc / j)
        gl = torch.stack(g, -1)  # [n, M, K]: P(N_light = j) (times nothing: e^{-tL} folded in)
        hh = hs[hcount[idx]]  # [n, M, K]
        below = torch.zeros_like(Lt)
        for a in range(K):
            below = below + hh[..., a] * gl[..., : K - a].sum(-1)
        la = lam[idx].unsqueeze(-1)
        r = rr[idx].unsqueeze(-1)
        diff = below - _pois_below(la * t, K)
        w = torch.exp(torch.log(r * t) - r * t) * H_STEP  # r t e^{-rt} ds
        integral = (w * diff).sum(-1)
        lam_n, r_n = lam[idx], rr[idx]
        Q = (lam_n / (lam_n + r_n)) ** K - integral
        return Q.clamp(0.0, 1.0)

    return evaluate


def wor_prefix_min(ps, qs, cp, rr, lam, cand, upper_g, K):
    """Minimum over candidate prefixes of cp - Q for each row.

    ps, qs, cp, rr, lam: ``[B, V]`` sorted masses, prefix p mass, q mass outside and inside
    each prefix; cand bool ``[B, V]`` (prefixes not excluded by the bounds and not proven Q = 1);
    upper_g ``[B]`` an achievable value (upper bound on the minimum).
    Returns (g ``[B, V]``: exact at evaluated prefixes, +inf at pruned ones; rows left to the scan).
    """
    B, V = ps.shape
    g = torch.full((B, V), math.inf, dtype=torch.float64)
    slow = []
    for b in range(B):
        ci = cand[b].nonzero().squeeze(-1)
        if ci.numel() == 0:
            continue
        ch = _choose_T(qs[b], rr[b], lam[b], ci, K)
        if ch is None:
            slow.append(b)
            continue
        T, heavy = ch
        ev = _row_eval(ps[b], qs[b], rr[b], lam[b], cp[b], ci, K, T, heavy)
        done = torch.zeros(ci.numel(), dtype=torch.bool)
        Qv = torch.full((ci.numel(),), math.nan, dtype=torch.float64)
        best = float(upper_g[b])
        lowQ_iid = (1.0 - rr[b][ci]).clamp(0.0, 1.0) ** K  # q(H)^K >= Q(H)
        cpc = cp[b][ci]
        alive = torch.ones(ci.numel(), dtype=torch.bool)
        while True:
            todo = (alive & ~done).nonzero().squeeze(-1)
            if todo.numel() == 0:
                break
            if todo.numel() > _ROUND:
                pick = todo[torch.linspace(0, todo.numel() - 1, _ROUND).round().long().unique()]
                # always include the candidate with the smallest lower bound
                lbq = cpc[todo] - lowQ_iid[todo]
                pick = torch.unique(torch.cat([pick, todo[lbq.argmin()].view(1)]))
            else:
                pick = todo
            Qv[pick] = ev(ci[pick])
            done[pick] = True
            best = min(best, float((cpc[pick] - Qv[pick]).min()))
            # next evaluated candidate at or after each position: its Q bounds Q from above
            pos = torch.arange(ci.numel())
            nxt_idx = torch.where(done, pos, ci.numel())
            nxt = torch.flip(torch.cummin(torch.flip(nxt_idx, [0]), 0).values, [0])
            Qnext = torch.cat([Qv, torch.ones(1, dtype=torch.float64)])[nxt]
            lb = cpc - torch.minimum(lowQ_iid, Qnext)
            alive = alive & (done | (lb <= best + _MARGIN))
        gb = torch.full((ci.numel(),), math.inf, dtype=torch.float64)
        gb[done] = cpc[done] - Qv[done]
        g[b, ci] = gb
    return g, slow
