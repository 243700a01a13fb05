"""Logit processing, the ONE place where logits become sampling distributions.

``process_logits(logits, temperature, top_k, top_p)`` maps raw logits ``[..., V]`` to the
distribution a sampler would draw from (float32 by default; ``dtype=torch.float64`` for
the experiments' stores). The decoder (target ``p`` and draft ``q`` at every tree node) and
the experiments (stored positions) both call it, so acceptance tables and block-efficiency
tables are computed on the same distributions:

* ``temperature == 0``: one-hot on the argmax (lowest id among ties) -- greedy decoding;
* otherwise ``softmax(logits / temperature)``, then
* ``top_k``: keep the k most likely tokens (ties broken by lower id), zero the rest;
* ``top_p``: keep the smallest prefix of tokens sorted by decreasing probability whose
  mass reaches ``top_p`` of the (top-k-renormalised) distribution, as transformers does;
  the most likely token is always kept; zero the rest;
* renormalise.

The decoder applies the same settings to the target (giving ``p``) and the draft (giving
``q``); verifiers see exactly these processed distributions, so the decoder is lossless
with respect to the processed target law.

Cost: at large V on CPU the top-k / top-p cut reads only the head of the sorted order
(``_cut_head``: a ``topk`` with exact ties, float64 sums with a margin against the full
path's rounding) and gives the full stable sort's tensor bit for bit, or falls back to that
sort when a head cannot decide it (about 1 ms instead of 14 ms for one V = 151,936 row).
"""
from __future__ import annotations

import torch

from ._validate import as_temperature, as_top_k, as_top_p

__all__ = ["process_logits", "sample_token", "check_sampling_args"]


def check_sampling_args(temperature, top_k, top_p, name: str = "temperature") -> None:
    """``ArgumentError`` (a ValueError) naming the argument for a bad temperature / top_k / top_p.

    Python and numpy numbers are accepted (``top_k`` any integer type, via ``operator.index``);
    bools are refused. The checks are ``_validate.as_temperature`` / ``as_top_k`` / ``as_top_p``,
    which the decoder's ``Settings`` calls directly."""
    as_temperature(temperature, name)
    as_top_k(top_k)
    as_top_p(top_p)


def process_logits(logits: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None,
                   *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Processed next-token distributions ``[..., V]`` in ``dtype`` (float32 or float64).  logits ``[..., V]``.

    Arguments are not re-validated here (hot path); callers check them once with
    :func:`check_sampling_args`.
    """
    x = logits.to(dtype)
    V = x.shape[-1]
    if temperature == 0:
        idx = x.argmax(-1, keepdim=True)  # first maximal index
        return torch.zeros_like(x).scatter_(-1, idx, 1.0)
    if temperature < _SHIFT_BELOW_T:  # max at 0 first: (x - max) / T is <= 0, never +inf, so no NaN row
        x = x - x.amax(-1, keepdim=True)
    probs = torch.softmax(x / float(temperature), dim=-1)
    cut_k = top_k is not None and top_k < V
    cut_p = top_p is not None and top_p < 1.0
    if (cut_k or cut_p) and V > _HEAD_MIN_V and x.device.type == "cpu":
        kept = _cut_head(probs, top_k if cut_k else None, top_p if cut_p else None)
        if kept is not None:
            return kept / kept.sum(-1, keepdim=True)
    if cut_k or cut_p:
        sp, si = torch.sort(probs, dim=-1, descending=True, stable=True)  # ties: lower id first
        keep = torch.ones_like(sp, dtype=torch.bool)
        if cut_k:
            keep[..., top_k:] = False
        if cut_p:
            sk = torch.where(keep, sp, torch.zeros_like(sp))
            before = torch.cumsum(sk, -1) - sk  # mass strictly before each sorted token
            keep &= before < top_p * sk.sum(-1, keepdim=True)  # relative to the top-k mass
            keep[..., 0] = True
        probs = torch.zeros_like(probs).scatter_(-1, si, torch.where(keep, sp, torch.zeros_like(sp)))
    return probs / probs.sum(-1, keepdim=True)


# Below this temperature the logits are shifted so the row's max is 0 before the division: the
# same law, and no overflow to inf however small T is (``_validate.MIN_TEMPERATURE`` bounds T).
_SHIFT_BELOW_T = 1e-3

# The top-k / top-p cut without sorting the vocabulary (CPU, V > _HEAD_MIN_V): the head of the
# stable descending order comes from _scan.top_desc_stable (exact, ties to the lower id), in
# heads of _HEADS tokens until the top-p boundary falls inside one. The full sort above is the
# reference and the fallback: a row whose cut is not decided by a head is cut by the sort.
_HEAD_MIN_V = 4096
_HEADS = (256, 4096)
# the full path's float32 sums (the sorted row's total, its cumulative sums) round differently
# from the float64 sums used here (by about 1e-6 of the total at V = 151,936); a head token whose
# mass-before lies within this fraction of the total from the threshold could be decided
# differently, so such rows go to the full sort
_P_MARGIN = 1e-5


def _cut_head(probs: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor | None:
    """The kept probabilities (unnormalised, zero elsewhere) of the full path's cut, or None
    when a head cannot decide it (the caller then sorts). probs ``[..., V]``."""
    from ._scan import top_desc_stable

    V = probs.shape[-1]
    flat = probs.reshape(-1, V)
    if top_p is None:  # top-k only: the first top_k of the stable order, no sums involved
        ids = top_desc_stable(flat, top_k)
        return torch.zeros_like(flat).scatter_(-1, ids, flat.gather(-1, ids)).reshape(probs.shape)
    if top_k is not None:  # the top-k mass: a sum over a set of values, whatever their order
        if top_k >= V // 2:
            return None
        total = torch.topk(flat, top_k, dim=-1, sorted=False).values.sum(-1, keepdim=True, dtype=torch.float64)
    else:
        total = flat.sum(-1, keepdim=True, dtype=torch.float64)  # [R, 1]
    thr = top_p * total
    for m in _HEADS:
        m = min(m, top_k) if top_k is not None else m
        if m >= V // 2:
            return None
        ids = top_desc_stable(flat, m)  # [R, m], the first m of the stable descending order
        sp = flat.gather(-1, ids)
        sp64 = sp.double()
        before = torch.cumsum(sp64, -1) - sp64  # mass strictly before each head token (float64)
        if bool(((before - thr).abs() <= _P_MARGIN * total).any()):
            return None  # a boundary too close to call against the full path's float32 sums
        keep = before < thr
        keep[:, 0] = True
        # decided when the head holds the cut: a token outside it in every row, or the whole top-k
        if not (top_k is not None and m == top_k) and not bool((~keep).any(-1).all()):
            continue
        vals = torch.where(keep, sp, torch.zeros((), dtype=sp.dtype))
        return torch.zeros_like(flat).scatter_(-1, ids, vals).reshape(probs.shape)
    return None


def sample_token(p: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token from a processed distribution ``p [V]`` (inverse CDF with one uniform); int64 scalar."""
    c = torch.cumsum(p.double(), -1)
    u = torch.rand((), generator=generator, dtype=torch.float64, device=p.device)
    idx = torch.searchsorted(c, (u * c[-1]).reshape(1), right=True)[0]
    idx = idx.clamp(max=p.shape[-1] - 1)
    # never return a zero-probability token (guards the float edge where u*c[-1] == c[-1])
    if bool(p[idx] <= 0):
        idx = torch.nonzero(p > 0).flatten()[-1]
    return idx
