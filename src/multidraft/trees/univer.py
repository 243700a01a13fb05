r"""UniVer: tree verification as conditional optimal transport (Weng, Hu, Yairi; arXiv 2605.04543), as a tree rule.

What could be read of the paper. Only the abstract (arXiv listing and several mirrors) and
one machine summary (arxivlens) were readable here; the body (algorithm box, definitions,
theorems, proofs) was not. From them: (1) a node's multi-draft decision ("horizontal") is an
optimal-transport problem whose target is *scaled* by the node's prefix acceptance
probability ("vertical"): the conditional OT; (2) the rule composes these local plans under
the prefix constraints, in a top-down mass-allocation phase (parallel across the nodes of
one depth) followed by a post-order (leaf-to-root) decision phase; (3) it is claimed
lossless, optimal "under the proposed conditional framework", and 4.2-8.5 % above recursive
rejection sampling without replacement (RRS-wor, the token-level walk ``rrs_wor``) in
accepted length. What follows is our reconstruction from those statements, derived here
and certified by enumeration (``tests/trees/test_univer_rule.py``), not a reading of the
paper's algorithm.

Losslessness, node by node. Let ``A(u)`` be the probability (over trees and the rule's
randomness) that node u lies on the accepted path (``A(root) = 1``) and ``E(u x)`` the
probability that the accepted path ends at u and the emitted token is x. Continuing Y with
target samples gives the target's sequence law iff, for every node u and token x,

    A(u x) + E(u x) = A(u) p(x | u)                                            (C)

(by induction on the length of a prefix: the continued sequence passes u x exactly when Y
does, or when Y stops at or above u and the continuation draws x). So it suffices that every
node u, *given that it is tried with weight a*, is kept with probability a on average over
its own subtree, and passes its mass on as ``a p(. | u)`` between its children and its own
emitted token.

The local problem (conditional OT at one node). Node u has weight ``alpha`` (its prefix
acceptance probability: the probability, averaged over the drafts below u, that u is kept
once tried) and its children are drafted by the node's law from ``q(. | u)``. The mass owed
to "continue with x" is ``alpha p(x | u)``, a sub-probability: the horizontal transport
problem is the usual multi-draft one with the target scaled by ``alpha`` and the missing
``1 - alpha`` free. We solve it sequentially, children in draft (slot) order, with a state
``(a, P, Q)``: ``a P(x)`` is the mass still owed per unit probability of reaching this slot,
Q the law of this slot's draft given the earlier slots. Initially ``(alpha, p(. | u), q(. | u))``.
The slot's token t gets weight

    w(t) = min(a P(t) / Q(t), 1),

so it supplies ``Q(t) w(t) = min(a P(t), Q(t))`` of the owed mass of t; its subtree is then
verified with the scaled target ``w(t) p(. | u t)`` (its weight is w(t)). The slot is refused
with probability ``1 - a + r``, ``r(x) = max(a P(x) - Q(x), 0)``, ``r = sum_x r(x)``, and the
owed mass left is ``r(x)``; spread over the refusal branches in proportion to their
probability (the step the paper's summary calls mass allocation) it gives the next state

    a <- r / (1 - a + r),    P <- r(.) / r,    Q <- the next slot's law given the past:
                                               q (iid), q without the drafted tokens,
                                               renormalised (wor).

(t was refusable only if ``a P(t) < Q(t)``, so ``r(t) = 0``: a refused token is owed
nothing, and a wor law never redraws it.) After the last slot, u is kept with probability
the final a and emits from the final P. Averaged over the slot's draw, the probability of
being kept at or after a slot with weight a is ``(a - r) + (1 - a + r) r / (1 - a + r) = a``,
and the owed mass of every x is met exactly; by induction over slots and over the subtree,
(C) holds. The root has ``alpha = 1`` and is always kept.

Special cases (tested): one chain (one draft a node) is block verification (Sun et al.
2025), tree by tree; i.i.d. node drafts give traversal verification (Weng, Hu et al. 2025)
as implemented in ``trees.traversal``, tree by tree; depth 1 with ``alpha = 1`` is recursive
rejection sampling (with replacement for iid, without for wor: ``rrs_wor``). New here: trees
whose siblings are drawn without replacement (the trees the paper compares on, against
``rrs_wor``).

The two phases. Phase 1 (top-down, ``allocate``): every node's weight and every slot's
weight from the state recursion above, level by level (each node's slots are a short
sequential loop over K; each step is one pass over V). Phase 2 (post-order): the children
of a node are tried in slot order, each child's subtree decided before the next sibling; a
node all of whose children were refused is kept with its final a (one uniform) and emits
from its final P. ``verify`` reads its generator in that order: one uniform per node
decided, depth first, then the emitted token (``sampling.sample_token``).

Exact value. Given the tree, with ``s(u)`` the probability that u's subtree keeps u once
tried, ``s(u) = 1 - (1 - h(u)) prod_children (1 - s(c))`` (h: the final weight; a leaf has
``s = h = w``), and the probability that child c_j is tried is its parent's times
``prod_(i<j) (1 - s(c_i))``; ``E|Y| = 1 + sum_(u != root) P(u tried) s(u)``
(``expected_tokens``), O(nodes x V) with phase 1 the only pass over V.

Steps the paper leaves unspecified to us, and our choices:

* The local plan. The abstract says the local plans are optimal transport plans for the
  scaled target. Two plans are offered. ``plan='residual'`` (default) is the sequential plan
  above (RRS at scale ``alpha``): any V, O(K x V) a node; optimal for one draft (a chain: it
  is block verification's weight) and for small ``alpha`` (it then accepts the whole owed
  mass), but at ``alpha = 1`` it is RRS-wor, below the optimal multi-draft acceptance for
  K >= 2. ``plan='ot'`` takes, at every node, a plan ``pi_S(j)`` (the probability of
  selecting slot j given the drafted tuple S) of *largest acceptance*: the linear program

      max sum_(S, j) D(S) pi_S(j)   s.t.  sum_j pi_S(j) <= 1,
                                          sum_(S, j: S_j = x) D(S) pi_S(j) <= alpha p(x | u),

  over every tuple S of the node's law D (only a token's first slot in S; the optimum is
  ``1 + min_X [alpha p(X) - P(S within X)]``, the multi-draft ceiling at scale ``alpha``).
  It is realised in slot order with conditional weights ``w_j = pi_S(j) / (1 - sum_(i<j)
  pi_S(i))`` (child j's weight), and the node keeps itself with the constant
  ``h = (alpha - A) / (1 - A)`` (A the plan's acceptance) and emits ``R(.) / R``,
  ``R(x) = alpha p(x | u) - sum_(S, j: S_j = x) D(S) pi_S(j)``: the owed mass is again met
  exactly, whatever the plan, so losslessness does not rest on the solver (the solution is
  scaled down to its caps before use: feasible to rounding). Such a plan is not unique and
  the choice matters below the node (an arbitrary optimal vertex put the mass on leaf slots
  and lost up to 0.9 tokens per call on a shape whose first slot carries the subtree), so a
  second LP picks, among plans within 1e-10 of the best acceptance, the one that puts the
  most mass on the slots with the largest shape subtree, then on earlier slots (our choice;
  the abstract says nothing of it). Cost: two HiGHS solves a node with
  ``(tuples of D) x K`` variables (V!/(V-K)! tuples for wor), refused past
  ``max_variables`` (``OT_MAX_VARIABLES``): small V only. It also takes the 'greedy' node law.
* How the refused mass is split among the refusal branches (which token was refused):
  in proportion to the branch probabilities (every branch gets the same normalised state).
* Order of the children: draft (slot) order, each subtree finished before the next sibling.
* Duplicate drafts (iid): a repeated token is a slot without a subtree; it
  still updates the state (it is a draw of the node's law) and has weight 0 (its token
  was refused before, so it is owed nothing).
* Degenerate rows: ``r = 0`` gives ``a = 0`` and keeps P (nothing is owed; a refusal then
  has probability 0 or the node is never kept); the root always emits from its current P.

Supported tree laws: full shapes (``kary``, ``explicit``) and tries of K sequences whose
node drafts are 'iid' or 'wor' (with ``plan='ot'`` also 'greedy'), and every chain ('iid',
'wor' or 'greedy': one draft a node is one draw from q); certified at 1e-12 by
``certify.certify_tree``. Refused: the 'greedy' node law with K >= 2 under the residual plan
(its top K-1 tokens are not draws from a known law given the earlier drafts),
'independent' columns (the shared row checks read one q row a node) and dynamic trees (a
node's number of drafts depends on the drafts elsewhere in its level).
"""
from __future__ import annotations

