"""Importance-weighted selection + single-draft SD (Khisti et al. 2024)."""
from __future__ import annotations

import functools
import itertools
import math
import threading

import numpy as np
import torch

from .._scan import cdf_search, top_desc_stable
from ._residual import accept, accept_prob, chunk_rows, residual_law, residual_or, row_scale, rows64, sample_rows
from .base import Verifier
from .registry import register

__all__ = ["KhistiIS"]

SORT_V = 4096  # below this vocabulary size the top set comes from one stable sort
# rank buckets off S: the bit pattern of a positive float is increasing in its value, so
# dropping all but the top two mantissa bits gives 4 buckets per factor 2 (3 cheap passes)
_SHIFT = {torch.float32: (torch.int32, 21), torch.float64: (torch.int64, 50)}
# ratio buckets off S (off="ratio"): p / qbar in float64, top three mantissa bits (8 buckets
# per factor 2), clamped to [2^-32, 2^32]: bucket c stands for the weight 2^((c - 256) / 8)
_R_SHIFT, _R_OCT, _R_PER = 49, 32, 8
_R_LO = int(torch.tensor(2.0**-_R_OCT, dtype=torch.float64).view(torch.int64)) >> _R_SHIFT
_R_C = 2 * _R_OCT * _R_PER + 1
_P_FLOOR = 1e-12  # QP weight of an S token with p = 0 (its mass is pushed away first)
OFF_RULES = ("ratio", "rank")
SOLVERS = ("lex", "lp")


def _n_buckets(dtype: torch.dtype) -> int:
    itype, sh = _SHIFT[dtype]
    return (int(torch.ones((), dtype=dtype).view(itype)) >> sh) + 1


def _bucket(score: torch.Tensor) -> torch.Tensor:
    """Rank bucket of each score (long, same shape, non-decreasing in the score): 0 for
    score <= 0, else the float's exponent and top two mantissa bits (scores are <= 1)."""
    itype, sh = _SHIFT[score.dtype]
    return (score.contiguous().view(itype) >> sh).clamp_min_(0).long()


def _ratio_bucket(p: torch.Tensor, qbar: torch.Tensor) -> torch.Tensor:
    """Bucket of the importance weight p / qbar (long, same shape, non-decreasing in it), in
    ``0 .. _R_C - 1``: 0 for p = 0, the top bucket for qbar = 0 < p. One fresh float64 tensor,
    reused in place as its int64 bit pattern (four passes over the row)."""
    r = torch.div(p.double(), qbar.double()).nan_to_num_(nan=0.0)  # 0/0 -> 0; p/0 = +inf -> top
    return r.view(torch.int64).bitwise_right_shift_(_R_SHIFT).sub_(_R_LO).clamp_(0, _R_C - 1)


def _ratio_matrix(device) -> torch.Tensor:
    """W[c, c'] = w_c / (w_c + w_c') with w_c = 2^(c / 8): the probability that a draft in
    ratio bucket c is kept against one in bucket c' (both off S). ``[C, C]`` float64,
    W + W^T = 1 exactly up to rounding (W[c, c] = 1/2). A constant: built once per device
    (read only; 4 ms of sigmoids per verify call otherwise)."""
    return _ratio_matrix_cached(str(torch.device(device)))


@functools.lru_cache(maxsize=8)
def _ratio_matrix_cached(device: str) -> torch.Tensor:
    c = torch.arange(_R_C, dtype=torch.float64, device=device)
    return torch.sigmoid((c.unsqueeze(-1) - c) * (np.log(2.0) / _R_PER))


class _OffRule:
    """The match rule between two drafts off S, as a function of their buckets.

    ``keep(c, c')`` = P(the current winner, in bucket c, is kept against a newcomer in c').
    rank: keep = [c >= c'] (ties keep the winner). ratio: keep = W[c, c'] (importance weights).
    """

    def __init__(self, kind: str, key: torch.Tensor, n_buckets: int):
        self.kind, self.key, self.C = kind, key, n_buckets  # key [N, V] long
        self.W = _ratio_matrix(key.device) if kind == "ratio" else None

    def sums(self, Ht: torch.Tensor, Hr: torch.Tensor):
        """From histograms ``[r, C]`` of the newcomer (Ht) and of the winner (Hr) off S:
        keep(c) = sum_c' Ht(c') keep(c, c') and win(c) = sum_c' Hr(c') (1 - keep(c', c))."""
        if self.W is None:
            le = Ht.cumsum(-1)
            return le, Hr.cumsum(-1) - Hr
        return Ht @ self.W.T, Hr @ self.W.T  # 1 - W[c', c] = W[c, c']

    def restricted(self, used: torch.Tensor) -> "_OffRule":
        """The rule on the buckets ``used`` ``[U]`` (increasing) only, for ``sums``: rank keeps
        the cumulative sums (a zero bucket adds nothing), ratio the submatrix of W."""
        out = _OffRule.__new__(_OffRule)
        out.kind, out.key, out.C = self.kind, None, used.numel()
        out.W = None if self.W is None else self.W.index_select(0, used).index_select(1, used)
        return out

    def keep_prob(self, ca: torch.Tensor, cb: torch.Tensor) -> torch.Tensor:
        """P(keep a against b) for bucket tensors of one shape (float64)."""
        if self.W is None:
            return (ca >= cb).double()
        return self.W[ca, cb]

    def keep_col(self, cb: torch.Tensor) -> torch.Tensor:
        """P(token kept against b) for every token of each row: cb ``[N]`` -> ``[N, V]``."""
        if self.W is None:
            return (self.key >= cb.unsqueeze(-1)).double()
        return self.W.T[cb].gather(-1, self.key)


def _off_coef(H: torch.Tensor, rule: _OffRule, K: int) -> torch.Tensor:
    """Off-S coefficients of the tournament winner: H ``[r, k1, C]`` histograms of the draft
    laws off S (k1 = 1: one shared q) -> A ``[r, k1, C]`` with, for y off S in bucket c,
    q_I(y) = sum_k q_k(y) A_k(c) (k1 = 1: q(y) A(c)).

    Recursion over the matches: A_0 = [1, 0, ..]; match m keeps the winner (draft k < m) with
    keep_m(c) and lets draft m win with win_m(c) (``_OffRule.sums``; a newcomer in S beats it,
    a winner in S beats the newcomer): A_k <- A_k keep_m for k < m, A_m = win_m. Buckets where
    no row has mass drop out first (their terms are zero; A there is never read against a
    positive q): the recursion runs on the U buckets used (``_OffRule.restricted``)."""
    r, k1, C = H.shape
    if K > 1:  # only the buckets holding mass (of any row and draft) matter: the rest get A = 0
        used = (H > 0).flatten(0, 1).any(0).nonzero().squeeze(-1)  # [U]
        if used.numel() < C:
            Ac = _off_coef(H.index_select(-1, used), rule.restricted(used), K)
            return torch.zeros(r, Ac.shape[1], C, dtype=torch.float64, device=H.device).index_copy_(-1, used, Ac)
    A = torch.zeros(r, K, C, dtype=torch.float64, device=H.device)
    A[:, 0] = 1.0
    for m in range(1, K):
        Hm = H[:, m if k1 > 1 else 0]
        Hr = (A[:, :m] * (H[:, :m] if k1 > 1 else H)).sum(1)
        keep, win = rule.sums(Hm, Hr)
        A[:, :m] *= keep.unsqueeze(1)
        A[:, m] = win
    return A if k1 > 1 else A.sum(1, keepdim=True)


