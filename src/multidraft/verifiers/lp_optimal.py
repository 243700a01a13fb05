"""The exact optimal coupling from the linear program (small V): the reference optimum."""
from __future__ import annotations

import torch

from ._residual import inverse_cdf
from .base import Verifier
from .registry import register


def _law(q: torch.Tensor, kind: str, K: int):
    from .. import drafts as D

    return D.make(kind, q, K)


@register
class LPOptimal(Verifier):
    r"""Optimal coupling of draft tuples and the target, solved as a linear program.

    .. math:: \max_\pi \sum_t \sum_{y \in t} \pi(t, y) \quad\text{s.t.}\quad
              \sum_y \pi(t, y) = P(t),\ \sum_t \pi(t, y) = p(y),\ \pi \ge 0,

    over all tuples t of the draft law (Hu et al. 2025, optimal transport form; Sun et al.
    2023). Given drafts t it outputs y with probability :math:`\pi(t, y)/P(t)`, so the
    output law is p and the acceptance is :math:`\alpha^*`. The LP has about V^K rows: small
    V only. The solution is cached per (p, q, law kind, K) instance.
    """

    name = "lp_optimal"
    laws = ("iid", "wor", "greedy", "independent")

    def _rows(self, p, q, drafts, law):
        # p [N, V] or [V], q [N, V] / [N, K, V], drafts [N, K] -> conditional laws [N, V]
        from ..limits.lp import coupling_rows, solve_coupling

        dev = p.device  # the LP is solved by scipy on the host; the rows come back on p's device
        P, Qf, D, _ = self._flat(p.cpu(), q.cpu(), drafts.cpu())
        V, K = P.shape[-1], D.shape[-1]
        out = torch.empty(P.shape[0], V, dtype=torch.float64, device=P.device)
        groups: dict = {}
        for i in range(P.shape[0]):
            key = (P[i].numpy().tobytes(), Qf[i].numpy().tobytes())
            groups.setdefault(key, []).append(i)
        for rows in groups.values():
            i0 = rows[0]
            lawobj = _law(Qf[i0], law, K)
            sol = solve_coupling(P[i0], lawobj)
            cond = coupling_rows(sol)  # [N_tuples, V], each row a law
            Vb = V + 1
            place = Vb ** torch.arange(K - 1, -1, -1, device=P.device)
            keys = (sol.tuples * place).sum(-1)
            sorted_keys, perm = torch.sort(keys)
            idx = torch.tensor(rows, device=P.device)
            want = (D[idx] * place).sum(-1)
            pos = torch.searchsorted(sorted_keys, want).clamp(max=sorted_keys.numel() - 1)
            if bool((sorted_keys[pos] != want).any()):
                raise ValueError("drafts: a draft tuple has probability 0 under the draft law")
            out[idx] = cond[perm[pos]]
        return out.reshape(*p.shape[:-1], V).to(dev)

    def _output_distribution(self, p, q, drafts, law):
        return self._rows(p, q, drafts, law)

    def _verify(self, p, q, drafts, g, law):
        rows = self._rows(p, q, drafts, law).reshape(-1, p.shape[-1])
        u = torch.rand(rows.shape[0], generator=g, dtype=torch.float64, device=rows.device)
        return inverse_cdf(rows, u).reshape(p.shape[:-1])
