"""How deep each free source's chains go in a step, chosen by cost (issue 39 item 3).

A free source (prompt lookup, the suffix index) costs nothing to *propose*, but every token it
adds to the step's tree is one more token of the target's pass, and on a CPU that pass grows
with its tokens (a 1.5B target over 12 tree tokens costs about 4x a one-token pass on two
cores). A copied token pays only when it is likely to be kept *and* the model's own drafts would
not have given it. :class:`FreeBudget` learns both online and cuts each source's chains where
one more token no longer pays.

The rule. For a source s with cap D (its ``depth``), let ``g_j`` (j = 1..D) be the probability
that the step's emitted path holds s's chain to depth j while the model's drafts hold it to
less than j: the token the chain's j-th node adds over the model's tree. With ``E`` the mean
tokens a step emits from the model's tree alone (1 + its accepted depth, measured), ``n`` the
tree's tokens before s (root included), ``m_L`` the tokens s's chains add when cut to depth L
and ``c(n)`` the step's predicted seconds at n tree tokens (the cost profile's target pass plus
``per_node_seconds`` a node, plus the step's fixed seconds ``b``: the draft model's levels at the
depth it drafts this step and the profile's per-step time, which the chains do not change but
which a step costs all the same), the predicted rate of s cut at depth L is

    rate(L) = (E + sum_{j <= L} g_j) / (b + c(n + m_L)),

and the source proposes ``L* = argmax_{0 <= L <= D} rate(L)`` tokens deep (the least L on
ties; L* = 0: nothing this step). ``g_j`` is estimated by ``(hits_j + 1) / (tried_j + 2)``
(hits: steps where depth j of the chain gained a token; tried: steps it was proposed). A depth
that is never proposed is never measured, so every ``explore_every``-th step a source has a
match, it proposes its whole cap (a fixed schedule: the chosen depths, and so the decode, stay
a function of the seed). Sources are taken in their order, each seeing the tokens the ones
before it chose.

The model's depth varies. Where the draft model's own depth is chosen step by step (``decoding.pace``:
0 when the copies already give the tokens), a step drafted ``c`` deep can hold at most c of the
model's drafts, so the figures above are read *at that depth*: ``g_j`` for j <= c is estimated from
the steps that drafted at least j deep (the model could have held depth j), and for j > c it is the
probability that the chain holds depth j at all (``(held_j + 1) / (offered_j + 2)`` over every
step that proposed it so deep: nothing of the model's competes there); ``E = 1 + sum_{j <= c} P(the
model's drafts hold depth j)``, from the steps drafted at least j deep. Without the depth (``drafted``
None) every step counts as drafted to the model's full depth, the rule above as written. Without
this, a step the pace drafts 0 deep would read ``g_j`` as if the model still held the first tokens
and cut the very chains that are its only drafts.

Exactness does not depend on any of this: the chains stay deterministic functions of the
committed text and the step's counters, never of the model's draws in that step, so the walk's
free-first verification stays lossless whatever depth is chosen (``trees.TokenWalk``). Without
a cost function there is no budget: every source proposes its cap, as before.
"""
from __future__ import annotations

from typing import Callable

__all__ = ["FreeBudget", "EXPLORE_EVERY"]

EXPLORE_EVERY = 8  # every 8th step with a match, a source proposes its whole cap (measures deep g_j)


