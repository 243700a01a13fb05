"""Cost-aware draft trees: a cost model, acceptance statistics and a Sequoia-style tree search.

Pure Python + numpy (no model code, nothing printed); ``multidraft profile`` measures a
:class:`CostProfile` and ``multidraft decode --tree auto`` calls :func:`choose_tree`.

Cost model (:class:`CostProfile`)
    One decoding step with a tree of ``n`` nodes (root included, see ``engine``) costs
    ``target_seconds(n)`` (one target forward over the n tree tokens) plus one draft forward
    per level that has internal nodes, ``draft_seconds(m_l)`` for the ``m_l`` internal nodes
    at depth ``l`` (depth 0 is the root), plus ``per_node_seconds`` for every non-root node
    and ``per_step_seconds`` once a step: the decoder's own time outside the models (logits
    processing, sampling, verification, cache bookkeeping, Python), which the target alone
    pays too, so the target alone runs at ``1 / (target_seconds(1) + per_step_seconds)``.
    Both are 0 unless measured; :func:`fit_overhead` fits them to timed decodes of the real
    engine (``multidraft profile`` runs them). Both model functions interpolate measured
    points linearly and extrapolate past the last point along the last segment.

Acceptance (:class:`AcceptStats`)
    ``accept[k][i]`` = P(at a node with k drafts the walk enters the child in draft slot i),
    duplicate slots merged into their first occurrence (the engine never expands a
    duplicate), so ``alpha_k = sum_i accept[k][i]`` is the node's acceptance. Positional
    and the same at every depth (Sequoia's assumption).

Tree search (:class:`TreeDP`)
    E[tokens per step] = 1 + sum over non-root nodes u of P(reach u), and
    P(reach the child in slot i of v) = P(reach v) * accept[k_v][i]. With ``f(n, d)`` the
    best sum of reach probabilities below a node (relative to reaching it) over subtrees of
    exactly n nodes (the node included) and depth <= d:

        f(1, d) = 0;   f(n, 0) = -inf for n > 1
        f(n, d) = max_k  max_{s_1 + ... + s_k = n - 1, s_i >= 1}  sum_i accept[k][i] * (1 + f(s_i, d - 1))

    The inner maximum is a knapsack over the k slots in order (slot i gets s_i nodes),
    solved slot by slot; children of one node may get subtrees of any sizes (chains
    included). The best tree of a budget is the best over sizes <= budget, so E is
    nondecreasing in the budget. :func:`choose_tree` evaluates the step cost of the best
    tree of every (budget, depth cap), and of every chain, and keeps the highest
    E[tokens] / seconds; the search is exact for E at a given (budget, depth), and the rate
    is computed exactly on that tree (the node count per level is not itself optimised for
    draft cost).

Acceptance along a text (:func:`expected_tokens_along`)
    Sequoia's positional model gives every node the mean acceptance, which averages easy and
    hard stretches of a text together and so undervalues long chains where acceptance runs
    high for many tokens in a row (code). Given per-position acceptances measured along
    continuations (the study's ``values``), a step starting at position t uses position
    t + j at depth j; ``choose_tree(..., along=...)`` rates the candidates that way.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace

import numpy as np

__all__ = ["CostProfile", "AcceptStats", "TreeDP", "TreeChoice", "Choice", "expected_tokens",
           "expected_tokens_along", "slot_increments", "tree_candidates", "STATISTICS",
           "level_counts", "drafting_seconds", "step_seconds", "chain", "fit_overhead", "choose_tree", "width_price", "chain_vs_tree",
           "ChainVsTree"]

MAX_NODES = 64
MAX_DEPTH = 8
STATISTICS = {"median": statistics.median, "mean": statistics.fmean, "min": min}


# ---------------------------------------------------------------------------------------------
def _points(nodes, seconds, name: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    try:
        ns = [int(n) for n in nodes]
        ss = [float(s) for s in seconds]
    except (TypeError, ValueError):
        raise ValueError(f"{name}: node counts must be integers and seconds numbers") from None
    if len(ns) != len(ss) or not ns:
        raise ValueError(f"{name}: need one time per node count and at least one point, got {len(ns)} and {len(ss)}")
    if any(n < 1 for n in ns):
        raise ValueError(f"{name}: node counts must be >= 1, got {ns}")
    if any(not math.isfinite(s) or s <= 0 for s in ss):
        raise ValueError(f"{name}: seconds must be finite and > 0, got {ss}")
    order = sorted(range(len(ns)), key=ns.__getitem__)
    ns = [ns[i] for i in order]
    ss = [ss[i] for i in order]
    if len(set(ns)) != len(ns):
        raise ValueError(f"{name}: node counts must be distinct, got {ns}")
    return tuple(ns), tuple(ss)


def _interp(ns, ss, n: float) -> float:
    """Piecewise linear through the points; constant below the first, along the last segment beyond."""
    if n <= ns[0]:
        return ss[0]
    if len(ns) == 1:
        return ss[0] * n / ns[0]  # one point: proportional beyond it
    j = min(int(np.searchsorted(ns, n)), len(ns) - 1)
    a, b = j - 1, j
    return max(ss[a] + (n - ns[a]) * (ss[b] - ss[a]) / (ns[b] - ns[a]), 0.0)


def _load_json(text: str, what: str):
    """json.loads with a one-line ValueError naming what was being read."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what}: not JSON ({exc.msg} at line {exc.lineno})") from None


