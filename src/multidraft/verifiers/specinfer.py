"""Recursive rejection sampling with replacement: SpecInfer's multi-round verification.

The shared recursive-rejection core (``rrs_sample`` / ``rrs_output``) also serves
``rrs_wor`` (the without-replacement variant), which only changes the draft distribution
after each rejection.
"""
from __future__ import annotations

import torch

from .registry import register
from ._residual import inverse_cdf_blocked, rows_per_chunk
from .base import Verifier, per_draft

__all__ = ["SpecInfer", "rrs_sample", "rrs_output"]


def rrs_output(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, wor: bool) -> torch.Tensor:
    """Exact float64 output law ``[..., V]`` of recursive rejection sampling.

    p ``[..., V]``, q ``[..., V]`` or ``[..., K, V]`` (float64), drafts ``[..., K]``.
    Round i accepts x_i with a_i = min(1, p_i(x_i)/q_i(x_i)); p_{i+1} = norm((p_i - q_i)+);
    with ``wor`` also q_{i+1} = norm(q_i with q_i(x_i) = 0).
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
        nxt = (res - qi).clamp_min(0.0)
        z = nxt.sum(-1, keepdim=True)
        # z == 0 means p_i == q_i: rejection has probability 0 (up to rounding); keep p_i
        res = torch.where(z > 0, nxt / torch.where(z > 0, z, torch.ones_like(z)), res)
        if wor:
            removed = removed.scatter(-1, x, True)
    return out + stay * res


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def rrs_sample(p, q, drafts, u, u_res, wor: bool) -> torch.Tensor:
    """Batched sampling path of recursive rejection sampling on given uniforms.

    p ``[B, V]``, q ``[B, V]`` or ``[B, K, V]``, drafts ``[B, K]``, u ``[B, K]`` (acceptance
    uniforms, round i uses ``u[:, i]``), u_res ``[B]`` (the residual draw). Returns tokens ``[B]``.

    Only p(x), q(x) ``[B, K]`` are gathered for every row; the full vocabulary is touched
    only for rows whose first draft is rejected, one cache-sized chunk of rows at a time,
    dropping rows as soon as a draft is accepted.
    """
    B, V = p.shape
    K = drafts.shape[-1]
    per = q.ndim == 3
    px = p.gather(-1, drafts).double()  # [B, K]
    if per:
        qx = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1).double()  # [B, K]
    else:
        qx = q.gather(-1, drafts).double()  # [B, K]
    token = drafts[:, 0].clone()
    rej = (u[:, 0] * qx[:, 0] > px[:, 0]).nonzero().squeeze(-1)  # rows whose first draft is rejected
    if rej.numel() == 0:
        return token
    if not per:
        _rrs_shared(p, q, drafts, u, u_res, wor, px, qx, rej, token)
        return token
    step = rows_per_chunk(V, 8)
    wbuf = torch.empty(min(step, rej.numel()), V, dtype=torch.float64, device=p.device)
    tbuf = torch.empty_like(wbuf)
    for s0 in range(0, rej.numel(), step):
        rows = rej[s0 : s0 + step]  # [r]
        n = rows.numel()
        w = wbuf[:n]
        w.copy_(p.index_select(0, rows))  # [r, V] unnormalised residual, w = Z * p_i
        Z = torch.ones(n, 1, dtype=torch.float64, device=p.device)  # [r, 1]
        if wor:
            # q_i = q on the not-yet-drafted tokens over their mass D_i; D_1 = 1 (q as given)
            sq = q.index_select(0, rows).sum(-1, keepdim=True, dtype=torch.float64)
            D = torch.ones_like(Z)
            drafted = torch.zeros_like(Z)
        live = rows  # rows of this chunk still undecided
        for i in range(1, K + 1):
            # round i-1 (0-based) was rejected: w <- (w - Z q_{i-1})+
            qprev = q[live, i - 1] if per else q.index_select(0, live)  # [n, V]
            scale = Z / D if wor else Z
            t = tbuf[: live.numel()]
            t.copy_(qprev)
            t.mul_(scale)
            torch.sub(w, t, out=t).clamp_min_(0.0)
            Zn = t.sum(-1, keepdim=True)
            keep = Zn > 0
            if not bool(keep.all()):  # rounding-level corner: p_i == q_i, keep p_i
                t.copy_(torch.where(keep, t, w))
                Zn = torch.where(keep, Zn, Z)
            w, t = t, w
            wbuf, tbuf = tbuf, wbuf
            Z = Zn
            if wor:
                drafted = drafted + qx[live, i - 1 : i]
                D = sq - drafted
            if i == K:
                break
            # round i: accept x_i with min(1, p_i(x_i) / q_i(x_i)), p_i(x) = w(x) / Z
            x = drafts[live, i : i + 1]  # [n, 1]
            wx = w.gather(-1, x)
            qix = qx[live, i : i + 1] / D if wor else qx[live, i : i + 1]
            acc = (u[live, i : i + 1] * qix * Z <= wx).squeeze(-1)
            if bool(acc.any()):
                token[live[acc]] = x[acc, 0]
                nk = ~acc
                live, Z = live[nk], Z[nk]
                if wor:
                    D, drafted, sq = D[nk], drafted[nk], sq[nk]
                if live.numel() == 0:
                    break
                w = w[nk]  # a compacted copy; the two buffers stay free for the next rounds
        if live.numel():
            token[live] = inverse_cdf_blocked(w, u_res[live])
    return token


def _rrs_shared(p, q, drafts, u, u_res, wor, px, qx, rej, token):
    """Rounds 2..K and the residual draw for rows ``rej`` when all drafts share one q ``[B, V]``.

    With one q the residual after any number of rejections is a single clipped line:
    p_i = (p - C_i q)+ / Z_i with C_1 = 0, C_{i+1} = C_i + Z_i / D_i (D_i = mass of q_i;
    1 with replacement, the undrafted mass of q without replacement, whose drafted tokens
    already have p_i = 0). Proof: (p_i - q_i)+ Z_i = ((p - C_i q)+ - Z_i q / D_i)+ =
    (p - C_{i+1} q)+ where p > C_i q, and both sides are 0 elsewhere. So a round is one
    pass Z = sum (p - C q)+ over the row in the input precision (float32 or better), and nothing is carried between rounds but the scalars C, Z, D.
    """
    B, V = p.shape
    K = drafts.shape[-1]
    dt = torch.float64 if p.dtype == torch.float64 and q.dtype == torch.float64 else torch.float32
    step = rows_per_chunk(V, 2 * torch.finfo(dt).bits // 8)
    n0 = min(step, rej.numel())
    tbuf = torch.empty(n0, V, dtype=dt, device=p.device)
    for s0 in range(0, rej.numel(), step):
        live = rej[s0 : s0 + step]  # [n]
        pr = p.index_select(0, live).to(dt)  # [n, V]
        qr = q.index_select(0, live).to(dt)  # [n, V]
        n = live.numel()
        C = torch.ones(n, 1, dtype=torch.float64, device=p.device)  # C_2 = C_1 + Z_1 / D_1 = 1
        if wor:
            sq = qr.sum(-1, keepdim=True).double()
            drafted = qx[live, 0:1].clone()
        for i in range(1, K + 1):
            t = tbuf[:n]
            torch.mul(qr, C.to(dt), out=t)
            torch.sub(pr, t, out=t).clamp_min_(0.0)
            if i == K:
                break
            Z = t.sum(-1, keepdim=True).double()  # [n, 1] (cascade sum in dt; sum(dtype=) would copy the row)
            D = sq - drafted if wor else None
            # round i: accept x_i with min(1, p_i(x_i) / q_i(x_i)), p_i(x) = (p(x) - C q(x))+ / Z
            x = drafts[live, i : i + 1]  # [n, 1]
            wx = t.gather(-1, x).double()
            qix = qx[live, i : i + 1] / D if wor else qx[live, i : i + 1]
            acc = (u[live, i : i + 1] * qix * Z <= wx).squeeze(-1)
            C = C + (Z / D if wor else Z)
            if wor:
                drafted = drafted + qx[live, i : i + 1]
            if bool(acc.any()):
                token[live[acc]] = x[acc, 0]
                nk = ~acc
                live, C, pr, qr = live[nk], C[nk], pr[nk], qr[nk]
                if wor:
                    sq, drafted = sq[nk], drafted[nk]
                n = live.numel()
                if n == 0:
                    break
        if n:
            w = tbuf[:n]
            empty = w.sum(-1, keepdim=True) <= 0
            if bool(empty.any()):  # rounding-level corner (p_K == q_K): the residual is p_K
                w = torch.where(empty, pr, w)
            token[live] = inverse_cdf_blocked(w, u_res[live])


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

    def _verify(self, p, q, drafts, g, law):
        # p [..., V], q [..., V] or [..., K, V], drafts [..., K]
        V = p.shape[-1]
        K = drafts.shape[-1]
        batch = p.shape[:-1]
        P = p.reshape(-1, V)
        Q = q.reshape(-1, K, V) if q.ndim == p.ndim + 1 else q.reshape(-1, V)
        X = drafts.reshape(-1, K)
        B = P.shape[0]
        u = torch.rand(B, K, generator=g, dtype=torch.float64, device=p.device)
        u_res = torch.rand(B, generator=g, dtype=torch.float64, device=p.device)
        return rrs_sample(P, Q, X, u, u_res, self.wor).reshape(batch)

    def _output_distribution(self, p, q, drafts, law):
        return rrs_output(p, q, drafts, self.wor)
