"""How deep a decode drafts, step by step, chosen by cost from its own acceptances (the target alone
included): speculation chosen per request, as the request goes (issue 40 item 2).

A tree that pays on code can cost on prose: the cost model picks one tree per run from acceptances
measured beforehand (``decoding.auto``), and a request whose text the draft model predicts badly
pays for every drafted token it refuses. :class:`DepthPace` measures, within one decode, how
often the step's tree is accepted at each depth and drafts each step only as deep as pays.

The rule. The settings' tree truncated at depth c (c = 0: no tree, the target alone; at most the
shape's depth) with ``m`` free tokens beside it (the mean the free sources added a step, 0 without
them) costs ``s(c)`` seconds a step: ``treeopt.step_seconds`` of its paths on the cost profile (the
target's pass over its tokens and the m copies, the draft's levels, the per-node and per-step
times). With ``F`` the mean depth the accepted path holds the free chains (0 without free sources)
and ``G_j`` the measured probability that the model's drafts hold the accepted path to depth j
while the free chains hold it to less (the token depth j of the model's tree adds; ``(hits_j + 1)
/ (tries_j + 2)`` over the steps drafted at least j deep), a step drafted c deep emits
``E(c) = 1 + F + G_1 + ... + G_c`` tokens on average, and drafts ``c* = argmax_c E(c) / s(c)``
deep (the least c on ties). So where copies already give the tokens, the model's drafting (its
passes and tree tokens) is kept only for what it adds. The first ``warmup`` steps draft the whole
depth (to measure), and every ``explore_every``-th step drafts one level deeper than c* (so a
refusal that stopped the drafting can be undone when the text turns predictable); both schedules
are fixed, so a decode stays a function of its seed.

Conditioned on the copies (free sources). The free chains are known before the model drafts (the
sources read only the committed text), and what the model adds depends on them: where the copies
run long the model's tokens are mostly the same ones, where nothing matches they are all there is.
So the statistics are also kept per *signal bucket*, the bucket of the longest chain the free
sources propose this step (:func:`signal_bucket`: none, 1-3, 4-7, 8 or more tokens), and a step
with signal b rates its depths by ``E_b(c) / s_b(c)`` with each of ``F``, the mean free tokens and
``G_j`` estimated within bucket b, shrunk towards the pooled estimate with weight
``PRIOR_WEIGHT`` (``(x_b + w x) / (n_b + w)``: a bucket seen rarely falls back to the pooled
figure). Without free sources there is no signal and the pooled rule above is the rule.

The warm-up with free sources counts only the steps with nothing to copy (bucket 0): there the
model is the only source and its acceptance must be measured before it is rated; a step with a copy
is rated from the start (its bucket's figures, the pooled ones, then the ``(hits + 1) / (tries + 2)``
prior), since a copy that already gives the step's tokens shows after a step or two that the model
adds nothing over it. A decode of 128 tokens is about a dozen steps on copy-heavy text: four
warm-up steps of full drafting beside the copies were a third of it.

Exactness does not depend on any of this: each step's depth is chosen before its tree is drafted,
from earlier steps alone, and the verifier is lossless at every depth (depth 0: one token from
the target's law).
"""
from __future__ import annotations

from .._errors import ArgumentError
from .treeopt import CostProfile, step_seconds

__all__ = ["DepthPace", "shape_paths", "check_cost_profile", "signal_bucket", "WARMUP_STEPS", "EXPLORE_EVERY",
           "SIGNAL_EDGES", "PRIOR_WEIGHT"]

WARMUP_STEPS = 4    # steps drafted at the whole depth before the first choice
EXPLORE_EVERY = 8   # every 8th step drafts one level deeper than the choice
SIGNAL_EDGES = (1, 4, 8)  # the free chain's length buckets: 0 | 1-3 | 4-7 | 8+
PRIOR_WEIGHT = 2.0  # a bucket's estimates shrink towards the pooled ones with this many pseudo-steps


def signal_bucket(signal: int | None) -> int | None:
    """The bucket of ``signal`` (the longest free chain proposed this step, in tokens; None: no free
    sources, the pooled statistics): the number of ``SIGNAL_EDGES`` it reaches."""
    if signal is None:
        return None
    if not isinstance(signal, int) or isinstance(signal, bool) or signal < 0:
        raise ValueError(f"signal must be None or an int >= 0, got {signal!r}")
    return sum(signal >= e for e in SIGNAL_EDGES)


def check_cost_profile(value):
    """``value`` when it is None or a ``treeopt.CostProfile``; else ``ArgumentError`` naming
    ``cost_profile`` (the one check of ``generate``'s and ``BatchDecoder``'s argument)."""
    if value is not None and not isinstance(value, CostProfile):
        raise ArgumentError("cost_profile", f"must be None or a multidraft.decoding.treeopt.CostProfile, got "
                                            f"{type(value).__name__}")
    return value


def shape_paths(shape, depth: int) -> list:
    """The paths (tuples of child indices, root excluded) of ``shape`` (a ``trees.TreeShape``) cut
    at ``depth``: its explicit paths; K chains for 'sequences'; for 'dynamic', the K-ary tree's
    paths breadth first up to its node budget (the most nodes it may draft)."""
    if shape.mode == "paths":
        return sorted((p for p in shape.children if 0 < len(p) <= depth), key=lambda p: (len(p), p))
    if shape.mode == "sequences":
        return [(i,) + (0,) * (j - 1) for j in range(1, depth + 1) for i in range(shape.k)]
    out, level = [], [()]
    for _ in range(depth):
        level = [p + (i,) for p in level for i in range(shape.k)]
        for p in level:
            if len(out) >= shape.budget - 1:
                return out
            out.append(p)
    return out