@dataclass(frozen=True)
class CostProfile:
    """Measured seconds of one target forward over n tree tokens and one draft forward over m nodes.

    ``target_nodes``/``target_times``: measured points (n = 1 is the target alone);
    ``draft_nodes``/``draft_times``: one draft level of m nodes; ``per_node_seconds``:
    the decoder's time outside the models per non-root node, ``per_step_seconds`` per step
    (:func:`fit_overhead`); ``meta``: machine, versions, dtype, models, and the timed samples
    and calibration decodes they came from.
    """

    target_nodes: tuple
    target_times: tuple
    draft_nodes: tuple
    draft_times: tuple
    per_node_seconds: float = 0.0
    meta: dict = field(default_factory=dict)
    per_step_seconds: float = 0.0

    def __post_init__(self):
        tn, tt = _points(self.target_nodes, self.target_times, "target")
        dn, dt = _points(self.draft_nodes, self.draft_times, "draft")
        object.__setattr__(self, "target_nodes", tn)
        object.__setattr__(self, "target_times", tt)
        object.__setattr__(self, "draft_nodes", dn)
        object.__setattr__(self, "draft_times", dt)
        for name in ("per_node_seconds", "per_step_seconds"):
            try:
                x = float(getattr(self, name))
            except (TypeError, ValueError):
                x = float("nan")
            if not math.isfinite(x) or x < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {getattr(self, name)!r}")
            object.__setattr__(self, name, x)
        if not isinstance(self.meta, dict):
            raise ValueError(f"meta must be a dict, got {type(self.meta).__name__}")

    def target_seconds(self, n: int) -> float:
        """Seconds of one target forward over n tree tokens (n >= 1, root included)."""
        if n < 1:
            raise ValueError(f"n must be >= 1 (the root is always scored), got {n}")
        return _interp(self.target_nodes, self.target_times, n)

    def draft_seconds(self, m: int) -> float:
        """Seconds of one draft forward over the m internal nodes of a level (0 for m = 0)."""
        if m < 0:
            raise ValueError(f"m must be >= 0, got {m}")
        return 0.0 if m == 0 else _interp(self.draft_nodes, self.draft_times, m)

    def target_only_rate(self) -> float:
        """Tokens per second of the target alone: 1 / (target_seconds(1) + per_step_seconds)."""
        return 1.0 / (self.target_seconds(1) + self.per_step_seconds)

    def without_overhead(self) -> "CostProfile":
        """The models' time only: the same points, per-node and per-step seconds 0."""
        return replace(self, per_node_seconds=0.0, per_step_seconds=0.0)

    @property
    def statistic(self) -> str | None:
        """How the points were made from the samples ('median', 'mean' or 'min'; None if unknown)."""
        return self.meta.get("statistic")

    def with_statistic(self, statistic: str, *, strict: bool = True) -> "CostProfile":
        """The same profile with every point recomputed from the timed samples kept in
        ``meta['samples']`` (``{'target': {n: [seconds]}, 'draft': {m: [seconds]}}``, as
        ``multidraft profile`` writes them) by ``statistic``: 'median', 'mean' or 'min';
        'stored' keeps the points as they are (the profile itself). Where the profile keeps
        its calibration decodes (``meta['overhead']['runs']``), the per-step and per-node
        seconds are fitted again against the new points (:func:`fit_overhead`): the overhead is
        what the decodes took beyond the models' time as this statistic counts it.

        A decode pays the mean of its forwards; the minimum estimates an unloaded machine and
        is fooled by a host whose speed switches between states (one fast sample sets the
        point). A profile that keeps no samples is a ValueError, or itself with ``strict=False``.
        """
        if statistic == "stored":
            return self
        pick = STATISTICS.get(statistic)
        if pick is None:
            raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, stored, got {statistic!r}")
        samples = self.meta.get("samples")
        if samples is None and not strict:
            return self
        if not isinstance(samples, dict) or not all(isinstance(samples.get(w), dict) for w in ("target", "draft")):
            raise ValueError("profile: no timed samples in meta.samples (written by hand or by an older "
                             "`multidraft profile`), so its points cannot be recomputed; measure it again")
        pts = {}
        for which, nodes in (("target", self.target_nodes), ("draft", self.draft_nodes)):
            got = samples[which]
            missing = [n for n in nodes if not got.get(str(n))]
            if missing:
                raise ValueError(f"profile: meta.samples.{which} has no samples for n = {missing}")
            try:
                pts[which] = [pick([float(x) for x in got[str(n)]]) for n in nodes]
            except (TypeError, ValueError):
                raise ValueError(f"profile: meta.samples.{which} must hold lists of seconds") from None
        out = replace(self, target_times=pts["target"], draft_times=pts["draft"], meta={**self.meta, "statistic": statistic})
        runs = (self.meta.get("overhead") or {}).get("runs")
        if runs:
            per_step, per_node = fit_overhead(out, runs)
            out = replace(out, per_step_seconds=per_step, per_node_seconds=per_node)
        return out

    def to_dict(self) -> dict:
        return {
            "target": {"nodes": list(self.target_nodes), "seconds": list(self.target_times)},
            "draft": {"nodes": list(self.draft_nodes), "seconds": list(self.draft_times)},
            "per_node_seconds": self.per_node_seconds,
            "per_step_seconds": self.per_step_seconds,
            "meta": self.meta,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, obj) -> "CostProfile":
        try:
            return cls(obj["target"]["nodes"], obj["target"]["seconds"], obj["draft"]["nodes"],
                       obj["draft"]["seconds"], obj.get("per_node_seconds", 0.0), dict(obj.get("meta", {})),
                       obj.get("per_step_seconds", 0.0))
        except (KeyError, TypeError, AttributeError):
            raise ValueError("profile: expected an object with target.nodes, target.seconds, draft.nodes, "
                             "draft.seconds (as written by `multidraft profile`)") from None

    @classmethod
    def from_json(cls, text: str) -> "CostProfile":
        return cls.from_dict(_load_json(text, "profile"))


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AcceptStats:
    """``accept[k]`` = list of k slot probabilities (see the module docstring); ``counts[k]`` records behind it."""

    accept: dict
    counts: dict = field(default_factory=dict)
    source: str = ""

    def __post_init__(self):
        if not isinstance(self.accept, dict) or not self.accept:
            raise ValueError("accept must be a non-empty dict {k: [k slot probabilities]}")
        clean = {}
        for k, row in self.accept.items():
            try:
                kk = int(k)
                vals = [float(x) for x in row]
            except (TypeError, ValueError):
                raise ValueError(f"accept[{k!r}] must be a list of numbers keyed by an integer k") from None
            if kk < 1 or len(vals) != kk:
                raise ValueError(f"accept[{kk}] must have k = {kk} entries (k >= 1), got {len(vals)}")
            if any(not math.isfinite(x) or x < 0 or x > 1 for x in vals):
                raise ValueError(f"accept[{kk}] entries must be probabilities in [0, 1], got {vals}")
            if sum(vals) > 1 + 1e-9:
                raise ValueError(f"accept[{kk}] sums to {sum(vals)} > 1 (it is the node's acceptance alpha_k)")
            clean[kk] = tuple(vals)
        object.__setattr__(self, "accept", dict(sorted(clean.items())))
        object.__setattr__(self, "counts", {int(k): int(v) for k, v in dict(self.counts).items()})

    @property
    def ks(self) -> tuple:
        return tuple(self.accept)

    def alpha(self, k: int) -> float:
        """The acceptance of a node with k drafts, sum_i accept[k][i]."""
        if k not in self.accept:
            raise ValueError(f"k: no acceptance statistics for k = {k}; have {list(self.accept)}")
        return float(sum(self.accept[k]))

    def restrict(self, ks) -> "AcceptStats":
        """Only the given k (e.g. those the verifier supports)."""
        keep = {k: v for k, v in self.accept.items() if k in set(ks)}
        if not keep:
            raise ValueError(f"k: none of {sorted(set(ks))} has acceptance statistics (have {list(self.accept)})")
        return AcceptStats(keep, {k: self.counts.get(k, 0) for k in keep}, self.source)

    @classmethod
    def from_records(cls, records, *, max_k: int | None = None, fill_smaller: bool = True,
                     source: str = "records") -> "AcceptStats":
        """Estimate from per-node records ``(k, slot)`` or ``(k, slot, depth)``; slot None or -1 = no draft kept.

        ``accept[k][i]`` = fraction of the k-draft nodes whose walk entered slot i (the empirical
        law; depth is ignored). With ``fill_smaller``, a k with no records below the largest
        observed k gets the first k slots of the next larger observed k' (``accept[k][i] =
        accept[k'][i]``): exact for verifiers that examine drafts in order (naive, specinfer,
        rrs_wor: the first k slots of k' drafts behave as k drafts), an approximation otherwise.
        ``max_k`` drops larger k.
        """
        hits: dict[int, list[int]] = {}
        for rec in records:
            try:
                k, slot = int(rec[0]), rec[1]
            except (TypeError, ValueError, IndexError):
                raise ValueError(f"records: each record is (k, slot) or (k, slot, depth), got {rec!r}") from None
            if k < 1:
                raise ValueError(f"records: k must be >= 1, got {k}")
            if max_k is not None and k > max_k:
                continue
            row = hits.setdefault(k, [0] * (k + 1))  # last entry: nothing kept
            if slot is None or int(slot) == -1:
                row[k] += 1
            else:
                s = int(slot)
                if not 0 <= s < k:
                    raise ValueError(f"records: slot must be in [0, {k}) or None for a node with k = {k}, got {slot!r}")
                row[s] += 1
        if not hits:
            raise ValueError("records: no per-node records (nothing was verified)")
        accept = {k: [c / sum(row) for c in row[:k]] for k, row in hits.items()}
        counts = {k: sum(row) for k, row in hits.items()}
        if fill_smaller:
            big = sorted(accept)
            for k in range(1, big[-1]):
                if k not in accept:
                    src = next(b for b in big if b > k)
                    accept[k] = list(accept[src][:k])
                    counts[k] = 0
        return cls(accept, counts, source)

    @classmethod
    def from_alphas(cls, alphas, *, source: str = "alphas") -> "AcceptStats":
        """No data needed: per-k acceptances ``alpha_k`` (a dict {k: alpha} or a list for k = 1, 2, ...)
        spread over the slots as increments, ``accept[k][i] = c_(i+1) - c_i`` with
        ``c_i = min(alpha_k, max_(j <= i) alpha_j)`` (c_0 = 0, c_k = alpha_k): slot i gets what
        the i-th draft adds, exact for in-order verifiers (see :meth:`from_records`).
        """
        if isinstance(alphas, dict):
            al = {int(k): float(a) for k, a in alphas.items()}
        else:
            al = {i + 1: float(a) for i, a in enumerate(alphas)}
        slots = slot_increments({k: np.array([a]) for k, a in al.items()})
        accept = {k: [float(x) for x in v[0]] for k, v in slots.items()}
        return cls(accept, {k: 0 for k in accept}, source)

    def to_dict(self) -> dict:
        return {"accept": {str(k): list(v) for k, v in self.accept.items()},
                "alpha": {str(k): self.alpha(k) for k in self.accept},
                "counts": {str(k): v for k, v in self.counts.items()}, "source": self.source}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, obj) -> "AcceptStats":
        try:
            return cls(dict(obj["accept"]), dict(obj.get("counts", {})), str(obj.get("source", "")))
        except (KeyError, TypeError, AttributeError):
            raise ValueError("accept stats: expected an object with 'accept': {k: [k slot probabilities]}") from None

    @classmethod
    def from_json(cls, text: str) -> "AcceptStats":
        return cls.from_dict(_load_json(text, "accept stats"))


