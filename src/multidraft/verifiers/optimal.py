r"""The optimal verifier for i.i.d. drafts at any vocabulary size (``optimal``).

Exactly lossless whatever the fit does; acceptance alpha* when the fit converges.
See docs/guide/optimal_verifier.md for the derivation. Per row:

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

Per-row cost: one stable sort of V float64 ratios (``_scan.argsort_desc_stable``), about 25
O(V) elementwise passes (prefix sums and minima, q_sel, boundaries, r of one-token layers,
ranks), O(n) passes over the n tokens of multi-token layers (their placement), and
``iterations x units x M log n`` for the fit. Layers are kept as the sorted list of their
boundaries (a draft's layer is a binary search), and the full-V diagnostics of ``OptimalFit``
(r, q_sel in token order, fit errors) are computed only when read. The
fit diagnostics (``fit``) report r, q_sel, alpha*, the acceptance reached, the fit error
and iterations; a fit that stops short is reported (``OptimalFit.shortfall``, a warning
from ``verify``), never silently, and the output law stays exactly p.

Large V (issue 27; rows of more than ``exact_below`` tokens, ``head`` not None): the scan runs on
**units** instead of tokens. The ``head`` tokens of largest p + q (``_head_numpy`` on CPU, ``torch.topk`` on GPU) are units of
their own; every other token joins the unit of its q/p bin (``_bin_keys``: the float64 ratio's
bit pattern, 2^bin_bits bins per octave, monotone in q/p). The unit rows get the construction
above; a token y of unit u gets ``r(y) = q(y) r_u / q_u``, its exact selection probability
(given the drafts' units, the race is independent of which token of a unit was drafted, and
that token is q-distributed inside its unit). The output law is p for any head and bins; the
acceptance loses at most ``w/(1+w)`` of ``min(p_u, r_u)`` per tail unit (ratios within 1 + w),
reported as ``LumpedFit.shortfall_bound``. No sort of V; O(V) work: the head, the keys, two
scatter-adds, and on a rejection the residual.

Routes (issue 27, round 2): on CPU, batches of at most ``NP_PLAN_ROWS`` rows of at most
``NP_PLAN_MAX`` entries (the unit rows, every small-V row) are planned in numpy one row and one
layer at a time (``_optimal_np``), and the unit rows, the head, the level race and the accept coin
run in numpy too: the same rule, without the dispatch of thousands of small torch operations
(~4.5 -> ~1.7 ms a node at V = 151,936). GPU rows, long rows and large batches take the batched
torch route (``NUMPY_ON_CPU = False`` forces it). The two routes round differently (and may stop a
fit at another point within its tolerance); each computes the exact r of its own placement. The
race is the same operations on both (``_race_torch``, ``_race_numpy``): for one generator they
draw the same tokens wherever the two placements agree, and where a fit stopped elsewhere (a layer
of units at another offset, r equal to 1e-9) another draft may win; the law is p on both.

Corners: K = 1 puts every token alone (r = q): single-draft SD. Tokens with q = 0 are never
drafted and get r = 0. Tokens with p = 0 < q come first (ratio inf), each its own layer.
Ties in q/p follow the stable sort; equal psi values are not records (strict minima).
"""
from __future__ import annotations

import functools
import warnings

import numpy as np
import torch

from .._scan import cummin, ipow, rev_cummin, segment_search
from ..limits.dual import prefix_order
from ._optimal_np import LINE, NP_PLAN_MAX, NP_PLAN_ROWS, STALL_STOP
from ._optimal_np import plan_rows as _np_plan_rows
from ._residual import accept, accept_prob, residual_law, residual_or, rows64, sample_rows
from .base import Verifier
from .registry import register

__all__ = ["Optimal", "OptimalFit", "chord"]

DEFAULT_LEVELS = 32
DEFAULT_MAX_ITER = 500
DEFAULT_TOL = 1e-13
FLOOR_TOL_FACTOR = 1e4  # a unit whose residual stopped improving within this factor of tol is done (see _fit_chunk)
UNIT_CHUNK_ELEMS = 1 << 22  # bound on units x levels held at once in the fit
DEFAULT_HEAD = 64  # tokens of largest p + q planned one by one (the rest lumped by q/p bin)
DEFAULT_BIN_BITS = 6  # 2^6 q/p bins per octave for the lumped tail (ratios within a factor 1 + 1/64)
DEFAULT_EXACT_BELOW = 4096  # rows of at most this many tokens are planned token by token
DEFAULT_WARN_LUMP = 1e-4  # warn when the lumping bound on the acceptance gap exceeds this
NUMPY_ON_CPU = True  # CPU rows: small plans, the unit rows and the race in numpy (False: torch everywhere; the tests compare both)


def chord(lo: torch.Tensor, hi: torch.Tensor, K: int) -> torch.Tensor:
    """(hi^K - lo^K) / (hi - lo) = sum_i hi^i lo^(K-1-i), with the limit K lo^(K-1) at hi = lo.

    Horner in hi (c_1 = 1, c_n = hi c_{n-1} + lo^(n-1)): positive terms only, no cancellation,
    3 (K - 1) elementwise operations in place (two temporaries of the input's size)."""
    s = torch.ones_like(torch.broadcast_tensors(lo, hi)[0])
    lp = torch.ones_like(s)
    for _ in range(K - 1):
        lp.mul_(lo)
        s.mul_(hi).add_(lp)
    return s


class OptimalFit:
    """Diagnostics of the fitted selection rule, one entry per row (leading dims ``batch``).

    ``r`` / ``q_sel`` are ``[..., V]`` float64 in token order; the rest are ``[...]``.
    ``acceptance`` is the exact acceptance of the fitted rule, ``sum_y min(p, r)``;
    ``shortfall = alpha_star - acceptance`` (>= 0 up to rounding). The full-V fields (``r``,
    ``q_sel``, the fit errors) are computed on first access, so decoding does not pay for them.
    """

    def __init__(self, *, batch, order, r_sorted, qsel_sorted, alpha_star, acceptance, n_layers,
                 n_fitted, largest_layer, iterations, converged, levels):
        self._batch = tuple(batch)
        self._order = order  # [R, V] sorted position -> token
        self._r_sorted = r_sorted  # [R, V]
        self._qsel_sorted = qsel_sorted  # [R, V]
        self.alpha_star = alpha_star.reshape(self._batch)  # [...]
        self.acceptance = acceptance.reshape(self._batch)  # [...]
        self.n_layers = n_layers.reshape(self._batch)  # [...] number of layers
        self.n_fitted = n_fitted.reshape(self._batch)  # [...] layers with more than one drafted token
        self.largest_layer = largest_layer.reshape(self._batch)  # [...] tokens in the largest layer
        self.iterations = iterations  # fixed-point iterations run (the most over the batch's units)
        self.converged = converged  # every unit reached tol before max_iter
        self.levels = levels

    def _tokens(self, x):
        out = torch.empty_like(x).scatter_(-1, self._order, x)
        return out.reshape(*self._batch, x.shape[-1])

    @functools.cached_property
    def r(self) -> torch.Tensor:  # [..., V] selection law induced by the fitted levels (exact)
        return self._tokens(self._r_sorted)

    @functools.cached_property
    def q_sel(self) -> torch.Tensor:  # [..., V] target selection law (closed form)
        return self._tokens(self._qsel_sorted)

    @functools.cached_property
    def fit_error_max(self) -> torch.Tensor:  # [...] max_y |r - q_sel|
        return (self._r_sorted - self._qsel_sorted).abs().amax(-1).reshape(self._batch)

    @functools.cached_property
    def fit_error_l1(self) -> torch.Tensor:  # [...] sum_y |r - q_sel|
        return (self._r_sorted - self._qsel_sorted).abs().sum(-1).reshape(self._batch)

    @property
    def shortfall(self) -> torch.Tensor:
        return self.alpha_star - self.acceptance

    @property
    def shortfall_bound(self) -> torch.Tensor:  # [...] the shortfall itself (alpha* is known here)
        return self.shortfall.clamp_min(0.0)

    def rebatch(self, batch) -> "OptimalFit":
        """The same fit with rows shaped as ``batch`` (leading dims)."""
        return OptimalFit(
            batch=batch, order=self._order, r_sorted=self._r_sorted, qsel_sorted=self._qsel_sorted,
            alpha_star=self.alpha_star, acceptance=self.acceptance, n_layers=self.n_layers,
            n_fitted=self.n_fitted, largest_layer=self.largest_layer, iterations=self.iterations,
            converged=self.converged, levels=self.levels,
        )