class FreeBudget:
    """Per-decode depth choice of the free sources (module notes).

    ``caps`` ``{source name: cap}`` (the source's ``depth``); ``step_seconds(n)`` the predicted
    seconds of a step whose tree has n tokens (root included; e.g. ``CostProfile.target_seconds(n)
    + per_node_seconds * (n - 1)``); ``explore_every`` the exploration period (>= 1; 1: always the
    cap).
    """

    def __init__(self, caps: dict, step_seconds: Callable[[int], float], explore_every: int = EXPLORE_EVERY):
        if not callable(step_seconds):
            raise ValueError(f"step_seconds must be callable, got {type(step_seconds).__name__}")
        if not isinstance(explore_every, int) or isinstance(explore_every, bool) or explore_every < 1:
            raise ValueError(f"explore_every must be an int >= 1, got {explore_every!r}")
        self.caps = {}
        for name, cap in dict(caps).items():
            if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
                raise ValueError(f"caps[{name!r}] must be an int >= 0, got {cap!r}")
            self.caps[name] = cap
        self.step_seconds = step_seconds
        self.explore_every = explore_every
        # depth j of the chain, over the steps that proposed it and drafted the model >= j deep:
        self.hits = {name: [0] * cap for name, cap in self.caps.items()}   # it gained over the model's
        self.tried = {name: [0] * cap for name, cap in self.caps.items()}
        # ... over every step that proposed it (whatever the model's depth):
        self.held = {name: [0] * cap for name, cap in self.caps.items()}   # the path held it
        self.offered = {name: [0] * cap for name, cap in self.caps.items()}
        self.offers = {name: 0 for name in self.caps}   # steps the source had a match
        self.steps = 0                                   # steps recorded
        self.model_tokens = 0                            # tokens the model's tree alone emitted, summed
        self.model_hits: list = []    # [j - 1]: steps drafted >= j deep whose path held the model's depth j
        self.model_tries: list = []   # [j - 1]: steps drafted >= j deep

    def gain(self, name: str, drafted: int | None = None) -> list:
        """The estimated ``g_j``, j = 1..cap, of source ``name`` in a step whose model drafts
        ``drafted`` deep (None: as deep as ever; module notes)."""
        out = []
        for j, (h, t, hd, o) in enumerate(zip(self.hits[name], self.tried[name], self.held[name],
                                               self.offered[name]), start=1):
            out.append((h + 1) / (t + 2) if drafted is None or j <= drafted else (hd + 1) / (o + 2))
        return out

    def expected_model_tokens(self, drafted: int | None = None) -> float:
        """``E``: mean tokens a step emits from the model's tree alone, drafted ``drafted`` deep
        (None: as deep as ever; 1 before any step)."""
        if drafted is None:
            return self.model_tokens / self.steps if self.steps else 1.0
        return 1.0 + sum((h + 1) / (t + 2) if t else 0.0
                         for h, t in zip(self.model_hits[:drafted], self.model_tries[:drafted]))

    def depth(self, name: str, n: int, sizes, base: float = 0.0, drafted: int | None = None) -> int:
        """The depth source ``name`` proposes this step: ``sizes[L - 1]`` the tokens its chains
        add to the tree when cut to depth L (L = 1..len(sizes); empty: no match), the tree has
        ``n`` tokens before it (root included), the step costs ``base`` seconds besides
        ``step_seconds`` (module notes: ``b``) and its model drafts ``drafted`` deep (None: as
        deep as ever)."""
        if not isinstance(base, (int, float)) or isinstance(base, bool) or not base >= 0:
            raise ValueError(f"base must be a number >= 0, got {base!r}")
        cap = min(self.caps[name], len(sizes))
        if cap <= 0:
            return 0
        self.offers[name] += 1
        if self.explore_every == 1 or self.offers[name] % self.explore_every == 1:
            return cap
        e, g = self.expected_model_tokens(drafted), self.gain(name, drafted)
        best, best_rate, tokens = 0, e / (base + self.step_seconds(n)), e
        for L in range(1, cap + 1):
            tokens += g[L - 1]
            rate = tokens / (base + self.step_seconds(n + sizes[L - 1]))
            if rate > best_rate * (1 + 1e-12):
                best, best_rate = L, rate
        return best

    def record(self, offered: dict, held: dict, model_held: int, drafted: int | None = None) -> None:
        """One step's outcome: ``offered[name]`` the depth each source proposed (0 or absent:
        none), ``held[name]`` how deep the emitted path holds its chains, ``model_held`` how deep
        it holds the model's drafts (the model's tree alone would have emitted ``model_held + 1``),
        which were drafted ``drafted`` deep (None: as deep as ever)."""
        if drafted is not None and (not isinstance(drafted, int) or isinstance(drafted, bool) or drafted < 0):
            raise ValueError(f"drafted must be None or an int >= 0, got {drafted!r}")
        self.steps += 1
        self.model_tokens += 1 + model_held
        if drafted is not None:
            while len(self.model_tries) < drafted:
                self.model_tries.append(0)
                self.model_hits.append(0)
            for j in range(1, drafted + 1):
                self.model_tries[j - 1] += 1
                self.model_hits[j - 1] += int(model_held >= j)
        for name, d in offered.items():
            h = held.get(name, 0)
            for j in range(1, min(d, self.caps[name]) + 1):
                self.offered[name][j - 1] += 1
                self.held[name][j - 1] += int(h >= j)
                if drafted is None or j <= drafted:
                    self.tried[name][j - 1] += 1
                    self.hits[name][j - 1] += int(h >= j > model_held)