# ---------------------------------------------------------------------------------------------
def slot_increments(alphas: dict) -> dict:
    """:meth:`AcceptStats.from_alphas`' rule at every position: ``{k: alpha_k [T]}`` -> ``{k: [T, k]}``.

    Slot i of a k-draft node gets ``c_(i+1) - c_i`` with ``c_i = min(alpha_k, max_(j <= i) alpha_j)``
    (``c_0 = 0``, ``c_k = alpha_k``; a j without data carries the running maximum on), so the slots
    sum to alpha_k and each is what the i-th draft adds. Every alpha must be a probability.
    """
    if not alphas:
        raise ValueError("alphas must give at least one alpha_k")
    al = {}
    for k, a in alphas.items():
        arr = np.asarray(a, dtype=float).reshape(-1)
        if int(k) < 1 or not np.all((arr >= 0) & (arr <= 1)):
            raise ValueError(f"alphas: alpha_{k} must be probabilities with k >= 1")
        al[int(k)] = arr
    sizes = {a.size for a in al.values()}
    if len(sizes) != 1:
        raise ValueError(f"alphas: every k needs the same number of positions, got {sorted(sizes)}")
    out = {}
    for k, ak in al.items():
        c = [np.zeros_like(ak)]
        run = np.zeros_like(ak)
        for i in range(1, k):
            run = np.maximum(run, al[i]) if i in al else run
            c.append(np.minimum(ak, run))
        c.append(ak)
        out[k] = np.stack([np.maximum(0.0, c[i + 1] - c[i]) for i in range(k)], axis=-1)
    return out