import torch

import numpy as np

from .. import drafts as _drafts
from .._scan import keep_ratio
from .._validate import as_generator, as_int
from ._check import check_tree, is_chain_law, is_mixed_law, mixed_refusal, row64
from .block import chain_path
from ._postorder import first_kept
from .rules import TreeRule, TreeVerdict, register
from .tree import DraftTree

__all__ = ["UniVer", "UNIVER_KINDS", "PLANS", "OT_MAX_VARIABLES"]

UNIVER_KINDS = ("iid", "wor")  # node laws whose next draft's law given the earlier drafts is known
PLANS = ("residual", "ot")
OT_MAX_VARIABLES = 50_000  # (draft tuple, distinct slot) pairs of one node's transport LP (plan='ot')


class _Plan:
    """Phase 1 of one tree: per node, its trial list ``[(token, child id or None, w)]`` in slot
    order and its final keep weight ``h`` and emission row ``rho`` ``[V]`` (float64)."""

    __slots__ = ("slots", "h", "rho", "weight")

    def __init__(self, n: int):
        self.slots: list[list] = [[] for _ in range(n)]
        self.h = [0.0] * n
        self.rho: list = [None] * n
        self.weight = [0.0] * n


def _next_state(a: float, P: torch.Tensor, Q: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The state after a refused slot: ``(r / (1 - a + r), r(.) / r)``, r the scaled residual."""
    res = (a * P - Q).clamp_min(0.0)  # [V]
    r = float(res.sum())
    if r <= 0.0:
        return 0.0, P
    return min(r / (1.0 - a + r), 1.0), res / r


def _ot_plan(P: torch.Tensor, Q: torch.Tensor, kind: str, k: int, alpha: float, max_variables: int, scores: tuple):
    """The node's local plan by linear programming (plan='ot'): the largest acceptance
    ``sum_(S, j) D(S) pi_S(j)`` with ``sum_j pi_S(j) <= 1`` and ``sum_(S, j: S_j = x) D(S) pi_S(j) <= alpha P(x)``
    over the node's draft tuples S (law ``kind`` from Q, k drafts; only a token's first slot
    in S gets mass); among the plans within 1e-10 of that acceptance, the one of largest
    ``sum D(S) pi_S(j) scores[j]`` (a second LP). Returns ``({tuple: [pi per slot]}, h, rho)``,
    made exactly feasible."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, vstack

    tuples, probs = _drafts.make(kind, Q, k).enumerate()
    tl, D = tuples.tolist(), probs.numpy()
    cols = [(n, j) for n, S in enumerate(tl) for j, t in enumerate(S) if t not in S[:j]]
    if len(cols) > max_variables:
        raise ValueError(f"tree: a node's transport plan has {len(cols):,} variables (draft tuples x slots), more than "
                         f"max_variables = {max_variables:,}; use plan='residual' (any V) or a smaller V or K")
    V = P.shape[0]
    nv, N = len(cols), len(tl)
    tok = np.array([tl[n][j] for n, j in cols])
    row_n = np.array([n for n, _ in cols])
    A = csr_matrix((np.ones(2 * nv), (np.concatenate([row_n, N + tok]), np.tile(np.arange(nv), 2))), shape=(N + V, nv))
    cap = np.concatenate([D, alpha * P.cpu().numpy()])
    res = linprog(-np.ones(nv), A_ub=A, b_ub=cap, bounds=(0, None), method="highs-ds")
    if res.status != 0:  # pragma: no cover - a feasible bounded LP (0 is feasible)
        raise RuntimeError(f"univer: the node's transport LP failed ({res.message})")
    x = np.clip(res.x, 0.0, None)
    best = float(x.sum())
    w2 = np.array([scores[j] for _, j in cols], dtype=np.float64)
    A2 = vstack([A, csr_matrix(-np.ones((1, nv)))]).tocsr()
    res2 = linprog(-w2, A_ub=A2, b_ub=np.concatenate([cap, [-(best - 1e-10)]]), bounds=(0, None), method="highs-ds")
    if res2.status == 0:
        x = np.clip(res2.x, 0.0, None)
    # exact feasibility: scale every token's mass down to its cap, then every tuple's row to D(S)
    M = np.bincount(tok, weights=x, minlength=V)
    f = np.where(M > cap[N:], cap[N:] / np.where(M > 0, M, 1.0), 1.0)
    x = x * f[tok]
    rows = np.bincount(row_n, weights=x, minlength=N)
    g = np.where(rows > D, D / np.where(rows > 0, rows, 1.0), 1.0)
    x = x * g[row_n]
    M = torch.as_tensor(np.bincount(tok, weights=x, minlength=V), device=P.device)  # [V]
    R = (alpha * P - M).clamp_min(0.0)  # [V]: the owed mass the node emits itself
    acc = float(x.sum())
    Rt = float(R.sum())
    h = min(Rt / (1.0 - acc), 1.0) if acc < 1.0 else 0.0
    rho = R / Rt if Rt > 0 else P
    pi: dict = {tuple(S): [0.0] * len(S) for S in tl}
    for v, (n, j) in enumerate(cols):
        pi[tuple(tl[n])][j] = float(x[v] / D[n])
    return pi, h, rho


