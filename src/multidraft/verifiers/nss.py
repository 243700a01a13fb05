"""Naive set sampling: sample the target and check membership."""
from __future__ import annotations

import torch

from ._residual import sample_rows
from .base import Verifier
from .registry import register


@register
class NSS(Verifier):
    r"""Naive set sampling (NSS).

    Output :math:`y \sim p`, ignoring the drafts; the step counts as accepted when
    :math:`y \in \{x_1, \dots, x_K\}`. Lossless for any draft law; acceptance is
    :math:`\mathbb{E}[p(\{x_1..x_K\})]`. A baseline used by Hu et al. (2025).
    """

    name = "nss"
    laws = ("iid", "wor", "greedy", "independent")

    def _verify(self, p, q, drafts, g, law):
        # p [..., V]; one draw per row by inverse CDF, never a [B, V] multinomial
        flat = p.reshape(-1, p.shape[-1])
        rows = torch.arange(flat.shape[0], device=p.device)
        return sample_rows(lambda r: flat[r], rows, g).reshape(p.shape[:-1])

    def _output_distribution(self, p, q, drafts, law):
        return p.clone()
