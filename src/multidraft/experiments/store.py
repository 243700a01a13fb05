"""Compact storage of (target, draft) next-token distributions at sampled positions.

A full distribution of the default pair is V = 151,936 floats. A position is stored as the
*lumped* pair over a support ``S`` plus one "other" token ``o`` carrying the tail mass
``p(T)``, ``q(T)`` of ``T = V \\ S``:

* ``S`` = the smallest top-p prefix with ``p(T_p) <= eps``, united with the smallest top-q
  prefix of at least ``k_max`` tokens with ``q(T_q) <= eps`` **and** ``q(T_q) < q_(k_max - 1)``
  (the (k_max-1)-th largest q), so the greedy law's top set is made of real tokens and ``o``
  never outranks them; ``S`` is kept sorted by token id, so ties break as in the full vocab.
* On disk: ragged ``ids`` (int32), ``p`` and ``q`` (float32) over ``S`` with row offsets,
  and the tails ``p_tail``, ``q_tail`` (float64). Memory and disk per position are
  ``O(|S|)``. There is no fixed support cap: ``|S|`` is chosen per position, as large as
  ``eps`` needs (a flat KJV row may need most of the vocabulary), so every stored tail is
  ``<= eps``; the support size and both tails are recorded per position. (Until 2026-12 a
  fixed cap of 16,384 tokens applied, which left up to 0.025 of p outside on KJV.) An
  explicit ``max_support`` (``relump``, ``--eval-support``) still caps it; then the tail
  actually kept is recorded and used in the bounds.

Bounds (proved in ``docs/results/paper/README.md``, section "What is stored, and the truncation bound"):
``0 <= alpha*_lumped - alpha* <= p(T)`` for the iid, greedy and independent laws, and
``|alpha*_lumped - alpha*| <= p(T) + q(T)^2 (sum_{j<K-1} 1/r_j)^2`` for the without-replacement
law, ``r_j = q(S) - (mass of the j largest q in S)``; :func:`alpha_bounds` computes them.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

FORMAT = "multidraft-positions/1"

__all__ = ["FORMAT", "PositionSet", "truncate", "lumped", "lumped_qs", "without_qs", "relump", "alpha_bounds", "save", "load",
           "check"]


@dataclass
class PositionSet:
    """Lumped distributions of N positions (ragged over the support)."""

    ids: torch.Tensor        # [total] int32, token ids of S, row after row (sorted by id within a row)
    p: torch.Tensor          # [total] float32, target probs on S
    q: torch.Tensor          # [total] float32, draft probs on S
    offsets: torch.Tensor    # [N + 1] int64, row i is ids[offsets[i]:offsets[i+1]]
    p_tail: torch.Tensor     # [N] float64, p(T)
    q_tail: torch.Tensor     # [N] float64, q(T)
    info: dict = field(default_factory=dict)  # dataset, config, models, V, eps, per-position source
    # optional: J more draft distributions on the same support (the independent law's per-draft
    # rows, the draft model at info["independent_temperatures"]) and their tails
    qs: torch.Tensor | None = None       # [total, J] float32
    qs_tail: torch.Tensor | None = None  # [N, J] float64

    def __len__(self) -> int:
        return int(self.offsets.numel() - 1)

    @property
    def support_sizes(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def nbytes(self) -> int:
        parts = (self.ids, self.p, self.q, self.offsets, self.p_tail, self.q_tail, self.qs, self.qs_tail)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)


def _prefix_len(sorted_vals: torch.Tensor, eps: float, offset: torch.Tensor | None = None) -> torch.Tensor:
    """Per row, the smallest m with offset + sum(sorted_vals[m:]) <= eps (or m = V).  sorted_vals [R, V] descending."""
    tail = sorted_vals.flip(-1).cumsum(-1).flip(-1)  # tail[m] = sum of entries m..V-1
    tail = torch.cat([tail, torch.zeros_like(tail[:, :1])], -1)
    if offset is not None:
        tail = tail + offset.unsqueeze(-1)
    ok = tail <= eps  # [R, V+1], monotone
    ok[:, -1] = True
    return ok.to(torch.int8).argmax(-1)


_NBINS = 2048  # the 11 exponent bits of a nonnegative float64 (bin 0: zeros and subnormals)


def _top_candidates(x: torch.Tensor, eps: float, min_len: int, offset: torch.Tensor | None = None):
    """The top of each row of ``x`` ``[R, V]`` (float64, >= 0) in the order of a stable descending sort,
    cut where the rest cannot matter: ``(ids [R, C], vals [R, C], low [R], n [R])``, n the row's real tokens.

    Tokens are binned by binary exponent (one pass over the bit patterns, which increase with
    the value); a row keeps the tokens of every bin at or above the highest bin b such that
    the mass of the bins below b is <= eps and at least ``min_len`` tokens are kept; ``low``
    is that left-out mass. Every token left out is smaller than every token kept, so the kept
    ones, stably sorted, are exactly the head of the full stable sort, and any prefix whose
    tail is <= eps (tail = mass after it in the kept list + ``low`` + ``offset``, mass lumped
    elsewhere ``[R]``) lies inside. Rows keeping more than V/8 tokens are sorted whole (low = 0).
    Rows are padded to C with value 0 after their real tokens."""
    R, V = x.shape
    b = x.contiguous().view(torch.int64) >> 52  # [R, V] biased exponent, monotone in x >= 0
    mass = torch.zeros(R, _NBINS, dtype=torch.float64).scatter_add_(1, b, x)
    cnt = torch.bincount((b + torch.arange(R).unsqueeze(1) * _NBINS).reshape(-1), minlength=R * _NBINS).view(R, _NBINS)
    below = mass.cumsum(-1) - mass  # [R, NB] mass of the bins strictly below
    kept = cnt.flip(-1).cumsum(-1).flip(-1)  # [R, NB] tokens in the bins at or above
    ok = ((below + offset.unsqueeze(-1) if offset is not None else below) <= eps) & (kept >= min(min_len, V))
    ok[:, 0] = True  # keeping everything always satisfies both
    bstar = (ok.to(torch.int64).cumsum(-1) * ok).argmax(-1, keepdim=True)  # [R, 1] highest ok bin (ok is a prefix)
    low = below.gather(-1, bstar).squeeze(-1)
    n_keep = kept.gather(-1, bstar).squeeze(-1)  # [R]
    big = n_keep * 8 > V
    C = V if bool(big.any()) else int(n_keep.max())
    idx = torch.zeros(R, C, dtype=torch.int64)
    vals = torch.zeros(R, C, dtype=x.dtype)
    small = (~big).nonzero().squeeze(-1)
    if small.numel():
        c = int(n_keep[small].max())
        xs = x[small]
        key = torch.where(b[small] >= bstar[small], xs, torch.full_like(xs, -1.0))
        ci = torch.topk(key, c, dim=-1, sorted=False).indices.sort(-1).values  # [r, c] candidates by id
        cv = key.gather(-1, ci)
        order = torch.sort(cv, dim=-1, descending=True, stable=True).indices  # (value desc, id asc)
        idx[small, :c] = ci.gather(-1, order)
        vals[small, :c] = cv.gather(-1, order).clamp_min(0.0)
    if bool(big.any()):
        rows = big.nonzero().squeeze(-1)
        vals[rows], idx[rows] = torch.sort(x[rows], dim=-1, descending=True, stable=True)
        low = torch.where(big, torch.zeros_like(low), low)
        n_keep = torch.where(big, torch.full_like(n_keep, V), n_keep)
    return idx, vals, low, n_keep


def _q_ok(q_sorted: torch.Tensor, offset: torch.Tensor, eps: float, k_max: int) -> torch.Tensor:
    """``[R, C+1]``: where a prefix of the stably sorted draft rows ``q_sorted`` ``[R, C]`` may stop:
    at least k_max tokens, tail (after it, plus ``offset`` ``[R]``) <= eps and < the (k_max-1)-th largest q, or 0."""
    R = q_sorted.shape[0]
    tail = torch.cat([q_sorted.flip(-1).cumsum(-1).flip(-1), torch.zeros_like(q_sorted[:, :1])], -1) + offset.unsqueeze(-1)
    kth = q_sorted[:, max(0, k_max - 2)].unsqueeze(-1) if k_max >= 2 else torch.full((R, 1), float("inf"), dtype=q_sorted.dtype)
    return (tail <= eps) & ((tail < kth) | (tail == 0)) & (torch.arange(q_sorted.shape[-1] + 1).unsqueeze(0) >= k_max)


def _q_prefix(q: torch.Tensor, eps: float, k_max: int, q_offset: torch.Tensor | None):
    """``(ids [R, C], m [R])``: the draft's prefix (at least k_max tokens, tail <= eps and tail <
    the (k_max-1)-th largest q, or 0) in stable descending order."""
    R, V = q.shape
    off = q_offset if q_offset is not None else torch.zeros(R, dtype=q.dtype)
    qi, q_sorted, low, n = _top_candidates(q, eps, k_max, q_offset)
    C = q_sorted.shape[-1]
    okq = _q_ok(q_sorted, low + off, eps, k_max)
    okq[:, -1] |= n == V  # a row holding every token may take them all (as the full sort does)
    found = okq.any(-1)
    mq = okq.to(torch.int8).argmax(-1)
    if bool(found.all()):
        return qi, mq
    # rows whose prefix reaches past the candidates (the kth condition): the full stable sort
    rows = (~found).nonzero().squeeze(-1)
    full_s, full_i = torch.sort(q[rows], dim=-1, descending=True, stable=True)
    ok = _q_ok(full_s, off[rows], eps, k_max)
    ok[:, -1] = True
    out_i = torch.cat([qi, torch.zeros(R, V - C, dtype=qi.dtype)], -1) if V > C else qi.clone()
    out_i[rows] = full_i
    mq = mq.clone()
    mq[rows] = ok.to(torch.int8).argmax(-1)
    return out_i, mq


def truncate(p: torch.Tensor, q: torch.Tensor, *, eps: float, k_max: int, max_support: int | None = None,
             p_offset: torch.Tensor | None = None, q_offset: torch.Tensor | None = None, qs: torch.Tensor | None = None):
    """Supports and lumped values for full distributions.

    p, q ``[R, V]`` float64 (rows normalised, or summing to ``1 - offset`` when
    ``p_offset``/``q_offset`` ``[R]`` give mass already lumped elsewhere). Returns a list of
    R tuples ``(ids int64 [m], p_S float64 [m], q_S float64 [m], p_tail, q_tail)`` where the
    tails ``1 - sum(p_S)`` include the offsets. With ``qs`` ``[R, J, V]`` (more draft
    distributions, normalised), ``S`` also holds each one's smallest prefix with tail <= eps
    and every tuple gets two more entries, ``qs_S float64 [J, m]`` and ``qs_tail float64 [J]``.
    ``max_support``: None (default) keeps each prefix as long as ``eps`` needs (every tail
    ``<= eps``); an integer caps each model's prefix at that many tokens (the tail kept is then
    what is returned, possibly above ``eps``).
    """
    if p.shape != q.shape or p.ndim != 2:
        raise ValueError(f"target and draft probabilities must both be [R, V], got {tuple(p.shape)} and {tuple(q.shape)}")
    if not 0 <= eps < 1:
        raise ValueError(f"eps must be in [0, 1), got {eps}")
    R, V = p.shape
    k_max = max(1, min(int(k_max), V))
    zero = torch.zeros(R, dtype=torch.float64)
    pi, ps, p_low, _ = _top_candidates(p, eps, 1, p_offset)
    mp = _prefix_len(ps, eps, p_low + (p_offset if p_offset is not None else zero))
    qi, mq = _q_prefix(q, eps, k_max, q_offset)
    extra = []
    if qs is not None:
        if qs.ndim != 3 or qs.shape[0] != R or qs.shape[-1] != V:
            raise ValueError(f"qs must be [R, J, V] = [{R}, J, {V}], got {tuple(qs.shape)}")
        for j in range(qs.shape[1]):  # J is a handful of draft temperatures
            ij, sj, low, _ = _top_candidates(qs[:, j], eps, 1)
            extra.append((ij, _prefix_len(sj, eps, low)))
    cap = V if max_support is None else int(max_support)
    out = []
    for r in range(R):  # R is the number of sampled positions in one text (small)
        a, b = int(min(int(mp[r]), cap)), int(min(int(mq[r]), cap))
        parts = [pi[r, :a], qi[r, :b]] + [ij[r, : int(min(int(mj[r]), cap))] for ij, mj in extra]
        ids = torch.unique(torch.cat(parts))  # sorted by id
        pS, qS = p[r, ids], q[r, ids]
        p_tail = float((1.0 - pS.sum()).clamp_min(0.0))
        q_tail = float((1.0 - qS.sum()).clamp_min(0.0))
        if qs is None:
            out.append((ids, pS, qS, p_tail, q_tail))
        else:
            qsS = qs[r][:, ids]  # [J, m]
            out.append((ids, pS, qS, p_tail, q_tail, qsS, (1.0 - qsS.sum(-1)).clamp_min(0.0)))
    return out


def from_rows(rows, info: dict) -> PositionSet:
    """Build a PositionSet from :func:`truncate` rows."""
    if not rows:
        raise ValueError("no positions to store (empty dataset)")
    sizes = torch.tensor([r[0].numel() for r in rows], dtype=torch.long)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    if len({len(r) for r in rows}) != 1:
        raise ValueError("rows must all have, or all lack, the extra draft distributions (qs)")
    with_qs = len(rows[0]) == 7
    return PositionSet(
        ids=torch.cat([r[0] for r in rows]).to(torch.int32),
        p=torch.cat([r[1] for r in rows]).to(torch.float32),
        q=torch.cat([r[2] for r in rows]).to(torch.float32),
        offsets=offsets,
        p_tail=torch.tensor([r[3] for r in rows], dtype=torch.float64),
        q_tail=torch.tensor([r[4] for r in rows], dtype=torch.float64),
        info=dict(info),
        qs=torch.cat([r[5].T for r in rows]).to(torch.float32) if with_qs else None,
        qs_tail=torch.stack([torch.as_tensor(r[6], dtype=torch.float64) for r in rows]) if with_qs else None,
    )


def without_qs(ps: PositionSet) -> PositionSet:
    """The same positions without the independent law's extra draft rows (same support)."""
    return PositionSet(ids=ps.ids, p=ps.p, q=ps.q, offsets=ps.offsets, p_tail=ps.p_tail, q_tail=ps.q_tail,
                       info=dict(ps.info))