def _top_set(score: torch.Tensor, n: int) -> torch.Tensor:
    """The n best tokens of each row of score ``[N, V]`` in the order (score desc, id asc),
    ``[N, n]`` in that order. Ties at the boundary are broken towards the lower id."""
    N, V = score.shape
    if n >= V:
        return torch.sort(score, dim=-1, descending=True, stable=True).indices
    if V <= SORT_V:
        return torch.sort(score, dim=-1, descending=True, stable=True).indices[:, :n]
    return top_desc_stable(score, n)  # topk; a tie across the boundary without a vocabulary sort


def _split_lp(pu, Mu, fixedu, a, b):
    """Pair splits ``[U, P]`` from one block LP (HiGHS) per distinct row: maximise
    sum_i min(p_i, m_i); returns None when HiGHS fails. Which optimal vertex comes back is
    HiGHS's choice (the old behaviour; kept as a reference for the lex solver)."""
    from scipy import sparse
    from scipy.optimize import linprog

    U, P = Mu.shape
    n = pu.shape[1]
    ea = np.zeros((n, P))
    ea[a, np.arange(P)] = 1.0
    eb = np.zeros((n, P))
    eb[b, np.arange(P)] = 1.0
    # z_i <= m_i  <=>  z_i - sum_{a=i} f + sum_{b=i} f <= fixed_i + sum_{b=i} M
    blk = sparse.hstack([sparse.csr_matrix(eb - ea), sparse.identity(n)])
    A = sparse.kron(sparse.identity(U), blk, format="csr")
    rhs = (fixedu + Mu @ eb.T).ravel()
    lo = np.zeros((U, P + n))
    hi = np.concatenate([Mu, pu], 1)
    c = np.tile(np.concatenate([np.zeros(P), -np.ones(n)]), U)
    res = linprog(c, A_ub=A, b_ub=rhs, bounds=np.stack([lo.ravel(), hi.ravel()], 1), method="highs")
    if res.status != 0 or res.x is None:
        return None
    return np.clip(res.x.reshape(U, P + n)[:, :P], 0.0, Mu)


def _split_lex(pu, Mu, fixedu, a, b, laws=None):
    """Pair splits ``[U, P]``: the lexicographically optimal winner law (Fujishige 1980).

    The laws m reachable by splitting the pair masses form the base polytope of a submodular
    function (fractional orientations of a weighted graph, shifted by ``fixed``). Its point
    minimising sum_i m_i^2 / p_i is unique and maximises sum_i min(p_i, m_i) over the whole
    polytope (Fujishige's lexicographically optimal base for the weights p), so it is one of
    the LP's optima, chosen by a strictly convex rule instead of by the solver's vertex. It
    is a bounded least-squares problem in f (BVLS, an exact active-set method), one per row;
    p_i = 0 gets the weight ``_P_FLOOR`` (its mass is moved away first). f itself need not be
    unique; m is. A row where BVLS fails keeps the even split (exact, only less efficient).
    ``laws`` = (r ``[U, n]``, t ``[U, n]``, r_out ``[U]``, t_out ``[U]``), the two drafts' laws
    the pair masses come from, lets ``_lex_chain_hull`` try the decomposition first."""
    U, P = Mu.shape
    n = pu.shape[1]
    out = Mu / 2
    E = None
    for u in range(U):
        live = Mu[u] > 0
        if not live.any():
            continue
        if n <= LEX_DECOMP_N:
            rt = None if laws is None else tuple(x[u] for x in laws)
            fu, ok = _lex_decomp_row(pu[u], Mu[u], fixedu[u], a, b, rt)
            if ok:
                out[u] = fu
                continue
        from scipy.optimize import lsq_linear

        if E is None:
            E = np.zeros((n, P))
            E[a, np.arange(P)] = 1.0
            E[b, np.arange(P)] -= 1.0
        base = fixedu[u] + np.bincount(b, Mu[u], n)  # m with every pair given to j
        d = 1.0 / np.sqrt(np.maximum(pu[u], _P_FLOOR))
        try:
            res = lsq_linear(d[:, None] * E[:, live], -d * base, bounds=(0.0, Mu[u, live]), method="bvls", tol=1e-15)
        except (ValueError, np.linalg.LinAlgError):  # pragma: no cover - numerical failure
            continue
        if res.success:
            out[u, live] = np.clip(res.x, 0.0, Mu[u, live])
    return out


LEX_DECOMP_N = 12  # up to this many S tokens the lex split is solved by its decomposition


@functools.lru_cache(maxsize=16)
def _subsets(k: int):
    """All nonempty subsets of k elements: ids ``[2^k - 1]``, membership ``[2^k - 1, k]`` (bool,
    float64), "touches pair (i, j)" ``[2^k - 1, k(k-1)/2]`` float64 and the pairs (i, j) in
    ``np.triu_indices`` order. Read only."""
    idx = np.arange(1, 1 << k)
    bits = ((idx[:, None] >> np.arange(k)) & 1).astype(bool)
    i, j = np.triu_indices(k, 1)
    return idx, bits, bits.astype(np.float64), (bits[:, i] | bits[:, j]).astype(np.float64), i, j


def _lex_decomp_row(p, M, fixed, a, b, rt=None):
    """The lex split of one row (``_split_lex``'s problem) by Fujishige's decomposition.

    The reachable winner laws are the bases of g(X) = fixed(X) + M(pairs touching X) (the
    most mass X can receive). The minimiser of sum_i m_i^2 / w_i (w = max(p, _P_FLOOR)) is
    m = lambda_j w on the j-th block of the chain: lambda_1 = min_X g(X) / w(X) over nonempty
    X, the block is the largest minimiser (minimisers of a submodular function are closed under
    union), then the same on the contraction g(X | B) - g(B), over subsets of the rest. Pairs
    across blocks go to the lower ratio; the pairs inside a block are split by the weighted
    Laplacian solve f = M (1/2 + y_a - y_b), pairs that leave [0, M] are clamped and the rest
    re-solved (an active set). Returns (f ``[P]``, ok): ok when the realised law matches the
    decomposition's to 1e-13 (else the caller solves the row by BVLS). With rt = (r, t,
    r_out, t_out), the laws behind fixed and M, the chain is first read off a hull of prefixes
    (``_lex_chain_hull``) and certified; the enumeration below runs when that fails."""
    w = np.maximum(p, _P_FLOOR)
    chain = None if rt is None else _lex_chain_hull(w, *rt)
    if chain is not None:
        f, ok = _lex_realise(*chain, w, M, fixed, a, b)
        if ok:  # m = lam w is realised, so a base, and its level sets are tight: the optimum
            return f, ok
    return _lex_realise(*_lex_chain_enum(w, M, fixed, a, b), w, M, fixed, a, b)