class _Plan:
    """Everything verify / output_distribution need, in sorted position space. Rows are flat [R, ...]."""

    __slots__ = ("order", "rank", "bnd_flat", "lo", "frac", "r_sorted", "fit")

    def layer_id(self, pos: torch.Tensor) -> torch.Tensor:  # pos [R, K] sorted positions
        """A layer identifier per position, increasing with the layer inside a row (comparable
        within a row only): the number of boundaries at or before the layer's start."""
        R, V = self.order.shape
        rows = torch.arange(R, device=pos.device).unsqueeze(-1) * (V + 1)
        return torch.searchsorted(self.bnd_flat, (rows + pos).reshape(-1), right=True).reshape(pos.shape)


def _plan(p: torch.Tensor, q: torch.Tensor, K: int, levels: int, max_iter: int, tol: float, route: str = "auto") -> _Plan:
    """p, q float64 [R, V] (normalised). Returns the plan with the fitted level race.

    ``route``: "numpy" (``_optimal_np``, one row at a time: under "auto", CPU batches of at most
    ``NP_PLAN_ROWS`` rows of at most ``NP_PLAN_MAX`` entries), "torch" (batched torch: GPU rows,
    long rows, large batches)."""
    R, V = p.shape
    if route == "numpy" or (route == "auto" and NUMPY_ON_CPU and p.device.type == "cpu" and V <= NP_PLAN_MAX and R <= NP_PLAN_ROWS):
        return _plan_numpy(p, q, K, levels, max_iter, tol)
    dev = p.device
    dt = torch.float64
    order = prefix_order(p, q)  # [R, V]
    ps = p.gather(-1, order)
    qs = q.gather(-1, order)
    Qc = torch.empty(R, V + 1, dtype=dt, device=dev)  # [R, V+1] prefix sums Q_0..Q_V
    Qc[:, 0] = 0.0
    torch.cumsum(qs, -1, out=Qc[:, 1:])
    psi = torch.empty_like(Qc)  # [R, V+1] P_j - Q_j^K (temporaries of [R, V] are kept few: at
    psi[:, 0] = 0.0  # B = 64 each is 78 MB of fresh pages)
    torch.cumsum(ps, -1, out=psi[:, 1:])
    psi.sub_(ipow(Qc, K))
    psi[:, 0] = 0.0
    psi[:, V] = 0.0
    jstar = psi.argmin(-1)  # first minimiser
    m = cummin(psi)  # prefix minimum
    s = rev_cummin(psi)  # suffix minimum
    idx = torch.arange(V + 1, device=dev)
    js = jstar.unsqueeze(-1)
    # q_sel on sorted positions (token j = position i + 1)
    below = idx[1:].unsqueeze(0) <= js  # [R, V]
    dm = (m[:, :-1] - m[:, 1:]).add_(ps)  # p_j + m_{j-1} - m_j
    ds = (s[:, :-1] - s[:, 1:]).add_(ps)  # p_j - (s_j - s_{j-1})
    qsel_s = torch.where(below, dm, ds)
    del dm, ds
    # boundaries: records of the prefix minimum on 1..j*, of the suffix minimum on j*..V-1
    if K == 1:
        bnd = torch.ones(R, V + 1, dtype=torch.bool, device=dev)  # every token alone: r = q, single-draft SD
    else:
        bnd = torch.empty(R, V + 1, dtype=torch.bool, device=dev)
        bnd[:, 1:] = (m[:, 1:] < m[:, :-1]) & below
        bnd[:, 0] = True
        bnd[:, :-1] |= (s[:, :-1] < s[:, 1:]) & (idx[:-1].unsqueeze(0) >= js)
        bnd[:, V] = True
    # a one-token layer (j-1, j] has r = q_j chord(Q_{j-1}, Q_j) = Q_j^K - Q_{j-1}^K = q_sel; so has a
    # layer without draft mass (r = 0); multi-token layers with mass are fitted below and overwritten
    r_s = chord(Qc[:, :-1], Qc[:, 1:], K).mul_(qs)  # [R, V]
    bnd_flat = bnd.reshape(-1).nonzero().squeeze(-1)  # [nb] increasing: row * (V+1) + position
    gaps = bnd_flat[1:] - bnd_flat[:-1]  # a row's last boundary (V) and the next row's first (0) are 1 apart
    brow = bnd_flat // (V + 1)
    n_layers = torch.bincount(brow, minlength=R) - 1
    largest = torch.zeros(R, dtype=torch.int64, device=dev).scatter_reduce_(
        0, brow[:-1], torch.where(brow[1:] == brow[:-1], gaps, torch.zeros_like(gaps)), "amax")
    multi = (gaps >= 2).nonzero().squeeze(-1)
    a_flat, b_flat = bnd_flat[multi], bnd_flat[multi + 1]
    Qflat = Qc.reshape(-1)
    keep = Qflat[b_flat] > Qflat[a_flat]  # layers to fit: two tokens or more and positive draft mass
    a_flat, b_flat = a_flat[keep], b_flat[keep]
    u_row = a_flat // (V + 1)
    u_a, u_b = a_flat - u_row * (V + 1), b_flat - u_row * (V + 1)
    lo = torch.zeros(R, V, dtype=torch.int64, device=dev)
    frac = torch.zeros(R, V, dtype=dt, device=dev)
    iters, conv = 0, True
    if u_row.numel():
        iters, conv = _fit_units(qs, qsel_s, Qc, u_row, u_a, u_b, r_s, lo, frac, K, levels, max_iter, tol)
    plan = _Plan()
    plan.order = order
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, idx[:V].expand(R, V))
    plan.rank = rank
    plan.bnd_flat = bnd_flat
    plan.lo = lo
    plan.frac = frac
    plan.r_sorted = r_s
    plan.fit = OptimalFit(
        batch=(R,), order=order, r_sorted=r_s, qsel_sorted=qsel_s,
        alpha_star=(1.0 + psi.gather(-1, js).squeeze(-1)).clamp(0.0, 1.0),
        acceptance=torch.minimum(ps, r_s).sum(-1), n_layers=n_layers,
        n_fitted=torch.bincount(u_row, minlength=R), largest_layer=largest,
        iterations=iters, converged=conv, levels=levels,
    )
    return plan


