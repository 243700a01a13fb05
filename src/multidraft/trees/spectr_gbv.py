r"""SpecTr-GBV (Lin, Sheng, Cai, Zhou; arXiv 2604.25925), as a tree rule: K i.i.d. drafts, a
SpecTr-style optimal-transport selection, then block verification of the selected path.

What we could read of the paper. The stored copies (the abstract page, a mirror of it,
three news/summary pages and a machine-written review) give only the abstract: SpecTr-GBV
"unifies multi-draft and greedy block verification (GBV) into a single framework", "by
formulating the verification step as an optimal transport problem over draft and target
token blocks", and the authors "prove that SpecTr-GBV achieves the optimal expected
acceptance length physically attainable within the framework of i.i.d. draft generation",
a bound that grows with the number of drafts. We could NOT read the OT problem's cost or
constraints, the algorithm, the theorem or its proof. What follows is our reconstruction,
lossless by construction and certified by enumeration (``tests/trees/test_gbv_rules.py``);
the optimality claim is checked against the exact tree-level ceiling there.

Reconstruction. SpecTr (Sun et al., NeurIPS 2023) couples K i.i.d. drafts with the target
by its "K-sequential" transport plan: with a parameter rho, draft j (in order) is accepted
with probability ``beta(x_j) = min(1, p(x_j) / (rho q(x_j)))``. We keep that plan as the
*selection* of ``trees.gbv``'s select-then-block-verify frame (whose module notes give the
lossless argument): at a node with k i.i.d. drafts the picked slot is the first j < k whose
coin succeeds, else the last slot, so the selection law is

    s(x) = q(x) beta(x) sum_(j=0..k-2) (1 - bbar)^j + (1 - bbar)^(k-1) q(x),
    bbar = sum_x q(x) beta(x),

and the picked path is then block-verified against s (the "GBV" half: Sun et al.'s
backward scan with ``a_i = min(a_(i-1) p / s, 1)``). rho at each node maximises the one-step
acceptance ``sum_x min(p(x), s(x))`` over a fixed grid (the OT step: with rho free, s ranges
over the SpecTr plans and the acceptance is their transport value), so the rule depends on
(p, q, k) of the node only. With one draft s = q and the rule is block verification.

Points unspecified to us, and our choices:

* The OT problem: SpecTr's K-sequential plan at the token level of every node on the
  picked path, composed with block verification along it. (An OT over whole blocks
  ``x^L`` would need p and q of blocks the tree does not contain, so it cannot read a
  DraftTree.)
* rho: the best of ``RHO_POINTS`` values ``exp(linspace(-log 4k, log 4k))`` (rho = 1
  included) for the one-step acceptance, ties to the smallest; any rho is lossless.
* No draft accepted: the last draft is picked (the verifier then decides; SpecTr itself
  would sample its residual here).
* Tree laws, degenerate rows and the paths not picked: as ``trees.gbv``.

Generator order (``verify``): at every node of the picked path from the root, k - 1
uniforms (the coins of slots 1 .. k-1, drawn together), then block verification's n
uniforms, then one uniform for the emitted token.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .gbv import SelectThenBlock, Selection, _log_
from .rules import register

__all__ = ["RHO_POINTS", "SpecTrGBV", "KSeqSelection", "kseq_selection", "kseq_selection_law"]

RHO_POINTS = 33  # grid of SpecTr's rho per node (odd: rho = 1 is on it)


class _Grid:
    """A node's rho grid and the K-sequential plan's rows at one rho (``kseq_selection_law``'s
    formula): p, q ``[V]`` float64 (q normalised here), k > 1 drafts."""

    __slots__ = ("p", "q", "k", "sup", "full", "qs", "rho")

    def __init__(self, p, q, k):
        self.p, self.q, self.k = p, q / q.sum(), k
        self.full = bool(self.q.min() > 0)  # one reduction; the support mask only where q has zeros
        self.sup = None if self.full else self.q > 0  # [V]
        self.qs = self.q if self.full else torch.where(self.sup, self.q, torch.ones_like(self.q))  # [V]
        self.rho = _rho_grid(k, self.q.device)  # [G, 1]

    def law(self, j):
        """The selection law ``s [1, V]`` at rho_j: ``q beta = min(q, p / rho)`` (0 off q's support),
        ``1 - bbar = 1 - sum q beta``, ``s = q beta G + M q``."""
        qb = torch.minimum(self.q, torch.div(self.p, self.rho[j:j + 1]))
        miss = 1.0 - qb.sum(-1, keepdim=True)
        return qb.mul_(_geo(miss, self.k)).add_(miss.pow(self.k - 1) * self.q)

    def coins(self, j, idx=slice(None)):
        """The coins ``beta = min(1, p / (rho_j q))`` (0 off q's support) at the tokens idx (all by default)."""
        beta = self.p[idx] / (self.rho[j, 0] * self.qs[idx])
        beta.clamp_(max=1.0)
        return beta if self.full else beta.masked_fill_(~self.sup[idx], 0.0)

    def screen(self):
        """``(candidates, miss)``: the grid indices to evaluate exactly, in grid order, and ``1 -
        bbar`` ``[G]`` from the screen's histogram (None when V <= ``SCREEN_V``: every rho)."""
        if self.q.shape[0] <= SCREEN_V:
            return list(range(RHO_POINTS)), None
        lo, hi, miss = _acceptance_bounds(self.p, self.q, self.sup, self.full, self.qs, self.rho[:, 0], self.k)
        return _contenders(lo, hi).tolist(), miss

    def best(self, cand):
        """``(j, s [V])``: the first rho of ``cand`` with the largest acceptance ``sum min(s, p)``, and its law."""
        best, kept = None, None
        for j in cand:
            s = self.law(j)
            if len(cand) == 1:  # the screen left one rho: it is the best, its acceptance is not needed
                return j, s[0]
            acc = float(torch.minimum(s, self.p).sum(-1)[0])
            if best is None or acc > best:
                best, kept = acc, (j, s[0])
        return kept


@functools.lru_cache(maxsize=32)
def _rho_grid(k, device):
    """SpecTr's rho grid for k drafts, ``exp(linspace(-log 4k, log 4k, RHO_POINTS))`` ``[G, 1]`` (shared: never
    written)."""
    half = math.log(4 * k)
    return torch.exp(torch.linspace(-half, half, RHO_POINTS, dtype=torch.float64, device=device)).unsqueeze(1)


def _contenders(lo, hi):
    """The grid indices ``[C]`` (host) whose upper bound ``hi [G]`` reaches the best lower bound ``lo [G]``, within
    ``SCREEN_TOL``."""
    return np.flatnonzero(hi >= lo.max() - SCREEN_TOL)


def _nonzero(x):
    """The indices ``[n]`` of the true entries of a 1-D bool tensor x, on x's device: by numpy's on the CPU (a
    fifth of ``torch.nonzero``'s time at V = 151,936 here; the same indices)."""
    if x.device.type == "cpu":
        return torch.as_tensor(np.flatnonzero(x.numpy()), device=x.device)
    return torch.nonzero(x).flatten()


def _geo(miss, k):  # sum_(j<k-1) (1 - bbar)^j: a tensor of any shape, or a float
    return sum(miss ** j for j in range(k - 1))


class _Coins:
    """The coins of one rho as a pick reads them, lazily: ``coins[idx]`` is ``beta`` at the tokens
    idx, the bits of the whole row's entries (``_Grid.coins``)."""

    __slots__ = ("_grid", "_j")

    def __init__(self, grid: _Grid, j: int):
        self._grid, self._j = grid, j

    @property
    def device(self):
        return self._grid.q.device

    def __getitem__(self, idx):
        return self._grid.coins(self._j, idx)


def _kseq(p, q, k):
    """``(grid, j, s [V])``: the node's grid, its best rho's index and law (``kseq_selection_law``)."""
    grid = _Grid(p, q, k)
    j, s = grid.best(grid.screen()[0])
    return grid, j, s


def kseq_selection_law(p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K-sequential selection at a node with k i.i.d. drafts: its law ``[V]`` at the best rho
    of the grid, and the acceptance coins ``beta [V]`` at that rho. p, q: ``[V]`` float64.

    For every rho of the grid, ``beta = min(1, p / (rho q))`` (0 off q's support),
    ``q beta = min(q, p / rho)``, ``1 - bbar = 1 - sum q beta``,
    ``s = q beta sum_(j<k-1) (1 - bbar)^j + (1 - bbar)^(k-1) q`` and its acceptance ``sum min(s, p)``;
    the first rho of the largest acceptance wins. One rho at a time over ``[V]`` rows (the same
    elementwise operations and row sums as on the whole ``[G, V]`` grid, so the same bits, without
    its ``[G, V]`` temporaries). Above ``SCREEN_V`` only the rhos whose acceptance may be the best
    (``_acceptance_bounds``, one histogram of p / q) are evaluated, in grid order; the law of the
    best is kept, not recomputed. (The law takes ``q beta`` as ``min(q, p / rho)``, the coins as
    ``min(1, p / (rho q))``: the same number to rounding, one pass over V fewer.)"""
    if k == 1:
        return q / q.sum(), torch.ones_like(q)
    grid, j, s = _kseq(p, q, k)
    return s, grid.coins(j)


class KSeqSelection(Selection):
    """SpecTr-GBV's selection law at one node, lazily, where the screen left one rho (above
    ``SCREEN_V``): the coins at the drafts for the pick (``_Coins``), one entry
    ``s(x) = min(q(x), p(x) / rho) sum_(j<k-1) (1 - bbar)^j + (1 - bbar)^(k-1) q(x)`` from the
    screen's ``1 - bbar`` (no pass over V), and the whole law (``kseq_selection_law``'s numbers)
    only when ``row()`` is read, where the backward scan stops. The screen's ``bbar = Q(t >= rho) +
    P(t < rho) / rho`` is the same sum in another order (rho lies on a bin edge), so an entry
    differs from the row's by rounding only (~1e-15)."""

    __slots__ = ("_grid", "_j", "_miss")

    def __init__(self, grid: _Grid, j: int, miss: float):
        super().__init__(None, _Coins(grid, j))
        self._grid, self._j, self._miss = grid, j, miss

    def at(self, x: int) -> float:
        if self._row is not None:
            return float(self._row[x])
        g, m = self._grid, self._miss
        qx = float(g.q[x])
        qb = min(qx, float(g.p[x]) / float(g.rho[self._j, 0]))
        return qb * _geo(m, g.k) + m ** (g.k - 1) * qx  # the row's order: (q beta) G + M q

    def row(self) -> torch.Tensor:
        if self._row is None:
            self._row = self._grid.law(self._j)[0]
        return self._row


def kseq_selection(p: torch.Tensor, q: torch.Tensor, k: int) -> Selection:
    """The selection at a node with k > 1 i.i.d. drafts as ``verify`` reads it: lazily
    (``KSeqSelection``) where the screen leaves one rho, else the law in full with lazy coins."""
    grid = _Grid(p, q, k)
    cand, miss = grid.screen()
    if len(cand) == 1 and miss is not None:
        return KSeqSelection(grid, cand[0], float(miss[cand[0]]))
    j, s = grid.best(cand)
    return Selection(s, _Coins(grid, j))


SCREEN_V = 4096  # above this V the grid is screened (``_acceptance_bounds``) before the exact evaluation
SCREEN_TOL = 1e-9  # rhos whose upper bound is within this of the best lower bound are evaluated exactly
SCREEN_BINS = 32  # histogram bins of log(p / q) per step of the rho grid
SCREEN_FLOOR = 30.0  # the histogram starts e^-30 below the smallest rho; below it one underflow bin
SCREEN_REFINE = 1 << 16  # the candidates' straddled bins are summed token by token up to this many tokens and (rho, token) terms


@functools.lru_cache(maxsize=32)
def _screen_grid(k, G):
    """The screen's static grid for k drafts and G rhos: bin width w in log t, the log L0 of the first
    regular edge, the number N of regular bins, ``lo_edge [N + 2]`` (bin i covers ``[lo_edge[i],
    lo_edge[i + 1])``: 0 first, then ``exp(L0 + w i)``) and ``r [G]`` (rho_j is ``lo_edge[r_j + 1]``:
    bins 0 .. r_j lie below it), host arrays (never written). Regular bins start ``SCREEN_FLOOR`` (in
    log t) under the smallest rho and end above every breakpoint (t >= every rho and every u <= k)."""
    half = math.log(4 * k)
    w = 2 * half / (G - 1) / SCREEN_BINS
    below = math.ceil(SCREEN_FLOOR / w)  # regular bins under the smallest rho
    L0 = -half - below * w
    top = max(half, math.log(k)) + 2 * half / (G - 1)
    N = below + (G - 1) * SCREEN_BINS + math.ceil((top - half) / w)  # regular bins 1 .. N; 0 under, N + 1 over
    edges = torch.exp(L0 + w * torch.arange(N + 1, dtype=torch.float64, device="cpu"))  # [N + 1], host
    lo_edge = torch.cat([edges.new_zeros(1), edges]).numpy()  # [N + 2]
    r = below + SCREEN_BINS * np.arange(G)  # [G]
    for a in (lo_edge, r):
        a.flags.writeable = False
    return w, L0, N, lo_edge, r


def _acceptance_bounds(p, q, sup, full, qs, rho, k):
    """Bounds ``(lo, hi)`` ``[G]`` on the one-step acceptance ``A(rho) = sum_x min(p, s_rho)`` at every
    rho of the grid, from one histogram of t = p / q (no sort, no ``[G, V]`` work), and ``1 - bbar``
    ``[G]`` (exact up to the order of its sums: every rho is a bin edge); host float64 arrays.

    With ``beta = min(1, t / rho)``, ``bbar = Q(t >= rho) + P(t < rho) / rho``, G_rho =
    sum_(j<k-1) (1 - bbar)^j, M_rho = (1 - bbar)^(k-1), u = G + M and c = M / (1 - G / rho) (G < rho),
    every token contributes ``q phi(t)`` with ``phi`` nondecreasing and linear between the
    breakpoints: ``phi = min(t, u)`` for t >= rho, ``min(t, t G / rho + M)`` for t < rho (t below
    c, the second term above). The histogram's bins (``SCREEN_BINS`` per grid step of log t, the
    grid's rhos on bin edges, an underflow bin from 0 and an overflow bin above every breakpoint)
    carry ``P_b = sum p`` and ``Q_b = sum q``: bbar is exact from their prefix sums (rho is an
    edge), a bin inside one linear piece contributes exactly ``P_b`` or ``G / rho P_b + M Q_b`` or
    ``u Q_b``, and only the (at most two) bins holding u or c are bounded: by ``Q_b phi(lower
    edge)`` below and ``min`` of the two pieces' sums above. Off q's support p and q weigh 0
    (s = 0 there). Tokens within rounding of an edge may fall on either side; every phi is
    continuous, so that moves a sum by rounding only, far below ``SCREEN_TOL``. Where more than one
    rho passes the screen, the bins straddled at those rhos are summed token by token (their tokens
    gathered once and grouped by bin, each (side, rho) summing its own bin's tokens, up to
    ``SCREEN_REFINE`` tokens and (rho, token) terms): their bounds become their acceptance
    to rounding (a heavy token in a straddled bin otherwise leaves a gap of up to its own mass times
    the bin's width, which kept 2-4 rhos in the race on real rows).

    So the exact evaluation's first best rho (its computed acceptance within rounding of the
    true one) has an upper bound within ``SCREEN_TOL`` of the best lower bound, and
    ``kseq_selection_law`` evaluates exactly the rhos that do, in grid order: the same rho, the
    same bits as evaluating every rho. p, q, sup: ``[V]``; full: sup everywhere; qs: q with 1 off
    sup; rho: ``[G]``, the grid ``exp(linspace(-log 4k, log 4k, G))``.

    Where it runs: the passes over V (the tokens' bins and the two histograms) on p's device; the
    bounds over the ``N + 2`` bins and G rhos on the host in numpy (a few dozen operations on arrays
    of G and N + 2 entries, where torch's per-operation overhead cost more than the arithmetic)."""
    G = rho.shape[0]
    w, L0, N, lo_edge, r = _screen_grid(k, G)
    pw = p if full else torch.where(sup, p, torch.zeros_like(p))

    def bin_of(t):  # t >= 0, a fresh tensor (its log is taken in place) -> its bins: 0 under, 1 .. N, N + 1 over
        return _log_(t).sub_(L0 - w).div_(w).clamp_(min=0.0, max=float(N + 1)).long()  # long() truncates: floor here

    idx = bin_of(torch.div(pw, qs))  # [V]
    Pb = torch.zeros(N + 2, dtype=p.dtype, device=p.device).scatter_add_(0, idx, pw).cpu().numpy()  # [N + 2]: sums of p per bin
    Qb = torch.zeros(N + 2, dtype=p.dtype, device=p.device).scatter_add_(0, idx, q).cpu().numpy()  # and of q
    CP, CQ = np.zeros(N + 3), np.zeros(N + 3)  # sums over bins < i
    np.cumsum(Pb, out=CP[1:])
    np.cumsum(Qb, out=CQ[1:])
    rho = rho.cpu().numpy()
    Pl, Ql = CP[r + 1], CQ[r + 1]  # [G]: P and Q of t < rho
    miss = 1.0 - ((CQ[-1] - Ql) + Pl / rho)
    geo = _geo(miss, k)
    M = miss ** (k - 1)
    u = geo + M

    # Both sides of rho at once, rows [2, G]: every token contributes q phi = min(p, alpha p + beta q),
    # t >= rho (bins r + 1 .. N + 1): alpha 0, beta u, breakpoint max(u, rho);
    # t < rho (bins 0 .. r): alpha G / rho, beta M, breakpoint c (rho when G >= rho: phi = t throughout).
    below_c = geo < rho
    c = np.where(below_c, M / np.where(below_c, 1.0 - geo / rho, 1.0), rho)
    alpha = np.stack([np.zeros(G), geo / rho])  # [2, G]
    beta = np.stack([u, M])
    a = np.stack([r + 1, np.zeros_like(r)])  # [2, G]: the bins [a, b) of each side
    b = np.stack([np.full_like(r, N + 2), r + 1])
    x = np.stack([np.maximum(u, rho), np.minimum(c, rho)]).clip(min=0.0)  # (M may round below 0)
    i = np.minimum(np.maximum(bin_of(torch.as_tensor(x, device="cpu")).numpy(), a), b)  # x's bin, clipped to its side
    inside = i < b  # a bin holds the breakpoint: only it is bounded, every other bin is exact
    j = np.where(inside, i + 1, i)
    exact = (CP[i] - CP[a]) + alpha * (CP[b] - CP[j]) + beta * (CQ[b] - CQ[j])  # [2, G]
    ii = np.where(inside, i, 0)
    P1, Q1 = np.where(inside, Pb[ii], 0.0), np.where(inside, Qb[ii], 0.0)
    e = lo_edge[ii]
    low, high = Q1 * np.minimum(e, alpha * e + beta), np.minimum(P1, alpha * P1 + beta * Q1)
    lo, hi = (exact + low).sum(0), (exact + high).sum(0)  # [G]
    cand = _contenders(lo, hi)  # [C]
    if cand.size > 1:  # the candidates' straddled bins, token by token: their acceptance to rounding
        sides, which = np.nonzero(inside[:, cand])  # [m]: the (side, candidate) pairs whose breakpoint's bin is bounded
        bins = ii[sides, cand[which]]  # [m]
        flag = torch.zeros(N + 2, dtype=torch.bool, device=idx.device)
        flag[torch.as_tensor(bins, device=idx.device)] = True
        hit = _nonzero(flag.index_select(0, idx))  # [n]: the tokens in those bins (one gather over V)
        if 0 < hit.numel() <= SCREEN_REFINE:
            bh, ph, qh = (v[hit].cpu().numpy() for v in (idx, pw, q))  # [n]
            order = np.argsort(bh, kind="stable")
            bh, ph, qh = bh[order], ph[order], qh[order]
            start = np.searchsorted(bh, bins, "left")  # [m]: each pair's tokens, a run of the sorted ones
            count = np.searchsorted(bh, bins, "right") - start
            total = int(count.sum())
            if 0 < total <= SCREEN_REFINE:  # (pair, token) terms
                pair = np.repeat(np.arange(bins.size), count)  # [total]
                at = np.arange(total) - np.repeat(np.cumsum(count) - count, count) + np.repeat(start, count)
                ph, qh = ph[at], qh[at]
                al, be = alpha[sides, cand[which]][pair], beta[sides, cand[which]][pair]
                per_pair = np.bincount(pair, weights=np.minimum(ph, al * ph + be * qh), minlength=bins.size)  # [m]
                lo[cand] = hi[cand] = exact[:, cand].sum(0) + np.bincount(which, weights=per_pair, minlength=cand.size)
    return lo, hi, miss


class SpecTrGBV(SelectThenBlock):
    """SpecTr-GBV as reconstructed here (see the module notes)."""

    name = "spectr_gbv"

    def _law(self, p, q, k):  # the law in full, the coins lazily (the pick and the slot probabilities read the drafts')
        if k == 1:
            return kseq_selection_law(p, q, k)
        grid, j, s = _kseq(p, q, k)
        return s, _Coins(grid, j)

    def _selection(self, p, q, k):
        return kseq_selection(p, q, k)

    def _slot_probs(self, key, drafts):
        out, left = [], 1.0
        for j, t in enumerate(drafts):
            if j == len(drafts) - 1:
                out.append(left)
            else:
                b = float(key[t])
                out.append(left * b)
                left *= 1.0 - b
        return out

    def _pick(self, key, drafts, g):
        k = len(drafts)
        if k == 1:
            return 0
        u = torch.rand(k - 1, generator=g, dtype=torch.float64, device=g.device)  # [k-1]: coins of slots 0 .. k-2
        b = key[torch.as_tensor(drafts[:-1], dtype=torch.long, device=key.device)]  # [k-1]
        hit = torch.nonzero(u < b).flatten()
        return int(hit[0]) if hit.numel() else k - 1


register("spectr_gbv", SpecTrGBV)
