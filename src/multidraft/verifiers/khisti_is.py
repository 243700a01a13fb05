"""Importance-weighted selection + single-draft SD (Khisti et al. 2024)."""
from __future__ import annotations

import numpy as np
import torch

from .registry import register
from ._residual import chunk_rows, sample_rows
from .base import Verifier

__all__ = ["KhistiIS"]

SORT_V = 4096  # below this vocabulary size the top set comes from one stable sort
# rank buckets off S: the bit pattern of a positive float is increasing in its value, so
# dropping all but the top two mantissa bits gives 4 buckets per factor 2 (3 cheap passes)
_SHIFT = {torch.float32: (torch.int32, 21), torch.float64: (torch.int64, 50)}


def _n_buckets(dtype: torch.dtype) -> int:
    itype, sh = _SHIFT[dtype]
    return (int(torch.ones((), dtype=dtype).view(itype)) >> sh) + 1


def _bucket(score: torch.Tensor) -> torch.Tensor:
    """Rank bucket of each score (long, same shape, non-decreasing in the score): 0 for
    score <= 0, else the float's exponent and top two mantissa bits (scores are <= 1)."""
    itype, sh = _SHIFT[score.dtype]
    return (score.contiguous().view(itype) >> sh).clamp_min_(0).long()


def _off_coef(lt: torch.Tensor, le: torch.Tensor) -> torch.Tensor:
    """A_k = prod_{j<k} lt_j * prod_{j>k} le_j over the draft dim -2: ``[..., K, C]`` -> same.

    For y off S in bucket c, q_I(y) = sum_k q_k(y) A_k(c): draft k is y, the earlier drafts
    lie in lower buckets and the later ones in buckets at or below c (all off S)."""
    K = lt.shape[-2]
    ones = torch.ones_like(lt[..., :1, :])
    pre = torch.cat([ones, lt[..., :-1, :]], -2).cumprod(-2)
    suf = torch.cat([le[..., 1:, :], ones], -2).flip(-2).cumprod(-2).flip(-2)
    return pre * suf if K > 1 else ones


def _top_set(score: torch.Tensor, n: int) -> torch.Tensor:
    """The n best tokens of each row of score ``[N, V]`` in the order (score desc, id asc), as a set
    ``[N, n]`` sorted by id. Ties at the boundary are broken towards the lower id."""
    N, V = score.shape
    if n >= V:
        return torch.arange(V, device=score.device).expand(N, V)
    if V <= SORT_V:
        idx = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, :n]
    else:
        vals, idx = torch.topk(score, n + 1, dim=-1)
        idx = idx[:, :n].clone()
        tie = (vals[:, n - 1] == vals[:, n]).nonzero().squeeze(-1)
        if tie.numel():
            idx[tie] = torch.sort(score[tie], dim=-1, descending=True, stable=True).indices[:, :n]
    return idx.sort(-1).values


