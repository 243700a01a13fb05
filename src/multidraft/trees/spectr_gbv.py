r"""SpecTr-GBV (Lin, Sheng, Cai, Zhou; arXiv 2604.25925), as a tree rule: K i.i.d. drafts, a
SpecTr-style optimal-transport selection, then block verification of the selected path.

What we could read of the paper. The stored copies (the abstract page, a mirror of it,
three news/summary pages and a machine-written review) give only the abstract: SpecTr-GBV
"unifies multi-draft and greedy block verification (GBV) into a single framework", "by
formulating the verification step as an optimal transport problem over draft and target
token blocks", and the authors "prove that SpecTr-GBV achieves the optimal expected
acceptance length physically attainable within the framework of i.i.d. draft generation",
a bound that grows with the number of drafts. We could NOT read the OT problem's cost or
constraints, the algorithm, the theorem or its proof. What follows is our reconstruction,
lossless by construction and certified by enumeration (``tests/trees/test_gbv_rules.py``);
the optimality claim is checked against the exact tree-level ceiling there.

Reconstruction. SpecTr (Sun et al., NeurIPS 2023) couples K i.i.d. drafts with the target
by its "K-sequential" transport plan: with a parameter rho, draft j (in order) is accepted
with probability ``beta(x_j) = min(1, p(x_j) / (rho q(x_j)))``. We keep that plan as the
*selection* of ``trees.gbv``'s select-then-block-verify frame (whose module notes give the
lossless argument): at a node with k i.i.d. drafts the picked slot is the first j < k whose
coin succeeds, else the last slot, so the selection law is

    s(x) = q(x) beta(x) sum_(j=0..k-2) (1 - bbar)^j + (1 - bbar)^(k-1) q(x),
    bbar = sum_x q(x) beta(x),

and the picked path is then block-verified against s (the "GBV" half: Sun et al.'s
backward scan with ``a_i = min(a_(i-1) p / s, 1)``). rho at each node maximises the one-step
acceptance ``sum_x min(p(x), s(x))`` over a fixed grid (the OT step: with rho free, s ranges
over the SpecTr plans and the acceptance is their transport value), so the rule depends on
(p, q, k) of the node only. With one draft s = q and the rule is block verification.

Points unspecified to us, and our choices:

* The OT problem: SpecTr's K-sequential plan at the token level of every node on the
  picked path, composed with block verification along it. (An OT over whole blocks
  ``x^L`` would need p and q of blocks the tree does not contain, so it cannot read a
  DraftTree.)
* rho: the best of ``RHO_POINTS`` values ``exp(linspace(-log 4k, log 4k))`` (rho = 1
  included) for the one-step acceptance, ties to the smallest; any rho is lossless.
* No draft accepted: the last draft is picked (the verifier then decides; SpecTr itself
  would sample its residual here).
* Tree laws, degenerate rows and the paths not picked: as ``trees.gbv``.

Generator order (``verify``): at every node of the picked path from the root, k - 1
uniforms (the coins of slots 1 .. k-1, drawn together), then block verification's n
uniforms, then one uniform for the emitted token.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .gbv import SelectThenBlock
from .rules import register

__all__ = ["RHO_POINTS", "SpecTrGBV", "kseq_selection_law"]

RHO_POINTS = 33  # grid of SpecTr's rho per node (odd: rho = 1 is on it)


def kseq_selection_law(p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K-sequential selection at a node with k i.i.d. drafts: its law ``[V]`` at the best rho
    of the grid, and the acceptance coins ``beta [V]`` at that rho. p, q: ``[V]`` float64.

    For every rho of the grid, ``beta = min(1, p / (rho q))`` (0 off q's support),
    ``1 - bbar = 1 - sum q beta``, ``s = q beta sum_(j<k-1) (1 - bbar)^j + (1 - bbar)^(k-1) q``
    and its acceptance ``sum min(s, p)``; the first rho of the largest acceptance wins. One
    rho at a time over ``[V]`` rows (the same elementwise operations and row sums as on the
    whole ``[G, V]`` grid, so the same bits, without its ``[G, V]`` temporaries)."""
    q = q / q.sum()
    sup = q > 0
    if k == 1:
        return q, torch.ones_like(q)
    half = math.log(4 * k)
    rho = torch.exp(torch.linspace(-half, half, RHO_POINTS, dtype=torch.float64, device=q.device)).unsqueeze(1)  # [G, 1]
    full = bool(sup.all())
    qs = q if full else torch.where(sup, q, torch.ones_like(q))  # [V]

    def coins(r):  # r [1, 1] -> beta [1, V], q beta [1, V], 1 - bbar [1, 1]
        beta = r * qs
        torch.div(p, beta, out=beta)
        beta.clamp_(max=1.0)
        if not full:
            beta.masked_fill_(~sup, 0.0)
        qb = q * beta
        return beta, qb, 1.0 - qb.sum(-1, keepdim=True)

    def law(qb, miss):  # s [1, V], in place of q beta
        geo = sum(miss.pow(j) for j in range(k - 1))  # [1, 1]: sum_(j<k-1) (1 - bbar)^j
        return qb.mul_(geo).add_(miss.pow(k - 1) * q)

    screen = _acceptance_screen(p, q, sup, full, qs, rho[:, 0], k) if q.shape[0] > SCREEN_V else None
    cand = range(RHO_POINTS) if screen is None else torch.nonzero(screen >= screen.max() - SCREEN_TOL).flatten().tolist()
    acc = torch.full((RHO_POINTS,), float("-inf"), dtype=torch.float64, device=q.device)  # [G]: acceptance at each rho
    for j in cand:
        beta, qb, miss = coins(rho[j:j + 1])
        acc[j] = torch.minimum(law(qb, miss), p, out=beta).sum(-1)[0]
    best = int(torch.argmax(acc))  # first of the largest
    beta, qb, miss = coins(rho[best:best + 1])
    return law(qb, miss)[0], beta[0]


