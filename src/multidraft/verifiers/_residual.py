"""The arithmetic every verifier shares: rows in float64, acceptance, residuals, row sampling.

Exactness at the float32 and subnormal edges is decided here, once for every rule:

* ``rows64``: a probability row in any float dtype is read as the law ``x / sum(x)``, in
  float64 and divided by its own float64 sum. float16/bfloat16/float32 values (subnormals
  included) are exact in float64, so the only rounding is float64's. A confident float32 q
  ``[1, 1e-9, 1e-9, 0]`` sums to 1 in float32 but represents ``q(0) = 1 / (1 + 2e-9)``: its
  residual against a one-hot p has mass 2e-9, which float64 holds and float32 loses.
* ``accept(u, num, den)`` (with ``accept_prob``; they live in ``multidraft._scan``, shared with the
  tree rules, whose scalar twin is ``_scan.keep_ratio``): the coin ``u < num / den`` as ``num > 0 and u * den <= num``, so a
  draft whose (residual) target mass is 0 is never kept, whatever ``den`` (0 included) and
  whatever ``u`` (0 included).
* ``residual_or(w, fallback)`` / ``residual_law``: a residual row ``w = (p_i - m)+`` whose
  computed mass is 0 is replaced by ``fallback`` (the previous target row ``p_i``). That can
  only happen where ``p_i <= m`` holds to float64 precision on every token, i.e. where the
  exact residual is empty (the rule reaches it with probability 0) or has a mass below float64
  rounding (reached with at most that probability); either way the row sampled lies inside
  the support of ``p_i``, which lies inside the support of p. No residual row is ever empty.
* ``inverse_cdf`` / ``inverse_cdf_blocked``: the sampled index always has positive weight
  (a target that rounds up to the row total goes to the row's last positive entry).

The hot path of a verifier touches the full vocabulary only for rows that need a residual
(after a rejection), and then in cache-sized chunks of rows: ``sample_rows`` draws one token
per requested row by inverse CDF (cumsum + searchsorted) without ever building a full
``[B, V]`` multinomial.
"""
from __future__ import annotations

from typing import Callable

import torch

from .._scan import accept, accept_prob, cdf_search, lift_tiny  # accept, accept_prob: their home is _scan

CHUNK_ELEMS = 1 << 17  # float64 elements per chunk (1 MiB): stays in L2 on common CPUs


# a float64 row whose float64 sum is within NORMALISED of 1 is taken as normalised: the
# rounding of a cascade sum of a normalised row (about log2(V) ulp), far inside the 1e-12 of a
# certificate. This makes rows64 idempotent (a normalised row keeps its bits).
NORMALISED = 2.0 ** -45


def row_scale(x: torch.Tensor) -> torch.Tensor:
    """The divisor ``[..., 1]`` float64 that ``rows64`` applies to each row of x ``[..., V]``: its
    float64 sum, or 1.0 where that is within ``NORMALISED`` of 1 (or not positive). Summed a
    cache-sized chunk of rows at a time (a float64 sum of a whole float32 batch would first
    copy it to float64)."""
    V = x.shape[-1]
    if x.dtype == torch.float64:
        s = x.sum(-1, keepdim=True)
    else:
        flat = x.reshape(-1, V)
        s = torch.empty(flat.shape[0], 1, dtype=torch.float64, device=x.device)
        step = chunk_rows(V)
        for s0 in range(0, flat.shape[0], step):
            s[s0 : s0 + step] = flat[s0 : s0 + step].sum(-1, keepdim=True, dtype=torch.float64)
        s = s.reshape(*x.shape[:-1], 1)
    off = ((s - 1.0).abs() > NORMALISED) & (s > 0)
    return torch.where(off, s, torch.ones_like(s))


