"""SpecTr K-SEQ (Sun et al. 2023), with rho* solved exactly and batched.

Notation: ``r(x) = p(x)/q(x)``, ``S(rho) = sum_x min(p(x), rho q(x)) = rho beta(rho)``,
``f(rho) = S(rho) - p_acc(rho) = S(rho) - 1 + (1 - S(rho)/rho)^K``. S is concave,
increasing and piecewise linear in rho with breakpoints at the ratios r(x); f is
increasing, f(1) <= 0 <= f(K) (Bernoulli), and rho* is its smallest root in [1, K].
Numerically f is evaluated as ``(1 - E)(rho - sum_{i<K} E^i)`` from the per-draft rejection
mass E(rho) = 1 - beta(rho) = sum_x (q(x) - p(x)/rho)+, a sum of nonnegative terms formed
within each row (``k_seq_f_rejected``): no 1 - (1 - beta)^K or S - 1 cancellation, rho* = 1
exactly when p == q, and a row's rho* never depends on the other rows of its batch.

Why the rule is lossless for any rho with f(rho) >= 0: draft i is reached with probability
(1-beta)^(i-1) and kept as y with probability min(p(y)/rho, q(y)), so the kept mass is
gamma min(p/rho, q) with gamma = p_acc/beta; f(rho) >= 0 means gamma <= rho, hence
p - gamma min(p/rho, q) >= 0 with total 1 - p_acc, which is exactly the probability that
every draft is rejected. rho* is the smallest such rho, so it maximises p_acc.

Cost. The accept test U_i <= r(x_i)/rho* is the same as t_i = r(x_i)/U_i >= rho*, i.e.
f(t_i) >= 0 (f is increasing). ``verify`` therefore never solves for rho* on rows whose
drafts decide without it: t_i >= K accepts and t_i < 1 rejects outright (rho* in [1, K]);
otherwise one pass over the row evaluates f(t_i) (float32 with an error margin, float64
when close) and narrows a per-row bracket for rho*. Only rows whose K drafts are all
rejected solve rho* exactly (bucketed breakpoints + a sort of one bucket), to build the
residual. The floor is one read of p and q for each row that needs f: memory bandwidth.
"""
from __future__ import annotations

import torch

from ._residual import inverse_cdf_blocked, residual_law, residual_or, rows_per_chunk
from .base import Verifier
from .registry import register

__all__ = ["SpecTr", "solve_rho", "solve_rho_rows", "k_seq_f", "k_seq_f_rejected", "kseq_sample"]

NBUCKETS = 256
BISECT_STEPS = 64


def k_seq_f(S: torch.Tensor, rho: torch.Tensor, K: int) -> torch.Tensor:
    """f = S - 1 + (1 - S/rho)^K, the K-SEQ root function, from S(rho) = rho beta(rho)."""
    return S - 1 + (1 - S / rho).clamp_min(0.0) ** K


def _geom(E: torch.Tensor, K: int) -> torch.Tensor:
    """sum_{i<K} E^i (Horner), E in [0, 1]: the factor gamma = p_acc/beta of the kept mass."""
    g = torch.ones_like(E)
    for _ in range(K - 1):
        g = 1 + E * g
    return g


def k_seq_f_rejected(E: torch.Tensor, rho: torch.Tensor, K: int) -> torch.Tensor:
    """f from the per-draft rejection mass E(rho) = 1 - beta(rho) = sum_x (q(x) - p(x)/rho)+:
    ``f = (1 - E) (rho - sum_{i<K} E^i)``.

    The same function as ``k_seq_f`` when p and q sum to 1, without its cancellations: E is
    a sum of nonnegative terms (exactly 0 when p == q, so rho* = 1 exactly there), and the
    sign, which is all the solver and the accept decisions use, is that of
    rho - gamma(rho) (or 0 when beta = 0 and nothing can be accepted).
    """
    E = E.clamp(0.0, 1.0)
    return (1 - E) * (rho - _geom(E, K))


