"""Single-draft speculative sampling (Leviathan et al. 2023; Chen et al. 2023)."""
from __future__ import annotations

import torch

from ._residual import accept, residual_law, residual_or, row_scale, sample_rows
from .base import Verifier
from .registry import register


@register
class Naive(Verifier):
    r"""Single-draft speculative sampling.

    Accept the draft x ~ q with probability :math:`\min(1, p(x)/q(x))`; otherwise sample
    from the residual :math:`\mathrm{norm}((p - q)_+)`. The output law is p and the
    acceptance is :math:`\sum_x \min(p(x), q(x)) = 1 - \mathrm{TV}(p, q)`.
    Leviathan, Kalman & Matias (2023); Chen et al. (2023). K = 1 only.
    """

    name = "naive"
    laws = ("iid", "wor", "greedy", "independent")  # all coincide at K = 1
    min_k = 1
    max_k = 1

    raw_rows = True  # only the gathers for every row; the residual rows divided by row_scale

    def _verify(self, p, q, drafts, g, law):
        # p [..., V], q [..., V] or [..., 1, V] (the caller's dtype), drafts [..., 1]
        if q.ndim == p.ndim + 1:
            q = q.squeeze(-2)
        V = p.shape[-1]
        flat_p, flat_q = p.reshape(-1, V), q.reshape(-1, V)
        sp, sq = row_scale(flat_p), row_scale(flat_q)  # [N, 1]: the rows are p / sp, q / sq (rows64)
        x = drafts[..., 0]
        px = (flat_p.gather(-1, x.reshape(-1, 1)).double() / sp).reshape(x.shape)
        qx = (flat_q.gather(-1, x.reshape(-1, 1)).double() / sq).reshape(x.shape)
        u = torch.rand(x.shape, generator=g, dtype=torch.float64, device=p.device)
        token = x.clone()
        rej = (~accept(u, px, qx)).reshape(-1).nonzero().squeeze(-1)
        if rej.numel():

            def weights(rows):
                pr = flat_p[rows].double() / sp[rows]
                return residual_or((pr - flat_q[rows].double() / sq[rows]).clamp_min(0.0), pr)

            token.view(-1)[rej] = sample_rows(weights, rej, g)
        return token

    def _output_distribution(self, p, q, drafts, law):
        if q.ndim == p.ndim + 1:
            q = q.squeeze(-2)
        px = p.gather(-1, drafts).squeeze(-1)
        qx = q.gather(-1, drafts).squeeze(-1)
        a = (px / qx).clamp(max=1.0)  # [...]
        res = residual_law((p - q).clamp_min(0.0), p)
        out = (1 - a).unsqueeze(-1) * res
        return out.scatter_add(-1, drafts, a.unsqueeze(-1))
