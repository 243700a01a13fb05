"""Recursive rejection sampling without replacement (Jeon et al. 2024)."""
from __future__ import annotations

from .registry import register
from .specinfer import SpecInfer


@register
class RRSWithoutReplacement(SpecInfer):
    r"""Recursive rejection sampling without replacement (RRS-wor).

    Drafts are distinct, drawn sequentially from q without replacement (Gumbel-top-k).
    With :math:`p_1 = p, q_1 = q`: accept :math:`x_i` with probability
    :math:`\min(1, p_i(x_i)/q_i(x_i))`; on rejection
    :math:`p_{i+1} = \mathrm{norm}((p_i - q_i)_+)` and
    :math:`q_{i+1} = \mathrm{norm}(q_i \text{ with } q_i(x_i) = 0)`, the law of the next
    draft given the past; if all K are rejected, output a sample of :math:`p_{K+1}`.
    Jeon et al., "Recursive Speculative Decoding" (2024).
    """

    name = "rrs_wor"
    laws = ("wor",)
    default_law = "wor"
    wor = True

    def _check(self, p, q, drafts, law, validate=True):
        p, q, drafts, kind = super()._check(p, q, drafts, law, validate)
        if q.ndim == p.ndim + 1:
            raise ValueError(
                "draft_probs: rrs_wor needs the one draft distribution [..., V] the drafts were "
                f"drawn from without replacement, got per-draft shape {tuple(q.shape)}"
            )
        K = drafts.shape[-1]
        if K > 1:
            eq = (drafts.unsqueeze(-1) == drafts.unsqueeze(-2)).triu(1)
            if bool(eq.any()):
                raise ValueError("drafts: the without-replacement law gives distinct draft tokens, got a repeated token in a row")
        return p, q, drafts, kind
