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