SCREEN_V = 4096  # above this V the grid is screened (``_acceptance_screen``) before the exact evaluation
SCREEN_TOL = 1e-9  # rhos whose screened acceptance is within this of the best are evaluated exactly


def _acceptance_screen(p, q, sup, full, qs, rho, k):
    """The one-step acceptance ``sum_x min(p, s_rho)`` at every rho ``[G]`` from cumulative sums
    over the tokens sorted by t = p / q (one sort, no ``[G, V]`` work): ``beta = min(1, t / rho)``,
    so ``bbar = Q(t >= rho) + P(t < rho) / rho`` and, with G_rho = sum_(j<k-1) (1 - bbar)^j,
    M_rho = (1 - bbar)^(k-1), u = G + M, c = M / (1 - G / rho) (G < rho):
    ``min(p, s) = min(p, q u)`` for t >= rho (p below t = u, q u above) and
    ``min(p, p G / rho + q M)`` for t < rho (p below t = c, the sum above); each region's sum is
    a difference of F_p(x) = P(t < x), F_q(x) = Q(t < x) at <= 3 thresholds. Off q's support
    p and q weigh 0 here (s = 0 there).

    It is only a screen: the rounding of these sums differs from the direct evaluation's by far
    less than ``SCREEN_TOL`` (both are sums of V terms of a distribution, error ~V 2^-53, and a
    token on a region's boundary contributes the same on either side), so the direct
    evaluation's first best rho is among the rhos screened within ``SCREEN_TOL`` of the best,
    and ``kseq_selection_law`` evaluates exactly those, in grid order: the same rho, the same
    bits as evaluating every rho. p, q, sup: ``[V]``; full: sup everywhere; qs: q with 1 off sup;
    rho: ``[G]`` ascending."""
    pw = p if full else torch.where(sup, p, torch.zeros_like(p))
    t = pw / qs  # [V]
    if t.device.type == "cpu":  # numpy's sort is several times torch's on the CPU
        tn, pn, qn = t.numpy(), pw.numpy(), q.numpy()
        o = np.argsort(tn)
        ts = torch.as_tensor(np.take(tn, o), device=t.device)
        cp = torch.as_tensor(np.concatenate([[0.0], np.cumsum(np.take(pn, o))]), device=t.device)
        cq = torch.as_tensor(np.concatenate([[0.0], np.cumsum(np.take(qn, o))]), device=t.device)
    else:
        ts, o = torch.sort(t)
        z = t.new_zeros(1)
        cp, cq = torch.cat([z, pw[o].cumsum(0)]), torch.cat([z, q[o].cumsum(0)])
    cp, cq, rho_c = cp.to(rho.device), cq.to(rho.device), rho.to(ts.device)

    def F(x):  # (P(t < x), Q(t < x)) at thresholds x [T]
        i = torch.searchsorted(ts, x.to(ts.device)).to(rho.device)
        return cp[i], cq[i]

    Fp_r, Fq_r = F(rho_c)
    Qtot = cq[-1]
    miss = 1.0 - ((Qtot - Fq_r) + Fp_r / rho)  # [G]
    geo = sum(miss.pow(j) for j in range(k - 1))  # [G]
    M = miss.pow(k - 1)
    u = geo + M
    low = geo < rho
    c = torch.where(low, M / torch.where(low, 1.0 - geo / rho, torch.ones_like(rho)), rho)
    Fp_a, Fq_a = F(torch.maximum(u, rho))
    Fp_b, Fq_b = F(torch.minimum(c, rho))
    region_a = (Fp_a - Fp_r) + u * (Qtot - Fq_a)
    region_b = Fp_b + (geo / rho) * (Fp_r - Fp_b) + M * (Fq_r - Fq_b)
    return region_a + region_b


class SpecTrGBV(SelectThenBlock):
    """SpecTr-GBV as reconstructed here (see the module notes)."""

    name = "spectr_gbv"

    def _law(self, p, q, k):
        return kseq_selection_law(p, q, k)

    def _slot_probs(self, key, drafts):
        out, left = [], 1.0
        for j, t in enumerate(drafts):
            if j == len(drafts) - 1:
                out.append(left)
            else:
                b = float(key[t])
                out.append(left * b)
                left *= 1.0 - b
        return out

    def _pick(self, key, drafts, g):
        k = len(drafts)
        if k == 1:
            return 0
        u = torch.rand(k - 1, generator=g, dtype=torch.float64, device=g.device)  # [k-1]: coins of slots 0 .. k-2
        b = key[torch.as_tensor(drafts[:-1], dtype=torch.long, device=key.device)]  # [k-1]
        hit = torch.nonzero(u < b).flatten()
        return int(hit[0]) if hit.numel() else k - 1


register("spectr_gbv", SpecTrGBV)
