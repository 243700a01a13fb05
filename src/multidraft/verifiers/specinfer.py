"""Recursive rejection sampling with replacement: SpecInfer's multi-round verification.

The shared recursive-rejection core (``rrs_sample`` / ``rrs_output``) also serves
``rrs_wor`` (the without-replacement variant), which only changes the draft distribution
after each rejection.
"""
from __future__ import annotations

import torch

from ._residual import accept, inverse_cdf_blocked, residual_law, residual_or, row_scale, rows_per_chunk
from .base import Verifier, per_draft
from .registry import register

__all__ = ["SpecInfer", "rrs_sample", "rrs_output"]


def rrs_output(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, wor: bool) -> torch.Tensor:
    """Exact float64 output law ``[..., V]`` of recursive rejection sampling.

    p ``[..., V]``, q ``[..., V]`` or ``[..., K, V]`` (float64), drafts ``[..., K]``.
    Round i accepts x_i with a_i = min(1, p_i(x_i)/q_i(x_i)); p_{i+1} = norm((p_i - q_i)+)
    (p_i itself where that row has no mass: ``_residual.residual_law``); with ``wor`` also
    q_{i+1} = norm(q_i with q_i(x_i) = 0).
    """
    K = drafts.shape[-1]
    qk = per_draft(q, p, K)  # [..., K, V]
    out = torch.zeros_like(p)
    stay = torch.ones(p.shape[:-1] + (1,), dtype=p.dtype, device=p.device)  # [..., 1] P(reach round i)
    res = p  # [..., V] p_i
    removed = torch.zeros_like(p, dtype=torch.bool)  # wor: drafts rejected so far
    for i in range(K):
        x = drafts[..., i : i + 1]  # [..., 1]
        qi = qk[..., i, :]
        if wor:
            qi = torch.where(removed, torch.zeros_like(qi), qi)
            d = qi.sum(-1, keepdim=True)
            qi = qi / torch.where(d > 0, d, torch.ones_like(d))
        pix = res.gather(-1, x)
        qix = qi.gather(-1, x)
        a = torch.where(qix > 0, (pix / torch.where(qix > 0, qix, torch.ones_like(qix))).clamp(max=1.0), torch.zeros_like(pix))
        out = out.scatter_add(-1, x, stay * a)
        stay = stay * (1 - a)
        res = residual_law((res - qi).clamp_min(0.0), res)
        if wor:
            removed = removed.scatter(-1, x, True)
    return out + stay * res


def _round_q(q, sq, rows, drafts, i: int, wor: bool) -> torch.Tensor:
    """q_i ``[n, V]`` float64 for round i (0-based) of the given rows: draft i's row of q (q
    ``[B, V]`` shared or ``[B, K, V]`` per draft, divided by its ``row_scale`` sq); with ``wor`` the tokens drafted before
    round i removed and the row divided by its remaining mass, summed directly (never as
    sum(q) - q(drafted), which cancels to 0 for a confident q with subnormal tails)."""
    if q.ndim == 3:
        qi = q[rows, i].double() / sq[rows, i]
    else:
        qi = q.index_select(0, rows).double() / sq[rows]
    if wor and i > 0:
        qi = qi.scatter(-1, drafts[rows, :i], 0.0)
        d = qi.sum(-1, keepdim=True)
        qi = qi / torch.where(d > 0, d, torch.ones_like(d))
    return qi


