"""Linear programs for the optimal acceptance at small V (the references).

Coupling LP (Hu et al. 2025, optimal transport form). For tuples t with law P(t) and the
target p over tokens y, a verifier is a coupling pi(t, y) with row sums P(t) and column sums
p(y); its acceptance is sum_t sum_{y in t} pi(t, y). Only the "matched" pairs y in t enter the
objective, and any matched part can be completed to a full coupling by pairing the leftover
row mass P(t) - m(t) with the leftover column mass p(y) - c(y) in product form (both total
1 - alpha). So we solve the equivalent inequality form

    max  sum_{t, y in t} pi(t, y)   s.t.  sum_{y in t} pi(t, y) <= P(t),
                                          sum_{t ni y} pi(t, y) <= p(y),   pi >= 0,

which has no redundant equality row (with both full marginal sets as equalities HiGHS can
report "infeasible" at probabilities near 1e-15). The solution is then projected to be
exactly feasible (clipped, rows and columns scaled down) and its marginals are checked.

Importance-sampling LP (Khisti et al. 2024, canonical two-step architecture): selection
weights beta_y(t) >= 0 on the drafts of t summing to 1 induce q_I(y) = sum_t P(t) beta_y(t),
and the acceptance of single-draft SD of the selected draft is sum_y min(p(y), q_I(y)):

    max  sum_y m_y   s.t.  m_y <= p(y),  m_y <= q_I(y),  sum_{y in t} beta_y(t) = 1.

Both run in float64 through ``scipy.optimize.linprog(method="highs")`` and are meant for
V^K up to a few thousand tuples.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from .._validate import as_probs64
from ..drafts import DraftLaw

__all__ = [
    "CouplingSolution",
    "solve_coupling",
    "lp_optimal_acceptance",
    "is_lp_optimal_acceptance",
    "tuple_count",
    "check_lp_size",
    "MAX_LP_TUPLES",
]

FEAS_TOL = 1e-8  # accepted violation of the LP marginals before projection
# Largest number of draft tuples the LPs accept. HiGHS time grows faster than linearly in the
# tuple count: V = 6, K = 4 (1,296 tuples) takes about 2 s on one core, K = 5 (7,776) about
# 12 s, K = 6 (46,656) minutes, K = 8 (1.7 million) hours.
MAX_LP_TUPLES = 10_000


COUNT_CAP = 10**100  # size checks count tuples exactly up to here, and stop above it (fast: ~100 products)


def _capped_product(factors, cap: int | None) -> int:
    """The product of non-negative integers, or ``cap + 1`` as soon as it exceeds ``cap``
    (so a count like 6^(10^8) is never formed: at most about log2(cap) big multiplications)."""
    out = 1
    for f in factors:
        out *= f
        if out == 0:
            return 0
        if cap is not None and out > cap:
            return cap + 1
    return out


def tuple_count(law: DraftLaw, cap: int | None = None) -> int:
    """Number of draft tuples of positive probability (the rows ``law.enumerate()`` would
    list), from the support sizes alone: nothing is enumerated or allocated. With ``cap``,
    counting stops above it (the result is then ``cap + 1``): what a size check needs, in
    time independent of K (a bare ``n**K`` at K = 10^8 runs for minutes)."""
    if not isinstance(law, DraftLaw):
        raise ValueError(f"law must be a DraftLaw (from multidraft.drafts), got {type(law).__name__}")
    if len(law.batch_shape) != 0:
        raise ValueError(f"law must be unbatched to count its tuples, got batch_shape {tuple(law.batch_shape)}")
    K = law.k
    if law.kind == "independent":
        return _capped_product((int((law.q[j] > 0).sum()) for j in range(K)), cap)
    n = int((law.q > 0).sum())
    if law.kind == "iid":
        return n**K if cap is None or n <= 1 else _capped_product((n for _ in range(K)), cap)
    if law.kind == "wor":
        return math.perm(n, K) if cap is None or K > n else _capped_product(range(n, n - K, -1), cap)
    if law.kind == "greedy":
        return max(0, n - (K - 1))  # the top K-1 are fixed; the last draft ranges over the rest's support
    raise ValueError(f"law: unknown draft law kind {law.kind!r}")  # pragma: no cover


def check_lp_size(law: DraftLaw, max_tuples: int | None = None) -> int:
    """The tuple count of the coupling LP for ``law``; ``ValueError`` up front (naming k and
    the count) when it exceeds ``max_tuples`` (default ``MAX_LP_TUPLES``), so callers can
    refuse or say so before minutes of solver time."""
    limit = MAX_LP_TUPLES if max_tuples is None else int(max_tuples)
    n = tuple_count(law, cap=COUNT_CAP)  # exact up to 10^100, in time independent of K
    if n > limit:
        shown = f"{n:,}" if n <= COUNT_CAP else "more than 10^100"
        raise ValueError(
            f"k = {law.k}: the acceptance LP for the {law.kind!r} law at V = {law.V} would have {shown} draft tuples "
            f"(limit {limit:,}); the LP is a small-V reference, use optimal_acceptance for alpha* at this size"
        )
    return n


class CouplingSolution(NamedTuple):
    tuples: torch.Tensor     # [N, K] int64, every tuple of positive probability
    probs: torch.Tensor      # [N] float64, P(tuple)
    matched: torch.Tensor    # [N, V] float64, pi(t, y) on y in t, exactly feasible
    residual: torch.Tensor   # [V] float64, law of the leftover column mass (p where rounding leaves none)
    acceptance: float        # sum of matched mass (the LP optimum)


def _check(p, law) -> torch.Tensor:
    if not isinstance(law, DraftLaw):
        raise ValueError(f"law must be a DraftLaw (from multidraft.drafts), got {type(law).__name__}")
    if len(law.batch_shape) != 0:
        raise ValueError(f"law must be unbatched for the LP (small V), got batch_shape {tuple(law.batch_shape)}")
    p = as_probs64(p, "p")
    if p.ndim != 1:
        raise ValueError(f"p must be a single distribution [V] for the LP, got shape {tuple(p.shape)}")
    if p.shape[-1] != law.V:
        raise ValueError(f"p has V = {p.shape[-1]} but the law has V = {law.V}")
    return p


def _pairs(tuples: torch.Tensor):
    """Distinct (tuple index, token) pairs with the token in the tuple: two int64 arrays."""
    N, K = tuples.shape
    rows = np.repeat(np.arange(N), K)
    toks = tuples.numpy().reshape(-1)
    key = np.unique(rows * (int(toks.max()) + 1 if toks.size else 1) + toks)
    base = int(toks.max()) + 1 if toks.size else 1
    return key // base, key % base


_HIGHS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}


def _linprog(c, A_ub=None, b_ub=None, A_eq=None, b_eq=None, bounds=(0, None)):
    from scipy.optimize import linprog

    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs", options=_HIGHS)
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed on the acceptance LP: {res.message}")
    return res


_CACHE: dict = {}
_CACHE_MAX = 256


def solve_coupling(p, law: DraftLaw) -> CouplingSolution:
    """Optimal coupling of the law's tuples with p (small V); cached per (p, q, kind, K)."""
    p = _check(p, law)
    q = law._q64()
    key = (law.kind, law.k, p.numpy().tobytes(), q.numpy().tobytes())
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    check_lp_size(law)
    from scipy.sparse import coo_matrix

    tuples, probs = law.enumerate()
    N, V = tuples.shape[0], p.shape[-1]
    r, y = _pairs(tuples)
    M = r.size
    idx = np.arange(M)
    A = coo_matrix(
        (np.ones(2 * M), (np.concatenate([r, N + y]), np.concatenate([idx, idx]))), shape=(N + V, M)
    ).tocsr()
    b = np.concatenate([probs.numpy(), p.numpy()])
    res = _linprog(-np.ones(M), A_ub=A, b_ub=b)
    x = np.clip(res.x, 0.0, None)
    # project to exact feasibility: scale rows, then columns, down to their capacities
    viol = A @ x - b
    if viol.max(initial=0.0) > FEAS_TOL:
        raise RuntimeError(f"HiGHS solution violates the marginals by {viol.max():.3g}")
    pi = torch.zeros(N, V, dtype=torch.float64)
    pi[torch.from_numpy(r), torch.from_numpy(y)] = torch.from_numpy(x)
    row = pi.sum(-1)
    pi = pi * torch.where(row > probs, probs / torch.where(row > 0, row, 1.0), torch.ones_like(row)).unsqueeze(-1)
    col = pi.sum(0)
    pi = pi * torch.where(col > p, p / torch.where(col > 0, col, 1.0), torch.ones_like(col))
    left = (p - pi.sum(0)).clamp_min(0.0)
    z = left.sum()
    # the rows' leftover mass goes where the columns' is; where the projection filled every column
    # to p (z = 0) a row may still be short by its rounding: it follows p itself, so every row of
    # ``coupling_rows`` is a law inside the support of p (moving at most that rounding)
    residual = left / z if float(z) > 0 else p.clone()
    sol = CouplingSolution(tuples, probs, pi, residual, float(pi.sum()))
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = sol
    return sol