def _plan_numpy(p, q, K, levels, max_iter, tol) -> _Plan:
    """``_plan`` by the numpy route (same rule; see ``_optimal_np``)."""
    d = _np_plan_rows(p, q, K, levels, max_iter, tol, FLOOR_TOL_FACTOR)
    R = p.shape[0]
    plan = _Plan()
    for name in ("order", "rank", "bnd_flat", "lo", "frac", "r_sorted"):
        setattr(plan, name, d[name])
    plan.fit = OptimalFit(
        batch=(R,), order=d["order"], r_sorted=d["r_sorted"], qsel_sorted=d["qsel_sorted"],
        alpha_star=d["alpha_star"], acceptance=d["acceptance"], n_layers=d["n_layers"], n_fitted=d["n_fitted"],
        largest_layer=d["largest_layer"], iterations=d["iterations"], converged=d["converged"], levels=levels,
    )
    return plan


class _Lumped:
    """A plan on a reduced alphabet of units (head tokens alone, tail tokens lumped by q/p bin),
    expanded to tokens. Rows are flat [R, ...]; ``red`` is the ``_Plan`` of the unit rows."""

    __slots__ = ("red", "hidx", "key", "lut", "c", "q64", "fit")

    def units(self, tok: torch.Tensor) -> torch.Tensor:  # tok [R, n] token ids -> unit ids [R, n]
        eq = tok.unsqueeze(-1) == self.hidx.unsqueeze(-2)  # [R, n, h]
        inh = eq.any(-1)
        u_t = self.lut.gather(-1, self.key.gather(-1, tok).long().clamp(max=self.lut.shape[-1] - 1))
        return torch.where(inh, eq.to(torch.uint8).argmax(-1), u_t)

    def r_tokens(self, rows: torch.Tensor) -> torch.Tensor:  # [n, V] the exact selection law of these rows
        R, V = self.key.shape
        u = self.lut[rows].gather(-1, self.key[rows].long().clamp(max=self.lut.shape[-1] - 1))
        u.scatter_(-1, self.hidx[rows], torch.arange(self.hidx.shape[-1], device=u.device).expand(rows.numel(), -1))
        return self.q64[rows] * self.c[rows].gather(-1, u)


def _bin_keys(p: torch.Tensor, q: torch.Tensor, bits: int) -> torch.Tensor:
    """Bin of q/p per token, int64 [R, V], monotone in q/p: the float64 ratio's bit pattern
    shifted right by 52 - bits (exponent and the first ``bits`` mantissa bits), offset so that
    float32's normal range [2^-126, 2^128) maps to [1 << bits, 255 << bits), clamped to
    [0, 255 << bits] (below: q = 0 or a ratio under 2^-126; 255 << bits: p = 0 or a ratio of
    2^128 or more). A bin of a normal key holds ratios within a factor 1 + 2^-bits. The ratio's
    own buffer becomes the keys (one O(V) temporary: fresh multi-MB buffers cost page faults)."""
    key = torch.div(q, p).view(torch.int64).bitwise_right_shift_(52 - bits).sub_(896 << bits)
    return key.clamp_(0, 255 << bits)


def _plan_lumped(p, q, K, head, bits, levels, max_iter, tol):
    """p, q float64 [R, V]. The head (``head`` tokens of largest p + q, in token order) stays
    token by token; every other token joins the unit of its q/p bin. The unit rows are planned
    by ``_plan`` (exact level race on units); a token y of unit u gets r(y) = q(y) r_u / q_u."""
    R, V = p.shape
    dev = p.device
    h = min(head, V)
    if NUMPY_ON_CPU and dev.type == "cpu":
        hidx = _head_numpy(p, q, h)  # [R, h]
    else:
        # in token order, as the numpy route gives it: a unit's index breaks ties in the plan, and
        # topk's own order (sorted=False) is the kernel's, which may differ across devices
        hidx = torch.topk(p + q, h, dim=-1, sorted=False).indices.sort(-1).values  # [R, h]
    key = _bin_keys(p, q, bits)  # [R, V]
    nb = (255 << bits) + 2
    key.scatter_(-1, hidx, nb - 1)  # head tokens: a dummy bin, dropped
    kl = key.long()
    Pb = torch.zeros(R, nb, dtype=p.dtype, device=dev).scatter_add_(-1, kl, p)
    Qb = torch.zeros(R, nb, dtype=p.dtype, device=dev).scatter_add_(-1, kl, q)
    ph, qh = p.gather(-1, hidx), q.gather(-1, hidx)  # [R, h]
    w = 2.0 ** -bits + 2.0 ** -22  # the bins' ratio spread (2^-22: a margin for the rounding of q/p, far above it)
    if NUMPY_ON_CPU and dev.type == "cpu":  # the unit rows are small: numpy (the same values as the torch lines below)
        red, lut, c, lump = _units_numpy(Pb, Qb, ph, qh, K, h, bits, w, levels, max_iter, tol)
    else:
        red, lut, c, lump = _units_torch(Pb, Qb, ph, qh, K, h, bits, w, levels, max_iter, tol)
    lp = _Lumped()
    lp.red, lp.hidx, lp.key, lp.lut, lp.c, lp.q64 = red, hidx, key, lut, c, q
    lp.fit = LumpedFit(p=p, q=q, K=K, lumped=lp, red_fit=red.fit, lump_bound=lump, head=h, bits=bits)
    return lp


HEAD_THRESHOLDS = (2.0 ** -17, 2.0 ** -24)  # candidate cut-offs tried for the head (numpy route); the first keeps >= 64 tokens on LM rows


def _head_numpy(p, q, h):
    """The ``h`` tokens of largest p + q per row, ids ascending, ties at the h-th value broken
    by the lowest ids (a function of the row). p, q float64 CPU ``[R, V]``; returns int64 ``[R, h]``.

    Without a sort or a [V] temporary of p + q: the candidates are the tokens with p + q at
    or above the first cut-off of ``HEAD_THRESHOLDS`` that keeps at least h of them (every token
    when none does); the h-th largest value v is found among the candidates (``np.partition``),
    and since v is at or above the cut-off every token of value v is a candidate."""
    pn, qn = p.numpy(), q.numpy()
    R, V = pn.shape
    out = np.empty((R, h), dtype=np.int64)
    for i in range(R):
        for t in HEAD_THRESHOLDS:
            cand = np.flatnonzero((pn[i] >= 0.5 * t) | (qn[i] >= 0.5 * t))  # p + q >= t needs one of them >= t / 2
            sc = pn[i][cand] + qn[i][cand]
            keep = sc >= t
            if int(keep.sum()) >= h:
                cand, sc = cand[keep], sc[keep]
                break
        else:
            cand = np.arange(V)
            sc = pn[i] + qn[i]
        if cand.size > h:
            v = np.partition(sc, cand.size - h)[cand.size - h]  # the h-th largest value
            above = cand[sc > v]
            cand = np.sort(np.concatenate([above, cand[sc == v][: h - above.size]]))
        out[i] = cand
    return torch.as_tensor(out, device=p.device)


