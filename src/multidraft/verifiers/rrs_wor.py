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
    # distinct drafts and one shared q are checked for every 'wor' call in base._check
    # (_validate.check_law); per-draft rows, identical by that check, arrive collapsed to [..., V]
