"""Row-wise sampling helpers for the batched sampling paths.

The hot path of a verifier touches the full vocabulary only for rows that need a residual
(after a rejection), and then in cache-sized chunks of rows: ``sample_rows`` draws one token
per requested row by inverse CDF (cumsum + searchsorted) without ever building a full
``[B, V]`` multinomial.
"""
from __future__ import annotations

from typing import Callable

import torch

CHUNK_ELEMS = 1 << 17  # float64 elements per chunk (1 MiB): stays in L2 on common CPUs


def chunk_rows(V: int) -> int:
    return max(1, CHUNK_ELEMS // max(1, V))


def inverse_cdf(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One index per row of unnormalised weights ``w [R, V]`` at uniforms ``u [R]`` in [0, 1)."""
    c = torch.cumsum(w, -1)
    tot = c[:, -1:]
    if bool((tot <= 0).any()):
        raise RuntimeError("internal error: a residual row has no mass (inputs not normalised?)")
    idx = torch.searchsorted(c, u.unsqueeze(-1).to(c.dtype) * tot, right=True).squeeze(-1)
    return idx.clamp_(max=w.shape[-1] - 1)


def sample_rows(weights: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Sample one token per row in ``rows`` (LongTensor[R]) from ``weights(rows_chunk) -> [r, V]``.

    Uniforms for all rows are drawn first, in row order, so results depend only on the
    generator state and not on the chunk size.
    """
    n = rows.numel()
    out = torch.empty(n, dtype=torch.long, device=rows.device)
    if n == 0:
        return out
    u = torch.rand(n, generator=g, dtype=torch.float64, device=rows.device)
    w = weights(rows[:1])
    out[:1] = inverse_cdf(w, u[:1])
    step = chunk_rows(w.shape[-1])
    for s0 in range(1, n, step):
        r = rows[s0 : s0 + step]
        out[s0 : s0 + r.numel()] = inverse_cdf(weights(r), u[s0 : s0 + r.numel()])
    return out


# shared chunked helpers for the recursive-rejection and K-SEQ families --------------------
BLOCK = 1024  # elements per block of the two-level inverse CDF


def rows_per_chunk(V: int, elem_bytes: int = 8) -> int:
    """Rows of ``V`` elements of ``elem_bytes`` that fit one cache-sized chunk (at least 1)."""
    return max(1, (CHUNK_ELEMS * 8 // max(1, elem_bytes)) // max(1, V))


def inverse_cdf_blocked(w: torch.Tensor, u: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Like ``inverse_cdf`` (one index per row of ``w [R, V]`` at ``u [R]``), in two levels.

    Block sums locate the block holding ``u * total``; only that block is cumulated. The
    law is the same as a full cumsum (up to rounding), at the cost of one summing pass
    instead of a full-length float64 cumsum. ``w`` must be nonnegative with positive rows.
    """
    R, V = w.shape
    if V <= 4 * block:
        return inverse_cdf(w.double() if w.dtype != torch.float64 else w, u)
    nfull = V // block
    head = w[:, : nfull * block].reshape(R, nfull, block).sum(-1, dtype=torch.float64)  # [R, nfull]
    if nfull * block < V:
        head = torch.cat([head, w[:, nfull * block :].sum(-1, keepdim=True, dtype=torch.float64)], -1)
    cb = torch.cumsum(head, -1)  # [R, nb]
    tot = cb[:, -1:]
    if bool((tot <= 0).any()):
        raise RuntimeError("internal error: a residual row has no mass (inputs not normalised?)")
    target = u.to(torch.float64).unsqueeze(-1) * tot  # [R, 1]
    b = torch.searchsorted(cb, target, right=True)  # [R, 1]
    # never land in an empty block (rounding at the top end): at most the last nonzero one
    ar = torch.arange(head.shape[-1], device=w.device).expand_as(head)
    b = torch.minimum(b, torch.where(head > 0, ar, torch.zeros_like(ar)).amax(-1, keepdim=True))
    prev = torch.where(b > 0, cb.gather(-1, (b - 1).clamp_min(0)), torch.zeros_like(target))
    start = b * block  # [R, 1]
    cols = start + torch.arange(block, device=w.device)  # [R, block]
    inside = cols < V
    vals = w.gather(-1, cols.clamp(max=V - 1)).double()
    vals = torch.where(inside, vals, torch.zeros_like(vals))
    c = torch.cumsum(vals, -1) + prev  # [R, block]
    j = torch.searchsorted(c, target, right=True)  # [R, 1]
    # clamp to the last positive entry of the block (guards u * tot at the very top)
    last = torch.where(vals > 0, torch.arange(block, device=w.device).expand_as(vals), torch.zeros_like(cols)).amax(-1, keepdim=True)
    j = torch.minimum(j, last)
    return (start + j).squeeze(-1)