def _lex_chain_hull(w, r, t, r_out, t_out):
    """A candidate chain for ``_lex_decomp_row``: the lower hull of prefix sets (or None).

    Here g(X) = fixed(X) + M(pairs touching X) = P(either draft in X) = r(X) + t(X) (r_out +
    r(S - X)) (r, t the winner's and the newcomer's laws on S, r(S) + r_out = 1), a sum of
    nonnegative terms. Tokens are ordered by (r_i + t_i) / w_i (ties by slot), and the lower convex hull of the prefix points (w(P_k), g(P_k)) gives a
    chain: from the current vertex a, the next is the largest b minimising
    (g(P_b) - g(P_a)) / w(P_b - P_a), with the contraction g(P_b) - g(P_a) = r(D) (t_out +
    t(S - P_b)) + t(D) (r_out + r(S - P_a)), D = P_b - P_a (no cancellation). The candidate
    m = lambda w is the lexicographically optimal base iff it is a base of g whose level sets
    are tight (Fujishige 1980, 'Lexicographically optimal base of a polymatroid with respect to
    a weight vector'): the chain's sets are tight by construction (the lambdas telescope) and
    the lambdas increase (checked), so m is the optimum as soon as it is a base, i.e. as soon
    as a split of the pairs realises it: ``_lex_decomp_row`` takes the chain when
    ``_lex_realise`` succeeds (realised law = m to 1e-13) and enumerates otherwise. For r = t (the first match
    of iid drafts) g = 2 t(X) - t(X)^2 is a concave function of t(X), whose minimisers of
    g - lambda w are prefixes of the order by t_i / w_i (a swap towards a lower ratio at equal
    t(X) raises w(X)), so the chain is found whenever no two ratios tie; later matches mostly
    are prefix chains too. Returns (lam ``[n]``, blk ``[n]``) as the enumeration, or None when
    the lambdas fail to increase."""
    n = w.shape[0]
    if n > LEX_DECOMP_N:
        return None
    order = np.argsort((r + t) / w, kind="stable")
    seg, low, inf = _segments(n)  # [(n+1)^2, n]: rows (a, b) sum slots a <= i < b; low: b <= a (1 / +inf)
    sums = (seg @ np.stack([r[order], t[order], w[order]], 1)).reshape(n + 1, n + 1, 3)
    SR, ST, SW = sums[..., 0], sums[..., 1], sums[..., 2]
    # [a, b]: the contraction ratio of D = slots a..b-1 (+inf for b <= a)
    slope = (SR * (t_out + ST[:, n]) + ST * (r_out + SR[:, n : n + 1])) / (SW + low) + inf
    lo = slope.min(1, keepdims=True)  # [n+1, 1]; row n is +inf
    nxt = (n - np.argmax((slope <= lo * (1 + 1e-12))[:, ::-1], 1)).tolist()  # the largest minimising b
    sl = slope.tolist()
    lam_o = np.empty(n)
    blk_o = np.empty(n, dtype=np.int64)
    a = j = 0
    prev = -np.inf
    while a < n:
        b = nxt[a]
        lab = sl[a][b]
        if not lab > prev:  # lambdas must increase along the chain
            return None
        lam_o[a:b] = lab
        blk_o[a:b] = j
        prev = lab
        a, j = b, j + 1
    lam = np.empty(n)
    blk = np.empty(n, dtype=np.int64)
    lam[order], blk[order] = lam_o, blk_o
    return lam, blk


@functools.lru_cache(maxsize=16)
def _segments(n: int):
    """``[(n+1)^2, n]`` float64, row a * (n+1) + b the indicator of slots a <= i < b, and the
    ``[n+1, n+1]`` float64 indicator of b <= a, and the same with +inf for 1 (read only)."""
    ab = np.arange((n + 1) ** 2)
    a, b = ab // (n + 1), ab % (n + 1)
    i = np.arange(n)
    low = (b <= a).reshape(n + 1, n + 1)
    return ((a[:, None] <= i) & (i < b[:, None])).astype(np.float64), low.astype(np.float64), np.where(low, np.inf, 0.0)


def _lex_chain_enum(w, M, fixed, a, b):
    """The chain of ``_lex_decomp_row`` by enumeration: (lam ``[n]``, blk ``[n]``)."""
    n = w.shape[0]
    pid = np.zeros((n, n), dtype=np.int64)
    pid[a, b] = np.arange(a.shape[0])
    lam = np.empty(n)
    blk = np.empty(n, dtype=np.int64)
    rest = np.arange(n)
    j = 0
    while rest.size:
        idx, bits, bitsf, touch, i2, j2 = _subsets(rest.size)
        Mr = M[pid[rest[i2], rest[j2]]]  # the pairs inside the rest
        r = (bitsf @ fixed[rest] + touch @ Mr) / (bitsf @ w[rest])  # (g(X | done) - g(done)) / w(X)
        sel = int(np.bitwise_or.reduce(idx[r <= r.min() * (1 + 1e-12)]))
        el = bits[sel - 1]
        B = rest[el]
        lam[B] = (fixed[B].sum() + touch[sel - 1] @ Mr) / w[B].sum()
        blk[B] = j
        j += 1
        rest = rest[~el]
    return lam, blk


def _lex_realise(lam, blk, w, M, fixed, a, b):
    """A split f ``[P]`` realising m = lam w from the chain (``_lex_decomp_row``), and ok.

    Pairs across blocks go whole to the lower block; the pairs inside a block are split by
    the weighted-Laplacian solve f = M (1/2 + y_a - y_b) with an active set for the pairs that
    leave [0, M]. The Laplacian is singular (y is defined up to a constant on each connected
    part): it is solved with the same-block matrix J added (L + c J, one extra equation per
    block, the solution's differences inside a connected block are those of any solution);
    when that fails or the realised law misses m, the minimum-norm solve (lstsq) is used."""
    f, ok = _lex_realise_with(lam, blk, w, M, fixed, a, b, grounded=True)
    if not ok:
        f, ok = _lex_realise_with(lam, blk, w, M, fixed, a, b, grounded=False)
    return f, ok


def _lex_realise_with(lam, blk, w, M, fixed, a, b, grounded):
    n = w.shape[0]
    m = lam * w
    ba, bb = blk[a], blk[b]
    f = np.where(ba < bb, M, 0.0)  # across blocks the lower ratio takes the whole pair
    free = (ba == bb) & (M > 0)
    both = np.concatenate([a, b])  # one bincount for the two ends of every pair
    ab, ba_, dg = a * n + b, b * n + a, np.arange(n) * (n + 1)
    J = (blk[:, None] == blk[None, :]) if grounded else None
    for _ in range(2 * n):
        if not free.any():
            break
        Mi = np.where(free, M, 0.0)
        fo = np.where(free, 0.0, f)
        got = np.bincount(both, np.concatenate([fo, M - Mi - fo]), n)  # mass the fixed pairs give
        deg = np.bincount(both, np.concatenate([Mi, Mi]), n)
        L = np.zeros((n, n))
        L.flat[ab] = -Mi
        L.flat[ba_] = -Mi
        L.flat[dg] = deg
        rhs = m - fixed - got - 0.5 * deg
        if grounded:
            try:
                y = np.linalg.solve(L + float(Mi.max()) * J, rhs)
            except np.linalg.LinAlgError:
                return f, False
        else:
            y = np.linalg.lstsq(L, rhs, rcond=None)[0]
        fi = Mi * (0.5 + y[a] - y[b])
        out = free & ((fi < 0) | (fi > M))
        f = np.where(free, np.minimum(np.maximum(fi, 0.0), M), f)
        if not out.any():
            break
        free = free & ~out  # the pairs past a bound stay there
    mr = fixed + np.bincount(both, np.concatenate([f, M - f]), n)
    return f, bool(np.abs(mr - m).max() <= 1e-13 * max(1.0, float(m.max())))


