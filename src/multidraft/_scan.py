"""Row-wise scans and sorts that the exact cores share (``limits``, ``verifiers.optimal``).

Each function gives the same result as its plain torch form; on CPU tensors some take a
faster numpy route (measured on the 2-core AVX2 machine, one [1, 151936] float64 row:
``torch.sort(stable=True)`` 15.9 ms vs numpy quicksort + tie repair 6-7 ms; ``torch.cummin``
2.6 ms vs ``np.minimum.accumulate`` 0.6 ms; ``x ** 4`` 2.6 ms vs two multiplications 0.17 ms).
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["argsort_desc_stable", "cummin", "rev_cummin", "ipow", "segment_search"]


def _np_ok(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and not x.requires_grad and x.dtype in (torch.float64, torch.float32)


def argsort_desc_stable(x: torch.Tensor) -> torch.Tensor:
    """``torch.sort(x, -1, descending=True, stable=True).indices`` exactly. x ``[R, V]``, no NaN.

    CPU route: numpy's (unstable, SIMD) quicksort of -x, then every run of equal values is
    put back in increasing index order, which is what the stable sort returns."""
    if not _np_ok(x) or x.ndim != 2:
        return torch.sort(x, dim=-1, descending=True, stable=True).indices
    R, V = x.shape
    xn = x.detach().numpy()
    order = torch.from_numpy(np.argsort(-xn, axis=-1).astype(np.int64, copy=False))
    if V < 2:
        return order
    sv = x.gather(-1, order)  # [R, V] sorted values, non-increasing
    eq = sv[:, 1:] == sv[:, :-1]  # [R, V-1] position i+1 ties with i
    if not bool(eq.any()):
        return order
    intie = torch.zeros(R, V, dtype=torch.bool)
    intie[:, 1:] |= eq
    intie[:, :-1] |= eq
    run = torch.zeros(R, V, dtype=torch.int64)
    run[:, 1:] = torch.cumsum(~eq, -1)  # run id along the sorted row
    flat = intie.reshape(-1).nonzero().squeeze(-1)  # increasing flat positions, runs contiguous
    rows = flat // V
    key = (rows * V + run.reshape(-1)[flat]) * V + order.reshape(-1)[flat]
    order.view(-1)[flat] = torch.sort(key).values % V
    return order


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


def ipow(x: torch.Tensor, k: int) -> torch.Tensor:
    """x ** k for an integer k >= 0 by repeated squaring (elementwise multiplications only).

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
    return torch.ones_like(x) if out is None else out


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
