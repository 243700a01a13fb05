r"""Closed forms for identical drafts (Khisti et al. 2024).

For K = 2 drafts drawn i.i.d. from q, ``alpha* = min_S [1 + p(S) - q(S)^2]``, and
acceptance 1 is reachable iff ``p(S) >= q(S)^K`` for every token set S. Both minimise
p(S) - q(S)^K, a modular term minus a convex function of a modular term, whose minimum
over all 2^V sets is reached on a prefix of the tokens sorted by q/p decreasing; so one
sort and a prefix scan, O(V log V), batched over leading dimensions.
"""
from __future__ import annotations

import torch

from .._validate import as_k, as_probs64
from .dual import iid_scan

__all__ = ["k2_optimal_acceptance", "unit_acceptance_possible", "UNIT_TOL"]

UNIT_TOL = 1e-12  # min_S [p(S) - q(S)^k] >= -UNIT_TOL counts as acceptance 1


def _pq(p, q):
    p = as_probs64(p, "p")
    q = as_probs64(q, "q")
    if q.shape[-1] != p.shape[-1]:
        raise ValueError(f"q has V = {q.shape[-1]} but p has V = {p.shape[-1]}")
    try:
        shape = torch.broadcast_shapes(p.shape, q.shape)
    except RuntimeError:
        raise ValueError(f"p of shape {tuple(p.shape)} and q of shape {tuple(q.shape)} do not broadcast") from None
    return p.expand(shape), q.expand(shape)


def k2_optimal_acceptance(p, q):
    """alpha* for two i.i.d. drafts from q: ``min_S [1 + p(S) - q(S)^2]``. p, q ``[..., V]``."""
    p, q = _pq(p, q)
    alpha, _ = iid_scan(p, q, 2)
    return float(alpha) if alpha.ndim == 0 else alpha


def unit_acceptance_possible(p, q, k):
    """Whether some verifier accepts with probability 1 for k i.i.d. drafts from q:
    ``p(S) >= q(S)^k`` for all S (checked to ``UNIT_TOL``). p, q ``[..., V]``; bool or bool tensor."""
    k = as_k(k)
    p, q = _pq(p, q)
    alpha, _ = iid_scan(p, q, k)
    ok = alpha >= 1.0 - UNIT_TOL
    return bool(ok) if ok.ndim == 0 else ok