def _ratios(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """r = p/q with p = 0 -> 0 and q = 0 < p -> inf.  p, q float64 [R, V]."""
    return torch.div(p, q).nan_to_num_(nan=0.0, posinf=float("inf"))  # 0/0 -> 0, x/0 -> inf, 0/x -> 0


def solve_rho(p: torch.Tensor, q: torch.Tensor, K: int, nbuckets: int = NBUCKETS) -> torch.Tensor:
    """rho* ``[R]`` in [1, K]: the smallest root of f, for float64 p, q ``[R, V]``.

    Exact up to float64 rounding: breakpoints r(x) in (1, K) are bucketed (one bincount),
    f is evaluated exactly at the bucket edges, the bucket holding the root is sorted, the
    linear piece of S holding the root is found, and the root of f on that piece is
    bisected to the last bit. The upper end of the final bracket is returned, so
    f(rho*) >= 0 up to rounding (the residual stays nonnegative).
    """
    return solve_rho_rows(p, q, torch.arange(p.shape[0], device=p.device), K, nbuckets)


def solve_rho_rows(P: torch.Tensor, Q: torch.Tensor, rows: torch.Tensor, K: int, nbuckets: int = NBUCKETS) -> torch.Tensor:
    """rho* ``[n]`` for rows ``rows`` of P, Q ``[B, V]`` (any float dtype), a cache-sized chunk of rows at a time."""
    V = P.shape[-1]
    if K == 1:  # f(rho) = S (1 - 1/rho) >= 0 on [1, K]: rho* = 1 (single-draft SD)
        return torch.ones(rows.numel(), dtype=torch.float64, device=P.device)
    step = max(1, rows_per_chunk(V, 8) // 2)
    parts = []
    for s0 in range(0, rows.numel(), step):
        rr = rows[s0 : s0 + step]
        parts.append(_segments(P.index_select(0, rr).double(), Q.index_select(0, rr).double(), K, nbuckets))
    ql, pl, lo, hi = (torch.cat(x) for x in zip(*parts))
    for _ in range(BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        up = k_seq_f_rejected(ql - pl / mid, mid, K) >= 0
        hi = torch.where(up, mid, hi)
        lo = torch.where(up, lo, mid)
    return hi


def _segments(p: torch.Tensor, q: torch.Tensor, K: int, nbuckets: int):
    """Per row of float64 p, q ``[R, V]``: (ql, pl, lo, hi) ``[R]`` with the rejection mass
    E(rho) = sum_x (q - p/rho)+ = ql - pl/rho on [lo, hi], f(lo) < 0 <= f(hi) (or lo == hi
    at the root).

    ql and pl are the q and p masses of the tokens with ratio below the segment, always
    formed as sums of nonnegative terms within the row (no differences of totals, no sum
    running across rows), so a row's rho* does not depend on the other rows of the batch.
    """
    R, V = p.shape
    dev = p.device
    nb = int(min(nbuckets, max(4, V // 64)))  # about 64 breakpoints per bucket; fewer edges for small V
    r = _ratios(p, q)  # [R, V]
    scale = nb / (K - 1)
    b = ((r - 1) * scale).floor_().clamp_(-1, nb).add_(1).long()  # [R, V]: 0 (r < 1), k in 1..nb ([c_{k-1}, c_k)), nb+1 (r >= K)
    off = (torch.arange(R, device=dev) * (nb + 2)).unsqueeze(-1)
    flat = (b + off).reshape(-1)
    Pb = torch.bincount(flat, weights=p.reshape(-1), minlength=R * (nb + 2)).view(R, nb + 2)
    Qb = torch.bincount(flat, weights=q.reshape(-1), minlength=R * (nb + 2)).view(R, nb + 2)
    cP = Pb.cumsum(-1)  # [R, nb+2]: mass of p with bucket <= k
    cQ = Qb.cumsum(-1)
    edges = 1 + torch.arange(nb + 1, dtype=torch.float64, device=dev) / scale  # c_0 = 1 .. c_nb = K
    edges[-1] = float(K)
    E_edge = cQ[:, : nb + 1] - cP[:, : nb + 1] / edges  # E(c_k): tokens with r < c_k
    ok = k_seq_f_rejected(E_edge, edges, K) >= 0  # [R, nb+1]
    ok[:, -1] = True  # f(K) >= 0 in exact arithmetic
    kstar = ok.to(torch.int8).argmax(-1)  # first edge with f >= 0
    one = torch.ones(R, dtype=torch.float64, device=dev)
    ql_out, pl_out, lo_out, hi_out = 0 * one, 0 * one, one.clone(), one.clone()  # f(1) >= 0: rho* = 1
    need = (kstar > 0).nonzero().squeeze(-1)  # rows whose root is inside (c_{k-1}, c_k]
    if need.numel() == 0:
        return ql_out, pl_out, lo_out, hi_out
    kk = kstar[need]  # [n]
    lo_edge = edges[kk - 1]
    hi_edge = edges[kk]
    A = cP[need, kk - 1]  # p mass with r < c_{k-1}
    Aq = cQ[need, kk - 1]  # q mass with r < c_{k-1}
    # breakpoints inside the bucket, plus the two bucket edges as massless sentinels
    kfull = torch.where(kstar > 0, kstar, torch.full_like(kstar, -1))
    sel = (b == kfull.unsqueeze(-1)).nonzero()  # [m, 2] (row, column), rows in increasing order
    n = need.numel()
    pos = torch.full((R,), -1, dtype=torch.long, device=dev)
    pos[need] = torch.arange(n, device=dev)  # row -> position in need
    ar = torch.arange(n, device=dev)
    seg = torch.cat([pos[sel[:, 0]], ar, ar])
    rows_full = sel[:, 0]
    tr = torch.cat([r[rows_full, sel[:, 1]], lo_edge, hi_edge])
    tp = torch.cat([p[rows_full, sel[:, 1]], torch.zeros(2 * n, dtype=torch.float64, device=dev)])
    tq = torch.cat([q[rows_full, sel[:, 1]], torch.zeros(2 * n, dtype=torch.float64, device=dev)])
    o1 = torch.sort(tr, stable=True).indices
    o2 = torch.sort(seg[o1], stable=True).indices
    order = o1[o2]  # sorted by (row, r)
    seg, tr, tp, tq = seg[order], tr[order], tp[order], tq[order]
    counts = torch.bincount(seg, minlength=n)
    start = torch.cumsum(counts, 0) - counts  # [n]
    j = torch.arange(tr.numel(), device=dev)
    col = j - start[seg]  # position within the row
    L = int(counts.max())
    # per-row exclusive prefix sums in a padded [n, L + 1] layout
    grid = torch.zeros(2, n, L + 1, dtype=torch.float64, device=dev)
    grid[0, seg, col + 1] = tp
    grid[1, seg, col + 1] = tq
    grid = grid.cumsum(-1)
    pex = grid[0, seg, col]  # p mass of this row's breakpoints strictly before j
    qex = grid[1, seg, col]
    E_j = (Aq[seg] + qex) - (A[seg] + pex) / tr
    okj = k_seq_f_rejected(E_j, tr, K) >= 0
    big = torch.full_like(j, tr.numel())
    first = torch.full((n,), tr.numel(), dtype=torch.long, device=dev)
    first = first.scatter_reduce(0, seg, torch.where(okj, j, big), reduce="amin", include_self=True)
    last = start + counts - 1
    first = torch.minimum(first, last)  # rounding: the hi sentinel closes every bracket
    prev = torch.maximum(first - 1, start)
    lo, hi = tr[prev], tr[first]
    ql_out[need] = Aq + qex[first]  # E(rho) = ql - pl / rho on (t_prev, t_first]
    pl_out[need] = A + pex[first]
    lo_out[need], hi_out[need] = lo, hi
    return ql_out, pl_out, lo_out, hi_out


def _residual(p64: torch.Tensor, q64: torch.Tensor, rho: torch.Tensor, K: int):
    """(unnormalised residual (p - gamma min(p/rho, q))+ [R, V], min(p/rho, q) [R, V])."""
    m = torch.minimum(p64 / rho, q64)  # rho [R, 1]
    # gamma = p_acc / beta = sum_{i<K} E^i with E = sum (q - m) the per-draft rejection mass:
    # no division, no 1 - (1 - beta)^K cancellation; E = 1 (beta = 0) gives gamma = K
    E = (q64 - m).sum(-1, keepdim=True)
    gamma = _geom(E.clamp(0.0, 1.0), K)
    return (p64 - gamma * m).clamp_min_(0.0), m


def _f_rows(P: torch.Tensor, Q: torch.Tensor, rows: torch.Tensor, t: torch.Tensor, K: int) -> torch.Tensor:
    """f(t) [n] for rows ``rows`` [n] of P, Q [B, V] at points t [n] (float64), chunked.

    float32 inputs are evaluated in float32 first; a value within the float32 error margin
    of 0 is recomputed in float64, so the sign (the accept decision) is exact.
    """
    V = P.shape[-1]
    out = torch.empty(rows.numel(), dtype=torch.float64, device=P.device)
    lowp = P.dtype != torch.float64 or Q.dtype != torch.float64
    step = rows_per_chunk(V, 4 if lowp else 8)
    margin = 1e-4 * K
    for s0 in range(0, rows.numel(), step):
        rr = rows[s0 : s0 + step]
        tt = t[s0 : s0 + step].unsqueeze(-1)  # [r, 1]
        pr = P.index_select(0, rr)
        qr = Q.index_select(0, rr)
        # E(t) = sum_x (q t - p)+ / t, the rejection mass at rho = t
        if lowp:
            pr, qr = pr.float(), qr.float()
            E = (qr * tt.float() - pr).clamp_min_(0.0).sum(-1, keepdim=True).double() / tt
            f = k_seq_f_rejected(E, tt, K)
            close = (f.abs() < margin).squeeze(-1)
            if bool(close.any()):
                p64, q64 = pr[close].double(), qr[close].double()
                E64 = (q64 * tt[close] - p64).clamp_min_(0.0).sum(-1, keepdim=True) / tt[close]
                f[close] = k_seq_f_rejected(E64, tt[close], K)
        else:
            E = (qr * tt - pr).clamp_min_(0.0).sum(-1, keepdim=True) / tt
            f = k_seq_f_rejected(E, tt, K)
        out[s0 : s0 + rr.numel()] = f.squeeze(-1)
    return out


@register
class SpecTr(Verifier):
    r"""SpecTr K-SEQ: sequential acceptance with a boosted threshold.

    With :math:`\beta(\rho) = \sum_x \min(p(x)/\rho, q(x))` and
    :math:`p_{acc}(\rho) = 1 - (1 - \beta(\rho))^K`, take the smallest
    :math:`\rho^* \in [1, K]` with :math:`p_{acc}(\rho^*) = \rho^* \beta(\rho^*)`. Accept the
    first draft with :math:`U_i \le p(x_i) / (\rho^* q(x_i))`; if none is accepted, sample
    from :math:`\mathrm{norm}((p - \gamma \min(p/\rho^*, q))_+)`,
    :math:`\gamma = p_{acc}/\beta`. Lossless for K iid drafts. Sun et al., "SpecTr: Fast
    Speculative Decoding via Optimal Transport" (NeurIPS 2023).
    """

    name = "spectr"
    laws = ("iid",)

    def _check(self, p, q, drafts, law, validate=True):
        p, q, drafts, kind = super()._check(p, q, drafts, law, validate)
        if q.ndim == p.ndim + 1:
            raise ValueError(
                "draft_probs: spectr (K-SEQ) needs the one draft distribution [..., V] of its K iid drafts, "
                f"got per-draft shape {tuple(q.shape)}"
            )
        return p, q, drafts, kind

    def _verify(self, p, q, drafts, g, law):
        # p [..., V], q [..., V] (float64 rows), drafts [..., K]
        P, Q, X, batch = self._flat(p, q, drafts)
        B, K = X.shape
        u = torch.rand(B, K, generator=g, dtype=torch.float64, device=p.device)
        u_res = torch.rand(B, generator=g, dtype=torch.float64, device=p.device)
        return kseq_sample(P, Q, X, u, u_res).reshape(batch)

    def _output_distribution(self, p, q, drafts, law):
        P, Q, X, batch = self._flat(p, q, drafts)
        V, K = P.shape[-1], X.shape[-1]
        rho = solve_rho(P, Q, K).unsqueeze(-1)  # [N, 1]
        res, _ = _residual(P, Q, rho, K)
        res = residual_law(res, P)  # the sampling path's residual, normalised
        px = P.gather(-1, X)
        qx = Q.gather(-1, X)
        a = (px / (rho * qx)).clamp(max=1.0)  # [N, K]
        out = torch.zeros_like(P)
        stay = torch.ones_like(rho)
        for i in range(K):
            out = out.scatter_add(-1, X[:, i : i + 1], stay * a[:, i : i + 1])
            stay = stay * (1 - a[:, i : i + 1])
        return (out + stay * res).reshape(*batch, V)


def kseq_sample(P, Q, X, u, u_res) -> torch.Tensor:
    """K-SEQ sampling path on given uniforms. P, Q ``[B, V]``, X ``[B, K]``, u ``[B, K]``, u_res ``[B]``."""
    B, V = P.shape
    K = X.shape[-1]
    dev = P.device
    px = P.gather(-1, X).double()  # [B, K]
    qx = Q.gather(-1, X).double()
    lo = torch.ones(B, dtype=torch.float64, device=dev)  # bracket of rho*: lo <= rho* <= hi
    hi = torch.full((B,), float(K), dtype=torch.float64, device=dev)
    token = X[:, 0].clone()
    live = torch.arange(B, device=dev)
    for i in range(K):
        # accept iff u q rho* <= p  <=>  t = p / (u q) >= rho*
        t = px[live, i] / (u[live, i] * qx[live, i])  # u = 0 gives inf: accept
        acc = t >= hi[live]
        amb = ~acc & (t >= lo[live])
        if bool(amb.any()):
            ra, ta = live[amb], t[amb]
            up = _f_rows(P, Q, ra, ta, K) >= 0  # rho* <= t
            hi[ra] = torch.where(up, torch.minimum(hi[ra], ta), hi[ra])
            lo[ra] = torch.where(up, lo[ra], torch.maximum(lo[ra], ta))
            acc[amb] = up
        token[live[acc]] = X[live[acc], i]
        live = live[~acc]
        if live.numel() == 0:
            return token
    # every draft rejected: solve rho* exactly and sample the residual, a chunk of rows at a time
    rho_all = solve_rho_rows(P, Q, live, K)
    step = max(1, rows_per_chunk(V, 8) // 2)
    for s0 in range(0, live.numel(), step):
        rows = live[s0 : s0 + step]
        p64 = P.index_select(0, rows).double()
        q64 = Q.index_select(0, rows).double()
        rho = rho_all[s0 : s0 + step]
        res, _ = _residual(p64, q64, rho.unsqueeze(-1), K)
        # empty: p_acc == 1 up to rounding (p == q), the residual is p itself
        token[rows] = inverse_cdf_blocked(residual_or(res, p64), u_res[rows])
    return token
