"""The optimal verifier for the greedy draft law (Hu et al. 2025)."""
from __future__ import annotations

import torch

from .registry import register
from ._residual import sample_rows
from .base import Verifier

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
        # p [..., V], q [..., V] or [..., K, V], drafts [..., K]
        q, T, x, Z = split_greedy(q, p, drafts)
        px = p.gather(-1, x.unsqueeze(-1)).squeeze(-1).double()
        qx = q.gather(-1, x.unsqueeze(-1)).squeeze(-1).double()
        u = torch.rand(x.shape, generator=g, dtype=torch.float64, device=p.device)
        accept = u * qx <= px * Z  # u < p(x) / q'(x)
        token = x.clone()
        rej = (~accept).reshape(-1).nonzero().squeeze(-1)
        if rej.numel():
            V = p.shape[-1]
            fp, fq = p.reshape(-1, V), q.reshape(-1, V)
            fT, fZ = T.reshape(fp.shape[0], T.shape[-1]), Z.reshape(-1)

            def weights(rows):
                pr = fp[rows].double()
                w = (pr - fq[rows].double() / fZ[rows].unsqueeze(-1)).clamp_min(0.0)
                t = fT[rows]
                return w.scatter(-1, t, pr.gather(-1, t))  # q' = 0 on T

            token.view(-1)[rej] = sample_rows(weights, rej, g)
        return token

    def _output_distribution(self, p, q, drafts, law):
        q, T, x, Z = split_greedy(q, p, drafts)
        qr = (q / Z.unsqueeze(-1)).scatter(-1, T, 0.0)  # q' [..., V]
        px = p.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        qx = qr.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        a = (px / qx).clamp(max=1.0)  # [...]
        res = (p - qr).clamp_min(0.0)
        z = res.sum(-1, keepdim=True)
        res = torch.where(z > 0, res / torch.where(z > 0, z, 1.0), torch.zeros_like(res))
        out = (1 - a).unsqueeze(-1) * res
        return out.scatter_add(-1, x.unsqueeze(-1), a.unsqueeze(-1))