def expected_tokens_along(paths, slots: dict) -> float:
    """E[tokens per step] along a run of positions, keeping easy and hard stretches together.

    ``slots[k]`` is ``[T, k]``: the slot probabilities of a k-draft node at each of T consecutive
    positions (e.g. :func:`slot_increments` of per-position acceptances measured along a text).
    A step that starts at position t reaches a node at depth j through its ancestors at depths
    0..j-1, which use positions t..t+j-1; the result is the mean over starts t = 0..T-1-depth.
    With constant rows it equals :func:`expected_tokens` (Sequoia's positional model); with real
    rows it keeps the correlation of acceptance between neighbouring positions, which the
    positional model averages away (it underestimates long chains on code).
    """
    if not paths:
        return 1.0
    ch = _children(paths)
    depth = max(len(p) for p in ch)
    T = min(int(np.asarray(v).shape[0]) for v in slots.values())
    n = T - depth
    if n < 1:
        raise ValueError(f"slots: {T} positions cannot start a step of depth {depth}")
    reach = {(): np.ones(n)}
    total = np.ones(n)
    for path in sorted(ch, key=len):
        if not path:
            continue
        parent = path[:-1]
        k = ch[parent]
        if k not in slots:
            raise ValueError(f"tree: node {list(parent)} has {k} children but there are no statistics for k = {k}")
        j = len(parent)
        reach[path] = reach[parent] * np.asarray(slots[k])[j : j + n, path[-1]]
        total = total + reach[path]
    return float(total.mean())