class UniVer(TreeRule):
    """UniVer (see the module notes): sequence-level verification of trees whose node drafts
    are 'iid' or 'wor', by conditional (scaled) transport at every node.

    ``plan``: 'residual' (default; the sequential residual plan, any V) or 'ot' (each node's
    plan a maximum-acceptance transport plan from a linear program over its draft tuples,
    small V only, at most ``max_variables`` variables a node; also takes 'greedy' node laws).
    """

    name = "univer"

    def __init__(self, plan: str = "residual", max_variables: int = OT_MAX_VARIABLES):
        if plan not in PLANS:
            raise ValueError(f"plan must be one of {', '.join(map(repr, PLANS))}, got {plan!r}")
        self.plan = plan
        self.max_variables = as_int(max_variables, "max_variables", minimum=1)
        self._kinds = UNIVER_KINDS + (("greedy",) if plan == "ot" else ())
        self._memo: dict = {}

    def __repr__(self) -> str:
        return f"<tree rule 'univer' plan={self.plan!r}>"

    def refusal(self, tree_law):
        if is_mixed_law(tree_law):
            return mixed_refusal(self.name)
        if tree_law.shape.mode == "dynamic":
            return ("dynamic trees choose a node's number of drafts from the drafts of its whole level; univer "
                    "verifies fixed shapes: use kary(K, L, kind), explicit(paths, kind), sequences(K, L) or a chain")
        if tree_law.kind == "greedy" and is_chain_law(tree_law):
            return None
        if tree_law.kind not in self._kinds:
            return (f"its nodes draw {tree_law.kind!r} drafts; univer (plan={self.plan!r}) verifies "
                    f"{' or '.join(map(repr, self._kinds))} node drafts (kary(K, L, 'wor'), explicit(paths, 'iid'), "
                    "sequences(K, L)) or a chain" + ("; plan='ot' also takes 'greedy'" if self.plan == "residual" else ""))
        return None

    def supports(self, tree_law) -> bool:
        return self.refusal(tree_law) is None

    # phase 1 --------------------------------------------------------------------------------
    def _check(self, tree: DraftTree) -> bool:
        """The tree's checks (one ``ValueError`` naming what would work); True for a chain."""
        chainlike = isinstance(tree, DraftTree) and all(len(nd.drafts) <= 1 for nd in tree.nodes)
        check_tree(tree, self._kinds, "univer", chain=chainlike)
        if tree.shape.mode == "dynamic":
            raise ValueError("tree: a dynamic tree; univer verifies fixed shapes (kary, explicit, sequences, chains)")
        return chainlike

    def allocate(self, tree: DraftTree) -> _Plan:
        """Phase 1: every node's weight, every slot's weight, every node's final (h, rho)."""
        self._check(tree)
        law = tree.law
        plan = _Plan(len(tree.nodes))
        plan.weight[0] = 1.0
        for i, nd in enumerate(tree.nodes):  # creation order: a parent before its children
            alpha = plan.weight[i]
            P = row64(tree.p(i))  # [V]
            if not nd.drafts:
                plan.h[i], plan.rho[i] = alpha, P
                continue
            Q = row64(nd.q)  # [V]
            if law in ("wor", "greedy") and len(set(nd.drafts)) != len(nd.drafts):
                raise ValueError(f"tree: node {i} repeats a draft, which a {law!r} law never does "
                                 "(the drafts do not match the tree's law)")
            if self.plan == "ot":
                self._ot_node(tree, i, alpha, P, Q, plan)
                continue
            a = alpha
            seen: set = set()
            for j, t in enumerate(nd.drafts):
                qt = float(Q[t])
                if not qt > 0:
                    raise ValueError(f"tree: draft {t} at node {i} (slot {j}) has probability 0 under the law of that "
                                     "slot given the earlier drafts (the drafts do not match the tree's law)")
                w = keep_ratio(a * float(P[t]), qt)  # min(a P(t) / Q(t), 1)
                c = None if t in seen else nd.child[t]
                seen.add(t)
                if c is not None:
                    plan.weight[c] = w
                plan.slots[i].append((t, c, w if c is not None else 0.0))
                a, P = _next_state(a, P, Q)
                if law == "wor":
                    Q = Q.clone()
                    Q[t] = 0.0
                    left = float(Q.sum())
                    Q = Q / left if left > 0 else Q
            plan.h[i], plan.rho[i] = (1.0 if i == 0 else a), P
        return plan

    @staticmethod
    def _scores(tree: DraftTree, i: int, k: int) -> tuple:
        """Tie-break of plan='ot' among maximum-acceptance plans: slot j's score is
        ``(k + 1) x (nodes of the shape's subtree under slot j) + (k - j)``, so mass goes to the
        children with more drafts below them, then to earlier slots (K-sequence tries: slot
        order only)."""
        nd = tree.nodes[i]
        if tree.shape.mode != "paths":
            return tuple(float(k - j) for j in range(k))
        out = []
        for j in range(k):
            base = nd.slot + (j,)
            size = sum(1 for path in tree.shape.children if path[: len(base)] == base and len(path) <= tree.depth_cap)
            out.append(float((k + 1) * size + (k - j)))
        return tuple(out)

    def _ot_node(self, tree: DraftTree, i: int, alpha: float, P: torch.Tensor, Q: torch.Tensor, plan: _Plan) -> None:
        """Node i's slots under plan='ot': the LP plan's pi for the drafted tuple, realised in
        slot order as conditional weights ``w_j = pi_j / (1 - sum_(i<j) pi_i)``; final (h, rho)
        the plan's constant keep weight and residual."""
        nd = tree.nodes[i]
        drafts = tuple(nd.drafts)
        if alpha > 0:
            scores = self._scores(tree, i, len(drafts))
            key = (id(P), id(Q), alpha, len(drafts), tree.law, scores)
            hit = self._memo.get(key)
            if hit is None or hit[0] is not P or hit[1] is not Q:
                hit = (P, Q, _ot_plan(P, Q, tree.law, len(drafts), alpha, self.max_variables, scores))
                if len(self._memo) > 4096:
                    self._memo.clear()
                self._memo[key] = hit
            pis, h, rho = hit[2]
            pi = pis.get(drafts)
            if pi is None:
                raise ValueError(f"tree: the drafts {list(drafts)} at node {i} have probability 0 under the node's "
                                 f"{tree.law!r} law (the drafts do not match the tree's law)")
        else:
            pi, h, rho = [0.0] * len(drafts), 0.0, P
        left, seen = 1.0, set()
        for j, t in enumerate(drafts):
            c = None if t in seen else nd.child[t]
            seen.add(t)
            w = min(pi[j] / left, 1.0) if c is not None and left > 0 else 0.0
            left -= pi[j] if c is not None else 0.0
            if c is not None:
                plan.weight[c] = w
            plan.slots[i].append((t, c, w))
        plan.h[i], plan.rho[i] = (1.0 if i == 0 else h), rho

    # phase 2 --------------------------------------------------------------------------------
    @staticmethod
    def _decisions(plan: _Plan, i: int = 0, path: tuple = ()):
        """Phase 2's decisions for ``verify`` (``_postorder``): ``(path, keep, row, leaf)`` in
        post-order, a node's children in slot order (repeated tokens have no subtree), then the node
        itself with its final weight h and row rho."""
        kids = [c for _, c, _ in plan.slots[i] if c is not None]
        for c in kids:
            yield from UniVer._decisions(plan, c, path + (c,))
        yield path, plan.h[i], plan.rho[i], not kids

    @staticmethod
    def _exact(tree: DraftTree, plan: _Plan, visit) -> None:
        """Phase 2 read exactly: ``visit(i, prefix, reach, fail, h, rho)`` at every node tried with
        probability ``reach`` > 0, after its children (``fail``: the probability that all of them
        were refused once i is tried; ``prefix``: the tokens to i). A node is kept, once tried,
        with ``s = 1 - fail (1 - h)``."""

        def run(i: int, prefix: tuple, reach: float) -> float:
            fail = 1.0
            for t, c, _ in plan.slots[i]:
                if c is None or reach * fail <= 0:
                    continue
                fail *= 1.0 - run(c, prefix + (t,), reach * fail)
            visit(i, prefix, reach, fail, plan.h[i], plan.rho[i])
            return 1.0 - fail * (1.0 - plan.h[i])

        run(0, (), 1.0)

    def output_distribution(self, tree: DraftTree) -> dict:
        law: dict = {}

        def emit(i, prefix, reach, fail, h, rho):
            m = reach * fail * h  # P(the accepted path ends at i)
            if m > 0:
                for y in torch.nonzero(rho > 0).flatten().tolist():
                    key = prefix + (y,)
                    law[key] = law.get(key, 0.0) + m * float(rho[y])

        self._exact(tree, self.allocate(tree), emit)
        return law

    def expected_tokens(self, tree: DraftTree) -> float:
        """Exact E|Y| given this tree, O(nodes x V) with phase 1 the only pass over V (module
        notes, "Exact value")."""
        total = 1.0

        def add(i, prefix, reach, fail, h, rho):
            nonlocal total
            if i:
                total += reach * (1.0 - fail * (1.0 - h))  # P(i tried) s(i)

        self._exact(tree, self.allocate(tree), add)
        return total

    def _chain_decisions(self, tree: DraftTree):
        """Phase 2's decisions on a chain (one draft a node, plan='residual'), lazily: the weights
        ``w_i = min(a P(t) / Q(t), 1)`` from the values at the drafted tokens (``ChainRows.at``: the
        numbers of ``row64``), a node's keep weight and row (``_next_state``, one pass over V) only
        when the decisions reach it. The same numbers as ``allocate``: a step whose leaf is kept
        converts one row and computes no residual."""
        ids, xs, ps, qs = chain_path(tree)
        w = [1.0]  # w[d]: the weight of the node at depth d
        for d, t in enumerate(xs):
            qt = qs.at(d, t)
            if not qt > 0:
                raise ValueError(f"tree: draft {t} at node {ids[d]} (slot 0) has probability 0 under the law of that "
                                 "slot given the earlier drafts (the drafts do not match the tree's law)")
            w.append(keep_ratio(w[d] * ps.at(d, t), qt))
        L = len(xs)
        yield tuple(ids[1:]), w[L], ps[L], True
        for d in range(L - 1, -1, -1):
            a, row = _next_state(w[d], ps[d], qs[d])
            yield tuple(ids[1 : d + 1]), (1.0 if d == 0 else a), row, False

    def verify(self, tree: DraftTree, generator) -> TreeVerdict:
        g = generator if isinstance(generator, torch.Generator) else as_generator(generator, tree.p(0).device, purpose="verify")
        if self.plan == "residual" and self._check(tree):
            return first_kept(self._chain_decisions(tree), g)
        return first_kept(self._decisions(self.allocate(tree)), g)


register("univer", UniVer)