def relump(ps: PositionSet, *, eps: float, k_max: int, max_support: int | None = None) -> PositionSet:
    """A coarser lumping of a stored set: the old "other" token and everything dropped now
    form the new tail (a lumping of a lumping is a lumping, so the bounds hold with the new
    tails). Used to bound evaluation cost; the tails in force are reported."""
    if ps.qs is not None:
        raise ValueError("this position store holds independent-law draft rows (qs); relumping it "
                         "(--eval-support) is not supported: evaluate it on its stored support")
    rows = []
    for i in range(len(ps)):
        a, b = int(ps.offsets[i]), int(ps.offsets[i + 1])
        p, q = ps.p[a:b].double()[None], ps.q[a:b].double()[None]
        (keep, pS, qS, pt, qt), = truncate(p, q, eps=eps, k_max=k_max, max_support=max_support,
                                           p_offset=ps.p_tail[i : i + 1], q_offset=ps.q_tail[i : i + 1])
        rows.append((ps.ids[a:b][keep].long(), pS, qS, max(pt, float(ps.p_tail[i])), max(qt, float(ps.q_tail[i]))))
    info = dict(ps.info)
    info["relumped"] = {"eps": eps, "max_support": max_support}
    return from_rows(rows, info)


def lumped(ps: PositionSet, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense lumped float64 distributions ``(P [n, M+1], Q [n, M+1])``.

    Columns 0..M-1 hold the support (padded with zeros), column M the "other" token. Rows
    are renormalised in float64 (the float32 storage rounding is below 1e-6 per row).
    """
    idx = torch.arange(len(ps)) if rows is None else rows
    sizes = ps.support_sizes[idx]
    M = int(sizes.max()) if idx.numel() else 0
    n = idx.numel()
    P = torch.zeros(n, M + 1, dtype=torch.float64)
    Q = torch.zeros(n, M + 1, dtype=torch.float64)
    for j, i in enumerate(idx.tolist()):
        a, b = int(ps.offsets[i]), int(ps.offsets[i + 1])
        P[j, : b - a] = ps.p[a:b].double()
        Q[j, : b - a] = ps.q[a:b].double()
    P[:, M] = ps.p_tail[idx]
    Q[:, M] = ps.q_tail[idx]
    P = P / P.sum(-1, keepdim=True)
    Q = Q / Q.sum(-1, keepdim=True)
    return P, Q


def lumped_qs(ps: PositionSet, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Dense lumped float64 extra draft distributions ``[n, J, M+1]``, columns as in :func:`lumped`
    (same ``rows``, same support padding, column M the "other" token); ValueError without qs."""
    if ps.qs is None:
        raise ValueError("this position store has no independent-law draft rows (collect it with independent temperatures)")
    idx = torch.arange(len(ps)) if rows is None else rows
    M = int(ps.support_sizes[idx].max()) if idx.numel() else 0
    out = torch.zeros(idx.numel(), ps.qs.shape[1], M + 1, dtype=torch.float64)
    for j, i in enumerate(idx.tolist()):
        a, b = int(ps.offsets[i]), int(ps.offsets[i + 1])
        out[j, :, : b - a] = ps.qs[a:b].double().T
    out[:, :, M] = ps.qs_tail[idx]
    return out / out.sum(-1, keepdim=True)


def alpha_bounds(Q: torch.Tensor, p_tail: torch.Tensor, q_tail: torch.Tensor, law: str, k: int) -> torch.Tensor:
    """Per position, the proved bound on ``|alpha*_lumped - alpha*_full|`` ``[n]``.

    Q ``[n, M+1]`` lumped draft probs (last column the tail), tails ``[n]``.
    """
    if law in ("iid", "greedy", "independent") or k <= 1:
        return p_tail.clone()
    if law != "wor":
        raise ValueError(f"law must be 'iid', 'wor', 'greedy' or 'independent', got {law!r}")
    qS = Q[:, :-1]
    top = torch.sort(qS, -1, descending=True).values[:, : k - 1]  # [n, K-1]
    mass_S = qS.sum(-1, keepdim=True)
    before = torch.cumsum(top, -1) - top  # mass of the j largest, j = 0..K-2
    r = (mass_S - before).clamp_min(0.0)
    inv = torch.where(r > 0, 1.0 / torch.where(r > 0, r, 1.0), torch.full_like(r, float("inf"))).sum(-1)
    tv = (q_tail**2 * inv**2).clamp(max=1.0)
    tv = torch.where(q_tail == 0, torch.zeros_like(tv), tv)
    return (p_tail + tv).clamp(max=1.0)


def full_interval(alpha: torch.Tensor, lower: torch.Tensor, bound: torch.Tensor, law: str, k: int):
    """Per position, the certified interval ``(lo [n], hi [n])`` holding alpha* at full V.

    ``alpha`` ``[n]`` is alpha* on the stored pair (for the independent law the upper end of its
    certified bounds), ``lower`` ``[n]`` the lower end (``alpha`` for the exact laws), ``bound``
    ``[n]`` :func:`alpha_bounds`. Lemma 1 gives ``0 <= alpha*_stored - alpha*_full <= p(T)``
    for iid, greedy, independent drafts and every law at K = 1, so ``[lower - bound, alpha]``;
    without replacement at K >= 2 the bound is two-sided, ``[alpha - bound, alpha + bound]``;
    both cut to ``[0, 1]``. The same rule on row means is
    :func:`.records.alpha_interval_fields`."""
    if law == "wor" and k >= 2:
        lo, hi = alpha - bound, alpha + bound
    else:
        lo, hi = torch.minimum(lower, alpha) - bound, alpha.clone()
    return lo.clamp(0.0, 1.0), hi.clamp(0.0, 1.0)


def save(ps: PositionSet, path: str | os.PathLike) -> None:
    """Write atomically (a temporary file renamed), so an interrupt never leaves a torn store."""
    path = Path(path)
    from .records import ensure_dir

    ensure_dir(path.parent, "position store directory")
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        _save(ps, tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OSError(exc.errno, f"cannot write the position store ({exc.strerror or exc})", str(path)) from None
        if isinstance(exc, RuntimeError):  # torch's stream writer reports a full disk this way
            raise OSError(f"{path}: cannot write the position store ({' '.join(str(exc).split())[:200]})") from None
        raise


def _save(ps: PositionSet, tmp: Path) -> None:
    torch.save(
        {
            "format": FORMAT,
            "ids": ps.ids, "p": ps.p, "q": ps.q, "offsets": ps.offsets,
            "p_tail": ps.p_tail, "q_tail": ps.q_tail,
            "info": json.dumps(ps.info),
            **({"qs": ps.qs, "qs_tail": ps.qs_tail} if ps.qs is not None else {}),
        },
        tmp,
    )


def load(path: str | os.PathLike) -> PositionSet:
    """Read a store; ``ValueError`` naming the file when it is not a valid one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "no position store", str(path))
    try:
        with open(path, "rb") as f:
            d = torch.load(f, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot read the position store ({exc.strerror or exc})", str(path)) from None
    except Exception:  # noqa: BLE001
        # never relay torch's text: for a non-tensor pickle it suggests weights_only=False,
        # i.e. unpickling an untrusted file. Only tensors, dicts and strings are ever read.
        raise ValueError(f"{path} is not a readable position store (corrupt, truncated or not made by multidraft); "
                         "delete it to collect it again") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ValueError(f"{path} is not a multidraft position store (expected format {FORMAT!r})")
    try:
        ps = PositionSet(
            ids=d["ids"], p=d["p"], q=d["q"], offsets=d["offsets"],
            p_tail=d["p_tail"], q_tail=d["q_tail"], info=json.loads(d["info"]),
            qs=d.get("qs"), qs_tail=d.get("qs_tail"),
        )
    except KeyError as exc:
        raise ValueError(f"{path} is a damaged position store (missing {exc})") from None
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is a damaged position store (info is not JSON: {' '.join(str(exc).split())[:120]})") from None
    problem = check(ps)
    if problem:
        raise ValueError(f"{path} is a damaged position store ({problem}); delete it to collect it again")
    return ps


MASS_TOL = 1e-3  # |sum over the support + tail - 1| of a stored row (float32 storage rounds by < 1e-6)


def check(ps: PositionSet) -> str | None:
    """What is wrong with a position set, or None: every tensor's type, dtype and shape, the
    offsets (0 first, nondecreasing, the last the number of stored entries), the token ids
    (>= 0, below ``info['V']`` when given), finiteness and range of every probability and tail,
    and each position's total mass (support + tail = 1 within ``MASS_TOL``). Positions are
    named by their index. Vectorised over the whole set."""
    tensors = {"ids": ps.ids, "p": ps.p, "q": ps.q, "offsets": ps.offsets, "p_tail": ps.p_tail, "q_tail": ps.q_tail}
    if ps.qs is not None or ps.qs_tail is not None:
        tensors.update(qs=ps.qs, qs_tail=ps.qs_tail)
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            return f"{name} is a {type(t).__name__}, not a tensor"
    for name in ("ids", "offsets"):
        if tensors[name].is_floating_point() or tensors[name].is_complex() or tensors[name].dtype == torch.bool:
            return f"{name} must hold integers, got dtype {tensors[name].dtype}"
    for name in ("p", "q", "p_tail", "q_tail") + (("qs", "qs_tail") if ps.qs is not None else ()):
        if not tensors[name].is_floating_point():
            return f"{name} must hold floating-point probabilities, got dtype {tensors[name].dtype}"
    want_ndim = {"ids": 1, "p": 1, "q": 1, "offsets": 1, "p_tail": 1, "q_tail": 1, "qs": 2, "qs_tail": 2}
    for name, t in tensors.items():
        if t.ndim != want_ndim[name]:
            return f"{name} must be {want_ndim[name]}-D, got shape {tuple(t.shape)}"
    if not isinstance(ps.info, dict):
        return f"info must be an object, got {type(ps.info).__name__}"
    off = ps.offsets.long()
    n, total = off.numel() - 1, ps.ids.numel()
    if n < 1:
        return "no positions (offsets has fewer than 2 entries)"
    if int(off[0]) != 0 or int(off[-1]) != total:
        return f"offsets must run from 0 to the {total} stored entries, got {int(off[0])} .. {int(off[-1])}"
    step = off[1:] - off[:-1]
    if bool((step < 0).any()):
        i = int((step < 0).nonzero()[0])
        return f"offsets decrease at position {i} ({int(off[i])} -> {int(off[i + 1])})"
    for name in ("p", "q"):
        if tensors[name].numel() != total:
            return f"{name} has {tensors[name].numel()} entries, ids {total}"
    for name in ("p_tail", "q_tail"):
        if tensors[name].numel() != n:
            return f"{name} has {tensors[name].numel()} entries for {n} positions"
    if ps.qs is not None:
        if ps.qs.shape[0] != total or tuple(ps.qs_tail.shape) != (n, ps.qs.shape[1]):
            return f"qs {tuple(ps.qs.shape)} and qs_tail {tuple(ps.qs_tail.shape)} must be [{total}, J] and [{n}, J]"
    ids = ps.ids.long()
    V = ps.info.get("V")
    if total and (int(ids.min()) < 0 or (isinstance(V, int) and int(ids.max()) >= V)):
        return f"token ids must lie in [0, {V if isinstance(V, int) else 'V'}), got {int(ids.min())} .. {int(ids.max())}"
    row = torch.repeat_interleave(torch.arange(n), step)  # [total] the position of each stored entry

    def bad_rows(x: torch.Tensor, per_entry: bool) -> torch.Tensor:  # positions with a non-finite or out-of-range value
        b = ~torch.isfinite(x) | (x < 0) | (x > 1 + 1e-6)
        if b.ndim == 2:
            b = b.any(-1)
        return row[b] if per_entry else b.nonzero().squeeze(-1)

    for name, per_entry in (("p", True), ("q", True), ("p_tail", False), ("q_tail", False), ("qs", True), ("qs_tail", False)):
        if tensors.get(name) is None:
            continue
        b = bad_rows(tensors[name].double(), per_entry)
        if b.numel():
            return f"position {int(b[0])}: {name} is NaN, infinite or outside [0, 1]"
    for name, vals, tail in (("p", ps.p, ps.p_tail), ("q", ps.q, ps.q_tail)) + \
            ((("qs", ps.qs, ps.qs_tail),) if ps.qs is not None else ()):
        v = vals.double()
        mass = torch.zeros((n,) + tuple(v.shape[1:]), dtype=torch.float64).index_add_(0, row, v) + tail.double()
        dev = (mass - 1).abs()
        if dev.ndim == 2:
            dev = dev.amax(-1)
        if bool((dev > MASS_TOL).any()):
            i = int((dev > MASS_TOL).nonzero()[0])
            m = mass[i] if mass.ndim == 1 else mass[i][(mass[i] - 1).abs().argmax()]
            return f"position {i}: {name} and its tail sum to {float(m):.6g}, not 1"
    return None
