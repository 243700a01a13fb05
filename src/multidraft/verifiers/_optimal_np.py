r"""The plan of ``optimal`` (prefix scan, layers, fitted level race) in numpy, one row at a time.

The same rule as ``optimal._plan`` (torch), for CPU rows of at most ``NP_PLAN_MAX`` entries (batches
of at most ``NP_PLAN_ROWS`` rows): the
unit rows of the lumped rule (a head of 64 tokens plus a few hundred to two thousand q/p bins)
and every small-V row. On such rows the torch route spends its time in the dispatch of a few
thousand small operations (issue 27: ~3 ms of a ~4.5 ms node at V = 151,936); here each
operation works on one layer's M + 1 levels and costs about a microsecond.

Per row (p, q float64 ``[V]``, normalised):

1. order by q/p decreasing (``np.argsort`` of the negated ratio, stable: the tie rule of
   ``limits.dual.prefix_order``), prefix sums Q_j, ``psi_j = P_j - Q_j^K``, j* = argmin psi,
   m / s the prefix / suffix minima of psi, ``q_sel`` and the layer boundaries (records of m on
   1..j*, of s on j*..V), one-token layers r = Q_j^K - Q_{j-1}^K (``chord`` times q_j);
2. every layer of two tokens or more with draft mass: the level race fitted by the fixed point on
   its M level masses (six plain steps, then Newton with a finite-difference Jacobian, kept only
   where it lowers the residual; a unit whose residual has not halved for ``STALL_STOP`` steps
   stops, and one stopped above the rounding floor is refitted with half, then twice the levels,
   the lower residual kept), the placement of its tokens
   (level lo, fraction f) and **the exact r of that placement**: r(y) = q_y [(1 - f_y) W_lo +
   f_y W_lo+1] with W from the level masses the placement induces.

Exactness does not depend on anything the fit does: the accept/residual step of ``Optimal`` uses
r computed from the placement actually made (Khisti et al., ICLR 2025, arXiv 2410.18234: a
selection rule followed by single-draft SD against its exact selection law outputs p). The fit
only moves the acceptance, which is alpha* when it converges. The steps are those of the torch
route, except (a) the search for the first token of a layer with c >= W_l: ``np.searchsorted``
instead of binary lifting (the same index where c is nondecreasing, which it is inside a layer up
to rounding) and (b) the fixed-point map sums the level masses in closed form (D'_{l+1} =
Q(pos_l) + to_lo_l) instead of one by one: the same map in exact arithmetic, rounded differently,
so the placements agree with the torch route's up to rounding (r to ~1e-15 on the tests' rows). A
row's rule depends on that row only.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from .._scan import ipow

NP_PLAN_MAX = 16384  # CPU rows of at most this many entries are planned here ...
STALL_STOP = 48  # a fit whose residual has not halved for this many steps stops, whatever the residual (issue 39
# item 4: a layer whose fixed point sits at kinks of the placement, e.g. one token with a quarter of the layer's draft
# mass, as when the target's argmax was zeroed after a refused copy, crept for the whole max_iter at three level
# counts, ~1,100 Newton steps, 0.3-0.6 s a node; with 48 it stops at the same residual in ~60. 16 and 32 cut fits
# that converge after a long plateau (synthetic Zipf rows, V = 151,936: shortfall 6e-4 instead of 1e-15). The output
# law is exact at any stop; a shortfall is reported)
LINE = (1.0, 0.5, 0.25, 0.125)  # Newton step fractions tried at once (the lowest residual kept, if it lowers it)
NP_PLAN_ROWS = 512  # ... in batches of at most this many rows (one Python pass per row: a batch of
# 40,000 small rows, as the chi-square tests draw, is faster on the batched torch route)


@functools.lru_cache(maxsize=64)
def _grid(M: int) -> np.ndarray:
    return torch.linspace(0.0, 1.0, M + 1, dtype=torch.float64, device="cpu").numpy()  # the torch route's grid, bit for bit


def _chord(lo: np.ndarray, hi: np.ndarray, K: int) -> np.ndarray:
    """(hi^K - lo^K) / (hi - lo) = sum_i hi^i lo^(K-1-i) by Horner (``optimal.chord``)."""
    if K == 1:
        return np.ones(np.broadcast_shapes(lo.shape, hi.shape))
    s = hi + lo  # the first Horner step from s = lp = 1 (1 * hi and 1 * lo are exact)
    lp = None
    for _ in range(K - 2):
        lp = lo * lo if lp is None else lp * lo
        s *= hi
        s += lp
    return s


def plan_rows(p: torch.Tensor, q: torch.Tensor, K: int, levels: int, max_iter: int, tol: float, floor: float):
    """p, q float64 CPU ``[R, V]`` (normalised). Returns the dict of plan tensors (torch, ``[R, ...]``):
    order, rank, bnd_flat, lo, frac, r_sorted, qsel_sorted, alpha_star, acceptance, n_layers,
    n_fitted, largest_layer, iterations, converged."""
    R, V = p.shape
    dev = p.device  # the CPU (this route is taken for CPU rows only)
    pn, qn = p.detach().numpy(), q.detach().numpy()
    order = np.empty((R, V), dtype=np.int64)
    rank = np.empty((R, V), dtype=np.int64)
    lo = np.zeros((R, V), dtype=np.int64)
    frac = np.zeros((R, V))
    r_s = np.empty((R, V))
    qsel = np.empty((R, V))
    alpha = np.empty(R)
    acc = np.empty(R)
    n_layers = np.empty(R, dtype=np.int64)
    n_fitted = np.zeros(R, dtype=np.int64)
    largest = np.empty(R, dtype=np.int64)
    bnds = []
    iters, conv = 0, True
    ar = np.arange(V, dtype=np.int64)
    for i in range(R):
        b, it, cv = _row(pn[i], qn[i], K, levels, max_iter, tol, floor, ar, order[i], rank[i], lo[i], frac[i], r_s[i], qsel[i], alpha, acc, n_layers, n_fitted, largest, i)
        bnds.append(b + i * (V + 1))
        iters, conv = max(iters, it), conv and cv
    return dict(order=torch.as_tensor(order, device=dev), rank=torch.as_tensor(rank, device=dev), bnd_flat=torch.as_tensor(np.concatenate(bnds), device=dev),
                lo=torch.as_tensor(lo, device=dev), frac=torch.as_tensor(frac, device=dev), r_sorted=torch.as_tensor(r_s, device=dev),
                qsel_sorted=torch.as_tensor(qsel, device=dev), alpha_star=torch.as_tensor(alpha, device=dev), acceptance=torch.as_tensor(acc, device=dev),
                n_layers=torch.as_tensor(n_layers, device=dev), n_fitted=torch.as_tensor(n_fitted, device=dev), largest_layer=torch.as_tensor(largest, device=dev),
                iterations=iters, converged=conv)


def _row(p, q, K, M, max_iter, tol, floor, ar, order, rank, lo_out, frac_out, r_s, qsel, alpha, acc, n_layers, n_fitted, largest, i):
    """One row: fills order, rank, lo, frac, r_s, qsel (sorted positions) and the row's entries of
    the diagnostics; returns (boundaries [nb] in 0..V, iterations, converged)."""
    V = p.shape[0]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # q over a subnormal p: inf, as q / 0
        ratio = q / p
    ratio[np.isnan(ratio)] = 0.0  # 0 / 0; q / 0 stays inf
    order[:] = np.argsort(-ratio, kind="stable")  # descending, ties by index (torch's stable sort)
    rank[order] = ar
    ps, qs = p[order], q[order]
    Qc = np.empty(V + 1)
    Qc[0] = 0.0
    np.cumsum(qs, out=Qc[1:])
    psi = np.empty(V + 1)
    psi[0] = 0.0
    np.cumsum(ps, out=psi[1:])
    psi -= ipow(Qc, K)
    psi[0] = 0.0
    psi[V] = 0.0
    js = int(psi.argmin())
    m = np.minimum.accumulate(psi)
    s = np.minimum.accumulate(psi[::-1])[::-1]
    dm = (m[:-1] - m[1:]) + ps
    ds = (s[:-1] - s[1:]) + ps
    qsel[:js] = dm[:js]  # positions 0..js-1 are tokens 1..j*
    qsel[js:] = ds[js:]
    if K == 1:
        bnd = np.arange(V + 1, dtype=np.int64)
    else:
        bm = np.zeros(V + 1, dtype=bool)
        bm[1 : js + 1] = m[1 : js + 1] < m[:js]
        bm[js:V] |= s[js:V] < s[js + 1 :]
        bm[0] = bm[V] = True
        bnd = np.flatnonzero(bm)
    r_s[:] = _chord(Qc[:-1], Qc[1:], K) * qs
    gaps = np.diff(bnd)
    n_layers[i] = bnd.size - 1
    largest[i] = int(gaps.max()) if gaps.size else 0
    alpha[i] = min(max(1.0 + psi[js], 0.0), 1.0)
    it_max, conv = 0, True
    multi = np.flatnonzero(gaps >= 2)
    if multi.size:
        ct = np.empty(V + 1)
        ct[0] = 0.0
        np.cumsum(qsel, out=ct[1:])
        for j in multi.tolist():
            a, b = int(bnd[j]), int(bnd[j + 1])
            if not Qc[b] > Qc[a]:
                continue
            n_fitted[i] += 1
            it, res = _fit_layer(qs, qsel, Qc, ct, a, b, K, M, max_iter, tol, floor, r_s, lo_out, frac_out)
            it_max = max(it_max, it)
            conv = conv and res <= tol
    acc[i] = np.minimum(ps, r_s).sum()
    return bnd, it_max, conv


def _fit_layer(qs, qsel, Qc, ct, a, b, K, M, max_iter, tol, floor, r_s, lo_out, frac_out):
    """The level race of the layer of sorted positions [a, b): writes its placement and exact r;
    returns (iterations, residual). Refits a stalled layer with half, then twice the levels."""
    n = b - a
    qy = qs[a:b]
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(qy > 0, qsel[a:b] / np.where(qy > 0, qy, 1.0), np.inf)
    Ql, Tl = Qc[a : b + 1], ct[a : b + 1]
    Mu = min(M, n)
    it, res, best = _fit_once(c, qy, Ql, Tl, K, Mu, max(1, max_iter // 4), tol, floor)
    for alt in (max(M // 2, 2), 2 * M):
        if not res > floor * tol:
            break
        it2, res2, cand = _fit_once(c, qy, Ql, Tl, K, min(alt, n), max_iter, tol, floor)
        it = max(it, it2)
        if res2 < res:
            res, best = res2, cand
    lo, f, r = best
    lo_out[a:b] = lo
    frac_out[a:b] = f
    r_s[a:b] = r
    return it, res


def _fit_once(c, qy, Ql, Tl, K, M, max_iter, tol, floor):
    """Fit M levels of one layer; returns (iterations, residual, (lo, f, r) of its tokens)."""
    n = c.shape[0]
    Qa, Qb = Ql[0], Ql[-1]
    D = Qa + (Qb - Qa) * _grid(M)  # [M+1]

    def step(D):
        """Level masses induced by placing each token by interpolation in W(D). D [..., M+1].

        With pos_l the first token of c >= W_l, the tokens below W_0 sit on level 0, those at
        or above W_{M-1} on level M-1, and bucket l (W_l <= c < W_{l+1}) splits its draft mass
        between levels l (``to_lo``, so that its mean W matches its mean c) and l + 1. Summed
        level by level: D'_{l+1} = Q(pos_l) + to_lo_l, D'_0 = Q_a, D'_M = Q_b (the torch route
        sums the same level masses one by one, which rounds differently)."""
        W = _chord(D[..., :-1], D[..., 1:], K)
        pos = np.searchsorted(c, W, side="left")  # [..., M] first token with c >= W_l
        sq = Ql[pos]
        out = np.empty(D.shape)
        out[..., 0] = Qa
        out[..., M] = Qb
        if M > 1:
            stt = Tl[pos]
            wl, wh = W[..., :-1], W[..., 1:]
            gap = wh - wl
            ok = gap > 0
            qi = sq[..., 1:] - sq[..., :-1]  # [..., M-1] draft mass of bucket l
            ti = stt[..., 1:] - stt[..., :-1]  # its target mass
            to_lo = np.minimum(np.maximum(np.where(ok, (qi * wh - ti) / np.where(ok, gap, 1.0), 0.5 * qi), 0.0), qi)
            np.add(sq[..., :-1], to_lo, out=out[..., 1:M])
        return out

    G = step(D)
    res = float(np.abs(G - D).max())
    it = 0
    best = res
    stall = 0
    m1 = max(M - 1, 1)
    eye = 1e-14 * np.eye(m1)
    ar = np.arange(m1)
    done = res <= tol
    while it < max_iter and not done:
        it += 1
        if it <= 6 or M < 2:
            D, G = G, step(G)
        else:
            Fx = (G - D)[1:M]
            left = D[1:M] - D[0 : M - 1]
            right = D[2 : M + 1] - D[1:M]
            h = np.where(right >= left, 1.0, -1.0) * np.minimum(1e-7 * (Qb - Qa), 0.5 * np.maximum(left, right))
            h[h == 0] = 1e-300
            Dp = np.repeat(D[None], m1, 0)  # copy i perturbs level i + 1
            Dp[ar, ar + 1] += h
            Fp = (step(Dp) - Dp)[:, 1:M]
            J = ((Fp - Fx[None]) / h[:, None]).T + eye  # dF_i / dx_j
            try:
                dx = np.linalg.solve(J, -Fx)
                good = bool(np.isfinite(dx).all())
            except np.linalg.LinAlgError:
                good = False
            took = False
            if good:
                Dt = np.repeat(D[None], len(LINE), 0)  # [S, M+1] the Newton step and its fractions (a line search)
                Dt[:, 1:M] += np.array(LINE)[:, None] * dx
                Dt = np.minimum(np.maximum(Dt, Qa), Qb)
                Dt[:, 0] = Qa
                Dt = np.maximum.accumulate(Dt, -1)
                Gt = step(Dt)
                rt = np.abs(Gt - Dt).max(-1)
                j = int(rt.argmin())
                if rt[j] < res:
                    D, G, took = Dt[j], Gt[j], True
            if not took:
                D, G = G, step(G)
        rn = float(np.abs(G - D).max())
        res = rn
        if rn < 0.5 * best:
            stall = 0
        else:
            stall += 1
        best = min(best, rn)
        done = res <= tol or (stall >= 8 and res <= floor * tol) or stall >= STALL_STOP
    # placement of every token from the final levels, then the exact r of the masses it induces
    W = _chord(D[:-1], D[1:], K)  # [M]
    pos = np.searchsorted(c, W, side="left")
    bucket = np.cumsum(np.bincount(pos, minlength=n + 1))[:n]  # W_l at or before each token
    inside = (bucket > 0) & (bucket < M)
    lo = np.where(bucket >= M, M - 1, np.maximum(bucket - 1, 0))
    hi = np.minimum(lo + 1, M - 1)
    wl, wh = W[lo], W[hi]
    gap = wh - wl
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(inside & (gap > 0), (c - wl) / np.where(gap > 0, gap, 1.0), 0.0)
    f[np.isnan(f)] = 0.0  # (nan_to_num: inf stays inf here and clips to 1, as the torch route's max float does)
    f = np.clip(f, 0.0, 1.0)
    mu = np.bincount(np.concatenate([lo, hi]), weights=np.concatenate([qy * (1.0 - f), qy * f]), minlength=M)
    Dt = np.empty(M + 1)
    Dt[0] = Qa
    Dt[1:] = Qa + np.cumsum(mu)
    Wt = _chord(Dt[:-1], Dt[1:], K)
    r = qy * ((1.0 - f) * Wt[lo] + f * Wt[hi])
    return it, res, (lo, f, r)