def _units_torch(Pb, Qb, ph, qh, K, h, bits, w, levels, max_iter, tol):
    """The unit rows (head tokens ph, qh ``[R, h]`` first, then the occupied bins of Pb, Qb
    ``[R, nb]`` in bin order, zero-padded to the batch's largest count), their plan, the bin ->
    unit table ``lut [R, nb]``, ``c = r_u / q_u [R, U]`` and the lumping bound ``[R]``."""
    R, nb = Pb.shape
    dev = Pb.device
    occ = (Pb > 0) | (Qb > 0)
    occ[:, -1] = False
    lut = torch.cumsum(occ, -1).sub_(1).add_(h)  # [R, nb] bin -> unit (where occupied)
    nt = int(occ.sum(-1).max())
    U = h + nt
    pr = torch.zeros(R, U, dtype=Pb.dtype, device=dev)
    qr = torch.zeros(R, U, dtype=Pb.dtype, device=dev)
    pr[:, :h] = ph
    qr[:, :h] = qh
    rr, cc = occ.nonzero(as_tuple=True)
    uu = lut[rr, cc]
    pr[rr, uu] = Pb[rr, cc]
    qr[rr, uu] = Qb[rr, cc]
    red = _plan(pr, qr, K, levels, max_iter, tol)
    r_u = torch.empty_like(pr).scatter_(-1, red.order, red.r_sorted)  # [R, U] unit order
    c = torch.where(qr > 0, r_u / torch.where(qr > 0, qr, torch.ones_like(qr)), torch.zeros_like(qr))
    # bound on the gap to the true alpha* (which is <= the units' alpha*, min over fewer sets):
    # the units' own gap, plus per tail unit min(p_u, r_u) w/(1+w) (ratios within 1 + w) or
    # min(p_u, r_u) for the clamped bins; see docs/guide/optimal_verifier.md
    mn = torch.minimum(pr, r_u)
    wide = torch.zeros(R, nb, dtype=torch.bool, device=dev)
    wide[:, : 1 << bits] = True
    wide[:, 255 << bits] = True
    wide_u = torch.zeros(R, U, dtype=torch.bool, device=dev)
    wide_u[rr, uu] = wide[rr, cc]
    tail = torch.arange(U, device=dev) >= h
    lump = torch.where(wide_u, mn, mn * (w / (1 + w))).mul_(tail).sum(-1)
    return red, lut, c, lump


def _units_numpy(Pb, Qb, ph, qh, K, h, bits, w, levels, max_iter, tol):
    """``_units_torch`` on CPU in numpy: the same unit rows, plan (numpy route), lut, c and bound."""
    Pn, Qn = Pb.numpy(), Qb.numpy()
    R, nb = Pn.shape
    occ = (Pn + Qn) > 0  # p, q >= 0
    occ[:, -1] = False
    lut = np.cumsum(occ, -1) - 1 + h  # [R, nb] int64
    U = h + int(occ.sum(-1).max())
    pr = np.zeros((R, U))
    qr = np.zeros((R, U))
    pr[:, :h] = ph.numpy()
    qr[:, :h] = qh.numpy()
    rr, cc = occ.nonzero()
    uu = lut[rr, cc]
    pr[rr, uu] = Pn[rr, cc]
    qr[rr, uu] = Qn[rr, cc]
    dev = Pb.device
    red = _plan(torch.as_tensor(pr, device=dev), torch.as_tensor(qr, device=dev), K, levels, max_iter, tol)
    r_u = np.empty_like(pr)
    np.put_along_axis(r_u, red.order.numpy(), red.r_sorted.numpy(), -1)
    pos = qr > 0
    c = np.where(pos, r_u / np.where(pos, qr, 1.0), 0.0)
    mn = np.minimum(pr, r_u)
    wide_u = np.zeros((R, U), dtype=bool)
    wide_u[rr, uu] = (cc < (1 << bits)) | (cc == (255 << bits))
    lump = np.where(wide_u, mn, mn * (w / (1 + w)))
    lump[:, :h] = 0.0
    return red, torch.as_tensor(lut, device=dev), torch.as_tensor(c, device=dev), torch.as_tensor(lump.sum(-1), device=dev)


def _tile_lumped(plan: _Lumped, c: int) -> _Lumped:
    out = _Lumped()
    out.red = _tile(plan.red, c)
    for name in ("hidx", "key", "lut", "c", "q64"):
        setattr(out, name, getattr(plan, name).repeat(c, 1))
    out.fit = plan.fit
    return out


class LumpedFit:
    """Diagnostics of the lumped rule (head tokens alone, tail lumped by q/p bin), one entry per
    row (leading dims ``batch``). Cheap fields: ``units`` (units per row), ``shortfall_bound``
    ``[...]`` (an upper bound on alpha* - acceptance: the unit fit's own gap plus the lumping
    bound), ``unit_fit`` (the ``OptimalFit`` of the unit rows), ``iterations``, ``converged``.
    Exact full-V fields, computed on first access (a sort of V): ``alpha_star``, ``acceptance``
    (``sum_y min(p, r)``), ``shortfall``, ``r`` ``[..., V]`` (the exact selection law)."""

    def __init__(self, *, p, q, K, lumped, red_fit, lump_bound, head, bits, batch=None):
        self._p, self._q, self._K, self._lumped = p, q, K, lumped
        self._batch = tuple(batch) if batch is not None else (p.shape[0],)
        self.unit_fit = red_fit
        self.lump_bound = lump_bound.reshape(self._batch)  # [...]
        self.head, self.bin_bits = head, bits
        self.units = lumped.c.shape[-1]
        self.iterations = red_fit.iterations
        self.converged = red_fit.converged
        self.levels = red_fit.levels

    @property
    def shortfall_bound(self) -> torch.Tensor:  # [...] >= alpha* - acceptance
        gap = (self.unit_fit.alpha_star - self.unit_fit.acceptance).clamp_min(0.0)
        return gap.reshape(self._batch) + self.lump_bound

    @property
    def gap_bound(self) -> torch.Tensor:  # [...] the units' alpha* (>= alpha*) - the exact acceptance; one O(V) pass
        return (self.unit_fit.alpha_star.reshape(self._batch) - self.acceptance).clamp_min(0.0)

    @functools.cached_property
    def r(self) -> torch.Tensor:  # [..., V]
        R = self._p.shape[0]
        return self._lumped.r_tokens(torch.arange(R, device=self._p.device)).reshape(*self._batch, -1)

    @functools.cached_property
    def alpha_star(self) -> torch.Tensor:  # [...] exact, by the sorted prefix scan over all V
        from ..limits.dual import iid_scan

        return iid_scan(self._p, self._q, self._K)[0].clamp(0.0, 1.0).reshape(self._batch)

    @functools.cached_property
    def acceptance(self) -> torch.Tensor:  # [...] sum_y min(p, r) of the rule used
        return torch.minimum(self._p, self.r.reshape(self._p.shape)).sum(-1).reshape(self._batch)

    @property
    def shortfall(self) -> torch.Tensor:
        return self.alpha_star - self.acceptance

    # the unit fit's diagnostics, per row (the level race runs on the units)
    @property
    def fit_error_max(self) -> torch.Tensor:  # [...] max_u |r_u - q_sel_u| over the units
        return self.unit_fit.fit_error_max.reshape(self._batch)

    @property
    def n_layers(self) -> torch.Tensor:
        return self.unit_fit.n_layers.reshape(self._batch)

    @property
    def n_fitted(self) -> torch.Tensor:
        return self.unit_fit.n_fitted.reshape(self._batch)

    @property
    def largest_layer(self) -> torch.Tensor:  # [...] units in the largest layer
        return self.unit_fit.largest_layer.reshape(self._batch)

    def rebatch(self, batch) -> "LumpedFit":
        return LumpedFit(p=self._p, q=self._q, K=self._K, lumped=self._lumped, red_fit=self.unit_fit,
                         lump_bound=self.lump_bound.reshape(-1), head=self.head, bits=self.bin_bits, batch=batch)