def _solve_stage(pS, rS, r_out, tS, t_out, solver="lex"):
    """One match of the tournament: the winner so far (law r) against a fresh draft (law t).

    All float64 ``[N, n]`` (``[N]`` for the masses outside S). On S the unordered pair {i, j}
    (i < j) carries mass M_ij = r_i t_j + r_j t_i, split f_ij to i and M_ij - f_ij to j; the
    split maximises sum_i min(p_i, m_i) with m_i the new winner's mass on i: ``lex`` takes the
    unique optimum minimising sum_i m_i^2 / p_i (``_split_lex``), ``lp`` the vertex HiGHS
    returns (``_split_lp``); one problem per distinct row. Returns ``(W [N, n, n], m [N, n])``:
    W[i, j] = the probability that i is selected from the pair {i, j} (W[i, i] = 1) and m the
    new law on S. Any split is exact; the split only moves acceptance.
    """
    N, n = pS.shape
    dev = pS.device
    fixed = rS * tS + rS * t_out.unsqueeze(-1) + r_out.unsqueeze(-1) * tS  # [N, n]
    a, b = torch.triu_indices(n, n, 1, device=dev)
    M = rS[:, a] * tS[:, b] + rS[:, b] * tS[:, a]  # [N, P]
    if N == 1:  # one row (a decoder node): it is its own distinct row
        inv = first = torch.zeros(1, dtype=torch.long, device=dev)
    else:
        key = torch.cat([pS, rS, tS, r_out.unsqueeze(-1), t_out.unsqueeze(-1)], -1)
        uniq, inv = torch.unique(key, dim=0, return_inverse=True)
        first = torch.full((uniq.shape[0],), N, dtype=torch.long, device=dev).scatter_reduce(
            0, inv, torch.arange(N, device=dev), "amin"
        )
    an, bn = a.cpu().numpy(), b.cpu().numpy()
    Mu, fixu = M[first].cpu().numpy(), fixed[first].cpu().numpy()
    fu = None
    if a.numel():
        args = (pS[first].cpu().numpy(), Mu, fixu, an, bn)
        laws = tuple(x[first].cpu().numpy() for x in (rS, tS, r_out, t_out))
        fu = _split_lex(*args, laws) if solver == "lex" else _split_lp(*args)
    if fu is None:  # the even split: any split is exact, only less efficient
        fu = Mu / 2
    wu = _pair_keep(Mu, fu)  # [U, P]
    mu = np.stack([_stage_law(fixu[i], wu[i], Mu[i], an, bn) for i in range(wu.shape[0])])
    w = torch.as_tensor(wu, dtype=torch.float64, device=dev)[inv]
    W = torch.ones(N, n, n, dtype=torch.float64, device=dev)
    W[:, a, b] = w
    W[:, b, a] = 1 - w
    return W, torch.as_tensor(mu, dtype=torch.float64, device=dev)[inv]


def _pair_keep(M, f):
    """P(the lower slot i is selected from the pair {i, j}) = f / M (1/2 for an empty pair),
    numpy, any shape."""
    return np.where(M > 0, f / np.where(M > 0, M, 1.0), 0.5)


def _stage_law(fixed, w, M, a, b):
    """The winner's law on S after a match ``[n]``: fixed + the pair masses as the keep
    probabilities w split them, summed in one fixed order (numpy bincount) by every path
    (a row alone and a row inside a batch get the same bits)."""
    n = fixed.shape[0]
    return fixed + np.bincount(a, w * M, n) + np.bincount(b, (1 - w) * M, n)


@functools.lru_cache(maxsize=16)
def _triu(n: int):
    """``np.triu_indices(n, 1)`` (read only)."""
    return np.triu_indices(n, 1)


def _pair_index(n: int, i: int, j: int) -> int:
    """Index of the slot pair {i, j} (i != j) in ``np.triu_indices(n, 1)`` order."""
    if i > j:
        i, j = j, i
    return i * n - i * (i + 1) // 2 + (j - i - 1)


def _stages_one_row(pS, tS, t_out, solver):
    """``_solve_stage`` for every match of one row, in numpy (a decoder node: no batch to share
    the torch call overheads with): pS ``[n]``, tS ``[K, n]``, t_out ``[K]`` -> (Ws, one
    ``[1, n, n]`` per match, mS ``[1, n]``), on pS's device. The same arithmetic as
    ``_solve_stage``: the plan of a row alone equals its plan inside a batch bit for bit."""
    dev = pS.device
    ws, r = _stages_np(pS.cpu().numpy(), tS.cpu().numpy(), t_out.cpu().numpy(), solver)
    n = pS.shape[-1]
    a, b = np.triu_indices(n, 1)
    Ws = []
    for w in ws:
        W = np.ones((n, n))
        W[a, b] = w
        W[b, a] = 1 - w
        Ws.append(torch.as_tensor(W, dtype=torch.float64, device=dev).unsqueeze(0))
    return Ws, torch.as_tensor(r, dtype=torch.float64, device=dev).unsqueeze(0)


def _stages_np(p, t, to, solver):
    """The matches of one row on the host: p ``[n]``, t ``[K, n]``, to ``[K]`` float64 arrays ->
    (the keep probabilities ``[P]`` of the slot pairs (``np.triu_indices`` order), one array
    per match, and the winner's law ``[n]``), numpy float64."""
    n = p.shape[0]
    a, b = _triu(n)
    r, ro = t[0], float(to[0])
    ws = []
    for m in range(1, t.shape[0]):
        tm, tom = t[m], float(to[m])
        fixed = r * tm + r * tom + ro * tm
        M = r[a] * tm[b] + r[b] * tm[a]
        fu = None
        if a.size and solver == "lex" and n <= LEX_DECOMP_N:  # _split_lex's first try, without its batch loop
            f, ok = _lex_decomp_row(p, M, fixed, a, b, (r, tm, ro, tom))
            fu = f[None] if ok else None
        if a.size and fu is None:
            args = (p[None], M[None], fixed[None], a, b)
            laws = (r[None], tm[None], np.array([ro]), np.array([tom]))
            fu = _split_lex(*args, laws) if solver == "lex" else _split_lp(*args)
        w = _pair_keep(M, M / 2 if fu is None else fu[0])
        r = _stage_law(fixed, w, M, a, b)
        ro = ro * tom
        ws.append(w)
    return ws, r


class _Row:
    """One row as ``KhistiIS._verify`` receives it (raw_rows): p ``[V]``, q ``[V]`` (shared) or
    ``[K, V]`` (per draft), any float dtype. Every float64 value read is the value ``rows64``
    gives (``x.double() / row_scale(x)``, elementwise), read at the tokens asked for; the full
    float64 rows are built on first use only."""

    _serials = itertools.count()

    def __init__(self, p, q):
        self.p, self.q = p, q
        self.V = p.shape[-1]
        self.serial = next(_Row._serials)  # names this row's chunks in the workspace
        self.sp = row_scale(p)  # [1]
        self.sq = row_scale(q)  # [1] or [K, 1]
        self._p64 = self._q64 = self._qbar = None

    def p_at(self, idx):  # [m] float64
        return self.p[idx].double() / self.sp

    def qk_at(self, idx):  # [k1, m] float64
        q = self.q if self.q.ndim == 2 else self.q.unsqueeze(0)
        sq = self.sq if self.q.ndim == 2 else self.sq.unsqueeze(0)
        return q[:, idx].double() / sq

    def qbar_at(self, idx):  # [m] float64: qbar as the plan forms it (the mean of the K rows)
        return self.qk_at(idx)[0] if self.q.ndim == 1 else self.qk_at(idx).mean(-2)

    def p64(self):  # [V]
        if self._p64 is None:
            self._p64 = rows64(self.p)
        return self._p64

    def qk(self):  # [k1, V]
        if self._q64 is None:
            self._q64 = rows64(self.q) if self.q.ndim == 2 else rows64(self.q).unsqueeze(0)
        return self._q64

    def qbar(self):  # [V]
        if self._qbar is None:
            self._qbar = self.qk()[0] if self.q.ndim == 1 else self.qk().mean(-2)
        return self._qbar

    def score(self):  # [V]: p - qbar^2 in float64, as the plan computes it
        return self.p64() - self.qbar() * self.qbar()

    def top_set(self, n: int, K: int) -> torch.Tensor:
        """``_top_set(score, n)`` of the row ``[n]``: from a float32 bound when it certifies the
        set (``_certified_top``), else from the float64 score."""
        if self.p.dtype == torch.float32 and self.q.dtype == torch.float32 and self.V > SORT_V and n + CAND_EXTRA < self.V:
            S = _certified_top(self, n, K)
            if S is not None:
                return S
        return _top_set(self.score().unsqueeze(0), n)[0]


