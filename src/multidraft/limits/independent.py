r"""Certified bounds on alpha* for independent drafts (draft j from its own q_j) at any V.

Main bound (used by ``independent_bounds``): the geometric mean G(c) = (prod_j c_j)^{1/K} is
min over lam > 0 with prod lam = 1 of (lam . c)/K (AM-GM), so
f(H) = max_lam [p(H) - (lam . q(H) / K)^K] and, by weak duality, for every such lam
min_H f(H) >= min_H [p(H) - u(H)^K], u = lam . q / K, whose minimiser is a prefix of the tokens
sorted by u/p (convex function of a modular one: the iid exchange argument): one sort and a
scan give a certified lower bound; the prefix itself gives the upper bound f(H). lam is
updated to the AM-GM equality point of the best set (lam_j = G(c)/c_j, c = q(H)); the bounds
usually meet within 2-4 rounds.

"""
from __future__ import annotations

import math

import torch

__all__ = ["independent_bounds"]

ROUNDS = 8          # lagrangian rounds (each one sort of [B, V])


def _order(p, score):
    """Tokens by score / p decreasing (p = 0 < score first). p [B, V], score [B, V]."""
    ratio = torch.where(p > 0, score / torch.where(p > 0, p, 1.0), torch.where(score > 0, torch.inf, 0.0))
    return torch.sort(ratio, dim=-1, descending=True, stable=True).indices


def independent_bounds(p, qs, *, rounds: int = ROUNDS, tol: float = 1e-13):
    """p ``[B, V]``, qs ``[B, K, V]`` (float64). Returns (lower ``[B]``, upper ``[B]``, H bool ``[B, V]``,
    gap ``[B]``) with lower <= min_H f(H) <= upper = f(H) (the returned set), lower including the
    rounding allowance; gap = upper - (lagrangian bound) before that allowance (<= 1e-12: exact)."""
    B, K, V = qs.shape
    ar = torch.arange(V).expand(B, V)
    lam = torch.ones(B, K, dtype=torch.float64)
    lower = torch.full((B,), -math.inf, dtype=torch.float64)
    upper = torch.zeros(B, dtype=torch.float64)
    H = torch.zeros(B, V, dtype=torch.bool)
    for _ in range(rounds):
        u = (lam.unsqueeze(-1) * qs).sum(-2) / K           # [B, V]; prod(lam) = 1
        order = _order(p, u)
        cp = torch.cumsum(p.gather(-1, order), -1)
        cu = torch.cumsum(u.gather(-1, order), -1)
        lag, n = (cp - cu**K).min(-1)                       # min_H p(H) - (lam.q(H)/K)^K: a prefix
        lower = torch.maximum(lower, lag.clamp(max=0.0))
        Hn = torch.zeros(B, V, dtype=torch.bool).scatter(-1, order, ar < (n + 1).unsqueeze(-1))
        c = torch.where(Hn.unsqueeze(-2), qs, 0.0).sum(-1)  # [B, K]: q_j(H)
        f = torch.where(Hn, p, 0.0).sum(-1) - c.prod(-1)
        better = f < upper
        upper = torch.where(better, f, upper)
        H = torch.where(better.unsqueeze(-1), Hn, H)
        if bool((upper - lower <= tol).all()):
            break
        G = c.prod(-1).clamp_min(0.0) ** (1.0 / K)          # AM-GM equality point: lam_j = G / c_j
        ok = (c > 0).all(-1)
        lam = torch.where(ok.unsqueeze(-1), G.unsqueeze(-1) / c.clamp_min(1e-300), lam)
    gap = upper - lower
    # rounding allowance of the cumsums and powers behind the lagrangian value
    allowance = (K + 2) * V * 2.0**-52
    lower = torch.minimum(lower, upper) - allowance
    return lower, upper, H, gap