def _tile_any(plan, c: int):
    return _tile_lumped(plan, c) if isinstance(plan, _Lumped) else _tile(plan, c)


def _tile(plan: _Plan, c: int) -> _Plan:
    """The plan of ``c`` stacked copies of the plan's rows (row i of copy j is row j * R + i)."""
    R, V = plan.order.shape
    out = _Plan()
    for name in ("order", "rank", "lo", "frac", "r_sorted"):
        setattr(out, name, getattr(plan, name).repeat(c, 1))
    shift = torch.arange(c, device=plan.bnd_flat.device).unsqueeze(1) * (R * (V + 1))
    out.bnd_flat = (plan.bnd_flat.unsqueeze(0) + shift).reshape(-1)
    out.fit = plan.fit
    return out


class _Tokens:
    """The tokens of every unit, concatenated unit after unit (compact index space)."""

    def __init__(self, qs, qsel_s, u_row, u_a, n_u):
        V = qs.shape[-1]
        dev = qs.device
        self.off = torch.cumsum(n_u, 0) - n_u  # [U] compact index of each unit's first token
        n = int(n_u.sum())
        uid = torch.repeat_interleave(torch.arange(n_u.numel(), device=dev), n_u)
        self.flat = u_row[uid] * V + u_a[uid] + torch.arange(n, device=dev) - self.off[uid]  # [n] into [R, V]
        self.q = qs.reshape(-1)[self.flat]
        t = qsel_s.reshape(-1)[self.flat]
        pos = self.q > 0
        self.c = torch.where(pos, t / torch.where(pos, self.q, torch.ones_like(self.q)), torch.full_like(t, torch.inf))

    def of(self, off, lens):
        """(compact indices of the tokens of units with these offsets/lengths, unit-local id of each)."""
        dev = off.device
        cl = torch.cumsum(lens, 0) - lens
        uid = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens)
        return off[uid] + torch.arange(int(lens.sum()), device=dev) - cl[uid], uid