def _solve_stage(pS, rS, r_out, tS, t_out):
    """One match of the tournament: the winner so far (law r) against a fresh draft (law t).

    All float64 ``[N, n]`` (``[N]`` for the masses outside S). On S the unordered pair {i, j}
    (i < j) carries mass M_ij = r_i t_j + r_j t_i, split f_ij to i and M_ij - f_ij to j; the
    split maximises sum_i min(p_i, m_i) with m_i the new winner's mass on i (an LP solved with
    HiGHS, one block per distinct row). Returns ``(W [N, n, n], m [N, n])``: W[i, j] = the
    probability that i is selected from the pair {i, j} (W[i, i] = 1) and m the new law on S.
    """
    from scipy import sparse
    from scipy.optimize import linprog

    N, n = pS.shape
    dev = pS.device
    fixed = rS * tS + rS * t_out.unsqueeze(-1) + r_out.unsqueeze(-1) * tS  # [N, n]
    a, b = torch.triu_indices(n, n, 1, device=dev)
    M = rS[:, a] * tS[:, b] + rS[:, b] * tS[:, a]  # [N, P]
    P = a.numel()
    f = M / 2
    if P:
        key = torch.cat([pS, rS, tS, r_out.unsqueeze(-1), t_out.unsqueeze(-1)], -1)
        uniq, inv = torch.unique(key, dim=0, return_inverse=True)
        first = torch.full((uniq.shape[0],), N, dtype=torch.long, device=dev).scatter_reduce(
            0, inv, torch.arange(N, device=dev), "amin"
        )
        U = first.numel()
        Mu = M[first].cpu().numpy()
        pu = pS[first].cpu().numpy()
        ea = np.zeros((n, P))
        ea[a.cpu().numpy(), np.arange(P)] = 1.0
        eb = np.zeros((n, P))
        eb[b.cpu().numpy(), np.arange(P)] = 1.0
        # z_i <= m_i  <=>  z_i - sum_{a=i} f + sum_{b=i} f <= fixed_i + sum_{b=i} M
        blk = sparse.hstack([sparse.csr_matrix(eb - ea), sparse.identity(n)])
        A = sparse.kron(sparse.identity(U), blk, format="csr")
        rhs = (fixed[first].cpu().numpy() + Mu @ eb.T).ravel()
        lo = np.zeros((U, P + n))
        hi = np.concatenate([Mu, pu], 1)
        c = np.tile(np.concatenate([np.zeros(P), -np.ones(n)]), U)
        res = linprog(c, A_ub=A, b_ub=rhs, bounds=np.stack([lo.ravel(), hi.ravel()], 1), method="highs")
        if res.status == 0 and res.x is not None:
            fu = np.clip(res.x.reshape(U, P + n)[:, :P], 0.0, Mu)
            f = torch.as_tensor(fu, dtype=torch.float64, device=dev)[inv]
        # otherwise keep the even split: any split is exact, only less efficient
    w = torch.where(M > 0, f / torch.where(M > 0, M, 1.0), torch.full_like(M, 0.5))
    W = torch.ones(N, n, n, dtype=torch.float64, device=dev)
    W[:, a, b] = w
    W[:, b, a] = 1 - w
    Msym = torch.zeros(N, n, n, dtype=torch.float64, device=dev)
    Msym[:, a, b] = M
    Msym[:, b, a] = M
    m = fixed + (W * Msym).sum(-1)
    return W, m