CAND_EXTRA = 8  # candidates beyond s in the float32 pass of the top set
CAND_BLOCK = 1024  # block length of that pass (block maxima, then a topk inside the best blocks)


def _certified_top(R, n, K):
    """The top n tokens of the float64 score p - qbar^2 (order: score desc, id asc), found from
    a float32 upper bound of it on the raw float32 rows, or None when the bound does not
    certify them (e.g. ties at the boundary).

    Bound. P = fl(p / sp), Q = fl(q / sq) are the float64 rows (raw values over their row
    sums), qb the float32 mean of the raw q rows (q itself for a shared q), Qbar the float64
    one. With ep = |1/sp - 1| and eq >= |Qbar / qb - 1| (|1/sq - 1|, plus (K + 2) 2^-24 for the
    float32 mean of K rows), the float64 score P - Qbar^2 is at most
    p (1 + ep + 2^-50) - qb^2 (1 - 2 eq - 2^-50). u = p a - qb^2 b in float32, a = that factor
    plus 2^-20, b minus 2^-20, is above it even after float32 rounding (at most 2^-24 of
    each term per operation: 4 operations, 2^-22, fewer than the 2^-20 given). The m = n +
    CAND_EXTRA tokens of largest u are taken (maxima of blocks of CAND_BLOCK tokens, then a
    topk inside the m best blocks); uout bounds u off them (the (m+1)-th block maximum and the (m+1)-th value inside
    the chosen blocks). Their exact float64 scores are computed as the plan computes them, and
    the n best in the stable order are the answer when the n-th best exceeds uout: every other
    token's score is then below its u <= uout. The bound without the draft term (u = p a) is
    tried first: it reads p alone, and certifies on most rows of a language model."""
    S = _certified_top_from(R, n, K, q_free=True)  # most rows: the draft rows need not be read
    return S if S is not None else _certified_top_from(R, n, K, q_free=False)