def _children(paths) -> dict:
    from ..trees import parse_tree

    return parse_tree(paths)


def expected_tokens(paths, stats: AcceptStats) -> float:
    """E[tokens per step] of a tree (list of paths; [] = the target alone): 1 + sum of reach probabilities."""
    if not paths:
        return 1.0
    ch = _children(paths)
    reach = {(): 1.0}
    total = 1.0
    for path in sorted(ch, key=len):
        if not path:
            continue
        parent = path[:-1]
        k = ch[parent]
        if k not in stats.accept:
            raise ValueError(f"tree: node {list(parent)} has {k} children but there are no statistics for k = {k}")
        reach[path] = reach[parent] * stats.accept[k][path[-1]]
        total += reach[path]
    return total


def level_counts(paths) -> list[int]:
    """Internal nodes (nodes with children) per depth 0, 1, ...: what each draft forward feeds."""
    if not paths:
        return []
    ch = _children(paths)
    depth = max(len(p) for p in ch)
    out = [0] * depth
    for p, k in ch.items():
        if k > 0:
            out[len(p)] += 1
    return out


def drafting_seconds(paths, profile: CostProfile) -> float:
    """Predicted seconds of the draft model's levels drafting this tree (0 for [])."""
    return sum(profile.draft_seconds(m) for m in level_counts(paths))


def step_seconds(paths, profile: CostProfile) -> float:
    """Predicted seconds of one step with this tree ([] = the target alone)."""
    n = 1 + len(paths)
    return (profile.target_seconds(n) + drafting_seconds(paths, profile) + profile.per_node_seconds * len(paths)
            + profile.per_step_seconds)


