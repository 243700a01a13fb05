"""SpecHub: a hub token plus one sampled draft (Sun et al. 2024), K = 2."""
from __future__ import annotations

import torch

from ._residual import accept, chunk_rows, residual_law, residual_or, sample_rows
from .base import Verifier
from .registry import register
from .greedy_optimal import split_greedy

__all__ = ["SpecHub"]


@register
class SpecHub(Verifier):
    r"""SpecHub (K = 2): the hub token a = argmax q plus one draft :math:`x \sim q'`.

    Draft law. SpecHub sparsifies the joint draft law so that every pair contains the
    hub :math:`a`: the pair :math:`\{a, x\}` has probability
    :math:`q'(x) = q(x)/(1 - q(a))`, :math:`x \ne a`. As an unordered pair this is exactly
    ``drafts.greedy(q, 2)`` (the paper draws x_1 ~ q and sets the other draft to a, or to a
    draw from q' when x_1 = a; that ordered law differs from ``greedy`` only in the order,
    and this rule depends only on the pair), so the verifier is certified for ``greedy``
    with K = 2, reading the hub from ``drafts[..., 0]`` and x from ``drafts[..., 1]``.

    Transport plan (the sparse LP's closed form). Pair :math:`\{a, x\}` goes to x with
    probability :math:`\min(1, p(x)/q'(x))`; the rejected mass
    :math:`R = \sum_{y \ne a} (q'(y) - p(y))_+ = p(a) + \sum_{y \ne a} (p(y) - q'(y))_+`
    goes to the hub with probability :math:`p(a)/R` (computed from the right-hand form); what remains is sampled from :math:`\mathrm{norm}((p - q')_+)` off a.
    Output law p; acceptance :math:`p(a) + \sum_{y \ne a} \min(p(y), q'(y))`, which is
    the optimum for this sparse law (so it equals ``greedy_optimal`` at K = 2).
    Sun, Zhou, Chen & Sun (2024), "SpecHub: Provable Acceleration to Multi-Draft
    Speculative Decoding", EMNLP 2024.
    """

    name = "spechub"
    laws = ("greedy",)
    default_law = "greedy"
    min_k = 2
    max_k = 2

    def _verify(self, p, q, drafts, g, law):
        # p [..., V], q [..., V] or [..., 2, V] (float64 rows), drafts [..., 2]: (hub a, sampled x)
        q, T, x, Z = split_greedy(q, p, drafts)
        a = T[..., 0]
        px = p.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        qx = q.gather(-1, x.unsqueeze(-1)).squeeze(-1) / Z  # q'(x)
        u = torch.rand(x.shape, generator=g, dtype=torch.float64, device=p.device)
        token = x.clone()
        rej = (~accept(u, px, qx)).reshape(-1).nonzero().squeeze(-1)
        if rej.numel() == 0:
            return token
        V = p.shape[-1]
        fp, fq, fa, fZ = p.reshape(-1, V), q.reshape(-1, V), a.reshape(-1), Z.reshape(-1)

        def off_hub(rows):  # (p - q')+ off the hub [r, V]
            w = (fp[rows] - fq[rows] / fZ[rows].unsqueeze(-1)).clamp_min(0.0)
            return w.scatter(-1, fa[rows].unsqueeze(-1), 0.0)

        # residual mass M = sum_{y != a} (p - q')+ per rejected row (R = p(a) + M), in
        # cache-sized chunks of rows
        pa = fp.gather(-1, fa.unsqueeze(-1)).squeeze(-1)[rej]
        M = torch.empty(rej.numel(), dtype=torch.float64, device=p.device)
        step = chunk_rows(V)
        for s0 in range(0, rej.numel(), step):
            r = rej[s0 : s0 + step]
            M[s0 : s0 + r.numel()] = off_hub(r).sum(-1)
        uh = torch.rand(rej.numel(), generator=g, dtype=torch.float64, device=p.device)
        # the hub with probability p(a) / R; always when nothing is left off it and p(a) > 0;
        # when neither has mass (p == q' to rounding: reached with probability 0 up to
        # rounding) p itself is sampled (``_residual`` notes)
        hub = accept(uh, pa, pa + M) | ((M <= 0) & (pa > 0))
        token.view(-1)[rej[hub]] = fa[rej[hub]]
        rest = rej[~hub]
        if rest.numel():
            token.view(-1)[rest] = sample_rows(lambda rows: residual_or(off_hub(rows), fp[rows]), rest, g)
        return token

    def _output_distribution(self, p, q, drafts, law):
        q, T, x, Z = split_greedy(q, p, drafts)
        a = T  # [..., 1]
        qr = (q / Z.unsqueeze(-1)).scatter(-1, a, 0.0)  # q' [..., V]
        px = p.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        qx = qr.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        acc = (px / qx).clamp(max=1.0)  # [...]
        pa = p.gather(-1, a).squeeze(-1)
        res = (p - qr).clamp_min(0.0).scatter(-1, a, 0.0)
        z = res.sum(-1, keepdim=True)
        R = pa + z.squeeze(-1)  # = sum_{y != a} (q' - p)+ when p and q' are normalised
        # as the sampling path decides: p(a) / R, else the hub when p(a) > 0, else p itself
        h = torch.where(z.squeeze(-1) > 0, pa / torch.where(R > 0, R, 1.0), (pa > 0).to(R.dtype))
        res = residual_law(res, p)
        rej = 1 - acc
        out = (rej * (1 - h)).unsqueeze(-1) * res
        out = out.scatter_add(-1, a, (rej * h).unsqueeze(-1))
        return out.scatter_add(-1, x.unsqueeze(-1), acc.unsqueeze(-1))
