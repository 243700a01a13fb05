"""Row-wise scans and sorts that the exact cores share (``limits``, ``verifiers.optimal``), and the
acceptance coin every verifier and tree rule draws (``accept``, ``accept_prob``, ``keep_ratio``).

Each function gives the same result as its plain torch form; on CPU tensors some take a
faster route (measured on the 2-core AVX2 machine, one [1, 151936] float64 row: the stable
descending sort as a radix sort of integer keys, one 1-D row at a time, 3-8 ms, against
``torch.sort(stable=True)`` 26-30 ms and numpy quicksort + tie repair 18-22 ms; ``torch.cummin``
2.6 ms vs ``np.minimum.accumulate`` 0.6 ms; ``x ** 4`` 2.6 ms vs two multiplications 0.17 ms).
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["argsort_desc_stable", "top_desc_stable", "cummin", "rev_cummin", "ipow", "segment_search", "lift_tiny", "cdf_search",
           "accept", "accept_prob", "keep_ratio"]

TOP_SORT_V = 2048  # below this vocabulary size top_desc_stable is one stable sort


def _np_ok(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and not x.requires_grad and x.dtype in (torch.float64, torch.float32)


def argsort_desc_stable(x: torch.Tensor) -> torch.Tensor:
    """``torch.sort(x, -1, descending=True, stable=True).indices`` exactly. x ``[R, V]``, no NaN.

    CPU route: the float bits as a signed integer key that orders like the floats (negative
    values with their 63 low bits flipped, -0.0 made +0.0 first so that it ties with 0.0),
    complemented for the descending order, and a stable sort of each row as a 1-D integer
    tensor (torch's radix sort: a [151936] float64 row in 3-8 ms, against 18-22 ms for numpy's
    quicksort and 26-30 ms for torch's stable float sort on the 2-core machine; a 2-D sort
    along dim -1 does not take the radix route, hence the loop over rows)."""
    if not _np_ok(x) or x.ndim != 2:
        return torch.sort(x, dim=-1, descending=True, stable=True).indices
    R, V = x.shape
    itype, mask = (torch.int64, 0x7FFFFFFFFFFFFFFF) if x.dtype == torch.float64 else (torch.int32, 0x7FFFFFFF)
    bits = (x.detach() + 0.0).view(itype)  # + 0.0: -0.0 becomes +0.0 (a fresh tensor either way)
    key = bits.bitwise_xor_((bits >> (torch.iinfo(itype).bits - 1)) & mask).bitwise_not_()  # ascending = x descending
    if R == 1:
        return torch.sort(key[0], stable=True).indices.unsqueeze(0)
    return torch.stack([torch.sort(key[r], stable=True).indices for r in range(R)])


def top_desc_stable(x: torch.Tensor, n: int) -> torch.Tensor:
    """``torch.sort(x, -1, descending=True, stable=True).indices[..., :n]`` exactly, without
    sorting the row. x ``[..., V]``, no NaN; returns int64 ``[..., n]``.

    One ``topk`` of n + 1: when the n-th and (n+1)-th largest values differ the top-n set is
    unique and is put in the stable order (value descending, id ascending) by sorting n ids.
    Rows with a tie across the boundary take every token above the n-th value and the
    lowest ids among those equal to it (one comparison pass and a prefix count over the row)."""
    shape, V = x.shape, x.shape[-1]
    n = int(n)
    if n <= 0:
        return torch.empty(*shape[:-1], 0, dtype=torch.long, device=x.device)
    if n >= V or V <= TOP_SORT_V:
        return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :n]
    flat = x.reshape(-1, V)
    vals, idx = torch.topk(flat, n + 1, dim=-1, sorted=True)
    ids = idx[:, :n]
    tie = (vals[:, n - 1] == vals[:, n]).nonzero().squeeze(-1)
    if tie.numel():
        ids = ids.clone()
        xt = flat.index_select(0, tie)
        t = vals.index_select(0, tie)[:, n - 1 : n]
        gt = xt > t
        eq = xt == t
        need = n - gt.sum(-1, keepdim=True)  # >= 1: the n-th value itself is not above t
        take = gt | (eq & (eq.cumsum(-1) <= need))
        ids[tie] = take.nonzero()[:, 1].view(tie.numel(), n)  # exactly n per row, ids ascending
    ids = ids.sort(-1).values  # ids ascending, then a stable sort by value descending
    ids = ids.gather(-1, torch.sort(flat.gather(-1, ids), dim=-1, descending=True, stable=True).indices)
    return ids.reshape(*shape[:-1], n)


def cummin(x: torch.Tensor) -> torch.Tensor:
    """Prefix minimum along the last dim (``torch.cummin(x, -1).values``)."""
    if _np_ok(x):
        return torch.from_numpy(np.minimum.accumulate(x.detach().numpy(), axis=-1))
    return torch.cummin(x, -1).values


def rev_cummin(x: torch.Tensor) -> torch.Tensor:
    """Suffix minimum along the last dim: out[..., j] = min_{i >= j} x[..., i]."""
    if _np_ok(x):
        xn = x.detach().numpy()[..., ::-1]
        return torch.from_numpy(np.minimum.accumulate(xn, axis=-1)[..., ::-1].copy())
    return torch.flip(torch.cummin(torch.flip(x, [-1]), -1).values, [-1])


def ipow(x, k: int):
    """x ** k for an integer k >= 0 by repeated squaring (elementwise multiplications only); x a
    torch tensor or a numpy array (the numpy plan of ``verifiers._optimal_np`` multiplies in the
    same order, so both give the same bits).

    For k = 1 the result is x itself (not a copy)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    out = None
    base = x
    while k:
        if k & 1:
            out = base if out is None else out * base
        k >>= 1
        if k:
            base = base * base
    if out is None:
        return torch.ones_like(x) if isinstance(x, torch.Tensor) else np.ones_like(x)
    return out