def chain(depth: int) -> list:
    """The paths of single-draft SD's chain of ``depth`` drafts ([] for depth 0: the target alone)."""
    return [[0] * i for i in range(1, depth + 1)]


def fit_overhead(profile: CostProfile, runs) -> tuple[float, float]:
    """``(per_step_seconds, per_node_seconds)``: the decoder's time outside the models.

    ``runs``: timed decodes of the real engine, ``[{"depth": d, "steps": s, "seconds": w}]``
    with a chain of d drafts (d = 0: the target alone), s target passes and w seconds of
    decoding steps. Each gives a residual ``r = w / s - step_seconds(chain(d))`` under the
    models' time alone (:meth:`CostProfile.without_overhead`); ``r = a + b d`` is fitted by
    least squares with ``a, b >= 0`` (a negative slope gives ``b = 0``, ``a`` = the mean
    residual; a negative intercept the fit through the origin). The residual holds what the
    points do not: sampling and verification, cache bookkeeping, Python, and the draft's
    extra token after a fully accepted chain.
    """
    bare = profile.without_overhead()
    xs, ys = [], []
    for r in runs:
        try:
            d, steps, secs = int(r["depth"]), int(r["steps"]), float(r["seconds"])
        except (KeyError, TypeError, ValueError):
            raise ValueError("overhead runs must be {'depth': d, 'steps': s, 'seconds': w} objects") from None
        if d < 0 or steps < 1 or not math.isfinite(secs) or secs <= 0:
            raise ValueError(f"overhead run: depth >= 0, steps >= 1 and seconds > 0 expected, got {r!r}")
        xs.append(float(d))
        ys.append(secs / steps - step_seconds(chain(d), bare))
    if not xs:
        raise ValueError("overhead: no calibration runs")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    if b <= 0:
        return max(my, 0.0), 0.0
    a = my - b * mx
    if a < 0:
        sx2 = sum(x * x for x in xs)
        return 0.0, max(sum(x * y for x, y in zip(xs, ys)) / sx2, 0.0)
    return a, b


class TreeDP:
    """Best trees for every node budget n <= max_nodes (root included) and depth cap <= max_depth.

    ``best(n, depth)`` -> ``(paths, expected_tokens)``: the tree with at most n nodes and depth
    <= depth maximising 1 + sum of reach probabilities, using k in ``stats.ks`` only.
    """

    def __init__(self, stats: AcceptStats, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH):
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or not 1 <= max_nodes <= MAX_NODES:
            raise ValueError(f"max_nodes must be an integer in [1, {MAX_NODES}], got {max_nodes!r}")
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or not 1 <= max_depth <= MAX_DEPTH:
            raise ValueError(f"max_depth must be an integer in [1, {MAX_DEPTH}], got {max_depth!r}")
        if not isinstance(stats, AcceptStats):
            raise ValueError(f"stats must be an AcceptStats, got {type(stats).__name__}")
        self.stats, self.N, self.D = stats, max_nodes, max_depth
        N = max_nodes
        ks = [k for k in stats.ks if k <= N - 1]
        NEG = -np.inf
        # f[d][n]: best value below a node, exactly n nodes (index 0 unused), depth <= d
        self.f = np.full((max_depth + 1, N + 1), NEG)
        self.f[:, 1] = 0.0
        self.pick: dict = {}   # (d, n) -> (k, sizes of slots 0..k-1)
        for d in range(1, max_depth + 1):
            g = 1.0 + self.f[d - 1]          # g[s]: value of a child subtree of s nodes, incl. reaching it
            for k in ks:
                a = stats.accept[k]
                # S[m]: best over slots 0..i-1 with m nodes in total; back[i][m] = size of slot i-1
                S = np.full(N, NEG)
                S[0] = 0.0
                back = []
                for i in range(k):
                    # T[m] = max_s S[m - s] + a_i g[s], s >= 1
                    cand = np.full((N, N), NEG)          # [m, s]
                    for s in range(1, N):
                        if g[s] == NEG:
                            continue
                        cand[s:, s] = S[: N - s] + a[i] * g[s]
                    best_s = np.argmax(cand, axis=1)
                    T = cand[np.arange(N), best_s]
                    back.append(best_s)
                    S = T
                for m in range(k, N):       # a node of n = m + 1 nodes
                    if S[m] > self.f[d, m + 1] + 1e-15:
                        sizes = [0] * k
                        mm = m
                        for i in range(k - 1, -1, -1):
                            sizes[i] = int(back[i][mm])
                            mm -= sizes[i]
                        self.f[d, m + 1] = S[m]
                        self.pick[(d, m + 1)] = (k, tuple(sizes))

    def _build(self, d: int, n: int, prefix: tuple, out: list) -> None:
        if n == 1:
            return
        k, sizes = self.pick[(d, n)]
        for i, s in enumerate(sizes):
            path = prefix + (i,)
            out.append(list(path))
            self._build(d - 1, s, path, out)

    def best(self, n: int | None = None, depth: int | None = None) -> tuple[list, float]:
        """``(paths, expected_tokens)`` for at most n nodes (default max_nodes) and depth <= depth."""
        n = self.N if n is None else n
        depth = self.D if depth is None else depth
        if not 1 <= n <= self.N or not 1 <= depth <= self.D:
            raise ValueError(f"n must be in [1, {self.N}] and depth in [1, {self.D}], got n={n}, depth={depth}")
        row = self.f[depth, 1 : n + 1]
        m = int(np.argmax(row >= row.max() - 1e-12)) + 1   # the smallest size reaching the best value
        out: list = []
        self._build(depth, m, (), out)
        out.sort(key=lambda p: (len(p), p))
        return out, 1.0 + float(self.f[depth, m])

    def candidates(self):
        """``(paths, expected_tokens)`` of the best tree of every (budget >= 2, depth cap), each
        distinct tree once, depth caps ascending: what a cost model chooses among."""
        seen = set()
        for depth in range(1, self.D + 1):
            for n in range(2, self.N + 1):
                paths, e = self.best(n, depth)
                key = tuple(map(tuple, paths))
                if paths and key not in seen:
                    seen.add(key)
                    yield paths, e

    def table(self, depth: int | None = None) -> list[tuple[list, float]]:
        """``best(n, depth)`` for every budget n = 1..max_nodes."""
        return [self.best(n, depth) for n in range(1, self.N + 1)]


