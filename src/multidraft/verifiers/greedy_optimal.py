"""The optimal verifier for the greedy draft law (Hu et al. 2025)."""
from __future__ import annotations

import torch

from ._residual import accept, residual_law, residual_or, sample_rows
from .base import Verifier
from .registry import register

__all__ = ["GreedyOptimal", "split_greedy"]


def split_greedy(q: torch.Tensor, p: torch.Tensor, drafts: torch.Tensor):
    """The pieces of a greedy-law draft tuple.

    q ``[..., V]`` or ``[..., K, V]`` (the last draft's row is used), p ``[..., V]``,
    drafts ``[..., K]``: the first K-1 are the deterministic top set T, the last one x
    was drawn from q' = q restricted to the complement of T, renormalised.

    Returns ``(qs [..., V], T [..., K-1], x [...], Z [...] float64)`` with Z = q(V \\ T),
    the normaliser of q'. Raises ``ValueError`` naming ``drafts`` when the tuple cannot
    come from the greedy law (repeated token).
    """
    if q.ndim == p.ndim + 1:
        q = q[..., -1, :]
    K = drafts.shape[-1]
    T = drafts[..., : K - 1]
    x = drafts[..., K - 1]
    if K > 1:
        eq = drafts.unsqueeze(-1) == drafts.unsqueeze(-2)  # [..., K, K]
        if bool(eq.sum((-1, -2)).ne(K).any()):
            raise ValueError("drafts: a greedy-law tuple has K distinct tokens (top K-1 of q, then one from the rest)")
    # the sum over the complement directly (not 1 - q(T): no cancellation when q(T) ~ 1)
    Z = q.scatter(-1, T, 0.0).sum(-1, dtype=torch.float64)
    return q, T, x, Z


@register
class GreedyOptimal(Verifier):
    r"""Optimal verifier for the greedy draft law.

    Drafts: the top K-1 tokens T of q (deterministic) and :math:`x \sim q'` with
    :math:`q' = q\,\mathbb{1}[\cdot \notin T] / (1 - q(T))`. Rule: single-draft SD of x
    against q': accept x with probability :math:`\min(1, p(x)/q'(x))`, else sample from
    :math:`\mathrm{norm}((p - q')_+)`, a residual that carries all of p on T (q' = 0 there);
    an output in T is a kept draft. Output law p; acceptance
    :math:`p(T) + \sum_{x \notin T} \min(p(x), q'(x))`, which equals the optimal
    acceptance :math:`\alpha^*` for this law. Hu et al. (2025), "Towards Optimal
    Multi-draft Speculative Decoding", arXiv 2502.18779.

    T is read from ``drafts[..., :K-1]`` (under the greedy law it is the top set of q), so
    the hot path never sorts the vocabulary.
    """

    name = "greedy_optimal"
    laws = ("greedy",)
    default_law = "greedy"
    min_k = 1

    def _verify(self, p, q, drafts, g, law):
        # p [..., V], q [..., V] or [..., K, V] (float64 rows), drafts [..., K]
        q, T, x, Z = split_greedy(q, p, drafts)
        px = p.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        qx = q.gather(-1, x.unsqueeze(-1)).squeeze(-1) / Z  # q'(x): never a product of subnormals
        u = torch.rand(x.shape, generator=g, dtype=torch.float64, device=p.device)
        token = x.clone()
        rej = (~accept(u, px, qx)).reshape(-1).nonzero().squeeze(-1)
        if rej.numel():
            V = p.shape[-1]
            fp, fq = p.reshape(-1, V), q.reshape(-1, V)
            fT, fZ = T.reshape(fp.shape[0], T.shape[-1]), Z.reshape(-1)
            token.view(-1)[rej] = sample_rows(lambda rows: _residual_rows(fp[rows], fq[rows], fT[rows], fZ[rows]), rej, g)
        return token

    def _output_distribution(self, p, q, drafts, law):
        q, T, x, Z = split_greedy(q, p, drafts)
        qr = (q / Z.unsqueeze(-1)).scatter(-1, T, 0.0)  # q' [..., V]
        px = p.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        qx = qr.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        a = (px / qx).clamp(max=1.0)  # [...]
        res = residual_law((p - qr).clamp_min(0.0), p)
        out = (1 - a).unsqueeze(-1) * res
        return out.scatter_add(-1, x.unsqueeze(-1), a.unsqueeze(-1))


def _residual_rows(p, q, T, Z):
    """Residual weights (p - q')+ ``[r, V]`` with q' = q / Z off T and 0 on T (so the residual
    holds all of p on T), p where that is empty. p, q ``[r, V]`` float64, T ``[r, K-1]``, Z ``[r]``."""
    w = (p - (q / Z.unsqueeze(-1)).scatter(-1, T, 0.0)).clamp_min(0.0)
    return residual_or(w, p)