def coupling_rows(sol: CouplingSolution) -> torch.Tensor:
    """The full optimal coupling's conditional laws pi(t, .)/P(t), ``[N, V]`` float64: each row a
    law (sums to 1 to rounding) inside the support of p."""
    left = (sol.probs - sol.matched.sum(-1)).clamp_min(0.0)  # [N]
    full = sol.matched + left.unsqueeze(-1) * sol.residual.unsqueeze(0)
    return full / sol.probs.unsqueeze(-1)


def lp_optimal_acceptance(p, law: DraftLaw) -> float:
    """alpha* from the full coupling LP over all draft tuples (HiGHS). Small V only."""
    return solve_coupling(p, law).acceptance


def is_lp_optimal_acceptance(p, law: DraftLaw) -> float:
    """alpha* from the two-step importance-sampling LP of Khisti et al. (2024). Small V only."""
    from scipy.sparse import coo_matrix

    p = _check(p, law)
    check_lp_size(law)
    tuples, probs = law.enumerate()
    N, V = tuples.shape[0], p.shape[-1]
    r, y = _pairs(tuples)
    M = r.size
    # variables: beta [M] then m [V]; maximise sum m
    c = np.concatenate([np.zeros(M), -np.ones(V)])
    idx = np.arange(M)
    # m_y - sum_t P(t) beta_y(t) <= 0
    A_ub = coo_matrix(
        (np.concatenate([-probs.numpy()[r], np.ones(V)]), (np.concatenate([y, np.arange(V)]), np.concatenate([idx, M + np.arange(V)]))),
        shape=(V, M + V),
    )
    A_eq = coo_matrix((np.ones(M), (r, idx)), shape=(N, M + V))
    bounds = [(0, None)] * M + [(0, float(pv)) for pv in p.numpy()]
    res = _linprog(c, A_ub=A_ub.tocsr(), b_ub=np.zeros(V), A_eq=A_eq.tocsr(), b_eq=np.ones(N), bounds=bounds)
    beta = np.clip(res.x[:M], 0.0, None)
    qI = np.zeros(V)
    np.add.at(qI, y, probs.numpy()[r] * beta)
    return float(np.minimum(p.numpy(), qI).sum())