@dataclass(frozen=True)
class TreeChoice:
    paths: list
    expected_tokens: float
    seconds: float          # predicted seconds per step

    @property
    def nodes(self) -> int:
        return 1 + len(self.paths)

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    @property
    def tokens_per_s(self) -> float:
        return self.expected_tokens / self.seconds


@dataclass(frozen=True)
class Choice:
    """What :func:`choose_tree` returns: the best tree and the target-only baseline.

    ``tree`` is the best tree found (None if no tree has any drafts); ``pays`` says whether
    its predicted rate beats the target alone; ``target_only_tokens_per_s`` is
    :meth:`CostProfile.target_only_rate`.
    """

    tree: TreeChoice | None
    target_only_tokens_per_s: float
    pays: bool
    model: str = "positional"     # the acceptance model of E[tokens]: 'positional' or 'along'

    @property
    def speedup(self) -> float:
        return (self.tree.tokens_per_s / self.target_only_tokens_per_s) if self.tree is not None else 1.0

    def to_dict(self) -> dict:
        t = self.tree
        return {
            "pays": self.pays,
            "acceptance_model": self.model,
            "target_only_tokens_per_s": self.target_only_tokens_per_s,
            "tree": None if t is None else {
                "paths": t.paths, "nodes": t.nodes, "depth": t.depth, "expected_tokens": t.expected_tokens,
                "seconds_per_step": t.seconds, "tokens_per_s": t.tokens_per_s,
            },
            "predicted_speedup": self.speedup,
        }