def _fit_units(qs, qsel_s, Qc, u_row, u_a, u_b, r_s, lo_out, frac_out, K, M, max_iter, tol):
    """Fit the level race of every multi-token layer with draft mass (a "unit": row u_row,
    sorted positions [u_a, u_b)); writes r_s, lo, frac in place.

    Every quantity of a unit is computed from its own row only (row-wise prefix sums, a
    binary search inside the unit's range, per-unit convergence), so the rule a row gets
    does not depend on the other rows of the batch. Units are grouped by level count and
    processed in chunks bounded by UNIT_CHUNK_ELEMS."""
    R, V = qs.shape
    dev = qs.device
    n_u = u_b - u_a
    m_unit = torch.minimum(n_u, torch.full_like(n_u, M))  # a layer of n tokens gets min(M, n) levels
    ct = torch.cat([torch.zeros(R, 1, dtype=qs.dtype, device=dev), torch.cumsum(qsel_s, -1)], -1)  # [R, V+1]
    tok = _Tokens(qs, qsel_s, u_row, u_a, n_u)
    res_u = torch.zeros(u_row.numel(), dtype=qs.dtype, device=dev)  # final fixed-point residual per unit
    fit = (qs, tok, Qc, ct, u_row, u_a, u_b, r_s, lo_out, frac_out, K, tol)
    iters_max = _fit_groups(torch.arange(u_row.numel(), device=dev), m_unit, fit, max(1, max_iter // 4), res_u)
    # a unit that stalls at one level count (a quarter of max_iter) is refitted with half, then
    # twice as many levels, max_iter each (any placement is exact; the one with the lower
    # residual is kept, token by token of the unit). Units that _fit_chunk stopped at their
    # rounding floor (residual <= FLOOR_TOL_FACTOR * tol) are done and not refitted.
    for alt in (max(M // 2, 2), 2 * M):
        bad = (res_u > FLOOR_TOL_FACTOR * tol).nonzero().squeeze(-1)
        if bad.numel() == 0:
            break
        m_alt = torch.minimum(n_u[bad], torch.full_like(n_u[bad], alt))
        cidx, uid = tok.of(tok.off[bad], n_u[bad])
        tflat = tok.flat[cidx]
        saved = (r_s.view(-1)[tflat].clone(), lo_out.view(-1)[tflat].clone(), frac_out.view(-1)[tflat].clone())
        res_alt = res_u.clone()
        it = _fit_groups(bad, m_alt, fit, max_iter, res_alt)
        iters_max = max(iters_max, it)
        worse = res_alt[bad] >= res_u[bad]
        back = worse[uid]
        r_s.view(-1)[tflat[back]] = saved[0][back]
        lo_out.view(-1)[tflat[back]] = saved[1][back]
        frac_out.view(-1)[tflat[back]] = saved[2][back]
        res_u[bad] = torch.where(worse, res_u[bad], res_alt[bad])
    return iters_max, bool((res_u <= tol).all())


def _fit_groups(units, m_of, fit, max_iter, res_out):
    """Fit ``units`` (indices) with ``m_of[i]`` levels for units[i], grouped by level count, in
    chunks bounded by UNIT_CHUNK_ELEMS; writes the placement and each unit's residual."""
    iters_max = 0
    for Mu in torch.unique(m_of).tolist():
        sel = units[(m_of == Mu).nonzero().squeeze(-1)]
        per = max(1, UNIT_CHUNK_ELEMS // (Mu + 1))
        for u0 in range(0, sel.numel(), per):
            us = sel[u0 : u0 + per]
            it, res = _fit_chunk(fit, us, int(Mu), max_iter)
            res_out[us] = res
            iters_max = max(iters_max, it)
    return iters_max


def _fit_chunk(fit, us, M, max_iter):
    """Units ``us`` of the sorted rows with M levels each. Writes the placement and the exact r
    of their tokens; returns (iterations, residual per unit)."""
    qs, tok, Qc, ct, u_row, u_a, u_b, r_s, lo_out, frac_out, K, tol = fit
    R, V = qs.shape
    dev = qs.device
    dt = torch.float64
    row, ua, ub = u_row[us], u_a[us], u_b[us]
    U = row.numel()
    Qa = Qc[row, ua]
    Qb = Qc[row, ub]
    Qflat = Qc.reshape(-1)
    Tflat = ct.reshape(-1)
    cbase = tok.off[us] - ua  # compact index of sorted position x of unit u: cbase[u] + x
    nbits = int((ub - ua).max()).bit_length()  # 2^nbits > the longest unit
    grid = torch.linspace(0.0, 1.0, M + 1, dtype=dt, device=dev)
    D = Qa.unsqueeze(-1) + (Qb - Qa).unsqueeze(-1) * grid  # [U, M+1]
    all_u = torch.arange(U, device=dev)

    def search(ui, W):
        """Positions pos [N, M] in [ua, ub]: the first token of the unit with c >= W (binary
        lifting in compact index space, see _scan.segment_search)."""
        first = tok.off[us][ui].unsqueeze(-1)
        return segment_search(tok.c, first, first + (ub - ua)[ui].unsqueeze(-1), W, nbits) - cbase[ui].unsqueeze(-1)

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

    # fixed-point steps, then Newton on the interior levels (finite-difference Jacobian, all
    # units at once; the step and its fractions LINE tried at once, the lowest residual kept), kept
    # per unit only where it lowers the residual; converged units freeze
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
            line = torch.tensor(LINE, dtype=dt, device=dev)  # [S] the Newton step and its fractions (a line search)
            S = line.numel()
            Dt = Da.unsqueeze(1).repeat(1, S, 1)  # [A, S, M+1]
            Dt[:, :, 1:M] += line.view(1, S, 1) * torch.where(good.unsqueeze(-1), dx, torch.zeros_like(dx)).unsqueeze(1)
            Dt = torch.minimum(torch.maximum(Dt, qa.unsqueeze(1)), qb.unsqueeze(1))
            Dt[:, :, 0] = Qa[act].unsqueeze(-1)
            Dt = torch.cummax(Dt, -1).values
            Gt = step(Dt.reshape(A * S, M + 1), act.repeat_interleave(S)).reshape(A, S, M + 1)
            rts = (Gt - Dt).abs().amax(-1)  # [A, S]
            jbest = rts.argmin(-1)  # the first of the smallest residuals, as np.argmin
            pick = jbest.view(A, 1, 1).expand(A, 1, M + 1)
            Dt, Gt = Dt.gather(1, pick).squeeze(1), Gt.gather(1, pick).squeeze(1)
            rt = rts.gather(1, jbest.unsqueeze(-1)).squeeze(-1)
            take = good & (rt < ra)
            Dn = torch.where(take.unsqueeze(-1), Dt, Ga)
            Gn = torch.where(take.unsqueeze(-1), Gt, step(Ga, act)) if bool((~take).any()) else Gt
        rn = (Gn - Dn).abs().amax(-1)
        D[act] = Dn
        G[act] = Gn
        res[act] = rn
        # stop a unit at tol, or when its residual has not halved for 8 steps and is at most
        # FLOOR_TOL_FACTOR * tol (1e-9 of level mass): such a unit sits at a kink of the piecewise-
        # linear placement or at rounding. Measured on the study's HumanEval, KJV and MT-bench
        # blocks: the acceptance shortfall of fits stopped there stayed below 1e-10 (1e-3: below
        # 6e-11, 3-10x the steps; 1e6: up to 5e-8). The output law is exact whatever the fit.
        # A unit whose residual has not halved for STALL_STOP steps stops whatever its residual (it is
        # refitted at other level counts below; issue 39 item 4: see _optimal_np.STALL_STOP).
        better = rn < 0.5 * best[act]
        best[act] = torch.minimum(best[act], rn)
        stall[act] = torch.where(better, torch.zeros_like(stall[act]), stall[act] + 1)
        done = done | (res <= tol) | ((stall >= 8) & (res <= FLOOR_TOL_FACTOR * tol)) | (stall >= STALL_STOP)
    # placement of every token from the final levels D, then the exact r from the masses it induces
    W = chord(D[:, :-1], D[:, 1:], K)  # [U, M]
    pos = search(all_u, W)
    lens = ub - ua
    cidx, uid = tok.of(tok.off[us], lens)  # the chunk's tokens, unit by unit
    n = cidx.numel()
    off = torch.cumsum(lens, 0) - lens  # chunk-local index of each unit's first token
    tflat = tok.flat[cidx]
    cnt = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    cnt.index_add_(0, (off.unsqueeze(-1) + pos - ua.unsqueeze(-1)).reshape(-1), torch.ones(U * M, dtype=torch.int64, device=dev))
    bucket = torch.cumsum(cnt, 0)[:n] - M * uid  # number of W_l at or before the token
    inside = (bucket > 0) & (bucket < M)
    lo = torch.where(bucket >= M, torch.full_like(bucket, M - 1), (bucket - 1).clamp(min=0))
    hi = (lo + 1).clamp(max=M - 1)
    Wf = W.reshape(-1)
    base = uid * M
    wl, wh = Wf[base + lo], Wf[base + hi]
    cy = tok.c[cidx]
    qy = tok.q[cidx]
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


_norm64 = rows64  # the prologue's normalisation (a no-op on rows it already normalised)


@register
class Optimal(Verifier):
    r"""The optimal verifier for i.i.d. drafts at any V (layers + a fitted level race + SD).

    Selection: the draft in the highest layer of the sorted prefix scan wins; inside it a
    level race whose levels are fitted so that the selection law r equals the closed-form
    q_sel. Then accept Z with min(1, p(Z)/r(Z)), else sample norm((p - r)+), r computed
    exactly from the fitted levels: the output law is p whatever the fit; the acceptance is
    alpha* when the fit converges (see ``fit`` and docs/guide/optimal_verifier.md).

    At V > ``exact_below`` the same rule runs on units (the ``head`` tokens of largest p + q
    alone, the rest lumped by q/p bin, ``2^bin_bits`` bins per octave) and
    r(y) = q(y) r_u / q_u inside unit u: still exactly lossless (Khisti et al., "Multi-Draft
    Speculative Sampling: Canonical Decomposition and Theoretical Limits", ICLR 2025,
    arXiv 2410.18234: any selection rule with its exact selection law), acceptance alpha* - O(w) of the tail's
    overlap, bounded and reported (``LumpedFit.shortfall_bound``; a warning, once per verifier, the
    first time the exact bound ``LumpedFit.gap_bound`` is above ``warn_lump``). ``head=None`` plans every token.
    """

    name = "optimal"
    laws = ("iid",)

    def __init__(self, levels: int = DEFAULT_LEVELS, max_iter: int = DEFAULT_MAX_ITER, tol: float = DEFAULT_TOL, warn_shortfall: float = 1e-9,
                 head: int | None = DEFAULT_HEAD, bin_bits: int = DEFAULT_BIN_BITS, exact_below: int = DEFAULT_EXACT_BELOW,
                 warn_lump: float = DEFAULT_WARN_LUMP):
        if head is not None and (not isinstance(head, int) or head < 1):
            raise ValueError(f"head must be None (exact rule over all tokens) or an integer >= 1, got {head!r}")
        if not isinstance(bin_bits, int) or not 0 <= bin_bits <= 20:
            raise ValueError(f"bin_bits must be an integer in 0..20 (q/p bins per octave 2^bin_bits), got {bin_bits!r}")
        if not isinstance(exact_below, int) or exact_below < 0:
            raise ValueError(f"exact_below must be an integer >= 0 (vocabulary sizes planned exactly), got {exact_below!r}")
        if not (warn_lump >= 0):
            raise ValueError(f"warn_lump must be >= 0, got {warn_lump!r}")
        self.head, self.bin_bits, self.exact_below, self.warn_lump = head, bin_bits, exact_below, float(warn_lump)
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
        self._lump_warned = False  # the lumped tail's warning was given (it is given once per verifier)
        self.last_fit = None

    @property
    def last_fit(self) -> OptimalFit | None:
        """The fit of the last ``verify`` / ``output_distribution`` call, one entry per distinct
        row (computed on first access after a K = 1 call, which needs no fit to verify)."""
        if self._last_fit is None and self._fit_src is not None:
            pu, qu = self._fit_src
            V = pu.shape[-1]
            plan = _plan(_norm64(pu).reshape(-1, V), _norm64(qu).reshape(-1, V), 1, self.levels, self.max_iter, self.tol)
            self._last_fit, self._fit_src = plan.fit.rebatch(pu.shape[:-1]), None
        return self._last_fit

    @last_fit.setter
    def last_fit(self, fit: OptimalFit | None) -> None:
        self._last_fit, self._fit_src = fit, None

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
        plan = self._plan_rows(_norm64(p).reshape(-1, V), _norm64(q).reshape(-1, V), k)
        return plan.fit.rebatch(batch)

    def _lumps(self, V: int) -> bool:
        """Whether rows of V tokens get the lumped rule (head + q/p bins) instead of the exact scan."""
        return self.head is not None and V > max(self.exact_below, self.head)

    def _plan_rows(self, p64, q64, K):
        if self._lumps(p64.shape[-1]) and K > 1:
            return _plan_lumped(p64, q64, K, self.head, self.bin_bits, self.levels, self.max_iter, self.tol)
        return _plan(p64, q64, K, self.levels, self.max_iter, self.tol)

    @staticmethod
    def _distinct(p, q):
        """(rep, pu, qu): rows repeated along the first dim (an expanded view, stride 0: e.g.
        the experiments' [draws, positions, V], or one row as [draws, V]) are fitted once and the
        plan tiled."""
        rep = p.dim() >= 2 and p.shape[0] > 1 and p.stride(0) == 0 and q.stride(0) == 0
        return (rep, p[0], q[0]) if rep else (rep, p, q)

    def _make_plan(self, p, q, K, normalised=False):
        """(p64, q64, plan) of rows p, q; ``normalised``: the rows come from the prologue (float64,
        normalised: ``rows64`` would return them unchanged, so its O(V) check is skipped)."""
        q = _shared_q(p, q, K)
        V = p.shape[-1]
        rep, pu, qu = self._distinct(p, q)
        norm = (lambda x: x) if normalised else _norm64
        p64, q64, plan = self._fit_rows(norm(pu).reshape(-1, V), norm(qu).reshape(-1, V), K, pu.shape[:-1])
        if rep:
            plan = _tile_any(plan, p.shape[0])
            p64 = p64.repeat(p.shape[0], 1)
            q64 = q64.repeat(p.shape[0], 1)
        return p64, q64, plan

    def _fit_rows(self, p64, q64, K, batch):
        """The plan of normalised rows p64, q64 ``[R, V]``; sets ``last_fit`` (shape ``batch``) and
        warns when the fit stops short of alpha*."""
        plan = self._plan_rows(p64, q64, K)
        self.last_fit = plan.fit.rebatch(batch)  # one entry per distinct row
        fit = plan.fit.unit_fit if isinstance(plan, _Lumped) else plan.fit
        short = float(fit.shortfall.max())
        if short > self.warn_shortfall:
            warnings.warn(
                f"optimal verifier: fit stopped {short:.3g} below alpha* (iterations {fit.iterations}, "
                f"levels {self.levels}); the output law is still exact", RuntimeWarning, stacklevel=4,
            )
        if isinstance(plan, _Lumped) and not self._lump_warned and float(plan.fit.shortfall_bound.max()) > self.warn_lump:
            bound = float(plan.fit.gap_bound.max())  # the O(V) bound (a sort of V), read only when the cheap one is above
            if bound > self.warn_lump:  # once per verifier: on flat rows the cheap bound is above at every node and
                self._lump_warned = True  # the exact one cost ~6 of ~16 ms a node (issue 39 item 4); fit.gap_bound stays readable
                warnings.warn(
                    f"optimal verifier: the lumped tail may cost up to {bound:.3g} of acceptance below alpha* "
                    f"(head {self.head}, bin_bits {self.bin_bits}; head=None plans every token); the output law "
                    f"is still exact", RuntimeWarning, stacklevel=4,
                )
        return p64, q64, plan

    # prepared rows (Verifier.prepare): the fit once, tiled over the tuples ---------------
    def _prepare(self, p, q, k, law):
        q = _shared_q(p, q, k)
        return self._fit_rows(_norm64(p), _norm64(q), k, p.shape[:-1])

    def _output_prepared(self, state, p, q, drafts, law):
        p64, _, plan = state
        c = drafts.shape[0] // p64.shape[0]
        return self._output_from_plan(p64.repeat(c, 1), _tile_any(plan, c), drafts)

    @staticmethod
    def _draft_info(plan, drafts):
        if isinstance(plan, _Lumped):  # the unit race; r of the drafted token = q(y) r_u / q_u
            u = plan.units(drafts)
            pos, lid, lo, f, _ = Optimal._draft_info(plan.red, u)
            return pos, lid, lo, f, plan.q64.gather(-1, drafts) * plan.c.gather(-1, u)
        pos = plan.rank.gather(-1, drafts)  # [R, K]
        return pos, plan.layer_id(pos), plan.lo.gather(-1, pos), plan.frac.gather(-1, pos), plan.r_sorted.gather(-1, pos)

    # sampling path ---------------------------------------------------------------------
    def _verify(self, p, q, drafts, g, law):
        if drafts.shape[-1] == 1:
            return self._verify_single(p, q, drafts, g)
        return self._verify_plan(p, q, drafts, g, normalised=True)

    def _verify_plan(self, p, q, drafts, g, normalised=False):
        """The sampling path through the fitted plan (any K)."""
        batch, K = p.shape[:-1], drafts.shape[-1]
        p64, q64, plan = self._make_plan(p, q, K, normalised)
        D = drafts.reshape(-1, K)
        race = self._race_numpy if NUMPY_ON_CPU and p.device.type == "cpu" else self._race_torch
        token, rej = race(p64, plan, D, g)  # numpy on CPU: the same operations, no torch dispatch
        if rej.numel():
            res = self._residual_rows(p64, plan, rej)
            token[rej] = sample_rows(lambda rows: res[rows], torch.arange(rej.numel(), device=p.device), g)
        return token.reshape(batch)

    def _race_torch(self, p64, plan, D, g):
        """The level race and the accept coin of ``_verify_plan`` (any device): the draft of the
        highest layer wins, then the highest level in it (lo, or lo + 1 with probability f), then
        the largest tie uniform; it is accepted with probability min(1, p/r). (token [R], rejected rows)."""
        R, K = D.shape
        _, lid, lo, f, rk = self._draft_info(plan, D)
        u_lev = torch.rand(R, K, generator=g, dtype=torch.float64, device=p64.device)
        u_tie = torch.rand(R, K, generator=g, dtype=torch.float64, device=p64.device)
        u_acc = torch.rand(R, generator=g, dtype=torch.float64, device=p64.device)
        level = lo + (u_lev < f).to(lo.dtype)
        top = lid.amax(-1, keepdim=True)
        cand = lid == top
        lev = torch.where(cand, level, torch.full_like(level, -1))
        cand = cand & (lev == lev.amax(-1, keepdim=True))
        win = torch.where(cand, u_tie, torch.full_like(u_tie, -1.0)).argmax(-1, keepdim=True)  # [R, 1]
        Z = D.gather(-1, win).squeeze(-1)
        rZ = rk.gather(-1, win).squeeze(-1)
        pZ = p64.gather(-1, Z.unsqueeze(-1)).squeeze(-1)
        return Z.clone(), (~accept(u_acc, pZ, rZ)).nonzero().squeeze(-1)

    @staticmethod
    def _draft_info_numpy(plan, D):
        """``_draft_info`` in numpy (CPU plans): (layer id, lo, f, r of the drafted token), each [R, K]."""
        rows = np.arange(D.shape[0])[:, None]  # x[rows, idx]: x.gather(-1, idx)
        if isinstance(plan, _Lumped):
            hidx, lut = plan.hidx.numpy(), plan.lut.numpy()
            eq = D[:, :, None] == hidx[:, None, :]  # [R, K, h]
            kb = np.minimum(plan.key.numpy()[rows, D].astype(np.int64), lut.shape[-1] - 1)
            u = np.where(eq.any(-1), eq.argmax(-1), lut[rows, kb])
            lid, lo, f, _ = Optimal._draft_info_numpy(plan.red, u)
            return lid, lo, f, plan.q64.numpy()[rows, D] * plan.c.numpy()[rows, u]
        R, V = plan.order.shape
        pos = plan.rank.numpy()[rows, D]  # [R, K]
        lid = np.searchsorted(plan.bnd_flat.numpy(), rows * (V + 1) + pos, side="right")
        return lid, plan.lo.numpy()[rows, pos], plan.frac.numpy()[rows, pos], plan.r_sorted.numpy()[rows, pos]

    @staticmethod
    def _race_numpy(p64, plan, D, g):
        """``_race_torch`` on CPU, in numpy (the same uniforms, read in the same order, and the same
        float64 operations, so the same tokens for the same plan): (token [R] torch, rejected rows)."""
        R, K = D.shape
        dev = p64.device  # the CPU
        u_lev = torch.rand(R, K, generator=g, dtype=torch.float64, device=dev).numpy()
        u_tie = torch.rand(R, K, generator=g, dtype=torch.float64, device=dev).numpy()
        u_acc = torch.rand(R, generator=g, dtype=torch.float64, device=dev).numpy()
        Dn = D.numpy()
        lid, lo, f, rk = Optimal._draft_info_numpy(plan, Dn)
        level = lo + (u_lev < f)
        cand = lid == lid.max(-1, keepdims=True)
        lev = np.where(cand, level, -1)
        cand &= lev == lev.max(-1, keepdims=True)
        win = np.where(cand, u_tie, -1.0).argmax(-1)  # [R]
        rows = np.arange(R)
        Z = Dn[rows, win]
        rZ = rk[rows, win]
        pZ = p64.numpy()[rows, Z]
        ok = (pZ > 0) & (u_acc * rZ <= pZ)  # _residual.accept
        return torch.as_tensor(Z, device=dev), torch.as_tensor(np.flatnonzero(~ok), device=dev)

    def _verify_single(self, p, q, drafts, g):
        """K = 1 without the plan: every token is its own layer, so r = q exactly (the plan's
        r_sorted is chord(Q_{j-1}, Q_j) q_j = q_j for K = 1) and the rule is single-draft SD.
        The same uniforms are read in the same order as the K > 1 path, so the tokens equal
        what the plan gives for the same generator; the fit (``last_fit``) is computed only
        when read."""
        q = _shared_q(p, q, 1)
        batch, V = p.shape[:-1], p.shape[-1]
        _, pu, qu = self._distinct(p, q)
        self._last_fit, self._fit_src = None, (pu, qu)
        p64 = _norm64(p).reshape(-1, V)
        q64 = _norm64(q).reshape(-1, V)
        Z = drafts.reshape(-1)
        R = Z.shape[0]
        torch.rand(R, 1, generator=g, dtype=torch.float64, device=p.device)  # u_lev, u_tie: unused with one draft
        torch.rand(R, 1, generator=g, dtype=torch.float64, device=p.device)
        u_acc = torch.rand(R, generator=g, dtype=torch.float64, device=p.device)
        rZ = q64.gather(-1, Z.unsqueeze(-1)).squeeze(-1)
        pZ = p64.gather(-1, Z.unsqueeze(-1)).squeeze(-1)
        token = Z.clone()
        rej = (~accept(u_acc, pZ, rZ)).nonzero().squeeze(-1)
        if rej.numel():
            res = residual_or((p64[rej] - q64[rej]).clamp_min(0.0), p64[rej])
            token[rej] = sample_rows(lambda rows: res[rows], torch.arange(rej.numel(), device=p.device), g)
        return token.reshape(batch)

    @staticmethod
    def _residual_rows(p64, plan, rows):
        if isinstance(plan, _Lumped):
            pr = p64[rows]
            return residual_or((pr - plan.r_tokens(rows)).clamp_min(0.0), pr)
        r_tok = torch.empty(rows.numel(), p64.shape[-1], dtype=torch.float64, device=p64.device)
        r_tok.scatter_(-1, plan.order[rows], plan.r_sorted[rows])
        pr = p64[rows]
        return residual_or((pr - r_tok).clamp_min(0.0), pr)  # never empty (``_residual`` notes)

    # exact path -----------------------------------------------------------------------
    def _output_distribution(self, p, q, drafts, law):
        batch, V, K = p.shape[:-1], p.shape[-1], drafts.shape[-1]
        p64, q64, plan = self._make_plan(p, q, K, normalised=True)
        return self._output_from_plan(p64, plan, drafts.reshape(-1, K)).reshape(*batch, V)

    def _output_from_plan(self, p64, plan, D):
        """Output laws ``[R, V]`` for drafts D ``[R, K]`` of the plan's rows p64 ``[R, V]``."""
        R = D.shape[0]
        _, lid, lo, f, rk = self._draft_info(plan, D)
        win = _win_probs(lid, lo, f)  # [R, K]
        res = residual_law(self._residual_rows(p64, plan, torch.arange(R, device=p64.device)), p64)
        px = p64.gather(-1, D)
        # a = min(1, p/r) as ``_residual.accept`` decides it: 1 where r = 0 < p, 0 where p = 0
        a = accept_prob(px, rk)
        out = (win * (1.0 - a)).sum(-1, keepdim=True) * res
        return out.scatter_add(-1, D, win * a)


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
