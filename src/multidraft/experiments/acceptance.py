"""Acceptance experiment: alpha* and every verifier's acceptance on stored positions.

For each position (a lumped (p, q) pair, see :mod:`.store`), each draft law (iid, wor,
greedy) and K:

* ``alpha*`` exactly, batched (``multidraft.optimal_acceptance``);
* each verifier's acceptance ``P(output in drafts)`` per position: draw ``draws`` draft
  tuples from the law and average the *exact* conditional acceptance
  ``P(output in drafts | drafts)`` from ``v.output_distribution`` (Rao-Blackwell,
  ``estimator = "rao-blackwell"``); a verifier whose ``output_distribution`` raises
  ``NotImplementedError`` is estimated by plain Monte Carlo, one ``v.verify`` per draw and
  the indicator ``accepted_index >= 0`` (``estimator = "monte-carlo"``).

Errors (every verifier row; the estimator of a cell is the mean over the n stored positions
of the per-position estimates ``a_i``):

* ``se``: standard error OVER POSITIONS, ``sd(a_i) / sqrt(n)`` (it contains the Monte-Carlo
  error of each ``a_i``; this is the error bar a table shows);
* ``se_mc``: the Monte-Carlo error alone, ``sqrt(sum_i var(a_i)) / n`` (the error of the
  mean over *these* positions; ``se`` of rows written before this field existed);
* ``gap``, ``gap_se``: the PAIRED gap to alpha*, ``gap_i = alpha*_i - a_i`` on the same
  positions, ``gap = mean(gap_i)``, ``gap_se = sd(gap_i) / sqrt(n)``; ``gap_pct`` and
  ``gap_pct_se`` are the same relative to mean alpha*, in percent.

alpha* rows are exact per position (``se_mc = 0``); their ``se`` is the one over positions
too, and ``lump_bound_mean/max`` is the proved bound on alpha* from lumping the tail,
``p_tail_max``/``q_tail_max`` the largest tail masses in force. alpha* is exact on the
stored support; at full V the row's mean is certified to ``[alpha_full_lower,
alpha_full_upper]`` (:func:`.store.full_interval`, averaged over positions) and
``alpha_exact`` is true when that interval is at most ``records.EXACT_TOL`` = 1e-3 wide (the
report prints the interval where it is not). Every row carries
``eval_support`` and, when it is set (relumping to at most N tokens, a hidden truncation),
``eval_support_warning``. ``values`` are the per-position means rounded to 1e-6 (same
positions, same order for every row of a (dataset, temperatures, law, K)), so paired
differences between verifiers can be formed from the JSONL alone; all the errors above
are computed from full-precision values.

One JSONL row per (dataset, temperatures, law, K, verifier) with fields ``law``, ``K``,
``verifier``, ``acceptance``, ``se``, ``se_mc`` (``verifier = "alpha*"`` for the optimum). The file is
bound to the run's config (:mod:`.records`): a rerun with the same settings skips the
finished rows, a rerun that only adds Ks, laws, verifiers, datasets or temperatures
(``KEYED``) extends it, any other change is refused naming the keys.
:func:`run_experiment` is the whole experiment (collect, evaluate) behind
``multidraft experiment acceptance|temperature``.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from .. import drafts as _drafts
from .. import verifiers as _verifiers
from .._validate import ArgumentError, as_int, as_ks, as_temperature, as_top_k, as_top_p, derive_seed
from ..datasets import check_dataset
from ..exact import acceptance_given
from ..limits import optimal_acceptance
from . import collect as _collect
from . import store
from .records import EXACT_TOL, SCHEMAS, JsonlWriter, lock_run_dir, read_jsonl, resume, row_key, valid_rows

__all__ = ["KEY", "KEYED", "LAWS", "DEFAULT_EXCLUDE", "SHARD", "optimal", "optimal_bounds", "make_law", "verifier_acceptance",
           "shards", "shard_acceptance", "local_map", "CellShards", "cell_shards", "cell_acceptance", "evaluate",
           "default_verifiers", "position_errors", "run", "run_experiment", "AcceptanceConfig", "ExperimentResult",
           "read_along", "along_alphas", "tree_acceptance"]

KEY = SCHEMAS["acceptance"].key  # ("dataset", "t_target", "t_draft", "top_k", "top_p", "law", "K", "verifier")
# config keys that only choose which rows exist (each row carries them in KEY): may grow on a resume
KEYED = ("k", "laws", "verifiers", "datasets", "temperatures")
# a stored position holds one draft distribution, and optionally J more (PositionSet.qs) for
# the independent law: its K <= J drafts come from the store's independent temperatures t_1..t_K
LAWS = tuple(_drafts.SHARED_Q_KINDS) + ("independent",)
# lp_optimal solves an LP over all V^K tuples: reference for tiny V only
DEFAULT_EXCLUDE = ("lp_optimal",)
CHUNK_ELEMS = 1 << 21  # float64 elements per Monte-Carlo chunk (16 MiB)
# positions per unit of work: each shard of a cell draws from its own generator, seeded by
# (seed, cell, shard), so a run sharded over processes reproduces the single-process rows
SHARD = 64


def default_verifiers() -> list[str]:
    return [n for n in _verifiers.names() if n not in DEFAULT_EXCLUDE]


def make_law(Q: torch.Tensor, law: str, k: int):
    """The draft law object of kind ``law`` (a checked kind, ``AcceptanceConfig.laws``) for
    draft probs Q ``[..., V]``."""
    return _drafts.make(law, Q, k)


def optimal(P: torch.Tensor, Q: torch.Tensor, law: str, k: int) -> torch.Tensor:
    """alpha* per position, float64 ``[n]``.  P ``[n, V]``, Q ``[n, V]`` (``[n, K, V]`` for independent).

    For the independent law this is the certified upper bound (see :func:`optimal_bounds`)."""
    return optimal_bounds(P, Q, law, k)[0]


def optimal_bounds(P: torch.Tensor, Q: torch.Tensor, law: str, k: int):
    """``(alpha* [n], lower [n])`` float64: alpha* per position and a certified lower bound on it.

    Exact laws (iid, wor, greedy) have ``lower == alpha*``; for ``independent`` alpha* is the
    upper end of certified bounds (``optimal_acceptance(..., return_bounds=True)``)."""
    out = optimal_acceptance(P, make_law(Q, law, k), return_bounds=True)
    shape = P.shape[:-1]
    value = torch.as_tensor(out.value, dtype=torch.float64).reshape(shape)
    return value, torch.as_tensor(out.lower, dtype=torch.float64).reshape(shape)


def verifier_acceptance(v, P: torch.Tensor, Q: torch.Tensor, law: str, k: int, draws: int, generator: torch.Generator):
    """Per-position acceptance estimate and its variance ``([n], [n], estimator)``.

    P, Q ``[n, V]`` float64. The per-draw value is the exact conditional acceptance
    ``P(output in drafts | drafts)`` (Rao-Blackwell); the variance returned is the one of
    the per-position mean (already divided by ``draws``). Draws are taken in chunks of
    ``CHUNK_ELEMS`` float64 elements.
    """
    if draws < 2:
        raise ValueError(f"draws must be >= 2 (for a standard error), got {draws}")
    n, V = P.shape
    law_obj = make_law(Q, law, k)
    chunk = max(1, min(draws, CHUNK_ELEMS // max(1, n * V)))
    prepared = v.prepare(P, Q, law=law)  # the rule's work on (P, Q) alone, once for every chunk
    s1 = torch.zeros(n, dtype=torch.float64)
    s2 = torch.zeros(n, dtype=torch.float64)
    done = 0
    est = "rao-blackwell"
    while done < draws:
        c = min(chunk, draws - done)
        x = law_obj.sample(generator, num_samples=c)  # [c, n, K]
        a = None
        if est == "rao-blackwell":
            try:
                out = prepared.output_distribution(x)  # [c, n, V]
                a = acceptance_given(out, x)  # [c, n]
            except NotImplementedError:
                est = "monte-carlo"
                if done:  # never mix the two estimators within a cell
                    s1.zero_(), s2.zero_()
                    done = 0
                    continue
        if a is None:  # plain Monte Carlo: the indicator that the sampled output is a draft
            Pc = P.unsqueeze(0).expand(c, n, V)
            Qc = Q.unsqueeze(0).expand(c, *Q.shape)  # [c, n, V] ([c, n, K, V] for independent)
            verdict = v.verify(Pc, Qc, x, generator, law=law)
            a = (verdict.accepted_index >= 0).to(torch.float64)  # [c, n]
        s1 += a.sum(0)
        s2 += (a * a).sum(0)
        done += c
    mean = s1 / draws
    var = ((s2 - draws * mean * mean) / (draws - 1)).clamp_min(0.0)
    return mean, var / draws, est


def _sd(x: torch.Tensor) -> float:
    """Sample standard deviation of ``x`` ``[n]`` (0 for n < 2)."""
    return float(x.std()) if x.numel() > 1 else 0.0


def position_errors(values: torch.Tensor, alpha: torch.Tensor | None = None, var_mc: torch.Tensor | None = None) -> dict:
    """The error fields of one cell from full-precision per-position estimates.

    values ``[n]`` (a_i), alpha ``[n]`` (alpha*_i on the same positions), var_mc ``[n]``
    (Monte-Carlo variance of each a_i). Returns ``se`` = sd(a_i)/sqrt(n), ``se_mc`` =
    sqrt(sum var_mc)/n and, with alpha, the paired ``gap``, ``gap_se``, ``gap_pct``, ``gap_pct_se``."""
    values = values.to(torch.float64)
    n = values.numel()
    out = {"se": _sd(values) / math.sqrt(n),
           "se_mc": math.sqrt(float(var_mc.sum())) / n if var_mc is not None else 0.0}
    if alpha is not None:
        d = alpha.to(torch.float64) - values  # [n] paired gaps
        am = float(alpha.mean())
        gap, gap_se = float(d.mean()), _sd(d) / math.sqrt(n)
        out.update(gap=gap, gap_se=gap_se, gap_pct=100.0 * gap / am if am > 0 else 0.0,
                   gap_pct_se=100.0 * gap_se / am if am > 0 else 0.0)
    return out


def _seed_for(seed: int, key: tuple) -> int:
    return derive_seed(seed, repr(key), rule="unit")


def shards(n: int, size: int = SHARD) -> list[tuple[int, int]]:
    """The fixed position shards ``[(start, stop), ...]`` of a cell of ``n`` positions: the units of
    work of ``size`` positions that a mapper evaluates (not block verification, not block efficiency)."""
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def shard_acceptance(name: str, P: torch.Tensor, Q: torch.Tensor, law: str, k: int, draws: int, seed: int,
                     key: tuple, b: int):
    """Shard ``b`` of one cell: ``verifier_acceptance`` with the shard's own generator.

    P, Q ``[m, V]`` are the shard's rows. The generator is seeded by (seed, cell key, b), so a
    shard's estimates do not depend on which process evaluates it or in which order: the
    single-process run and a sharded one (``multidraft.experiments.distributed``) give the
    same numbers. Returns ``(mean [m], var [m], estimator)``."""
    g = torch.Generator().manual_seed(_seed_for(seed, tuple(key) + (b,)))
    return verifier_acceptance(_verifiers.get(name), P, Q, law, k, draws, g)


def local_map(tasks: Sequence[tuple]) -> list:
    """Evaluate ``shard_acceptance`` tasks in this process, in order (the default mapper)."""
    return [shard_acceptance(*t) for t in tasks]


@dataclass
class CellShards:
    """The position shards of one (store, law, K): ``parts`` is a list of ``(P_b, Q_b)``;
    ``order`` ``[n]`` (or None) the position of each shard row in the cell (rows sorted by
    support size, so each shard keeps only the columns its widest row needs)."""

    parts: list
    order: torch.Tensor | None = None


def cell_shards(P: torch.Tensor, Q: torch.Tensor, widths: torch.Tensor | None = None) -> CellShards:
    """Cut a cell's rows into shards of ``SHARD``.  P ``[n, M+1]``, Q ``[n, M+1]`` or ``[n, K, M+1]``
    (lumped: a row's support in its first columns, the tail in the last, zeros between).

    Without ``widths`` ``[n]`` (support sizes) shards are consecutive rows at full width. With
    them rows are taken in order of support size (stable) and shard b keeps columns
    ``0..w_b-1`` and the tail, w_b its widest row: the columns dropped are zero in every row of
    the shard, so each row's (p, q) is unchanged and the cost follows the shard's width, not
    the store's widest position. The cut depends on the rows alone, so every verifier of the
    cell, in any process, sees the same shards."""
    n = P.shape[0]
    if widths is None:
        return CellShards([(P[a:b], Q[a:b]) for a, b in shards(n)])
    order = torch.sort(widths, stable=True).indices
    M = P.shape[-1] - 1
    parts = []
    for a, b in shards(n):
        rows = order[a:b]
        w = int(widths[rows].max())
        cols = torch.cat([torch.arange(min(w, M)), torch.tensor([M])])
        parts.append((P[rows][:, cols], Q[rows][..., cols]))
    return CellShards(parts, order)


def cell_acceptance(name: str, P: torch.Tensor, Q: torch.Tensor, law: str, k: int, draws: int, seed: int,
                    key: tuple, mapper: Callable[[Sequence[tuple]], list] = local_map, *,
                    parts: CellShards | None = None):
    """Per-position estimates of one cell ``(mean [n], var [n], estimator)``, shard by shard.

    P, Q ``[n, V]`` (Q ``[n, K, V]`` for independent). ``parts``: the cell's shards
    (:func:`cell_shards`; default: consecutive rows at full width). ``mapper`` evaluates the
    list of shard tasks (arguments of :func:`shard_acceptance`) and returns their results in
    order; estimates come back in the rows' order."""
    parts = parts if parts is not None else cell_shards(P, Q)
    tasks = [(name, Pb, Qb, law, k, draws, seed, key, i) for i, (Pb, Qb) in enumerate(parts.parts)]
    res = mapper(tasks)
    ests = {r[2] for r in res}
    if len(ests) != 1:
        raise RuntimeError(f"{name}: shards of one cell used different estimators {sorted(ests)}")
    mean, var = torch.cat([r[0] for r in res]), torch.cat([r[1] for r in res])
    if parts.order is not None:
        mean = torch.empty_like(mean).index_copy_(0, parts.order, mean)
        var = torch.empty_like(var).index_copy_(0, parts.order, var)
    return mean, var, ests.pop()


def evaluate(
    ps: store.PositionSet,
    writer: JsonlWriter,
    *,
    done: set,
    laws: Sequence[str] = LAWS,
    ks: Sequence[int] = tuple(range(1, 9)),
    verifiers: Sequence[str] | None = None,
    draws: int = 200,
    seed: int = 0,
    eval_support: int | None = None,
    mapper: Callable[[Sequence[tuple]], list] = local_map,
    log: Callable[[str], None] = lambda _m: None,
    progress=None,
) -> int:
    """Write the missing rows for one position store; returns the number of rows written.

    ``laws`` are checked kinds and ``ks`` checked numbers of drafts (``AcceptanceConfig``
    validates them once). ``mapper`` evaluates each cell's position shards
    (:func:`cell_acceptance`); the default runs them here, a distributed one elsewhere, with
    the same rows."""
    info = ps.info
    settings = info.get("settings", {})
    base = {
        "dataset": info["dataset"], "t_target": info["t_target"], "t_draft": info["t_draft"],
        "top_k": settings.get("top_k"), "top_p": settings.get("top_p"),
    }
    names = list(verifiers) if verifiers is not None else default_verifiers()
    vs = [_verifiers.get(n) for n in names]
    warn = None
    full = ps  # with the independent law's rows (qs), if any, on their union support
    eps = float(settings.get("eps") or 0.0)
    if eval_support is not None:
        ps = store.relump(store.without_qs(ps), eps=eps, k_max=max(ks), max_support=int(eval_support))
        warn = (f"WARNING: --eval-support {eval_support}: positions relumped to at most {eval_support} tokens per model "
                f"(hidden truncation); tail mass now p <= {float(ps.p_tail.max()):.3g}, q <= {float(ps.q_tail.max()):.3g}")
        log(f"{info['dataset']} tt={info['t_target']:g} td={info['t_draft']:g}: {warn}")
    elif ps.qs is not None:
        # the shared-q laws need the p and q prefixes only: the tokens that only the draft at
        # the other temperatures needed go to the tail, as in a store collected without them
        # (each tail stays <= eps, or the stored tail of a store collected under the old fixed cap)
        ps = store.relump(store.without_qs(ps), eps=eps, k_max=max(ks), max_support=None)
    P, Q = store.lumped(ps)
    nnz = (Q > 0).sum(-1)
    ind_t = info.get("independent_temperatures") or []
    Qs = store.lumped_qs(full) if "independent" in laws and full.qs is not None else None  # [n, J, M+1]
    P_ind = store.lumped(full)[0] if Qs is not None else None
    if "independent" in laws and Qs is None:
        log(f"skip independent: {info['dataset']} was collected without independent temperatures")
    jobs = [(law, k) for law in laws for k in ks
            if law != "independent" or (Qs is not None and k <= Qs.shape[1])]
    written = 0
    it: Iterable = jobs if progress is None else progress(jobs, total=len(jobs), desc=f"acceptance {info['dataset']} tt={info['t_target']:g} td={info['t_draft']:g}")
    for law, k in it:
        rows = (nnz >= k) if law not in ("iid", "independent") else torch.ones_like(nnz, dtype=torch.bool)
        idx = rows.nonzero().squeeze(-1)
        n_excl = int(len(ps) - idx.numel())
        if idx.numel() == 0:
            log(f"skip {law} K={k}: no position has {k} draft tokens of positive probability")
            continue
        src = full if law == "independent" else ps  # the store whose support and tails the cell uses
        Pk, Qk = (P[idx], Q[idx]) if law != "independent" else (P_ind[idx], Qs[idx, :k])  # Qk [n, V] or [n, K, V]
        extra = {"independent_temperatures": ind_t[:k]} if law == "independent" else {}
        key_a = row_key({**base, "law": law, "K": k, "verifier": "alpha*"}, KEY)
        todo = [n for n, v in zip(names, vs) if v.supports(law, k)
                and row_key({**base, "law": law, "K": k, "verifier": n}, KEY) not in done]
        if key_a in done and not todo:  # a resumed run: nothing left in this (law, K), not even alpha*
            continue
        t0 = time.perf_counter()
        alpha, alpha_lower = optimal_bounds(Pk, Qk, law, k)
        q_tail_k = ps.q_tail[idx] if law != "independent" else full.qs_tail[idx, :k].max(-1).values
        bound = store.alpha_bounds(Q[idx], src.p_tail[idx], q_tail_k, law, k)
        a_extra = dict(extra)
        if law == "independent":  # alpha* is certified to [lower, value]: the row states the width
            a_extra.update(alpha_lower=float(alpha_lower.mean()), bound_width_max=float((alpha - alpha_lower).max()))
        lo, hi = store.full_interval(alpha, alpha_lower, bound, law, k)  # [n], [n]: alpha* at full V lies in them
        lo_m, hi_m = float(lo.mean()), float(hi.mean())
        a_extra.update(alpha_full_lower=lo_m, alpha_full_upper=hi_m, alpha_exact=hi_m - lo_m <= EXACT_TOL)
        if key_a not in done:
            writer.write(
                **base, law=law, K=k, verifier="alpha*", acceptance=float(alpha.mean()), **a_extra,
                **position_errors(alpha, var_mc=torch.zeros_like(alpha)),
                sd_positions=_sd(alpha), n_positions=int(idx.numel()),
                n_excluded=n_excl, estimator="exact", lump_bound_mean=float(bound.mean()), lump_bound_max=float(bound.max()),
                values=[round(float(a), 6) for a in alpha], seconds=time.perf_counter() - t0,
                p_tail_max=float(src.p_tail[idx].max()), q_tail_max=float(q_tail_k.max()), eval_support=eval_support,
                **({"eval_support_warning": warn} if warn and law != "independent" else {}),
            )
            done.add(key_a)
            written += 1
        parts = None
        for name, v in zip(names, vs):
            if not v.supports(law, k):
                continue
            key = row_key({**base, "law": law, "K": k, "verifier": name}, KEY)
            if key in done:
                continue
            t0 = time.perf_counter()
            if parts is None:  # once per (law, K): every verifier of the cell shares these tensors
                parts = cell_shards(Pk, Qk, src.support_sizes[idx])
            mean, var, est = cell_acceptance(name, Pk, Qk, law, k, draws, seed, key, mapper, parts=parts)
            m = float(mean.mean())
            am = float(alpha.mean())
            writer.write(
                **base, law=law, K=k, verifier=name, acceptance=m, **extra, **position_errors(mean, alpha, var),
                sd_positions=_sd(mean), n_positions=int(idx.numel()),
                n_excluded=n_excl, estimator=est, draws=draws, alpha_star=am,
                lump_bound_max=float(bound.max()), p_tail_max=float(src.p_tail[idx].max()),
                q_tail_max=float(q_tail_k.max()), eval_support=eval_support,
                **({"eval_support_warning": warn} if warn and law != "independent" else {}),
                above_alpha_positions=int((mean > alpha + 1e-9).sum()),
                values=[round(float(a), 6) for a in mean], seconds=time.perf_counter() - t0,
            )
            done.add(key)
            written += 1
    return written


def run(
    run_dir: str | Path,
    stores: Sequence[Path],
    *,
    file: str = "acceptance.jsonl",
    config: dict,
    seed: int,
    keyed: Sequence[str] = KEYED,
    **kw,
) -> Path:
    """Evaluate every store into ``RUN_DIR/file`` (appending, resuming); returns the path.

    The file is bound to ``(config, seed)``: a file of another run is refused (ValueError)."""
    path = Path(run_dir) / file
    with lock_run_dir(run_dir), JsonlWriter(path, config, seed, keyed=keyed) as w:
        done = w.done(KEY)
        for s in stores:
            evaluate(store.load(s), w, done=done, seed=seed, **kw)
    return path


@dataclass
class ExperimentResult:
    path: Path            # the JSONL results file
    rows: list            # every row of it (this run's, old and new)
    stores: list          # position stores evaluated
    written: int          # rows written by this call


@dataclass(frozen=True)
class AcceptanceConfig:
    """One acceptance (or temperature) experiment, validated once when made: every field is
    checked in ``__post_init__`` (``ArgumentError`` naming it) and stored resolved, so nothing
    below re-checks it: ``laws`` as kinds of ``LAWS`` (parsed once), ``ks`` sorted numbers of
    drafts >= 1 (``k``), ``verifiers`` registered names or None (all but lp_optimal).

    ``temperatures`` (t_target, t_draft) pairs; ``collect_kw`` the collector's position options
    (``positions_from``, ``new_tokens``, ...; bound into the results' config); ``experiment``
    and ``file`` name the results file (the temperature experiment: 'temperature',
    'temperature.jsonl', see ``temperature.sweep_config``).
    """

    datasets: tuple
    temperatures: tuple
    ks: tuple = tuple(range(1, 9))
    laws: tuple = LAWS
    verifiers: tuple | None = None
    draws: int = 200
    eval_support: int | None = None
    top_k: int | None = None
    top_p: float | None = None
    n_texts: int = 4
    positions_per_text: int | None = 8
    max_tokens: int = 256
    eps: float = 1e-4
    collect_kw: dict | None = None
    experiment: str = "acceptance"
    file: str = "acceptance.jsonl"

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        datasets = [self.datasets] if isinstance(self.datasets, str) else list(self.datasets)
        if not datasets:
            raise ArgumentError("datasets", "is empty")
        try:
            set_("datasets", tuple(check_dataset(d) for d in datasets))
        except ValueError as exc:
            raise ArgumentError.of("datasets", exc) from None
        temps = tuple((as_temperature(a, "t_target"), as_temperature(b, "t_draft")) for a, b in self.temperatures)
        for _, td in temps:
            if not td > 0:
                raise ArgumentError("t_draft", f"must be > 0 (the drafts are sampled), got {td}")
        if not temps:
            raise ArgumentError("temperatures", "is empty; give at least one (t_target, t_draft) pair")
        set_("temperatures", temps)
        set_("ks", as_ks(self.ks, "k"))
        set_("laws", _drafts.parse_laws(self.laws, LAWS, "laws"))
        if self.verifiers is not None:
            set_("verifiers", _verifiers.check_names(self.verifiers))
        draws = as_int(self.draws, "draws")
        if draws < 2:
            raise ArgumentError("draws", f"must be >= 2 (for a standard error), got {draws}")
        set_("draws", draws)
        if self.eval_support is not None:
            n = as_int(self.eval_support, "eval_support")
            if n < 2:
                raise ArgumentError("eval_support", f"must be >= 2 tokens, got {n}")
            set_("eval_support", n)
        set_("top_k", as_top_k(self.top_k, "top_k"))
        set_("top_p", as_top_p(self.top_p, "top_p"))
        set_("n_texts", as_int(self.n_texts, "n_texts", minimum=1))
        if self.positions_per_text is not None:
            set_("positions_per_text", as_int(self.positions_per_text, "positions_per_text", minimum=1))
        set_("max_tokens", as_int(self.max_tokens, "max_tokens", minimum=1))
        try:
            eps = float(self.eps)
        except (TypeError, ValueError):
            eps = math.nan
        if not 0 <= eps < 1:
            raise ArgumentError("eps", f"must be a number in [0, 1), got {self.eps!r}")
        set_("eps", eps)
        set_("collect_kw", dict(self.collect_kw) if self.collect_kw else None)

    def binding(self, model_names: dict) -> dict:
        """The config the results file is bound to (JSON-ready; ``KEYED`` keys may grow on a
        resume). ``collect_kw`` is bound too, under ``"positions"``, when given."""
        extra = {"positions": dict(self.collect_kw)} if self.collect_kw else {}
        return {**extra,
            "experiment": self.experiment, "models": dict(model_names), "datasets": list(self.datasets),
            "temperatures": [[a, b] for a, b in self.temperatures], "k": list(self.ks),
            "laws": list(self.laws), "verifiers": list(self.verifiers) if self.verifiers is not None else None,
            "draws": self.draws, "eval_support": self.eval_support, "top_k": self.top_k, "top_p": self.top_p,
            "texts": self.n_texts, "positions_per_text": self.positions_per_text,
            "max_tokens": self.max_tokens, "eps": self.eps,
        }


def run_experiment(
    run_dir: str | Path,
    config: AcceptanceConfig | None = None,
    *,
    models: Callable[[], tuple],
    model_names: dict,
    seed: int = 0,
    mapper: Callable[[Sequence[tuple]], list] = local_map,
    log: Callable[[str], None] = lambda _m: None,
    progress=None,
    datasets: Sequence[str] | None = None,
    temperatures: Sequence[tuple[float, float]] | None = None,
    ks: Sequence[int] = tuple(range(1, 9)),
    laws: Sequence[str] = LAWS,
    verifiers: Sequence[str] | None = None,
    draws: int = 200,
    eval_support: int | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    n_texts: int = 4,
    positions_per_text: int = 8,
    max_tokens: int = 256,
    eps: float = 1e-4,
    file: str = "acceptance.jsonl",
    experiment: str = "acceptance",
    collect_kw: dict | None = None,
) -> ExperimentResult:
    """The acceptance experiment: collect position stores (the only model calls, skipped when
    the stores exist) for every dataset x (t_target, t_draft) pair, then write the missing rows
    of ``RUN_DIR/config.file``.

    ``config`` is an :class:`AcceptanceConfig` (validated once, when made); without it the
    keywords from ``datasets`` on make one (the same fields). The run directory is checked
    writable and bound to this config before ``models()`` is called. ``collect_kw``: more
    options of :func:`multidraft.experiments.collect.collect` (where positions come from,
    continuation length, independent temperatures, ...), bound into the config."""
    if config is None:
        if datasets is None or temperatures is None:
            raise TypeError("run_experiment needs a config, or datasets= and temperatures=")
        config = AcceptanceConfig(
            datasets=tuple(datasets), temperatures=tuple(temperatures), ks=tuple(ks), laws=tuple(laws),
            verifiers=None if verifiers is None else tuple(verifiers), draws=draws, eval_support=eval_support,
            top_k=top_k, top_p=top_p, n_texts=n_texts, positions_per_text=positions_per_text, max_tokens=max_tokens,
            eps=eps, collect_kw=collect_kw, experiment=experiment, file=file)
    elif not isinstance(config, AcceptanceConfig):
        raise ArgumentError("config", f"must be an AcceptanceConfig, got {type(config).__name__}")
    c = config
    path = Path(run_dir) / c.file
    binding = c.binding(model_names)
    with lock_run_dir(run_dir):  # one process per run directory: a second one is refused, naming the holder
        resume(path, binding, seed, key_fields=KEY, keyed=KEYED)  # refuse a foreign file before any model call
        paths = _collect.collect(
            run_dir, models=models, model_names=model_names, datasets=list(c.datasets), configs=list(c.temperatures),
            top_k=c.top_k, top_p=c.top_p, n_texts=c.n_texts, positions_per_text=c.positions_per_text,
            max_tokens=c.max_tokens, eps=c.eps, k_max=max(c.ks), seed=seed, log=log, progress=progress,
            **(c.collect_kw or {}),
        )
        stores = list(paths.values())
        written = 0
        with JsonlWriter(path, binding, seed, keyed=KEYED) as w:
            done = w.done(KEY)
            for s in stores:
                ps = store.load(s)
                log(f"{s.name}: {len(ps)} positions, eps = {c.eps:g}, max p(T) = {float(ps.p_tail.max()):.3g}, "
                    f"max q(T) = {float(ps.q_tail.max()):.3g}  =>  0 <= alpha*_stored - alpha* <= "
                    f"{float(ps.p_tail.max()):.3g} (iid, greedy)")
                if max(float(ps.p_tail.max()), float(ps.q_tail.max())) > c.eps * (1 + 1e-9):
                    log(f"WARNING: {s.name}: stored tails exceed eps = {c.eps:g} (a store collected under the old fixed "
                        "support cap of 16,384 tokens, or with a larger eps); the report states the tails in force")
                written += evaluate(ps, w, done=done, laws=c.laws, ks=c.ks, verifiers=c.verifiers, draws=c.draws, seed=seed,
                                    eval_support=c.eval_support, mapper=mapper, log=log, progress=progress)
        _, rows = read_jsonl(path)
    return ExperimentResult(path=path, rows=rows, stores=stores, written=written)


# --- reading the per-position acceptances back (tree choice, tree against chain) -------------
def read_along(path, t_target: float, t_draft: float) -> dict:
    """``{(dataset, law, verifier): {K: per-position acceptances [T]}}`` of an acceptance JSONL
    at one (target, draft) temperature pair, rows without top-k / top-p only.

    The ``values`` of a row are in the order the positions were collected, i.e. along each
    continuation, so neighbouring entries are neighbouring tokens of one text (what
    ``decoding.treeopt.expected_tokens_along`` needs). Rows written without ``values`` are
    skipped. Entries are clipped to [0, 1] (rounding to 1e-6 can leave 1.0000005).
    """
    out: dict = {}
    _, rows, lines = read_jsonl(path, line_numbers=True)
    rows, bad = valid_rows(path, rows, lines, "acceptance", needed=KEY[:3] + KEY[5:])
    if bad:  # a damaged study is refused, naming its first damaged row
        raise ValueError(bad[0].removesuffix("; row skipped") + (f" (and {len(bad) - 1} more damaged rows)" if len(bad) > 1 else ""))
    for row in rows:
        if row.get("type") != "row" or row.get("t_target") != t_target or row.get("t_draft") != t_draft:
            continue
        if row.get("top_k") is not None or row.get("top_p") is not None or not row.get("values"):
            continue
        out.setdefault((row["dataset"], row["law"], row["verifier"]), {})[int(row["K"])] = \
            np.clip(np.asarray(row["values"], dtype=float), 0.0, 1.0)
    return out


def along_alphas(study: dict, dataset: str, law: str, verifier: str, ks) -> dict:
    """``{k: per-position acceptances}`` of one verifier under one law for the k in ``ks`` that
    the study has, from :func:`read_along`'s ``study``.

    k = 1 is single-draft SD whatever the law and verifier: its exact acceptance
    ``alpha*(iid, K = 1) = sum min(p, q)``, not a verifier's Monte-Carlo estimate of it, so a
    chain inside a tree is rated like the chain alone. ValueError naming what the study has
    when k = 1 or every k > 1 is missing.
    """
    have = sorted({d for d, _, _ in study})
    if dataset not in have:
        raise ValueError(f"no rows for data set {dataset!r} (the study has {', '.join(have) or 'none'})")
    sd = study.get((dataset, "iid", "alpha*"), {}).get(1)
    if sd is None:
        raise ValueError(f"{dataset}: no alpha*(iid, K = 1) row (single-draft SD's acceptance)")
    want = {int(k) for k in ks}
    got = {k: v for k, v in study.get((dataset, law, verifier), {}).items() if k > 1 and k in want}
    if want - {1} and not got:
        pairs = sorted({(lw, v) for d, lw, v in study if d == dataset})
        raise ValueError(f"{dataset}: no rows for {verifier} under the {law} law at K in {sorted(want - {1})} "
                         f"(the study has {', '.join(f'{v} ({lw})' for lw, v in pairs)})")
    if 1 in want or not got:
        got[1] = sd
    return dict(sorted(got.items()))


def tree_acceptance(path, *, verifier: str, law: str, ks, t_target: float, t_draft: float,
                    dataset: str | None = None):
    """Acceptance statistics for ``decoding.treeopt.choose_tree``: ``(stats, along)``.

    ``path`` is either an acceptance JSONL of the study (``multidraft experiment acceptance`` or
    ``experiment paper``; recognised by its meta row) or an :class:`AcceptStats` JSON. From a
    study: the per-position acceptances of ``verifier`` under ``law`` at the given
    temperatures (:func:`read_along`, :func:`along_alphas`; ``dataset`` picks one data set and
    may be left out when the study has one), returned as ``along`` ``{k: [T]}`` for the along
    model, with ``stats`` = :meth:`AcceptStats.from_alphas` of their means. From a JSON:
    ``(stats, None)``. ``stats.source`` says where they came from (the file's name when a JSON
    gives none). Every failure is a ValueError with one line naming the file.
    """
    from ..decoding.treeopt import AcceptStats

    path = Path(path).expanduser()
    try:
        with path.open("rb") as fh:
            head = fh.readline()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        first = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError):
        first = None
    if not (isinstance(first, dict) and first.get("type") == "meta"):
        try:
            stats = AcceptStats.from_json(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc} (or give a study's acceptance JSONL)") from None
        return (stats if stats.source else AcceptStats(stats.accept, stats.counts, str(path))), None
    study = read_along(path, float(t_target), float(t_draft))
    if not study:
        raise ValueError(f"{path}: no rows with per-position values at temperatures {t_target:g} (target), "
                         f"{t_draft:g} (draft)")
    sets = sorted({d for d, _, _ in study})
    if dataset is None:
        if len(sets) > 1:
            raise ValueError(f"{path}: the study has data sets {', '.join(sets)}; choose one")
        dataset = sets[0]
    try:
        along = along_alphas(study, dataset, law, verifier, ks)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    n = len(next(iter(along.values())))
    source = (f"study {path.name}: {dataset}, {verifier} ({law}), K = {','.join(map(str, along))}, "
              f"{n} positions, T = {t_target:g}/{t_draft:g}")
    return AcceptStats.from_alphas({k: float(v.mean()) for k, v in along.items()}, source=source), along