def tree_candidates(stats: AcceptStats, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> list:
    """``[(paths, positional E[tokens])]``: the best tree of every (budget, depth cap) under ``stats``
    (:meth:`TreeDP.candidates`) and every chain of depth <= max_depth that is not among them
    (what a cost model chooses among: a deep chain costs fewer draft forwards per node than the
    dynamic program's best tree of its budget, which may branch)."""
    out = list(TreeDP(stats, max_nodes, max_depth).candidates())
    seen = {tuple(map(tuple, p)) for p, _ in out}
    if 1 in stats.accept:
        for d in range(1, min(max_depth, max_nodes - 1) + 1):
            c = chain(d)
            if tuple(map(tuple, c)) not in seen:
                out.append((c, expected_tokens(c, stats)))
    return out


def choose_tree(profile: CostProfile, stats: AcceptStats, max_nodes: int = MAX_NODES,
                max_depth: int = MAX_DEPTH, *, along: dict | None = None) -> Choice:
    """The tree (budget <= max_nodes, depth <= max_depth) maximising E[tokens] / step seconds.

    Every candidate of :func:`tree_candidates` is costed with :func:`step_seconds`; the
    fastest is returned with ``pays = its rate > profile.target_only_rate()`` (the target alone).
    E[tokens] is the positional model's (:func:`expected_tokens`), or with ``along`` =
    ``{k: per-position acceptances [T]}`` measured along continuations (e.g. the study's
    ``values``), :func:`expected_tokens_along` on their :func:`slot_increments` (the
    candidates still come from ``stats``, e.g. :meth:`AcceptStats.from_alphas` of the means).
    """
    if not isinstance(profile, CostProfile):
        raise ValueError(f"profile must be a CostProfile, got {type(profile).__name__}")
    slots = None
    if along is not None:
        missing = [k for k in stats.ks if k not in along]
        if missing:
            raise ValueError(f"along: no per-position acceptances for k = {missing}")
        slots = slot_increments({k: along[k] for k in stats.ks})
    best: TreeChoice | None = None
    for paths, e in tree_candidates(stats, max_nodes, max_depth):
        if slots is not None:
            e = expected_tokens_along(paths, slots)
        c = TreeChoice(paths, e, step_seconds(paths, profile))
        if best is None or c.tokens_per_s > best.tokens_per_s * (1 + 1e-12):
            best = c
    base = profile.target_only_rate()
    return Choice(best, base, best is not None and best.tokens_per_s > base * (1 + 1e-9),
                  "along" if slots is not None else "positional")


def width_price(profile: CostProfile, ns=(2, 4, 8, 16), ms=(2, 4)) -> dict:
    """What width costs on the machine of ``profile``: ``{"target": {n: t(n) / t(1)},
    "draft": {m: d(m) / d(1)}}``, the seconds of one target forward over n tree tokens and of
    one draft level of m nodes, each relative to one token (interpolated between measured
    points, held flat beyond the last). A price near 1 means a wider tree is almost free; near
    n, that every extra node costs a whole forward (then only chains can pay)."""
    if not isinstance(profile, CostProfile):
        raise ValueError(f"profile must be a CostProfile, got {type(profile).__name__}")
    t1, d1 = profile.target_seconds(1), profile.draft_seconds(1)
    return {"target": {int(n): profile.target_seconds(int(n)) / t1 for n in ns},
            "draft": {int(m): profile.draft_seconds(int(m)) / d1 for m in ms}}


@dataclass(frozen=True)
class ChainVsTree:
    """The best chain and the best tree of :func:`choose_tree` under one profile and one set of
    acceptances: ``tree_over_chain`` = predicted tokens/s of the best tree over the best chain's
    (1.0 when the best tree is a chain, i.e. no branching pays on this machine)."""

    chain: TreeChoice
    tree: TreeChoice
    target_only_tokens_per_s: float

    @property
    def branches(self) -> bool:
        return any(p[-1] > 0 for p in self.tree.paths)

    @property
    def tree_over_chain(self) -> float:
        return self.tree.tokens_per_s / self.chain.tokens_per_s


def chain_vs_tree(profile: CostProfile, stats: AcceptStats, max_nodes: int = MAX_NODES,
                  max_depth: int = MAX_DEPTH) -> ChainVsTree:
    """The best chain (depth 1..max_depth, single-draft SD under ``stats.accept[1]``) against
    the best tree :func:`choose_tree` finds, both costed by :func:`step_seconds` on ``profile``:
    the cost model's answer to "does multi-draft pay on this machine?"."""
    if 1 not in stats.accept:
        raise ValueError("stats: no single-draft (k = 1) acceptances, so no chain can be rated")
    best_chain = None
    for d in range(1, min(max_depth, max_nodes - 1) + 1):
        c = TreeChoice(chain(d), expected_tokens(chain(d), stats), step_seconds(chain(d), profile))
        if best_chain is None or c.tokens_per_s > best_chain.tokens_per_s * (1 + 1e-12):
            best_chain = c
    choice = choose_tree(profile, stats, max_nodes, max_depth)
    tree = choice.tree if choice.tree is not None and choice.tree.tokens_per_s > best_chain.tokens_per_s else best_chain
    return ChainVsTree(best_chain, tree, choice.target_only_tokens_per_s)