def rows64(x: torch.Tensor) -> torch.Tensor:
    """Probability rows ``[..., V]`` (any float dtype, nonnegative, positive rows) as float64
    rows divided by their float64 sum: the law each row represents, normalised in float64.
    A row whose float64 sum is already 1 up to ``NORMALISED`` keeps its values (float64
    inputs normalised in float64 pass through unchanged, and ``rows64(rows64(x)) == rows64(x)``).
    Rows repeated along the first dimension (an expanded view, stride 0) stay an expanded
    view of one normalised copy. ``x.double() / row_scale(x)`` bit for bit."""
    if x.dim() >= 2 and x.shape[0] > 1 and x.stride(0) == 0:
        return rows64(x[0]).unsqueeze(0).expand(x.shape)
    scale = row_scale(x)
    x64 = x.double()
    if not bool((scale != 1.0).any()):
        return x64
    return x64.div_(scale) if x64 is not x else x64 / scale  # x / 1.0 is exact


def residual_or(w: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Residual rows ``w [R, V]`` (nonnegative) with every row of mass 0 replaced by the row
    of ``fallback [R, V]`` (the target row the residual was cut from). See the module notes."""
    empty = w.sum(-1, keepdim=True) <= 0
    if bool(empty.any()):
        return torch.where(empty, fallback.to(w.dtype), w)
    return w


def residual_law(w: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """The normalised residual law ``[..., V]`` of nonnegative rows w (exact paths):
    ``w / sum(w)``, or the normalised fallback row where w has no mass."""
    w = residual_or(w, fallback)
    z = w.sum(-1, keepdim=True)
    return w / torch.where(z > 0, z, torch.ones_like(z))


def chunk_rows(V: int) -> int:
    return max(1, CHUNK_ELEMS // max(1, V))


def inverse_cdf(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One index per row of unnormalised weights ``w [R, V]`` at uniforms ``u [R]`` in [0, 1).

    The index always has ``w > 0``: the search returns the first strict increase of the
    cumulative sum past ``u * total``; a target that rounds up to the total goes to the row's
    last positive entry."""
    c = torch.cumsum(w, -1)
    tot = c[:, -1:]
    if bool((tot <= 0).any()):
        raise RuntimeError("internal error: a residual row has no mass (inputs not normalised?)")
    idx = cdf_search(c, u)
    V = w.shape[-1]
    over = (idx >= V).nonzero().squeeze(-1)
    if over.numel():
        ar = torch.arange(V, device=w.device)
        idx[over] = torch.where(w.index_select(0, over) > 0, ar, torch.zeros_like(ar)).amax(-1)
    return idx


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
    tot = head.sum(-1, keepdim=True)
    if bool((tot <= 0).any()):
        raise RuntimeError("internal error: a residual row has no mass (inputs not normalised?)")
    scale = lift_tiny(torch.ones_like(tot), tot)  # [R, 1] 1, or LIFT for a subnormal-sized row
    head = head * scale
    cb = torch.cumsum(head, -1)  # [R, nb]
    tot = cb[:, -1:]
    target = u.to(torch.float64).unsqueeze(-1) * tot  # [R, 1]
    b = torch.searchsorted(cb, target, right=True)  # [R, 1]
    # never land in an empty block (rounding at the top end): at most the last nonzero one
    ar = torch.arange(head.shape[-1], device=w.device).expand_as(head)
    b = torch.minimum(b, torch.where(head > 0, ar, torch.zeros_like(ar)).amax(-1, keepdim=True))
    prev = torch.where(b > 0, cb.gather(-1, (b - 1).clamp_min(0)), torch.zeros_like(target))
    start = b * block  # [R, 1]
    cols = start + torch.arange(block, device=w.device)  # [R, block]
    inside = cols < V
    vals = w.gather(-1, cols.clamp(max=V - 1)).double() * scale
    vals = torch.where(inside, vals, torch.zeros_like(vals))
    c = torch.cumsum(vals, -1) + prev  # [R, block]
    j = torch.searchsorted(c, target, right=True)  # [R, 1]
    # clamp to the last positive entry of the block (guards u * tot at the very top)
    last = torch.where(vals > 0, torch.arange(block, device=w.device).expand_as(vals), torch.zeros_like(cols)).amax(-1, keepdim=True)
    j = torch.minimum(j, last)
    return (start + j).squeeze(-1)