def _certified_top_from(R, n, K, q_free):
    """``_certified_top`` from one bound: u as below, or (``q_free``) u = p a, which bounds the
    score as well (qbar^2 >= 0) and needs no pass over the K draft rows; it certifies unless
    the drafts' mass moves the order of the top tokens past the (m+1)-th largest p."""
    p, q, V = R.p, R.q, R.V
    sp = float(R.sp.reshape(-1)[0])
    sq = R.sq.reshape(-1)
    if not (sp > 0 and bool((sq > 0).all())):
        return None
    a = 1.0 + abs(1.0 / sp - 1.0) + 2.0 ** -50 + 2.0 ** -20
    if not q_free:
        eq = float((1.0 / sq.double() - 1.0).abs().max()) + 2.0 ** -52
        if q.ndim == 2:
            qb = q.mean(0)
            eq += (K + 2) * 2.0 ** -24
        else:
            qb = q
        b = 1.0 - 2 * eq - eq * eq - 2.0 ** -50 - 2.0 ** -20
        if not b > 0:
            return None
    m = n + CAND_EXTRA
    B = min(CAND_BLOCK, max(2, V // (4 * m)))  # at least 4m blocks
    nb = (V + B - 1) // B
    if nb <= m + 1:
        return None
    ub = _scratch("u", (nb * B,), torch.float32, p.device)  # u, padded with -inf to whole blocks
    torch.mul(p, a, out=ub[:V])  # u [V] float32, >= the float64 score
    if not q_free:
        ub[:V].addcmul_(qb, qb, value=-b)
    ub[V:] = -float("inf")
    blocks = ub.view(nb, B)
    top = torch.topk(blocks.amax(-1), m + 1)
    tv = torch.topk(blocks.index_select(0, top.indices[:m]).reshape(-1), m + 1)  # inside the m best blocks
    uout = max(float(top.values[m]), float(tv.values[m]))
    ti = tv.indices[:m]
    cand = (top.indices[:m][ti // B] * B + ti % B).sort().values  # ids ascending, then the stable order by exact score
    qbc = R.qbar_at(cand)
    sc = R.p_at(cand) - qbc * qbc
    order = torch.sort(sc, descending=True, stable=True)
    if not float(order.values[n - 1]) > uout + 2.0 ** -140:  # + float32 underflow (2^-150 an operation)
        return None
    return cand[order.indices[:n]]


OFF_CHUNK = 1 << 18  # float64 elements ([k1, c] of q) per chunk of the one-row off-S passes


_WS = threading.local()


def _scratch(name: str, shape, dtype, device) -> torch.Tensor:
    """A workspace tensor of this thread, reused from call to call (contents undefined): the
    one-row passes over V write their float64 temporaries here instead of allocating fresh
    multi-MB tensors, which glibc hands back to the OS and page-faults in again at every call
    (about 1 ms per MB on a shared VM). Never returned to a caller. Made outside inference mode
    (a tensor made inside it could not be written by a later call outside it, e.g. the
    decoder's verify under ``torch.inference_mode`` and then a user's)."""
    bufs = _WS.__dict__.setdefault("bufs", {})
    n = math.prod(shape)
    key = (name, dtype, str(device))
    t = bufs.get(key)
    if t is None or t.numel() < n:
        with torch.inference_mode(False):  # a normal tensor: writable inside and outside inference mode
            t = bufs[key] = torch.empty(n, dtype=dtype, device=device)
    return t[:n].view(shape)


def _chunks(R, reverse: bool = False):
    """The float64 values of one row in column chunks: (c0, c1, P ``[c]``, Q ``[k1, c]``, Qbar
    ``[c]``), each value the one ``rows64`` gives (elementwise), Qbar the mean of the K rows
    as the plan forms it. No ``[K, V]`` float64 copy of the rows is ever held; the chunks live
    in ``_scratch`` (valid until the next chunk), and the chunk left there by the previous pass
    over this row is not recomputed (``reverse``: last chunk first, for a pass whose chunks are
    independent)."""
    q2 = R.q if R.q.ndim == 2 else R.q.unsqueeze(0)
    sq2 = R.sq if R.q.ndim == 2 else R.sq.unsqueeze(0)  # [k1, 1]
    k1, dev = q2.shape[0], R.p.device
    step = min(R.V, max(4096, OFF_CHUNK // k1))
    starts = range(0, R.V, step)
    for c0 in (reversed(starts) if reverse else starts):
        c1 = min(R.V, c0 + step)
        Pc = _scratch("P", (c1 - c0,), torch.float64, dev)
        Qc = _scratch("Q", (k1, c1 - c0), torch.float64, dev)
        qb = Qc[0] if k1 == 1 else _scratch("Qbar", (c1 - c0,), torch.float64, dev)
        if getattr(_WS, "chunk", None) != (R.serial, c0, c1):
            _WS.chunk = None
            Pc.copy_(R.p[c0:c1]).div_(R.sp)
            Qc.copy_(q2[:, c0:c1]).div_(sq2)
            if k1 > 1:
                torch.mean(Qc, -2, out=qb)
            _WS.chunk = (R.serial, c0, c1)
        yield c0, c1, Pc, Qc, qb


def _residual_one(R, qi_chunk, g):
    """One draw from (p - q_I)+ of a row, q_I given chunk by chunk: qi_chunk(c0, c1, P, Q,
    Qbar) -> ``[c]``. The same uniform and inverse CDF as ``sample_rows`` / ``inverse_cdf``
    on that residual row (the fallback row p where it has no mass), in workspace tensors."""
    dev = R.p.device
    w = _scratch("w", (1, R.V), torch.float64, dev)
    for c0, c1, Pc, Qc, qb in _chunks(R, reverse=True):
        torch.sub(Pc, qi_chunk(c0, c1, Pc, Qc, qb), out=w[0, c0:c1]).clamp_min_(0.0)
    c = torch.cumsum(w, -1, out=_scratch("cdf", (1, R.V), torch.float64, dev))
    if not float(c[0, -1]) > 0:  # no mass (w >= 0): residual_or's fallback row
        w = residual_or(w, R.p64().unsqueeze(0))
        c = torch.cumsum(w, -1)
    u = torch.rand(1, generator=g, dtype=torch.float64, device=dev)  # sample_rows' uniform
    if not float(c[0, -1]) > 0:
        raise RuntimeError("internal error: a residual row has no mass (inputs not normalised?)")
    idx = int(cdf_search(c, u)[0])
    if idx >= R.V:  # a target rounded up to the total: the last positive entry
        idx = int((w[0] > 0).nonzero()[-1, 0])
    return torch.tensor(idx, dtype=torch.long, device=dev)


class _OffOne:
    """The off-S part of q_I for one row (``KhistiIS._off_parts`` and ``_q_inf_full`` for a
    row alone), built on first use: the full-V buckets and histograms only when a selected
    draft is off S or a draft is rejected, in column chunks (``_chunks``). R a ``_Row``; S,
    active ``[n]``; mS ``[n]`` (numpy). The histogram keeps the plan's summation order (the
    tokens of S go to an extra bucket instead of adding zeros to theirs)."""

    def __init__(self, off, R, S, active, mS, K):
        self.off, self.R, self.S, self.active, self.mS, self.K = off, R, S, active, mS, K
        self.A = None

    def _coef(self):
        if self.A is None:
            R, dev = self.R, self.R.p.device
            C = _R_C if self.off == "ratio" else _n_buckets(torch.float64)
            Sa = self.S[self.active]
            k1 = R.q.shape[0] if R.q.ndim == 2 else 1
            key = _scratch("key", (R.V,), torch.long, dev)
            H = torch.zeros(1, k1, C + 1, dtype=torch.float64, device=dev)
            for c0, c1, Pc, Qc, qb in _chunks(R):
                kc = key[c0:c1]
                if self.off == "ratio":  # _ratio_bucket, in place in the key's own memory
                    torch.div(Pc, qb, out=kc.view(torch.float64)).nan_to_num_(nan=0.0)
                    kc.bitwise_right_shift_(_R_SHIFT).sub_(_R_LO).clamp_(0, _R_C - 1)
                else:
                    kc.copy_(_bucket(Pc - qb * qb))
                inS = Sa[(Sa >= c0) & (Sa < c1)]
                kc[inS - c0] = C
                H[0].scatter_add_(-1, kc.unsqueeze(0).expand(k1, -1), Qc)
            A = _off_coef(H[..., :C].contiguous(), _OffRule(self.off, key.unsqueeze(0), C), self.K)[0]  # [k1, C]
            self.A = torch.cat([A, torch.zeros(k1, 1, dtype=torch.float64, device=dev)], -1)  # [k1, C + 1]
            self.key, self.Sa = key, Sa
            self.mSa = torch.as_tensor(self.mS, dtype=torch.float64, device=dev)[self.active]
        return self.A, self.key

    def q_inf_at(self, y: int) -> float:
        """q_I(y) for y off S: sum_k q_k(y) A_k(c_y), summed as ``KhistiIS._verify_rows`` sums it."""
        A, key = self._coef()
        qy = self.R.qk_at(torch.tensor([y], device=key.device))[:, 0]  # [k1]
        return float((qy * A[:, int(key[y])]).unsqueeze(0).sum(-1)[0])

    def _q_inf_chunk(self, c0, c1, Pc, Qc, qb):
        A, key = self.A, self.key
        k1, dev = Qc.shape[0], Qc.device
        Ak = _scratch("Ak", (k1, c1 - c0), torch.float64, dev)
        for k in range(k1):  # A_k at each token's bucket (row by row: a 1-D gather is a fast path)
            torch.index_select(A[k], 0, key[c0:c1], out=Ak[k])
        Ak.mul_(Qc)
        qi = Ak[0] if k1 == 1 else torch.sum(Ak, 0, out=_scratch("qi", (c1 - c0,), torch.float64, dev))  # [c]: off S
        sel = (self.Sa >= c0) & (self.Sa < c1)
        qi[self.Sa[sel] - c0] = self.mSa[sel]  # on S: the matches' law
        return qi

    def residual(self, g):
        """One draw from (p - q_I)+ (``_residual_one``)."""
        self._coef()
        return _residual_one(self.R, self._q_inf_chunk, g)


class _Plan:
    """Everything that depends on (p, q) only: S ``[N, n]`` (score order), active ``[N, n]``
    (slot inside the mass prefix), the off-S rule, one W ``[N, n, n]`` per match, the
    winner's law mS ``[N, n]`` on S."""

    __slots__ = ("S", "active", "rule", "Ws", "mS")

    def __init__(self, S, active, rule, Ws, mS):
        self.S, self.active, self.rule, self.Ws, self.mS = S, active, rule, Ws, mS


@register
class KhistiIS(Verifier):
    r"""Importance-weighted selection followed by single-draft SD (canonical architecture).

    Step 1 selects one draft y with selection weights :math:`\beta_y(x_1..x_K)`, which
    induces :math:`q_I(y) = \sum_{\mathrm{tuples}} P(\mathrm{tuple})\,\beta_y(\mathrm{tuple})`
    (computed exactly); step 2 is single-draft SD of y against p with draft law
    :math:`q_I`: accept w.p. :math:`\min(1, p(y)/q_I(y))`, else sample
    :math:`\mathrm{norm}((p - q_I)_+)`. Lossless for any selection rule whose q_I is exact.
    Khisti et al. (2024), "Multi-Draft Speculative Sampling: Canonical Architectures and
    Theoretical Limits", arXiv 2410.18234.

    Selection (their practical scheme). Tokens are ranked by :math:`p - \bar q^2`
    (:math:`\bar q` the mean draft distribution) and S is the top ``s`` (ties to the lower
    id), or with ``mass`` the shortest such prefix with :math:`p(S) \ge` ``mass`` (at most
    ``s`` tokens). A match between two tokens keeps the one in S if only one is; when both
    are in S it keeps i from {i, j} with the weight of a small LP that maximises
    :math:`\sum_{i \in S} \min(p_i, m_i)` for the winner's law m; ``solver="lex"`` takes the
    unique optimum minimising :math:`\sum_i m_i^2 / p_i` (Fujishige's lexicographically
    optimal base, one of the LP's optima), ``"lp"`` whichever vertex HiGHS returns.
    When neither is in S (``off``):

    * ``"ratio"`` (default): keep a against b with probability
      :math:`w_a / (w_a + w_b)`, :math:`w = 2^{c/8}` for c the bucket of the importance
      weight :math:`p/\bar q` (8 buckets per factor 2, clamped to :math:`2^{\pm 32}`);
    * ``"rank"``: keep the higher-ranked one (the paper's rule), the rank being a bucket
      of the score (its float exponent and top two mantissa bits); ties keep the current
      winner (the earlier draft).

    K = 2 is one match; for K > 2 the drafts play a pairwise tournament, the winner of each
    match meeting the next draft, each match with its own LP on the exact law of the winner
    so far (the intermediate LPs also target p; the paper is silent there). Off S the
    winner's law is a bucket histogram recursion (``_off_coef``):
    :math:`q_I(y) = \sum_k q_k(y) A_k(c_y)`. With ``s >= V`` and K = 2 the LP is the full
    optimal selection, reaching :math:`\alpha^* = \min_S [1 + p(S) - q(S)^2]` for iid drafts.
    Supports iid drafts and independent drafts (each from its own q_k).
    """

    name = "khisti_is"
    laws = ("iid", "independent")
    min_k = 1
    raw_rows = True  # _verify divides by row_scale itself (rows64 for batches; read values for one row)

    def __init__(self, s: int = 10, mass: float | None = None, off: str = "ratio", solver: str = "lex"):
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"s (size of the LP token set) must be a positive integer, got {s!r}")
        if mass is not None and (isinstance(mass, bool) or not isinstance(mass, (int, float)) or not 0 < mass <= 1):
            raise ValueError(f"mass (p-mass the LP token set covers) must be in (0, 1] or None, got {mass!r}")
        if off not in OFF_RULES:
            raise ValueError(f"off (rule between two drafts outside S) must be one of {OFF_RULES}, got {off!r}")
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
        self.s, self.mass, self.off, self.solver = s, mass, off, solver

    def __repr__(self) -> str:
        return f"<verifier {self.name!r} laws={self.laws} s={self.s} mass={self.mass} off={self.off!r} solver={self.solver!r}>"

    # the plan: everything that depends on (p, q) only ---------------------------------------
    def _plan(self, fp, fq, K) -> _Plan:
        # fp [N, V]; fq [N, V] (shared) or [N, K, V] (per draft)
        N, V = fp.shape
        qbar = fq if fq.ndim == 2 else fq.mean(-2)
        score = fp - qbar * qbar  # [N, V], ranking key (desc), ties to the lower id
        S = _top_set(score, min(self.s, V))  # [N, n], score order
        n = S.shape[-1]
        pS = fp.gather(-1, S).double()
        if self.mass is None:
            active = torch.ones(N, n, dtype=torch.bool, device=fp.device)
        else:  # shortest prefix with p(S) >= mass: slot i is in while the better ones miss it
            active = (pS.cumsum(-1) - pS) < self.mass
        pS = pS * active
        if fq.ndim == 2:
            tS = fq.gather(-1, S).double().unsqueeze(1).expand(N, K, n)  # [N, K, n]
        else:
            tS = fq.gather(-1, S.unsqueeze(1).expand(N, K, n)).double()
        tS = tS * active.unsqueeze(1)
        t_out = (1 - tS.sum(-1)).clamp_min(0.0)  # [N, K]
        if self.off == "ratio":
            rule = _OffRule("ratio", _ratio_bucket(fp, qbar), _R_C)
        else:
            rule = _OffRule("rank", _bucket(score), _n_buckets(score.dtype))
        if N == 1 and K > 1:  # one row (a decoder node): every match on the host, in numpy
            Ws, mS = _stages_one_row(pS[0], tS[0], t_out[0], self.solver)
            return _Plan(S, active, rule, Ws, mS)
        rS, r_out = tS[:, 0], t_out[:, 0]
        Ws = []
        for m in range(1, K):
            W, rS = _solve_stage(pS, rS, r_out, tS[:, m], t_out[:, m], self.solver)
            r_out = r_out * t_out[:, m]
            Ws.append(W)
        return _Plan(S, active, rule, Ws, rS)

    @staticmethod
    def _off_parts(fq, plan, rows, K):
        """For the given rows: draft laws off S ``[r, k1, V]`` (zero on S; k1 = 1 when q is
        shared), their off-S coefficients A ``[r, k1, C]`` and the buckets ``[r, V]``."""
        qk = fq[rows].double()
        Sr, ar = plan.S[rows], plan.active[rows]
        if fq.ndim == 2:
            qk = qk.scatter(-1, Sr, torch.where(ar, 0.0, qk.gather(-1, Sr))).unsqueeze(1)
        else:
            idx = Sr.unsqueeze(1).expand(-1, qk.shape[1], -1)
            qk = qk.scatter(-1, idx, torch.where(ar.unsqueeze(1), 0.0, qk.gather(-1, idx)))
        k1 = qk.shape[1]
        bk = plan.rule.key[rows]
        H = torch.zeros(rows.numel(), k1, plan.rule.C, dtype=torch.float64, device=qk.device)
        H.scatter_add_(-1, bk.unsqueeze(1).expand(-1, k1, -1), qk)
        return qk, _off_coef(H, plan.rule, K), bk

    def _step(self, fq, plan, K):
        V = fq.shape[-1]
        k1 = fq.shape[-2] if fq.ndim == 3 else 1
        return max(1, min(chunk_rows(V * k1), (1 << 20) // (plan.rule.C * K)))

    def _q_inf_full(self, fq, plan, rows, K):
        """q_I over the whole vocabulary ``[r, V]`` for the given rows (a histogram, no sort)."""
        step = self._step(fq, plan, K)
        if rows.numel() > step:
            return torch.cat([self._q_inf_full(fq, plan, rows[i : i + step], K) for i in range(0, rows.numel(), step)])
        qk, A, bk = self._off_parts(fq, plan, rows, K)
        qi = (qk * A.gather(-1, bk.unsqueeze(1).expand(-1, qk.shape[1], -1))).sum(1)
        Sr, ar = plan.S[rows], plan.active[rows]
        return qi.scatter(-1, Sr, torch.where(ar, plan.mS[rows], qi.gather(-1, Sr)))

    # sampling path ---------------------------------------------------------------------------
    def _verify(self, p, q, drafts, g, law):
        # p [..., V], q [..., V] or [..., K, V], drafts [..., K]
        # raw_rows: p, q as given (any float dtype); _verify_rows reads rows64(p), rows64(q),
        # _verify_one divides by row_scale only the values it reads (the same float64 values)
        batch = p.shape[:-1]
        if drafts.reshape(-1, drafts.shape[-1]).shape[0] == 1:  # a decoder node: the same rule, one row
            fp, fq, fd, _ = self._flat(p, q, drafts)
            return self._verify_one(_Row(fp[0], fq[0]), fd[0], g).reshape(batch)
        fp, fq, fd, _ = self._flat(rows64(p), rows64(q), drafts)
        return self._verify_rows(fp, fq, fd, g).reshape(batch)

    def _verify_one(self, R, d, g):
        """``_verify_rows`` for one row, token for token (the same uniforms, the same float64
        values at every token it reads): R a ``_Row`` (raw p ``[V]``, q ``[V]`` or ``[K, V]``),
        d ``[K]`` -> the token (0-dim long). The plan is built only as far as the drafts need
        it: the top set S (``_Row.top_set``: no float64 copy of the rows when a float32 bound
        certifies it) and the matches' laws on S (numpy) always; the importance-weight buckets
        of the K drafts alone; the O(V) off-S histogram only when the selected draft is off S
        or rejected."""
        K, V = d.shape[0], R.V
        dev = R.p.device
        u = torch.rand(1, K, generator=g, dtype=torch.float64, device=dev)[0].tolist()
        dl = d.tolist()
        if K == 1:  # no match: q_I = q (what the plan gives, value for value)
            y = dl[0]
            return self._finish(R, y, float(R.qk_at(d)[0, 0]), u[0], g,
                                lambda g: _residual_one(R, lambda c0, c1, P, Q, qb: Q[0], g))
        S = R.top_set(min(self.s, V), K)  # [n], score order
        n = S.shape[0]
        pS = R.p_at(S)
        if self.mass is None:
            active = torch.ones(n, dtype=torch.bool, device=dev)
        else:
            active = (pS.cumsum(-1) - pS) < self.mass
        pS = pS * active
        tS = R.qk_at(S).expand(K, n) * active
        t_out = (1 - tS.sum(-1)).clamp_min(0.0)  # [K]
        ws, mS = _stages_np(pS.cpu().numpy(), tS.cpu().numpy(), t_out.cpu().numpy(), self.solver)
        slot = {t: i for i, (t, a) in enumerate(zip(S.tolist(), active.tolist())) if a}
        # keys of the drafts off S (the plan's full-V key, read at these K tokens)
        pos = [slot.get(t, -1) for t in dl]
        keyv = Wm = None
        if sum(x < 0 for x in pos) >= 2:
            pd, qd = R.p_at(d), R.qbar_at(d)
            keyv = (_ratio_bucket(pd, qd) if self.off == "ratio" else _bucket(pd - qd * qd)).tolist()
            Wm = _ratio_matrix(dev) if self.off == "ratio" else None
        w, pw = dl[0], pos[0]
        kw = keyv[0] if keyv is not None else None
        for m in range(1, K):
            b, pb = dl[m], pos[m]
            kb = keyv[m] if keyv is not None else None
            if w == b:
                keep = 1.0
            elif pw >= 0:
                if pb >= 0:  # the plan's W[pw, pb]
                    keep = float(ws[m - 1][_pair_index(n, pw, pb)])
                    keep = keep if pw < pb else 1 - keep
                else:
                    keep = 1.0
            elif pb >= 0:
                keep = 0.0
            else:
                keep = float(Wm[kw, kb]) if Wm is not None else float(kw >= kb)
            if not u[m] < keep:
                w, pw, kw = b, pb, kb
        off = _OffOne(self.off, R, S, active, mS, K)
        if pw >= 0:
            return self._finish(R, w, float(mS[pw]), u[0], g, off.residual)
        return self._finish(R, w, off.q_inf_at(w), u[0], g, off.residual)

    @staticmethod
    def _finish(R, y, qi, u0, g, residual):
        """The accept step of the selected draft y (q_I(y) = qi): ``accept``'s coin, and on a
        rejection ``residual(g)``, one draw from (p - q_I)+."""
        dev = R.p.device
        py = float(R.p_at(torch.tensor([y], device=dev))[0])
        if py > 0 and u0 * qi <= py:
            return torch.tensor(y, dtype=torch.long, device=dev)
        return residual(g)

    def _verify_rows(self, fp, fq, fd, g):
        """The sampling path over N flattened rows: fp ``[N, V]``, fq ``[N, V]`` or
        ``[N, K, V]``, fd ``[N, K]`` -> tokens ``[N]``."""
        N, K = fd.shape
        p = fp
        plan = self._plan(fp, fq, K)
        S, active, rule = plan.S, plan.active, plan.rule
        ar = torch.arange(N, device=p.device)
        u = torch.rand(N, K, generator=g, dtype=torch.float64, device=p.device)

        def pos(tok):  # slot in S or -1
            eq = (S == tok.unsqueeze(-1)) & active
            return torch.where(eq.any(-1), eq.long().argmax(-1), torch.full_like(tok, -1))

        def key(tok):
            return rule.key.gather(-1, tok.unsqueeze(-1)).squeeze(-1)

        w = fd[:, 0]
        pw = pos(w)
        for m in range(1, K):
            b = fd[:, m]
            pb = pos(b)
            off = rule.keep_prob(key(w), key(b))
            keep = torch.where(pw >= 0, (pb < 0).double(), torch.where(pb < 0, off, torch.zeros_like(off)))
            both = (pw >= 0) & (pb >= 0)
            if bool(both.any()):
                lp = plan.Ws[m - 1][ar, pw.clamp_min(0), pb.clamp_min(0)]
                keep = torch.where(both, lp, keep)
            keep = torch.where(w == b, torch.ones_like(keep), keep)
            stay = u[:, m] < keep
            w = torch.where(stay, w, b)
            pw = torch.where(stay, pw, pb)
        # q_I at the selected token: from the LP on S, the histogram recursion off S
        qi = plan.mS.gather(-1, pw.clamp_min(0).unsqueeze(-1)).squeeze(-1)
        offr = (pw < 0).nonzero().squeeze(-1)
        if offr.numel():
            step = self._step(fq, plan, K)
            for s0 in range(0, offr.numel(), step):
                r = offr[s0 : s0 + step]
                y = w[r]
                qk, A, bk = self._off_parts(fq, plan, r, K)
                by = bk.gather(-1, y.unsqueeze(-1))  # [r, 1]
                qy = qk.gather(-1, y.view(-1, 1, 1).expand(-1, qk.shape[1], 1)).squeeze(-1)  # [r, k1]
                Ay = A.gather(-1, by.unsqueeze(1).expand(-1, qk.shape[1], 1)).squeeze(-1)  # [r, k1]
                qi[r] = (qy * Ay).sum(-1)
        py = fp.gather(-1, w.unsqueeze(-1)).squeeze(-1)
        token = w.clone()
        rej = (~accept(u[:, 0], py, qi)).nonzero().squeeze(-1)
        if rej.numel():
            token[rej] = sample_rows(
                lambda rows: residual_or((fp[rows] - self._q_inf_full(fq, plan, rows, K)).clamp_min(0.0), fp[rows]), rej, g
            )
        return token

    # exact path ------------------------------------------------------------------------------
    def _output_distribution(self, p, q, drafts, law):
        fp, fq, fd, batch = self._flat(p, q, drafts)
        K, V = fd.shape[-1], fp.shape[-1]
        plan = self._plan(fp, fq, K)
        qi = self._q_inf_full(fq, plan, torch.arange(fp.shape[0], device=p.device), K)  # [N, V]
        return self._output_from_plan(fp, plan, qi, fd).reshape(*batch, V)

    # prepared rows (Verifier.prepare): the LPs and q_I once, tiled over the tuples ------------
    def _prepare(self, p, q, k, law):
        plan = self._plan(p, q, k)
        return plan, self._q_inf_full(q, plan, torch.arange(p.shape[0], device=p.device), k)

    def _output_prepared(self, state, p, q, drafts, law):
        plan, qi = state
        n = p.shape[0]
        rows = torch.arange(drafts.shape[0], device=p.device) % n  # row j * n + i is row i
        r = plan.rule
        tiled = _Plan(plan.S[rows], plan.active[rows], _OffRule(r.kind, r.key[rows], r.C),
                      [W[rows] for W in plan.Ws], plan.mS[rows])
        return self._output_from_plan(p[rows], tiled, qi[rows], drafts)

    def _output_from_plan(self, fp, plan, qi, fd):
        """Output laws ``[N, V]`` for drafts fd ``[N, K]`` of the plan's rows fp ``[N, V]``, with
        their q_I ``[N, V]``."""
        N, V = fp.shape
        K = fd.shape[-1]
        S, active, rule = plan.S, plan.active, plan.rule
        rows = torch.arange(N, device=fp.device)
        offS = torch.ones(N, V, dtype=torch.bool, device=fp.device).scatter(-1, S, ~active)
        win = torch.zeros(N, V, dtype=torch.float64, device=fp.device)
        win[rows, fd[:, 0]] = 1.0
        for m in range(1, K):
            b = fd[:, m]
            eq = (S == b.unsqueeze(-1)) & active
            inS = eq.any(-1, keepdim=True)  # [N, 1]
            # P(a kept against b): off S the rule (a the current winner), S beats off S
            sel = torch.where(inS, torch.zeros(N, V, dtype=torch.float64, device=fp.device), rule.keep_col(rule.key.gather(-1, b.unsqueeze(-1)).squeeze(-1)))
            sel = torch.where(offS, sel, (~inS).double())
            if bool(inS.any()):
                pb = eq.long().argmax(-1)
                col = plan.Ws[m - 1][rows, :, pb]  # [N, n]: P(S_i kept against b)
                sel = sel.scatter(-1, S, torch.where(inS & active, col, sel.gather(-1, S)))
            lost = (win * (1 - sel)).sum(-1)
            win = win * sel
            win[rows, b] += lost
        acc = win * accept_prob(fp, qi)  # [N, V]
        res = residual_law((fp - qi).clamp_min(0.0), fp)
        return acc + (1 - acc.sum(-1, keepdim=True)) * res