class DepthPace:
    """Per-decode depth choice (module notes). ``shape`` the settings' tree shape, ``profile`` a
    ``treeopt.CostProfile``; ``warmup`` / ``explore_every`` the schedules (>= 0 / >= 1)."""

    def __init__(self, shape, profile: CostProfile, warmup: int = WARMUP_STEPS, explore_every: int = EXPLORE_EVERY):
        if not isinstance(profile, CostProfile):
            raise ValueError(f"profile must be a treeopt.CostProfile, got {type(profile).__name__}")
        for name, v, lo in (("warmup", warmup, 0), ("explore_every", explore_every, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        self.depth = int(shape.depth)
        self.profile = profile
        self.paths = [shape_paths(shape, c) for c in range(self.depth + 1)]
        self.warmup, self.explore_every = warmup, explore_every
        self.hits = [0] * self.depth
        self.tries = [0] * self.depth
        self.steps = 0          # steps recorded
        self.free_held = 0      # depths the accepted paths held the free chains, summed
        self.free_tokens = 0    # tokens the free sources added to the trees, summed
        self.chosen = [0] * (self.depth + 1)  # steps drafted at each depth
        nb = len(SIGNAL_EDGES) + 1  # the same counters per signal bucket (module notes)
        self.b_hits = [[0] * self.depth for _ in range(nb)]
        self.b_tries = [[0] * self.depth for _ in range(nb)]
        self.b_steps = [0] * nb
        self.b_free_held = [0] * nb
        self.b_free_tokens = [0] * nb

    def _shrunk(self, x_b: float, n_b: float, pooled: float) -> float:
        return (x_b + PRIOR_WEIGHT * pooled) / (n_b + PRIOR_WEIGHT)

    def gain(self, bucket: int | None = None) -> list:
        """The estimated ``G_j``, j = 1..depth (within signal ``bucket``; None: pooled)."""
        g = [(h + 1) / (t + 2) for h, t in zip(self.hits, self.tries)]
        if bucket is None:
            return g
        return [self._shrunk(h, t, gj) for h, t, gj in zip(self.b_hits[bucket], self.b_tries[bucket], g)]

    def _free_means(self, bucket: int | None) -> tuple:
        """(``F``, mean free tokens a step) pooled, or within ``bucket``."""
        f = self.free_held / self.steps if self.steps else 0.0
        m = self.free_tokens / self.steps if self.steps else 0.0
        if bucket is None:
            return f, m
        n = self.b_steps[bucket]
        return (self._shrunk(self.b_free_held[bucket], n, f), self._shrunk(self.b_free_tokens[bucket], n, m))

    def expected_tokens(self, c: int, bucket: int | None = None) -> float:
        """``E(c)``: tokens a step drafted ``c`` deep emits on average (by the estimates; within
        signal ``bucket`` when given)."""
        return 1.0 + self._free_means(bucket)[0] + sum(self.gain(bucket)[:c])

    def seconds(self, c: int, bucket: int | None = None) -> float:
        """``s(c)``: predicted seconds of a step drafted ``c`` deep with the mean free tokens beside
        it (within signal ``bucket`` when given)."""
        m = self._free_means(bucket)[1]
        p, n = self.profile, 1 + len(self.paths[c])
        return (step_seconds(self.paths[c], p) + p.target_seconds(n + m) - p.target_seconds(n)
                + p.per_node_seconds * m)

    def best(self, cap: int, signal: int | None = None) -> int:
        """``c*`` among 0..cap (for a step whose longest free chain is ``signal`` tokens; None:
        pooled)."""
        cap = max(0, min(cap, self.depth))
        b = signal_bucket(signal)
        rates = [self.expected_tokens(c, b) / self.seconds(c, b) for c in range(cap + 1)]
        top = max(rates)
        return next(c for c, r in enumerate(rates) if r >= top * (1 - 1e-12))

    def cap(self, cap: int, signal: int | None = None) -> int:
        """The depth this step drafts, at most ``cap`` (the tokens left and the context's room);
        ``signal`` the longest free chain proposed this step (None: no free sources)."""
        cap = max(0, min(cap, self.depth))
        b = signal_bucket(signal)
        if b is None and self.steps < self.warmup or b == 0 and self.b_steps[0] < self.warmup:
            return cap  # warm-up (module notes: with free sources, the steps with nothing to copy)
        c = self.best(cap, signal)
        if self.steps % self.explore_every == self.explore_every - 1:
            c = min(c + 1, cap)
        return c

    def record(self, drafted: int, model_held: int, free_held: int = 0, free_tokens: int = 0,
               signal: int | None = None) -> None:
        """One step's outcome: it drafted ``drafted`` deep, its accepted path holds ``model_held`` of
        the model's drafts and ``free_held`` of the free chains, which added ``free_tokens`` tokens;
        ``signal`` the longest free chain proposed before it drafted (None: no free sources)."""
        b = signal_bucket(signal)
        self.steps += 1
        self.free_held += free_held
        self.free_tokens += free_tokens
        self.chosen[max(0, min(drafted, self.depth))] += 1
        if b is not None:
            self.b_steps[b] += 1
            self.b_free_held[b] += free_held
            self.b_free_tokens[b] += free_tokens
        for j in range(1, min(drafted, self.depth) + 1):
            hit = int(model_held >= j > free_held)
            self.tries[j - 1] += 1
            self.hits[j - 1] += hit
            if b is not None:
                self.b_tries[b][j - 1] += 1
                self.b_hits[b][j - 1] += hit