def rrs_sample(p, q, drafts, u, u_res, wor: bool, sp=None, sq=None) -> torch.Tensor:
    """Batched sampling path of recursive rejection sampling on given uniforms.

    p ``[B, V]``, q ``[B, V]`` or ``[B, K, V]`` (probability rows in any float dtype; read as
    ``rows64`` reads them: divided by their ``row_scale`` sp ``[B, 1]``, sq ``[B, 1]`` or
    ``[B, K, 1]``, computed when not given, and worked on in float64), drafts ``[B, K]``, u
    ``[B, K]`` (acceptance uniforms, round i uses ``u[:, i]``), u_res ``[B]`` (the residual
    draw). Returns tokens ``[B]``.

    Only p(x), q(x) ``[B, K]`` are gathered for every row; the full vocabulary is touched
    only for rows whose first draft is rejected, one cache-sized chunk of rows at a time,
    dropping rows as soon as a draft is accepted. Each round keeps the residual p_i as a
    normalised float64 row (p_{i+1} = norm((p_i - q_i)+), or p_i where that has no mass:
    ``_residual.residual_or``) and decides with ``_residual.accept``, so a token with p = 0 is
    never output and no scale overflows (a without-replacement q_i over a subnormal remaining
    mass is a row of ordinary numbers; 1 / that mass is not).
    """
    V, K = p.shape[-1], drafts.shape[-1]
    per = q.ndim == 3
    sp = row_scale(p) if sp is None else sp  # [B, 1]
    sq = row_scale(q) if sq is None else sq  # [B, 1] or [B, K, 1]
    px = p.gather(-1, drafts).double() / sp  # [B, K]
    if per:
        qx = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1).double() / sq.squeeze(-1)  # [B, K]
    else:
        qx = q.gather(-1, drafts).double() / sq  # [B, K]
    token = drafts[:, 0].clone()
    rej = (~accept(u[:, 0], px[:, 0], qx[:, 0])).nonzero().squeeze(-1)  # rows whose first draft is rejected
    step = rows_per_chunk(V, 16)
    for s0 in range(0, rej.numel(), step):
        live = rej[s0 : s0 + step]  # [n]
        t = p.index_select(0, live).double() / sp[live]  # [n, V] p_1 = p
        qi = _round_q(q, sq, live, drafts, 0, wor)  # [n, V] q_1
        for i in range(1, K + 1):
            # round i-1 (0-based) was rejected: p_i <- norm((p_{i-1} - q_{i-1})+)
            t = residual_or((t - qi).clamp_min_(0.0), t)
            t = t / t.sum(-1, keepdim=True)
            if i == K:
                break
            # round i: accept x_i with min(1, p_i(x_i) / q_i(x_i))
            qi = _round_q(q, sq, live, drafts, i, wor)
            x = drafts[live, i : i + 1]  # [n, 1]
            acc = accept(u[live, i : i + 1], t.gather(-1, x), qi.gather(-1, x)).squeeze(-1)
            if bool(acc.any()):
                token[live[acc]] = x[acc, 0]
                nk = ~acc
                live, t, qi = live[nk], t[nk], qi[nk]
                if live.numel() == 0:
                    break
        if live.numel():
            token[live] = inverse_cdf_blocked(t, u_res[live])
    return token


@register
class SpecInfer(Verifier):
    r"""SpecInfer multi-round verification = recursive rejection sampling with replacement.

    With :math:`p_1 = p` and drafts in order: accept :math:`x_i` with probability
    :math:`\min(1, p_i(x_i)/q_i(x_i))`; on rejection
    :math:`p_{i+1} = \mathrm{norm}((p_i - q_i)_+)`; if all K drafts are rejected, output a
    sample of :math:`p_{K+1}`. Lossless when :math:`x_i \sim q_i` independently given the
    past: the iid law (:math:`q_i = q`) and the independent law (draft i from its own
    :math:`q_i`). Miao et al., "SpecInfer" (ASPLOS 2024); Chen et al. (2023).
    """

    name = "specinfer"
    laws = ("iid", "independent")
    wor = False
    raw_rows = True  # rrs_sample divides by row_scale on the rows it touches

    def _verify(self, p, q, drafts, g, law):
        # p [..., V], q [..., V] or [..., K, V], drafts [..., K]
        P, Q, X, batch = self._flat(p, q, drafts)
        B, K = X.shape
        u = torch.rand(B, K, generator=g, dtype=torch.float64, device=p.device)
        u_res = torch.rand(B, generator=g, dtype=torch.float64, device=p.device)
        return rrs_sample(P, Q, X, u, u_res, self.wor).reshape(batch)

    def _output_distribution(self, p, q, drafts, law):
        return rrs_output(p, q, drafts, self.wor)