def segment_search(c: torch.Tensor, first: torch.Tensor, end: torch.Tensor, w: torch.Tensor, nbits: int | None = None) -> torch.Tensor:
    """Per query, the first index of its segment whose key is >= the query, by binary lifting.

    c ``[n]`` keys, nondecreasing inside each segment; first, end ``[N, 1]`` (or ``[N, M]``) the
    segment ``[first, end)`` of each query row; w ``[N, M]`` queries. Returns ``[N, M]`` int64 in
    ``[first, end]``: one plus the last index reached by lifting with ``c < w`` (``first`` when
    none). ``nbits`` (default: the fewest with 2^nbits > the longest segment) fixes the lifting
    steps. The CPU route runs the same lifting in numpy (fewer, cheaper small-array operations:
    the fit of ``verifiers.optimal`` calls this a few dozen times per row) and returns the same
    integers as the torch route, keys out of order included."""
    if nbits is None:
        nbits = int((end - first).max()).bit_length() if end.numel() else 0
    if c.device.type == "cpu" and w.device.type == "cpu" and not w.requires_grad:
        return _lift_numpy(c, first, end, w, nbits)
    return _lift_torch(c, first, end, w, nbits)


def _lift_numpy(c, first, end, w, nbits):
    cn = c.detach().numpy()
    wn = w.detach().numpy()
    en = np.broadcast_to(end.numpy(), wn.shape)
    pc = np.array(np.broadcast_to(first.numpy() - 1, wn.shape))  # last index known to have c < w
    cand = np.empty_like(pc)
    ok = np.empty(wn.shape, dtype=bool)
    for b in range(nbits - 1, -1, -1):
        np.add(pc, 1 << b, out=cand)
        np.less(cand, en, out=ok)
        idx = np.where(ok, cand, 0)
        ok &= cn[idx] < wn
        np.copyto(pc, cand, where=ok)
    return torch.from_numpy(pc + 1)


def _lift_torch(c, first, end, w, nbits):
    pc = (first - 1).expand_as(w)
    for b in range(nbits - 1, -1, -1):
        cand = pc + (1 << b)
        ok = cand < end
        pc = torch.where(ok & (c[torch.where(ok, cand, 0)] < w), cand, pc)
    return pc + 1


# rows whose float64 total is below TINY_TOTAL are scaled by LIFT (a power of two: exact) before
# an inverse-CDF search: u * total at a subnormal total keeps only a few bits of u (two masses
# of 5e-324 split 25/75, not 50/50)
TINY_TOTAL = 2.0 ** -900
LIFT = 2.0 ** 900


def lift_tiny(c: torch.Tensor, tot: torch.Tensor) -> torch.Tensor:
    """float64 rows ``c [n, m]`` times LIFT where their total ``tot [n, 1]`` is below TINY_TOTAL
    (exact: a power of two), unchanged elsewhere (the same values, so the same draws)."""
    tiny = tot < TINY_TOTAL
    if bool(tiny.any()):
        return torch.where(tiny, c * LIFT, c)
    return c


def cdf_search(c: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``[n]`` indices: the first strict increase of the float64 cumulative sums ``c [n, V]`` past
    ``u * total`` (u ``[n]`` or ``[n, 1]`` in [0, 1)), full precision at subnormal totals
    (``lift_tiny``). An index V (a target rounded up to the total) is the caller's to map to its
    row's last positive entry."""
    c = lift_tiny(c, c[:, -1:])
    return torch.searchsorted(c, u.reshape(-1, 1).to(c.dtype) * c[:, -1:], right=True).squeeze(-1)


# the acceptance coin: exact at every float64 mass (subnormal, 0, a denominator that underflowed) ------

def accept(u: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """The acceptance coin ``u < min(1, num / den)`` for uniforms u in [0, 1), float64:
    ``num > 0 and u * den <= num``. A target mass ``num = 0`` never accepts (not even with
    u = 0 or den = 0), so a draft with p = 0 (or residual mass 0) is never kept."""
    return (num > 0) & (u * den <= num)


def accept_prob(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``P(accept(u, num, den))`` for u uniform on [0, 1): ``min(1, num / den)``, 1 where
    den = 0 < num, 0 where num = 0 (the exact paths' side of ``accept``)."""
    pos = den > 0
    return torch.where(pos, (num / torch.where(pos, den, torch.ones_like(den))).clamp(max=1.0), (num > 0).to(num.dtype))


def keep_ratio(num: float, den: float) -> float:
    """``accept_prob`` at one point, for Python floats (the tree rules' weights ``min(a p / q, 1)``):
    0 where ``num <= 0`` (a target mass 0 is never kept, 0 / 0 included), 1 where ``num >= den``
    (a denominator that underflowed to 0 or is subnormal: no division, no overflow), else
    ``num / den``. A drafted token's q (or selection) mass that is positive but rounds to 0 in
    float64 weighs at most ~1e-308, so reading it as 0 changes no law beyond float64 rounding."""
    num, den = float(num), float(den)
    if not num > 0:
        return 0.0
    if num >= den:
        return 1.0
    return num / den
