r"""The optimal verifier for i.i.d. drafts at any vocabulary size (``optimal``).

Exactly lossless whatever the fit does; acceptance alpha* when the fit converges.
See docs/optimal_verifier.md for the derivation. Per row:

1. **Order and scan.** Tokens t_1..t_V by q/p decreasing (``limits.dual.prefix_order``, the
   tie rule of the alpha* scan), prefix sums P_j, Q_j, ``psi_j = P_j - Q_j^K``
   (psi_0 = 0 = psi_V), j* = argmin psi, ``alpha* = 1 + psi_j*``.
2. **Target selection law** ``q_sel``: ``p_j + m_{j-1} - m_j`` for j <= j* and
   ``p_j - (s_j - s_{j-1})`` for j > j* (m prefix minimum, s suffix minimum of psi).
3. **Layers**: maximal runs (a, b] between records of m (on 1..j*) and of s (on j*..V). A
   layer carries ``Q_b^K - Q_a^K`` of q_sel: the probability that the draft of largest
   index lies in it. The draft in the highest layer wins.
4. **Inside a layer: a level race.** The layer has M levels; token y sits on level
   ``lo_y`` with probability ``1 - f_y`` and on ``lo_y + 1`` with probability ``f_y`` (each
   draft slot draws its own level). The slot on the highest level wins; ties are broken
   uniformly. With ``D_l`` = per-slot probability of a priority below level l (lower layers
   included) and ``mu_l = D_{l+1} - D_l``, the winner is on level l with probability
   ``D_{l+1}^K - D_l^K`` and is then a uniform slot there, so the selection law is the
   exact finite sum

       r(y) = q_y [(1 - f_y) W_{lo_y} + f_y W_{lo_y + 1}],   W_l = (D_{l+1}^K - D_l^K) / mu_l,

   (W_l = sum_i D_{l+1}^i D_l^{K-1-i}: no cancellation). Only the ratio ``c_y = q_sel(y)/q_y``
   matters for the fit: given the levels, y is placed by linear interpolation of c_y between
   the two W values around it, and the level masses that placement induces define new
   levels. That fixed point is iterated on the M level masses alone: the tokens of a layer
   are already sorted by c (they are sorted by q/p), so every iteration is M binary searches
   and bucket sums from prefix sums, O(M log V) per layer, however many tokens it holds.
5. **Accept** the selected Z with ``min(1, p(Z)/r(Z))``, else sample ``norm((p - r)+)``,
   where r is recomputed exactly from the levels the tokens were actually given. The output
   law is p for ANY level placement (Khisti et al.'s two-step form); only the acceptance
   ``sum_y min(p(y), r(y))`` depends on the fit, and equals alpha* when r = q_sel.

Per-row cost: one stable sort of V float64 ratios, a constant number of O(V) passes (prefix
sums, minima, the final placement), and ``iterations x layers x M log V`` for the fit. The
fit diagnostics (``fit``) report r, q_sel, alpha*, the acceptance reached, the fit error
and iterations; a fit that stops short is reported (``OptimalFit.shortfall``, a warning
from ``verify``), never silently, and the output law stays exactly p.

Corners: K = 1 puts every token alone (r = q): single-draft SD. Tokens with q = 0 are never
drafted and get r = 0. Tokens with p = 0 < q come first (ratio inf), each its own layer.
Ties in q/p follow the stable sort; equal psi values are not records (strict minima).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ..limits.dual import prefix_order
from ._residual import sample_rows
from .base import Verifier
from .registry import register

__all__ = ["Optimal", "OptimalFit", "chord"]

DEFAULT_LEVELS = 32
DEFAULT_MAX_ITER = 500
DEFAULT_TOL = 1e-13
FLOOR_TOL_FACTOR = 1e3  # a unit whose residual stopped improving within this factor of tol is done
UNIT_CHUNK_ELEMS = 1 << 22  # bound on units x levels held at once in the fit


def chord(lo: torch.Tensor, hi: torch.Tensor, K: int) -> torch.Tensor:
    """(hi^K - lo^K) / (hi - lo) = sum_i hi^i lo^(K-1-i), with the limit K lo^(K-1) at hi = lo."""
    s = torch.zeros_like(lo)
    hp = torch.ones_like(hi)
    for i in range(K):
        s = s + hp * lo ** (K - 1 - i)
        hp = hp * hi
    return s


@dataclass
class OptimalFit:
    """Diagnostics of the fitted selection rule, one entry per row (leading dims flattened).

    ``r`` / ``q_sel`` are ``[..., V]`` float64 in token order; the rest are ``[...]``.
    ``acceptance`` is the exact acceptance of the fitted rule, ``sum_y min(p, r)``;
    ``shortfall = alpha_star - acceptance`` (>= 0 up to rounding).
    """

    r: torch.Tensor             # [..., V] selection law induced by the fitted levels (exact)
    q_sel: torch.Tensor         # [..., V] target selection law (closed form)
    alpha_star: torch.Tensor    # [...]
    acceptance: torch.Tensor    # [...]
    fit_error_max: torch.Tensor  # [...] max_y |r - q_sel|
    fit_error_l1: torch.Tensor  # [...] sum_y |r - q_sel|
    n_layers: torch.Tensor      # [...] number of layers
    n_fitted: torch.Tensor      # [...] layers with more than one drafted token (fitted)
    largest_layer: torch.Tensor  # [...] tokens in the largest layer
    iterations: int             # fixed-point iterations run (shared by the batch)
    converged: bool             # the level masses stopped moving (to tol) before max_iter
    levels: int

    @property
    def shortfall(self) -> torch.Tensor:
        return self.alpha_star - self.acceptance


class _Plan:
    """Everything verify / output_distribution need, in sorted position space. Rows are flat [R, ...]."""

    __slots__ = ("order", "rank", "lid", "lo", "frac", "r_sorted", "fit")


def _plan(p: torch.Tensor, q: torch.Tensor, K: int, levels: int, max_iter: int, tol: float) -> _Plan:
    """p, q float64 [R, V] (normalised). Returns the plan with the fitted level race."""
    R, V = p.shape
    dev = p.device
    dt = torch.float64
    order = prefix_order(p, q)  # [R, V]
    ps = p.gather(-1, order)
    qs = q.gather(-1, order)
    zero = torch.zeros(R, 1, dtype=dt, device=dev)
    P = torch.cat([zero, torch.cumsum(ps, -1)], -1)  # [R, V+1]
    Qc = torch.cat([zero, torch.cumsum(qs, -1)], -1)  # [R, V+1]
    psi = P - Qc**K
    psi[:, 0] = 0.0
    psi[:, V] = 0.0
    jstar = psi.argmin(-1)  # first minimiser
    m = torch.cummin(psi, -1).values
    s = torch.flip(torch.cummin(torch.flip(psi, [-1]), -1).values, [-1])
    idx = torch.arange(V + 1, device=dev)
    js = jstar.unsqueeze(-1)
    # q_sel on sorted positions (token j = position i + 1)
    jj = idx[1:]
    below = jj.unsqueeze(0) <= js  # [R, V]
    qsel_s = torch.where(below, ps + m[:, :-1] - m[:, 1:], ps - (s[:, 1:] - s[:, :-1]))
    # boundaries: records of the prefix minimum on 1..j*, of the suffix minimum on j*..V-1
    bnd = torch.zeros(R, V + 1, dtype=torch.bool, device=dev)
    if K == 1:
        bnd[:] = True  # every token alone: r = q, single-draft SD
    else:
        rec_m = torch.zeros_like(bnd)
        rec_m[:, 1:] = (m[:, 1:] < m[:, :-1]) & (idx[1:].unsqueeze(0) <= js)
        rec_s = torch.zeros_like(bnd)
        rec_s[:, :-1] = (s[:, :-1] < s[:, 1:]) & (idx[:-1].unsqueeze(0) >= js)
        bnd = rec_m | rec_s
        bnd[:, 0] = True
        bnd[:, V] = True
    cb = torch.cumsum(bnd[:, :V].to(torch.int64), -1)  # [R, V]
    lid = cb - 1  # layer index of sorted position i (token j = i + 1), monotone
    n_layers = cb[:, -1]
    a_pos = torch.cummax(torch.where(bnd[:, :V], idx[:V], torch.zeros_like(idx[:V])), -1).values  # [R, V]
    bb = torch.where(bnd[:, 1:], idx[1:], torch.full_like(idx[1:], V))
    b_pos = torch.flip(torch.cummin(torch.flip(bb, [-1]), -1).values, [-1])  # [R, V]
    Qa = Qc.gather(-1, a_pos)
    Qb = Qc.gather(-1, b_pos)
    size = b_pos - a_pos
    # default (one level per layer): r = q * chord(Qa, Qb)
    W1 = chord(Qa, Qb, K)
    r_s = qs * W1
    lo = torch.zeros(R, V, dtype=torch.int64, device=dev)
    frac = torch.zeros(R, V, dtype=dt, device=dev)
    # layers to fit: two tokens or more and positive draft mass
    unit_tok = (size >= 2) & (Qb > Qa)
    iters, conv = 0, True
    if bool(unit_tok.any()):
        iters, conv = _fit_units(qs, qsel_s, Qc, a_pos, b_pos, unit_tok, r_s, lo, frac, K, levels, max_iter, tol)
    plan = _Plan()
    plan.order = order
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, idx[:V].expand(R, V).contiguous())
    plan.rank = rank
    plan.lid = lid
    plan.lo = lo
    plan.frac = frac
    plan.r_sorted = r_s
    # diagnostics (exact, O(V))
    err = (r_s - qsel_s).abs()
    acc = torch.minimum(ps, r_s).sum(-1)
    alpha = (1.0 + psi.gather(-1, js).squeeze(-1)).clamp(0.0, 1.0)
    r_tok = torch.empty_like(r_s).scatter_(-1, order, r_s)
    qsel_tok = torch.empty_like(qsel_s).scatter_(-1, order, qsel_s)
    largest = torch.zeros(R, dtype=torch.int64, device=dev)
    largest = size.amax(-1)
    n_fit = (unit_tok & (idx[:V].unsqueeze(0) == a_pos)).sum(-1)
    plan.fit = OptimalFit(
        r=r_tok, q_sel=qsel_tok, alpha_star=alpha, acceptance=acc, fit_error_max=err.amax(-1),
        fit_error_l1=err.sum(-1), n_layers=n_layers, n_fitted=n_fit, largest_layer=largest,
        iterations=iters, converged=conv, levels=levels,
    )
    return plan


def _fit_units(qs, qsel_s, Qc, a_pos, b_pos, unit_tok, r_s, lo_out, frac_out, K, M, max_iter, tol):
    """Fit the level race of every multi-token layer (a "unit"); writes r_s, lo, frac in place.

    Every quantity of a unit is computed from its own row only (row-wise prefix sums, a
    binary search inside the unit's range, per-unit convergence), so the rule a row gets
    does not depend on the other rows of the batch. Units are grouped by level count and
    processed in chunks bounded by UNIT_CHUNK_ELEMS."""
    R, V = qs.shape
    dev = qs.device
    dt = torch.float64
    starts_mask = unit_tok & (torch.arange(V, device=dev).unsqueeze(0) == a_pos)
    u_flat = starts_mask.reshape(-1).nonzero().squeeze(-1)  # flat sorted position of each unit's first token
    u_row = u_flat // V
    u_a = u_flat % V
    u_b = b_pos.reshape(-1)[u_flat]
    n_u = u_b - u_a
    m_unit = torch.minimum(n_u, torch.full_like(n_u, M))  # a layer of n tokens gets min(M, n) levels
    ct = torch.cat([torch.zeros(R, 1, dtype=dt, device=dev), torch.cumsum(qsel_s, -1)], -1)  # [R, V+1]
    c = torch.where(qs > 0, qsel_s / torch.where(qs > 0, qs, torch.ones_like(qs)), torch.full_like(qs, torch.inf))
    res_u = torch.zeros(u_flat.numel(), dtype=dt, device=dev)  # final fixed-point residual per unit
    iters_max = _fit_groups(torch.arange(u_flat.numel(), device=dev), m_unit, qs, c, Qc, ct, u_row, u_a, u_b,
                            r_s, lo_out, frac_out, K, max(1, max_iter // 4), tol, res_u)
    # a unit that stalls at one level count (a quarter of max_iter) is refitted with half, then
    # twice as many levels, max_iter each (any placement is exact; the one with the lower
    # residual is kept, token by token of the unit). Units that _fit_chunk stopped at their
    # rounding floor (residual <= FLOOR_TOL_FACTOR * tol) are done and not refitted.
    for alt in (max(M // 2, 2), 2 * M):
        bad = (res_u > FLOOR_TOL_FACTOR * tol).nonzero().squeeze(-1)
        if bad.numel() == 0:
            break
        m_alt = torch.minimum(n_u[bad], torch.full_like(n_u[bad], alt))
        lens = n_u[bad]
        uid = torch.repeat_interleave(torch.arange(bad.numel(), device=dev), lens)
        off = torch.cumsum(lens, 0) - lens
        tflat = u_row[bad][uid] * V + u_a[bad][uid] + torch.arange(int(lens.sum()), device=dev) - off[uid]
        saved = (r_s.view(-1)[tflat].clone(), lo_out.view(-1)[tflat].clone(), frac_out.view(-1)[tflat].clone())
        res_alt = res_u.clone()
        it = _fit_groups(bad, m_alt, qs, c, Qc, ct, u_row, u_a, u_b, r_s, lo_out, frac_out, K, max_iter, tol, res_alt)
        iters_max = max(iters_max, it)
        worse = res_alt[bad] >= res_u[bad]
        back = worse[uid]
        r_s.view(-1)[tflat[back]] = saved[0][back]
        lo_out.view(-1)[tflat[back]] = saved[1][back]
        frac_out.view(-1)[tflat[back]] = saved[2][back]
        res_u[bad] = torch.where(worse, res_u[bad], res_alt[bad])
    return iters_max, bool((res_u <= tol).all())


def _fit_groups(units, m_of, qs, c, Qc, ct, u_row, u_a, u_b, r_s, lo_out, frac_out, K, max_iter, tol, res_out):
    """Fit ``units`` (indices) with ``m_of[i]`` levels for units[i], grouped by level count, in
    chunks bounded by UNIT_CHUNK_ELEMS; writes the placement and each unit's residual."""
    iters_max = 0
    for Mu in torch.unique(m_of).tolist():
        sel = units[(m_of == Mu).nonzero().squeeze(-1)]
        per = max(1, UNIT_CHUNK_ELEMS // (Mu + 1))
        for u0 in range(0, sel.numel(), per):
            us = sel[u0 : u0 + per]
            it, res = _fit_chunk(qs, c, Qc, ct, u_row[us], u_a[us], u_b[us], r_s, lo_out, frac_out, K, int(Mu), max_iter, tol)
            res_out[us] = res
            iters_max = max(iters_max, it)
    return iters_max


def _fit_chunk(qs, c, Qc, ct, row, ua, ub, r_s, lo_out, frac_out, K, M, max_iter, tol):
    """Units (row, [ua, ub)) of the sorted rows with M levels each. qs, c [R, V]; Qc, ct [R, V+1]
    prefix sums of q and q_sel. Writes the placement and the exact r of their tokens."""
    R, V = qs.shape
    dev = qs.device
    dt = torch.float64
    U = row.numel()
    Qa = Qc[row, ua]
    Qb = Qc[row, ub]
    cflat = c.reshape(-1)
    Qflat = Qc.reshape(-1)
    Tflat = ct.reshape(-1)
    nbits = int(max(1, int((ub - ua).max()))).bit_length() + 1
    grid = torch.linspace(0.0, 1.0, M + 1, dtype=dt, device=dev)
    D = Qa.unsqueeze(-1) + (Qb - Qa).unsqueeze(-1) * grid  # [U, M+1]
    all_u = torch.arange(U, device=dev)

    def search(ui, W):
        """Positions pos [N, M] in [ua, ub]: the first token of the unit with c >= W (binary search)."""
        lo = ua[ui].unsqueeze(-1).expand_as(W).clone()
        hi = ub[ui].unsqueeze(-1).expand_as(W).clone()
        base = (row[ui] * V).unsqueeze(-1)
        for _ in range(nbits):
            act = lo < hi
            mid = (lo + hi) // 2
            cm = cflat[(base + mid.clamp(max=V - 1))]
            go_right = act & (cm < W)
            lo = torch.where(go_right, mid + 1, lo)
            hi = torch.where(act & ~go_right, mid, hi)
        return lo

    def step(D, ui):
        """The level masses induced by placing each token by interpolation in W(D): new D [N, M+1]."""
        W = chord(D[:, :-1], D[:, 1:], K)
        pos = search(ui, W)
        N = D.shape[0]
        edges = torch.cat([ua[ui].unsqueeze(-1), pos, ub[ui].unsqueeze(-1)], -1)  # [N, M+2]
        fi = (row[ui] * (V + 1)).unsqueeze(-1) + edges
        sq, stt = Qflat[fi], Tflat[fi]
        bq = sq[:, 1:] - sq[:, :-1]  # [N, M+1] bucket b: W_{b-1} <= c < W_b
        bt = stt[:, 1:] - stt[:, :-1]
        mu = torch.zeros(N, M, dtype=dt, device=dev)
        mu[:, 0] += bq[:, 0]
        mu[:, M - 1] += bq[:, M]
        if M > 1:
            wl, wh = W[:, :-1], W[:, 1:]
            gap = wh - wl
            ok = gap > 0
            g = torch.where(ok, gap, torch.ones_like(gap))
            qi, ti = bq[:, 1:M], bt[:, 1:M]
            to_lo = torch.where(ok, (qi * wh - ti) / g, 0.5 * qi).clamp(min=0.0)
            to_lo = torch.minimum(to_lo, qi)
            mu[:, :-1] += to_lo
            mu[:, 1:] += qi - to_lo
        q0 = Qa[ui].unsqueeze(-1)
        return torch.cat([q0, q0 + torch.cumsum(mu, -1)], -1)

    def project(D):
        D = torch.minimum(torch.maximum(D, Qa.unsqueeze(-1)), Qb.unsqueeze(-1))
        D[:, 0] = Qa
        return torch.cummax(D, -1).values

    # fixed-point steps, then Newton on the interior levels (finite-difference Jacobian, all
    # units at once), kept per unit only where it lowers the residual; converged units freeze
    it = 0
    G = step(D, all_u)
    res = (G - D).abs().amax(-1)  # [U]
    done = res <= tol
    n_plain = 6
    m1 = max(M - 1, 1)
    eye = torch.eye(m1, dtype=dt, device=dev)
    best = res.clone()
    stall = torch.zeros(U, dtype=torch.int64, device=dev)
    while it < max_iter and not bool(done.all()):
        it += 1
        act = (~done).nonzero().squeeze(-1)  # only units still moving are stepped
        Da, Ga, ra = D[act], G[act], res[act]
        A = act.numel()
        if it <= n_plain or M < 2:
            Dn = Ga
            Gn = step(Dn, act)
        else:
            qa, qb = Qa[act].unsqueeze(-1), Qb[act].unsqueeze(-1)
            Fx = (Ga - Da)[:, 1:M]  # [A, m1]
            left = Da[:, 1:M] - Da[:, 0 : M - 1]
            right = Da[:, 2 : M + 1] - Da[:, 1:M]
            sgn = torch.where(right >= left, 1.0, -1.0)
            h = sgn * torch.minimum(torch.full_like(left, 1e-7) * (qb - qa), 0.5 * torch.maximum(left, right))
            h = torch.where(h == 0, torch.full_like(h, 1e-300), h)
            Dp = Da.unsqueeze(1).repeat(1, m1, 1)  # [A, m1, M+1]: copy i perturbs level i + 1
            ar = torch.arange(m1, device=dev)
            Dp[:, ar, ar + 1] += h
            Gp = step(Dp.reshape(A * m1, M + 1), act.repeat_interleave(m1)).reshape(A, m1, M + 1)
            Fp = (Gp - Dp)[:, :, 1:M]
            J = ((Fp - Fx.unsqueeze(1)) / h.unsqueeze(-1)).transpose(1, 2) + 1e-14 * eye  # dF_i / dx_j
            sol = torch.linalg.solve_ex(J, -Fx.unsqueeze(-1))
            dx = sol.result.squeeze(-1)
            good = (sol.info == 0) & torch.isfinite(dx).all(-1)
            Dt = Da.clone()
            Dt[:, 1:M] = Da[:, 1:M] + torch.where(good.unsqueeze(-1), dx, torch.zeros_like(dx))
            Dt = torch.minimum(torch.maximum(Dt, qa), qb)
            Dt[:, 0] = Qa[act]
            Dt = torch.cummax(Dt, -1).values
            Gt = step(Dt, act)
            rt = (Gt - Dt).abs().amax(-1)
            take = good & (rt < ra)
            Dn = torch.where(take.unsqueeze(-1), Dt, Ga)
            Gn = torch.where(take.unsqueeze(-1), Gt, step(Ga, act)) if bool((~take).any()) else Gt
        rn = (Gn - Dn).abs().amax(-1)
        D[act] = Dn
        G[act] = Gn
        res[act] = rn
        # stop a unit at tol, or when its residual has not improved for 8 steps (rounding floor)
        better = rn < 0.5 * best[act]
        best[act] = torch.minimum(best[act], rn)
        stall[act] = torch.where(better, torch.zeros_like(stall[act]), stall[act] + 1)
        done = done | (res <= tol) | ((stall >= 8) & (res <= FLOOR_TOL_FACTOR * tol))
    # placement of every token from the final levels D, then the exact r from the masses it induces
    W = chord(D[:, :-1], D[:, 1:], K)  # [U, M]
    pos = search(all_u, W)
    lens = ub - ua
    off = torch.cumsum(lens, 0) - lens  # local index of each unit's first token
    n = int(lens.sum())
    uid = torch.repeat_interleave(all_u, lens)
    tpos = torch.arange(n, device=dev) - off[uid] + ua[uid]  # sorted position of each token
    tflat = row[uid] * V + tpos
    cnt = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    cnt.index_add_(0, (off.unsqueeze(-1) + pos - ua.unsqueeze(-1)).reshape(-1), torch.ones(U * M, dtype=torch.int64, device=dev))
    bucket = torch.cumsum(cnt, 0)[:n] - M * uid  # number of W_l at or before the token
    inside = (bucket > 0) & (bucket < M)
    lo = torch.where(bucket >= M, torch.full_like(bucket, M - 1), (bucket - 1).clamp(min=0))
    hi = (lo + 1).clamp(max=M - 1)
    Wf = W.reshape(-1)
    base = uid * M
    wl, wh = Wf[base + lo], Wf[base + hi]
    cy = cflat[tflat]
    qy = qs.reshape(-1)[tflat]
    gap = wh - wl
    f = torch.where(inside & (gap > 0), (cy - wl) / torch.where(gap > 0, gap, torch.ones_like(gap)), torch.zeros_like(cy))
    f = torch.nan_to_num(f, nan=0.0).clamp(0.0, 1.0)
    mu = torch.zeros(U * M, dtype=dt, device=dev)
    mu.index_add_(0, base + lo, qy * (1.0 - f))
    mu.index_add_(0, base + hi, qy * f)
    mu = mu.reshape(U, M)
    Dt = torch.cat([Qa.unsqueeze(-1), Qa.unsqueeze(-1) + torch.cumsum(mu, -1)], -1)
    Wt = chord(Dt[:, :-1], Dt[:, 1:], K).reshape(-1)
    r_s.view(-1)[tflat] = qy * ((1.0 - f) * Wt[base + lo] + f * Wt[base + hi])
    lo_out.view(-1)[tflat] = lo
    frac_out.view(-1)[tflat] = f
    return it, res


def _shared_q(p, q, K):
    if q.ndim == p.ndim + 1:
        if bool((q != q[..., :1, :]).any()):
            raise ValueError("draft_probs: the optimal verifier needs one draft distribution shared by the K drafts (iid law); per-draft rows differ")
        q = q[..., 0, :]
    return q


def _norm64(x):
    x = x.double()
    return x / x.sum(-1, keepdim=True)


@register
class Optimal(Verifier):
    r"""The optimal verifier for i.i.d. drafts at any V (layers + a fitted level race + SD).

    Selection: the draft in the highest layer of the sorted prefix scan wins; inside it a
    level race whose levels are fitted so that the selection law r equals the closed-form
    q_sel. Then accept Z with min(1, p(Z)/r(Z)), else sample norm((p - r)+), r computed
    exactly from the fitted levels: the output law is p whatever the fit; the acceptance is
    alpha* when the fit converges (see ``fit`` and docs/optimal_verifier.md).
    """

    name = "optimal"
    laws = ("iid",)

    def __init__(self, levels: int = DEFAULT_LEVELS, max_iter: int = DEFAULT_MAX_ITER, tol: float = DEFAULT_TOL, warn_shortfall: float = 1e-9):
        if not isinstance(levels, int) or levels < 1:
            raise ValueError(f"levels must be an integer >= 1, got {levels!r}")
        if not isinstance(max_iter, int) or max_iter < 0:
            raise ValueError(f"max_iter must be an integer >= 0, got {max_iter!r}")
        if not (tol >= 0):
            raise ValueError(f"tol must be >= 0, got {tol!r}")
        self.levels = levels
        self.max_iter = max_iter
        self.tol = float(tol)
        self.warn_shortfall = warn_shortfall
        self.last_fit: OptimalFit | None = None

    # diagnostics --------------------------------------------------------------------------
    def fit(self, p, q, k: int) -> OptimalFit:
        """The fitted selection rule for target p ``[..., V]`` and draft q ``[..., V]`` with K = k iid drafts."""
        from .._validate import as_k, as_probs

        p = as_probs(p, "target_probs")
        q = as_probs(q, "draft_probs")
        k = as_k(k, "k")
        if q.shape != p.shape:
            raise ValueError(f"draft_probs has shape {tuple(q.shape)}; expected {tuple(p.shape)} (shared q)")
        batch, V = p.shape[:-1], p.shape[-1]
        plan = _plan(_norm64(p).reshape(-1, V), _norm64(q).reshape(-1, V), k, self.levels, self.max_iter, self.tol)
        return _reshape_fit(plan.fit, batch, V)

    def _make_plan(self, p, q, K):
        q = _shared_q(p, q, K)
        V = p.shape[-1]
        p64 = _norm64(p).reshape(-1, V)
        q64 = _norm64(q).reshape(-1, V)
        plan = _plan(p64, q64, K, self.levels, self.max_iter, self.tol)
        self.last_fit = _reshape_fit(plan.fit, p.shape[:-1], V)
        short = float(plan.fit.shortfall.max())
        if short > self.warn_shortfall:
            warnings.warn(
                f"optimal verifier: fit stopped {short:.3g} below alpha* (iterations {plan.fit.iterations}, "
                f"levels {self.levels}); the output law is still exact", RuntimeWarning, stacklevel=3,
            )
        return p64, q64, plan

    @staticmethod
    def _draft_info(plan, drafts):
        pos = plan.rank.gather(-1, drafts)  # [R, K]
        return pos, plan.lid.gather(-1, pos), plan.lo.gather(-1, pos), plan.frac.gather(-1, pos), plan.r_sorted.gather(-1, pos)

    # sampling path ---------------------------------------------------------------------
    def _verify(self, p, q, drafts, g, law):
        batch, V, K = p.shape[:-1], p.shape[-1], drafts.shape[-1]
        p64, q64, plan = self._make_plan(p, q, K)
        D = drafts.reshape(-1, K)
        R = D.shape[0]
        _, lid, lo, f, rk = self._draft_info(plan, D)
        u_lev = torch.rand(R, K, generator=g, dtype=torch.float64, device=p.device)
        u_tie = torch.rand(R, K, generator=g, dtype=torch.float64, device=p.device)
        u_acc = torch.rand(R, generator=g, dtype=torch.float64, device=p.device)
        level = lo + (u_lev < f).to(lo.dtype)
        top = lid.amax(-1, keepdim=True)
        cand = lid == top
        lev = torch.where(cand, level, torch.full_like(level, -1))
        cand = cand & (lev == lev.amax(-1, keepdim=True))
        win = torch.where(cand, u_tie, torch.full_like(u_tie, -1.0)).argmax(-1, keepdim=True)  # [R, 1]
        Z = D.gather(-1, win).squeeze(-1)
        rZ = rk.gather(-1, win).squeeze(-1)
        pZ = p64.gather(-1, Z.unsqueeze(-1)).squeeze(-1)
        accept = u_acc * rZ <= pZ
        token = Z.clone()
        rej = (~accept).nonzero().squeeze(-1)
        if rej.numel():
            res = self._residual_rows(p64, plan, rej)
            tot = res.sum(-1)
            empty = tot <= 0  # residual of mass 0: rejection has probability 0 (rounding); keep Z
            go = rej[~empty]
            if go.numel():
                resg = res[~empty]
                token[go] = sample_rows(lambda rows: resg[rows], torch.arange(go.numel(), device=p.device), g)
        return token.reshape(batch)

    @staticmethod
    def _residual_rows(p64, plan, rows):
        r_tok = torch.empty(rows.numel(), p64.shape[-1], dtype=torch.float64, device=p64.device)
        r_tok.scatter_(-1, plan.order[rows], plan.r_sorted[rows])
        return (p64[rows] - r_tok).clamp_min(0.0)

    # exact path -----------------------------------------------------------------------
    def _output_distribution(self, p, q, drafts, law):
        batch, V, K = p.shape[:-1], p.shape[-1], drafts.shape[-1]
        p64, q64, plan = self._make_plan(p, q, K)
        D = drafts.reshape(-1, K)
        R = D.shape[0]
        _, lid, lo, f, rk = self._draft_info(plan, D)
        win = _win_probs(lid, lo, f)  # [R, K]
        res = self._residual_rows(p64, plan, torch.arange(R, device=p.device))
        tot = res.sum(-1, keepdim=True)
        has = tot > 0
        res = torch.where(has, res / torch.where(has, tot, torch.ones_like(tot)), torch.zeros_like(res))
        px = p64.gather(-1, D)
        a = torch.where(rk > 0, (px / torch.where(rk > 0, rk, torch.ones_like(rk))).clamp(max=1.0), torch.ones_like(px))
        a = torch.where(has, a, torch.ones_like(a))
        out = (win * (1.0 - a)).sum(-1, keepdim=True) * res
        out = out.scatter_add(-1, D, win * a)
        return out.reshape(*batch, V)


def _win_probs(lid, lo, f):
    """P(slot k is selected | drafts) [R, K] for the level race, exactly.

    Slot k on level l wins against slot j when j is in a lower layer, or in the same layer
    on a lower level, or on the same level and the uniform tie-break picks k: with
    b_j = P(j below), a_j = P(j on l), the win probability is int_0^1 prod_j (b_j + a_j z) dz.
    """
    R, K = lid.shape
    dt = torch.float64
    out = torch.zeros(R, K, dtype=dt, device=lid.device)
    for o in (0, 1):
        lev = lo + o  # [R, K] candidate level of slot k
        w = (1.0 - f) if o == 0 else f
        poly = torch.zeros(R, K, K, dtype=dt, device=lid.device)  # [R, k, degree]
        poly[..., 0] = 1.0
        for j in range(K):
            lj, loj, fj = lid[:, j : j + 1], lo[:, j : j + 1], f[:, j : j + 1]  # [R, 1]
            same = lj == lid
            lower = lj < lid
            b = (loj < lev).to(dt) * (1 - fj) + (loj + 1 < lev).to(dt) * fj
            a = (loj == lev).to(dt) * (1 - fj) + (loj + 1 == lev).to(dt) * fj
            b = torch.where(same, b, lower.to(dt))
            a = torch.where(same, a, torch.zeros_like(a))
            selfk = torch.zeros(K, dtype=torch.bool, device=lid.device)
            selfk[j] = True
            b = torch.where(selfk, torch.ones_like(b), b)
            a = torch.where(selfk, torch.zeros_like(a), a)
            new = poly * b.unsqueeze(-1)
            new[..., 1:] += poly[..., :-1] * a.unsqueeze(-1)
            poly = new
        integ = (poly / torch.arange(1, K + 1, dtype=dt, device=lid.device)).sum(-1)
        out = out + w * integ
    return out


def _reshape_fit(fit: OptimalFit, batch, V) -> OptimalFit:
    def rs(x):
        return x.reshape(*batch, V) if x.ndim == 2 else x.reshape(batch)

    return OptimalFit(
        r=rs(fit.r), q_sel=rs(fit.q_sel), alpha_star=rs(fit.alpha_star), acceptance=rs(fit.acceptance),
        fit_error_max=rs(fit.fit_error_max), fit_error_l1=rs(fit.fit_error_l1), n_layers=rs(fit.n_layers),
        n_fitted=rs(fit.n_fitted), largest_layer=rs(fit.largest_layer), iterations=fit.iterations,
        converged=fit.converged, levels=fit.levels,
    )