@register
class KhistiIS(Verifier):
    r"""Importance-weighted selection followed by single-draft SD (canonical architecture).

    Step 1 selects one draft y with selection weights :math:`\beta_y(x_1..x_K)`, which
    induces :math:`q_I(y) = \sum_{\mathrm{tuples}} P(\mathrm{tuple})\,\beta_y(\mathrm{tuple})`
    (computed exactly); step 2 is single-draft SD of y against p with draft law
    :math:`q_I`: accept w.p. :math:`\min(1, p(y)/q_I(y))`, else sample
    :math:`\mathrm{norm}((p - q_I)_+)`. Lossless for any selection rule whose q_I is exact.
    Khisti et al. (2024), "Multi-Draft Speculative Sampling: Canonical Architectures and
    Theoretical Limits", arXiv 2410.18234.

    Selection (their practical scheme). Tokens are ranked by :math:`p - \bar q^2`
    (:math:`\bar q` the mean draft distribution) and S is the top ``s`` (ties to the lower
    id). A match between two tokens keeps the one in S if only one is; when both are in S
    it keeps i from {i, j} with the weight of a small LP that maximises
    :math:`\sum_{i \in S} \min(p_i, m_i)` for the winner's law m (HiGHS, one block per
    distinct row); when neither is, it keeps the higher-ranked one, where off S the rank is
    a bucket of the score (its float exponent and top two mantissa bits: 4 equal slices per
    factor 2; all scores <= 0 share the lowest bucket) and a tie keeps the current winner
    (the earlier draft). The paper ranks off S by the score itself; buckets keep that
    order up to a factor 2^(1/4) and make
    q_I off S a histogram instead of a full-vocabulary sort. K = 2 is one match; for K > 2
    the drafts play a pairwise tournament, the winner of each match meeting the next draft,
    each match with its own LP on the exact law of the winner so far (independent of the
    next draft; the intermediate LPs also target p, the paper is silent there). Off S the
    winner's law is closed-form: y wins iff all drafts are off S, the drafts before y's
    draft k lie in lower buckets and the later ones in buckets at or below y's, so
    :math:`q_I(y) = \sum_k q_k(y) \prod_{j<k} L^<_j(c_y) \prod_{j>k} L^{\le}_j(c_y)`.
    With ``s >= V`` and K = 2 the LP is the full optimal selection, reaching
    :math:`\alpha^* = \min_S [1 + p(S) - q(S)^2]` for iid drafts.
    Supports iid drafts and independent drafts (each from its own q_k).
    """

    name = "khisti_is"
    laws = ("iid", "independent")
    min_k = 1

    def __init__(self, s: int = 10):
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"s (size of the LP token set) must be a positive integer, got {s!r}")
        self.s = s

    def __repr__(self) -> str:
        return f"<verifier {self.name!r} laws={self.laws} s={self.s}>"

    # the plan: everything that depends on (p, q) only ---------------------------------------
    def _plan(self, fp, fq, K):
        # fp [N, V]; fq [N, V] (shared) or [N, K, V] (per draft)
        N, V = fp.shape
        qbar = fq if fq.ndim == 2 else fq.mean(-2)
        score = fp - qbar * qbar  # [N, V], ranking key (desc), ties to the lower id
        S = _top_set(score, min(self.s, V))  # [N, n]
        pS = fp.gather(-1, S).double()
        if fq.ndim == 2:
            tS = fq.gather(-1, S).double().unsqueeze(1).expand(N, K, S.shape[-1])  # [N, K, n]
        else:
            tS = fq.gather(-1, S.unsqueeze(1).expand(N, K, S.shape[-1])).double()
        t_out = (1 - tS.sum(-1)).clamp_min(0.0)  # [N, K]
        rS, r_out = tS[:, 0], t_out[:, 0]
        Ws = []
        for m in range(1, K):
            W, rS = _solve_stage(pS, rS, r_out, tS[:, m], t_out[:, m])
            r_out = r_out * t_out[:, m]
            Ws.append(W)
        return score, S, Ws, rS

    @staticmethod
    def _q_off(fq, S, rows):
        """Draft rows off S (zero on S), float64 ``[r, 1, V]`` when shared, else ``[r, K, V]``."""
        qk = fq[rows].double()
        if fq.ndim == 2:
            return qk.scatter(-1, S[rows], 0.0).unsqueeze(1)
        return qk.scatter(-1, S[rows].unsqueeze(1).expand(-1, qk.shape[1], -1), 0.0)

    @staticmethod
    def _coef(lt, le, K):
        """Off-S coefficients for ``_q_off`` rows: ``[r, 1, C]`` (shared q: the sum of A_k) or ``[r, K, C]``."""
        if lt.shape[1] == 1:
            return _off_coef(lt.expand(-1, K, -1), le.expand(-1, K, -1)).sum(1, keepdim=True)
        return _off_coef(lt, le)

    def _q_inf_full(self, fq, score, S, mS, rows, K):
        """q_I over the whole vocabulary ``[r, V]`` for the given rows (a histogram, no sort)."""
        nb = _n_buckets(score.dtype)
        step = max(1, (1 << 17) // (nb * (K if fq.ndim == 3 else 1)))
        if rows.numel() > step:  # bound the [r, K, buckets] histogram
            return torch.cat([self._q_inf_full(fq, score, S, mS, rows[i : i + step], K) for i in range(0, rows.numel(), step)])
        bk = _bucket(score[rows])  # [r, V]
        qk = self._q_off(fq, S, rows)  # [r, K or 1, V]
        k1 = qk.shape[1]
        H = torch.zeros(rows.numel(), k1, nb, dtype=torch.float64, device=score.device)
        H.scatter_add_(-1, bk.unsqueeze(1).expand(-1, k1, -1), qk)
        le = H.cumsum(-1)
        A = self._coef(le - H, le, K)  # [r, K or 1, C]
        qi = (qk * A.gather(-1, bk.unsqueeze(1).expand(-1, k1, -1))).sum(1)
        return qi.scatter(-1, S[rows], mS[rows])

    # sampling path ---------------------------------------------------------------------------
    def _verify(self, p, q, drafts, g, law):
        # p [..., V], q [..., V] or [..., K, V], drafts [..., K]
        V, K = p.shape[-1], drafts.shape[-1]
        batch = drafts.shape[:-1]
        fp = p.reshape(-1, V)
        fq = q.reshape(-1, V) if q.ndim == p.ndim else q.reshape(-1, K, V)
        fd = drafts.reshape(-1, K)
        N = fp.shape[0]
        score, S, Ws, mS = self._plan(fp, fq, K)
        ar = torch.arange(N, device=p.device)
        u = torch.rand(N, K, generator=g, dtype=torch.float64, device=p.device)

        def pos(tok):  # index in S or -1
            eq = S == tok.unsqueeze(-1)
            return torch.where(eq.any(-1), eq.long().argmax(-1), torch.full_like(tok, -1))

        w = fd[:, 0]
        pw = pos(w)
        for m in range(1, K):
            b = fd[:, m]
            pb = pos(b)
            bw = _bucket(score.gather(-1, w.unsqueeze(-1)).squeeze(-1))
            bb = _bucket(score.gather(-1, b.unsqueeze(-1)).squeeze(-1))
            keep = torch.where(pw >= 0, pb < 0, (pb < 0) & (bw >= bb)).double()
            both = (pw >= 0) & (pb >= 0)
            if bool(both.any()):
                lp = Ws[m - 1][ar, pw.clamp_min(0), pb.clamp_min(0)]
                keep = torch.where(both, lp, keep)
            keep = torch.where(w == b, torch.ones_like(keep), keep)
            stay = u[:, m] < keep
            w = torch.where(stay, w, b)
            pw = torch.where(stay, pw, pb)
        # q_I at the selected token: from the LP on S, closed form off S
        qi = mS.gather(-1, pw.clamp_min(0).unsqueeze(-1)).squeeze(-1)
        off = (pw < 0).nonzero().squeeze(-1)
        if off.numel():
            step = chunk_rows(V * K)
            for s0 in range(0, off.numel(), step):
                r = off[s0 : s0 + step]
                y = w[r]
                bk = _bucket(score[r])  # [r, V]
                by = bk.gather(-1, y.unsqueeze(-1))
                qk = self._q_off(fq, S, r)  # [r, K or 1, V]
                lt = (qk * (bk < by).unsqueeze(1)).sum(-1, keepdim=True)  # [r, K or 1, 1]
                le = lt + (qk * (bk == by).unsqueeze(1)).sum(-1, keepdim=True)
                qy = qk.gather(-1, y.view(-1, 1, 1).expand(-1, qk.shape[1], 1))
                qi[r] = (qy * self._coef(lt, le, K)).sum((-1, -2))
        py = fp.gather(-1, w.unsqueeze(-1)).squeeze(-1).double()
        accept = u[:, 0] * qi <= py
        token = w.clone()
        rej = (~accept).nonzero().squeeze(-1)
        if rej.numel():
            token[rej] = sample_rows(
                lambda rows: (fp[rows].double() - self._q_inf_full(fq, score, S, mS, rows, K)).clamp_min(0.0), rej, g
            )
        return token.reshape(batch)

    # exact path ------------------------------------------------------------------------------
    def _output_distribution(self, p, q, drafts, law):
        V, K = p.shape[-1], drafts.shape[-1]
        batch = drafts.shape[:-1]
        fp = p.reshape(-1, V)
        fq = q.reshape(-1, V) if q.ndim == p.ndim else q.reshape(-1, K, V)
        fd = drafts.reshape(-1, K)
        N = fp.shape[0]
        score, S, Ws, mS = self._plan(fp, fq, K)
        rows = torch.arange(N, device=p.device)
        qi = self._q_inf_full(fq, score, S, mS, rows, K)  # [N, V]
        bk = _bucket(score)  # [N, V]
        offS = torch.ones(N, V, dtype=torch.bool, device=p.device).scatter(-1, S, False)
        win = torch.zeros(N, V, dtype=torch.float64, device=p.device)
        win[rows, fd[:, 0]] = 1.0
        for m in range(1, K):
            b = fd[:, m]
            eq = S == b.unsqueeze(-1)
            inS = eq.any(-1, keepdim=True)  # [N, 1]
            # P(a kept against b): off S the higher bucket, ties to the earlier draft (a)
            sel = torch.where(inS, torch.zeros_like(bk, dtype=torch.bool), bk >= bk.gather(-1, b.unsqueeze(-1)))
            sel = torch.where(offS, sel, ~inS).double()
            if bool(inS.any()):
                pb = eq.long().argmax(-1)
                col = Ws[m - 1][rows, :, pb]  # [N, n]: P(S_i kept against b)
                sel = sel.scatter(-1, S, torch.where(inS, col, sel.gather(-1, S)))
            lost = (win * (1 - sel)).sum(-1)
            win = win * sel
            win[rows, b] += lost
        a = (fp / qi.clamp_min(1e-300)).clamp(max=1.0)
        acc = win * a  # [N, V]
        res = (fp - qi).clamp_min(0.0)
        z = res.sum(-1, keepdim=True)
        res = torch.where(z > 0, res / torch.where(z > 0, z, 1.0), torch.zeros_like(res))
        out = acc + (1 - acc.sum(-1, keepdim=True)) * res
        return out.reshape(*batch, V)
