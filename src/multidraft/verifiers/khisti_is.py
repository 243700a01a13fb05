"""Importance-weighted selection + single-draft SD (Khisti et al. 2024)."""
from __future__ import annotations

import functools

import numpy as np
import torch

from .._scan import top_desc_stable
from ._residual import accept, accept_prob, chunk_rows, residual_law, residual_or, sample_rows
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
    a winner in S beats the newcomer): A_k <- A_k keep_m for k < m, A_m = win_m."""
    r, k1, C = H.shape
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


def _split_lex(pu, Mu, fixedu, a, b):
    """Pair splits ``[U, P]``: the lexicographically optimal winner law (Fujishige 1980).

    The laws m reachable by splitting the pair masses form the base polytope of a submodular
    function (fractional orientations of a weighted graph, shifted by ``fixed``). Its point
    minimising sum_i m_i^2 / p_i is unique and maximises sum_i min(p_i, m_i) over the whole
    polytope (Fujishige's lexicographically optimal base for the weights p), so it is one of
    the LP's optima, chosen by a strictly convex rule instead of by the solver's vertex. It
    is a bounded least-squares problem in f (BVLS, an exact active-set method), one per row;
    p_i = 0 gets the weight ``_P_FLOOR`` (its mass is moved away first). f itself need not be
    unique; m is. A row where BVLS fails keeps the even split (exact, only less efficient)."""
    from scipy.optimize import lsq_linear

    U, P = Mu.shape
    n = pu.shape[1]
    out = Mu / 2
    E = np.zeros((n, P))
    E[a, np.arange(P)] = 1.0
    E[b, np.arange(P)] -= 1.0
    for u in range(U):
        live = Mu[u] > 0
        if not live.any():
            continue
        if n <= LEX_DECOMP_N:
            fu, ok = _lex_decomp_row(pu[u], Mu[u], fixedu[u], a, b)
            if ok:
                out[u] = fu
                continue
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


def _lex_decomp_row(p, M, fixed, a, b):
    """The lex split of one row (``_split_lex``'s problem) by Fujishige's decomposition.

    The reachable winner laws are the bases of g(X) = fixed(X) + M(pairs touching X) (the
    most mass X can receive). The minimiser of sum_i m_i^2 / w_i (w = max(p, _P_FLOOR)) is
    m = lambda_j w on the j-th block of the chain: lambda_1 = min_X g(X) / w(X) over nonempty
    X, the block is the largest minimiser (minimisers of a submodular function are closed under
    union), then the same on the contraction g(X | B) - g(B), over subsets of the rest. Pairs
    across blocks go to the lower ratio; the pairs inside a block are split by the weighted
    Laplacian solve f = M (1/2 + y_a - y_b), pairs that leave [0, M] are clamped and the rest
    re-solved (an active set). Returns (f ``[P]``, ok): ok when the realised law matches the
    decomposition's to 1e-13 (else the caller solves the row by BVLS)."""
    n = p.shape[0]
    w = np.maximum(p, _P_FLOOR)
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
    m = lam * w
    ba, bb = blk[a], blk[b]
    f = np.where(ba < bb, M, 0.0)  # across blocks the lower ratio takes the whole pair
    free = (ba == bb) & (M > 0)
    ar = np.arange(n)
    for _ in range(2 * n):
        if not free.any():
            break
        Mi = np.where(free, M, 0.0)
        fo = np.where(free, 0.0, f)
        d = m - fixed - np.bincount(a, fo, n) - np.bincount(b, np.where(free, 0.0, M - fo), n)
        half = 0.5 * (np.bincount(a, Mi, n) + np.bincount(b, Mi, n))
        L = np.zeros((n, n))
        L[a, b] = -Mi
        L[b, a] = -Mi
        L[ar, ar] = -L.sum(1)
        y = np.linalg.lstsq(L, d - half, rcond=None)[0]
        fi = Mi * (0.5 + y[a] - y[b])
        out = free & ((fi < 0) | (fi > M))
        f = np.where(free, np.clip(fi, 0.0, M), f)
        if not out.any():
            break
        free = free & ~out  # the pairs past a bound stay there
    mr = fixed + np.bincount(a, f, n) + np.bincount(b, M - f, n)
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
    P = a.numel()
    f = M / 2
    if P:
        if N == 1:  # one row (a decoder node): it is its own distinct row
            inv = first = torch.zeros(1, dtype=torch.long, device=dev)
        else:
            key = torch.cat([pS, rS, tS, r_out.unsqueeze(-1), t_out.unsqueeze(-1)], -1)
            uniq, inv = torch.unique(key, dim=0, return_inverse=True)
            first = torch.full((uniq.shape[0],), N, dtype=torch.long, device=dev).scatter_reduce(
                0, inv, torch.arange(N, device=dev), "amin"
            )
        args = (pS[first].cpu().numpy(), M[first].cpu().numpy(), fixed[first].cpu().numpy(), a.cpu().numpy(), b.cpu().numpy())
        fu = _split_lex(*args) if solver == "lex" else _split_lp(*args)
        if fu is not None:
            f = torch.as_tensor(fu, dtype=torch.float64, device=dev)[inv]
        # otherwise keep the even split: any split is exact, only less efficient
    w = torch.where(M > 0, f / torch.where(M > 0, M, 1.0), torch.full_like(M, 0.5))
    W = torch.ones(N, n, n, dtype=torch.float64, device=dev)
    W[:, a, b] = w
    W[:, b, a] = 1 - w
    Msym = torch.zeros(N, n, n, dtype=torch.float64, device=dev)
    Msym[:, a, b] = M
    Msym[:, b, a] = M
    m = fixed + (W * Msym).sum(-1)
    return W, m


def _stages_one_row(pS, tS, t_out, solver):
    """``_solve_stage`` for every match of one row, in numpy (a decoder node: no batch to share
    the torch call overheads with): pS ``[n]``, tS ``[K, n]``, t_out ``[K]`` -> (Ws, one
    ``[1, n, n]`` per match, mS ``[1, n]``), on pS's device. The same formulas as
    ``_solve_stage`` in float64, so the same law up to the order of a sum."""
    dev = pS.device
    p = pS.cpu().numpy()
    t = tS.cpu().numpy()
    to = t_out.cpu().numpy()
    n = p.shape[0]
    a, b = np.triu_indices(n, 1)
    r, ro = t[0], float(to[0])
    Ws = []
    for m in range(1, t.shape[0]):
        tm, tom = t[m], float(to[m])
        fixed = r * tm + r * tom + ro * tm
        M = r[a] * tm[b] + r[b] * tm[a]
        f = M / 2
        if a.size:
            args = (p[None], M[None], fixed[None], a, b)
            fu = _split_lex(*args) if solver == "lex" else _split_lp(*args)
            if fu is not None:
                f = fu[0]
        w = np.where(M > 0, f / np.where(M > 0, M, 1.0), 0.5)
        W = np.ones((n, n))
        W[a, b] = w
        W[b, a] = 1 - w
        Msym = np.zeros((n, n))
        Msym[a, b] = M
        Msym[b, a] = M
        # this sum in torch, as _solve_stage sums it: the plan of a row alone equals its plan
        # inside a batch bit for bit (numpy's pairwise sum would round differently)
        Wt, Mt = torch.as_tensor(W, device="cpu"), torch.as_tensor(Msym, device="cpu")
        r = (torch.as_tensor(fixed, device="cpu") + (Wt * Mt).sum(-1)).numpy()
        ro = ro * tom
        Ws.append(torch.as_tensor(W, dtype=torch.float64, device=dev).unsqueeze(0))
    return Ws, torch.as_tensor(r, dtype=torch.float64, device=dev).unsqueeze(0)


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
        fp, fq, fd, batch = self._flat(p, q, drafts)
        N, K = fd.shape
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
        return token.reshape(batch)

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
