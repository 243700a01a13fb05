r"""The tree-level ceiling: the most tokens per call any lossless rule can emit for a tree law.

A rule is a coupling ``pi(T, Y) >= 0`` of the draft tree T (law ``P(T)``) and the emitted
sequence Y (an accepted path of T plus one token):

    sum_Y pi(T, Y) = P(T)                                     for every tree T,
    sum_(T, Y <= s) pi(T, Y) p(s after Y | Y) = p(s)           for every s in V^(L+1),

the second row being losslessness (Y continued by target samples has the target's law).
The ceiling maximises ``E|Y| = sum pi(T, Y) |Y|``. Small reductions, all exact:

* Trees are merged by their set of paths S (node prefixes): Y depends on T only through
  S, and a merged solution splits back as ``pi(T, Y) = pi(S, Y) P(T) / P(S)``.
* Y with ``p(Y) = 0`` must get 0 (its continuations have target probability 0) and rows of
  s with ``p(s) = 0`` are then empty: both are left out. On the rest
  ``p(s after Y | Y) = p(s) / p(Y)``.
* The sequence rows are written ``<= p(s)``: they sum to the tree rows' total 1 = sum_s p(s),
  so every one holds with equality at any feasible point, and the LP has no redundant
  equality row.

Solved in float64 by HiGHS' dual simplex (``scipy.optimize.linprog``). Then

* the primal is *repaired* by iterative refinement (the LP solved again for the correction
  of its own residual, scaled up to size 1, at most ``REFINE_ROUNDS`` times; then, if that
  stalls, a nonnegative least-squares solution on the optimal face), so the coupling's tree
  rows and sequence marginals hold to rounding (``feasibility_error``, 1e-16 in every
  instance tested, 'peaked' ones with trees of probability 1e-12 included); ``TreeLP``
  samples from it, and its certificate's error is at most about twice that;
* the dual ``(u_S, v_s >= 0)`` is made exactly feasible (``u_S`` raised by its largest
  violation): then for every lossless rule ``E|Y| <= sum_S P(S) u_S + sum_s p(s) v_s``
  (``upper_bound``), a certificate independent of the solver's tolerances; the duality
  gap ``upper_bound - value`` is reported.

``optimal_tokens`` counts the LP's size before building it and refuses (``ValueError``
naming ``tree_law``) past ``max_variables``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .._validate import as_generator, as_int
from ..sampling import sample_token
from ._check import check_tree, row64
from .laws import MAX_TREES, as_tree_law
from .rules import TreeRule, TreeVerdict, register
from .tables import as_sequence_model
from .tree import DraftTree

__all__ = ["MAX_LP_VARIABLES", "CeilingSolution", "RootTradeoff", "TreeLP", "lp_size", "optimal_tokens", "root_tradeoff",
           "tree_paths"]

MAX_LP_VARIABLES = 300_000  # (tree, Y) pairs the ceiling LP accepts
FACE_TOL = 1e-9  # reduced costs within this of 0 count as the optimal face in the repair
REFINE_ROUNDS = 3  # iterative-refinement rounds of the primal
REFINE_SECONDS = 10.0  # time limit of one refinement LP: HiGHS can stall on the scaled problem of an
# ill-conditioned instance (sequences K=3 L=2 V=2, seed 281, 'peaked'); the NNLS repair takes over


class CeilingSolution(NamedTuple):
    value: float              # E|Y| of the repaired optimal coupling (tokens per call)
    upper_bound: float        # dual certificate: no lossless rule exceeds it
    gap: float                # upper_bound - value
    feasibility_error: float  # largest violation of the repaired coupling's rows (trees and sequences)
    coupling: dict            # {S (frozenset of node prefixes): {Y: pi(S, Y)}}
    tree_probs: dict          # {S: P(S)}
    duals: tuple              # (u: {S: u_S}, v: {s: v_s}) the certified dual solution
    variables: int            # LP columns (merged tree, Y)


def tree_paths(tree: DraftTree) -> frozenset:
    """The set of node prefixes of a tree (the root's is ``()``): what the LP merges trees by."""
    return frozenset(tree.prefix(i) for i in range(len(tree.nodes)))


def lp_size(tree_law, V: int) -> tuple[int, int, int]:
    """Upper bounds ``(trees, emitted sequences per tree, variables)`` of the ceiling LP, from
    the shape alone (nothing enumerated): trees <= V^(drafts per tree), Y per tree <= nodes x V."""
    V = as_int(V, "V", minimum=1)
    sh = as_tree_law(tree_law).shape
    if sh.mode == "sequences":
        drafts = sh.k * sh.depth
    elif sh.mode == "dynamic":
        drafts = sh.budget - 1  # the node budget, root included
    else:
        drafts = sum(sh.children.values())
    nodes = 1 + drafts
    trees = V ** drafts
    return trees, nodes * V, trees * nodes * V


def _check_size(tree_law, V: int, max_variables: int) -> None:
    trees, per, n = lp_size(tree_law, V)
    if trees > MAX_TREES or n > max_variables:
        raise ValueError(
            f"tree_law: {tree_law.name} at V = {V} gives up to {trees:,} draft trees x {per:,} emitted "
            f"sequences = {n:,} LP variables, more than the limit of {max_variables:,} variables "
            f"({MAX_TREES:,} trees); use a smaller V, K or depth")


class _LP(NamedTuple):
    classes: list        # merged trees S, in row order
    probs: dict          # {S: P(S)}
    cols_Y: list         # the emitted sequence of each column
    cols_S: np.ndarray   # the tree class of each column
    lens: np.ndarray     # |Y| of each column
    A_ub: object         # sequence rows (sparse): sum pi(S, Y) p(s | Y) <= p(s)
    b_ub: np.ndarray
    A_eq: object         # tree rows (sparse): sum_Y pi(S, Y) = P(S)
    b_eq: np.ndarray
    keep_rows: np.ndarray  # flat indices in V^(L+1) of the sequence rows


def _ceiling_lp(tree_law, model, max_variables: int = MAX_LP_VARIABLES) -> _LP:
    """The ceiling LP's data (module notes), built after the size check."""
    from scipy.sparse import csr_matrix

    as_tree_law(tree_law)
    as_sequence_model(model)
    max_variables = as_int(max_variables, "max_variables", minimum=1)
    if max_variables > MAX_LP_VARIABLES:  # the one bound: the dense tables below are sized by it
        raise ValueError(f"max_variables: at most {MAX_LP_VARIABLES:,} (trees.MAX_LP_VARIABLES), got {max_variables:,}")
    V, L = model.V, tree_law.depth
    _check_size(tree_law, V, max_variables)
    n = L + 1
    # merged trees
    probs: dict = {}
    for tree, w in tree_law.enumerate(model):
        S = tree_paths(tree)
        probs[S] = probs.get(S, 0.0) + w
    classes = sorted(probs, key=lambda S: sorted(S))
    # the target's law of s in V^n, and p(Y) for every prefix Y (sums of blocks of it)
    full = model.sequence_law((), n).numpy().reshape(-1)  # [V^n], C order
    keep_rows = np.nonzero(full > 0)[0]
    row_of = -np.ones(full.size, dtype=np.int64)
    row_of[keep_rows] = np.arange(keep_rows.size)
    nT = len(classes)

    def block(Y: tuple) -> tuple[int, int]:
        m = len(Y)
        start = 0
        for t in Y:
            start = start * V + t
        span = V ** (n - m)
        return start * span, span

    cols_Y, cols_S = [], []
    ent_r, ent_c, ent_v = [], [], []
    for si, S in enumerate(classes):
        for u in sorted(S):
            for y in range(V):
                Y = u + (y,)
                lo, span = block(Y)
                seg = full[lo : lo + span]
                pY = float(seg.sum())
                if pY <= 0:
                    continue
                j = len(cols_Y)
                cols_Y.append(Y)
                cols_S.append(si)
                nz = np.nonzero(seg > 0)[0]
                ent_r.append(row_of[lo + nz])
                ent_c.append(np.full(nz.size, j))
                ent_v.append(seg[nz] / pY)
    nv = len(cols_Y)
    cols_S = np.asarray(cols_S)
    lens = np.array([len(Y) for Y in cols_Y], dtype=np.float64)
    A_ub = csr_matrix((np.concatenate(ent_v), (np.concatenate(ent_r), np.concatenate(ent_c))), shape=(keep_rows.size, nv))
    b_ub = full[keep_rows]
    A_eq = csr_matrix((np.ones(nv), (cols_S, np.arange(nv))), shape=(nT, nv))
    b_eq = np.array([probs[S] for S in classes])
    return _LP(classes, probs, cols_Y, cols_S, lens, A_ub, b_ub, A_eq, b_eq, keep_rows)


def optimal_tokens(tree_law, model, max_variables: int = MAX_LP_VARIABLES) -> CeilingSolution:
    """The tree-level ceiling of ``tree_law`` (a ``laws.TreeLaw``) under ``model``
    (``tables.TableModel``): the LP of the module notes, solved, repaired and certified."""
    from scipy.optimize import linprog, nnls

    lp = _ceiling_lp(tree_law, model, max_variables)
    V, n = model.V, tree_law.depth + 1
    classes, probs, cols_Y, cols_S, lens = lp.classes, lp.probs, lp.cols_Y, lp.cols_S, lp.lens
    A_ub, b_ub, A_eq, b_eq, keep_rows = lp.A_ub, lp.b_ub, lp.A_eq, lp.b_eq, lp.keep_rows
    nT, nv = len(classes), len(cols_Y)
    opts = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
    # dual simplex at tight tolerances; where it stalls (trees or sequences of probability ~1e-17, 'peaked'
    # at V = 4), interior point at the same tolerances, then dual simplex at HiGHS' defaults: the repair
    # and the certified dual below do not depend on which one answered
    for method, o in (("highs-ds", opts), ("highs-ipm", opts), ("highs-ds", {})):
        res = linprog(-lens, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=(0, None), method=method, options=o)
        if res.status == 0:
            break
    if res.status != 0:
        raise RuntimeError(f"ceiling LP for {tree_law.name}: HiGHS status {res.status} ({res.message})")
    # dual certificate (linprog minimises -|Y|: the max problem's duals are minus the marginals)
    u = -np.asarray(res.eqlin.marginals, dtype=np.float64)
    v = np.clip(-np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0, None)
    slack = lens - (u[cols_S] + A_ub.T @ v)  # reduced costs: <= 0 when the dual is feasible, 0 on the optimal face
    # repair (1): iterative refinement of the primal. With residuals r = b - A x of size eps,
    # solve the same LP for a correction d (rows A d = r / eps, bounds d >= -x / eps) and take
    # x + eps d: each round shrinks the residual by about the solver's tolerance.
    x0 = np.clip(res.x, 0.0, None)
    b_all = np.concatenate([b_eq, b_ub])

    def err(x):
        return float(max(np.abs(A_eq @ x - b_eq).max(), np.abs(A_ub @ x - b_ub).max()))

    best = x0
    for _ in range(REFINE_ROUNDS):
        eps = err(best)
        if eps <= 1e-14:  # below this the residuals are rounding, and scaled by 1 / eps mere noise
            break
        # the sequence rows get a slack of 1e-6 (1e-6 eps once scaled back): their right-hand sides sum
        # to the tree rows' only up to rounding, which divided by eps could make the correction infeasible
        for method in ("highs-ds", "highs-ipm"):  # the scaled problem needs only the default tolerances
            fix = linprog(-lens, A_ub=A_ub, b_ub=(b_ub - A_ub @ best) / eps + 1e-6, A_eq=A_eq,
                          b_eq=(b_eq - A_eq @ best) / eps, bounds=np.stack([-best / eps, np.full(nv, np.inf)], 1),
                          method=method, options={"time_limit": REFINE_SECONDS})
            if fix.status == 0:
                break
        if fix.status != 0:
            break
        x1 = np.clip(best + eps * fix.x, 0.0, None)
        if err(x1) >= eps or lens @ x1 < lens @ best - 10 * n * eps:  # no better, or the value lost more than the residual allows
            break
        best = x1
    # repair (2), when (1) stalls: a nonnegative solution of all rows on the optimal face (NNLS)
    face = np.nonzero((slack >= -FACE_TOL) | (best > 0))[0]
    rows = nT + keep_rows.size
    if err(best) > 1e-14 and 0 < face.size and rows * face.size <= 20_000_000:  # (a dense matrix of at most 160 MB)
        A_face = np.vstack([A_eq[:, face].toarray(), A_ub[:, face].toarray()])
        xs, _ = nnls(A_face, b_all, maxiter=50 * face.size)
        x1 = np.zeros(nv)
        x1[face] = xs
        if err(x1) < err(best):
            best = x1
    x = best
    feas = err(x)
    value = float(lens @ x)
    viol = np.zeros(nT)
    np.maximum.at(viol, cols_S, slack)
    u = u + np.clip(viol, 0.0, None)  # now u_S + (A^T v)_Y >= |Y| for every column
    upper = float(b_eq @ u + b_ub @ v)
    coupling: dict = {S: {} for S in classes}
    for j in np.nonzero(x > 0)[0]:
        coupling[classes[cols_S[j]]][cols_Y[j]] = float(x[j])
    seqs = {}
    for r, k in enumerate(keep_rows):
        if v[r] != 0:
            seqs[tuple(int(d) for d in np.unravel_index(k, (V,) * n))] = float(v[r])
    duals = ({S: float(u[i]) for i, S in enumerate(classes)}, seqs)
    return CeilingSolution(value, upper, upper - value, feas, coupling, dict(probs), duals, nv)


class RootTradeoff(NamedTuple):
    ceiling: float           # the ceiling LP's value (HiGHS, not repaired)
    alpha_root: float        # the largest P(|Y| >= 2) of any lossless rule: alpha* of the root's drafts
    root_optimal: float      # the most tokens per call of a lossless rule with P(|Y| >= 2) >= alpha_root - slack
    ceiling_root_max: float  # the largest P(|Y| >= 2) of a lossless rule within slack of the ceiling


def root_tradeoff(tree_law, model, slack: float = 1e-9, max_variables: int = MAX_LP_VARIABLES) -> RootTradeoff:
    """Whether reaching the ceiling costs acceptance at the root: three more LPs on the ceiling's
    constraints (issue 26, item 5). ``root_optimal < ceiling`` (beyond LP precision) means no rule
    that accepts the first token as often as possible (``alpha*`` at the root, as every token walk
    of 'optimal') reaches the ceiling of this instance; ``ceiling_root_max < alpha_root`` says the
    same from the ceiling's side. Values at HiGHS' tolerances (1e-10), no certificate."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, vstack

    lp = _ceiling_lp(tree_law, model, max_variables)
    opts = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
    first = (lp.lens >= 2).astype(np.float64)  # P(|Y| >= 2): the first draft token accepted

    def solve(c, extra_row=None, extra_b=None):
        A, b = lp.A_ub, lp.b_ub
        if extra_row is not None:
            A, b = vstack([A, csr_matrix(extra_row)]), np.append(b, extra_b)
        res = linprog(-c, A_ub=A, b_ub=b, A_eq=lp.A_eq, b_eq=lp.b_eq, bounds=(0, None), method="highs-ds", options=opts)
        if res.status != 0:
            raise RuntimeError(f"root_tradeoff LP for {tree_law.name}: HiGHS status {res.status} ({res.message})")
        return -float(res.fun)

    ceiling = solve(lp.lens)
    alpha = solve(first)
    root_optimal = solve(lp.lens, -first, -(alpha - slack))
    root_max = solve(first, -lp.lens, -(ceiling - slack))
    return RootTradeoff(ceiling, alpha, root_optimal, root_max)


class TreeLP(TreeRule):
    """The reference rule at the ceiling: given a tree with path set S it emits Y with
    probability ``pi(S, Y) / sum_Y' pi(S, Y')`` from ``optimal_tokens(tree_law, model)``.

    It needs the whole instance (every tree's probability, the target beyond the tree), so
    it is built for one ``tree_law`` and ``model``; trees of other laws or other rows are
    refused. The LP is solved on first use.
    """

    name = "tree_lp"
    small_v_only = "samples the coupling of the tree-level LP, which enumerates every draft tree (small V only)"

    def __init__(self, tree_law=None, model=None, max_variables: int = MAX_LP_VARIABLES):
        if tree_law is None or model is None:
            raise ValueError("tree_law and model: tree_lp solves the ceiling LP of one instance; "
                             "use trees.get('tree_lp', tree_law=..., model=...)")
        self.tree_law, self.model = tree_law, model
        self.max_variables = as_int(max_variables, "max_variables", minimum=1)
        _check_size(tree_law, model.V, self.max_variables)
        self._sol: CeilingSolution | None = None

    def __repr__(self) -> str:
        return f"<tree rule 'tree_lp' for {self.tree_law.name}>"

    @property
    def solution(self) -> CeilingSolution:
        if self._sol is None:
            self._sol = optimal_tokens(self.tree_law, self.model, self.max_variables)
        return self._sol

    def refusal(self, tree_law):
        if tree_law.name != self.tree_law.name or tree_law.shape != self.tree_law.shape:
            return f"this tree_lp rule was solved for {self.tree_law.name}; build one with trees.get('tree_lp', tree_law=..., model=...)"
        return None

    def supports(self, tree_law) -> bool:
        return self.refusal(tree_law) is None

    def _row(self, tree: DraftTree) -> dict:
        check_tree(tree, (self.tree_law.kind,), "tree_lp")
        if tree.shape != self.tree_law.shape:
            raise ValueError(f"tree: not a tree of {self.tree_law.name} (the law this tree_lp rule was solved for)")
        for i in range(len(tree.nodes)):
            pre = tree.prefix(i)
            if not torch.equal(row64(tree.p(i)), self.model.p(pre)) or (  # rows read as the laws they represent
                    tree.nodes[i].drafts and not torch.equal(row64(tree.nodes[i].q), self.model.q(pre))):
                raise ValueError(f"tree: the rows at node {i} differ from the model this tree_lp rule was solved for")
        S = tree_paths(tree)
        sol = self.solution
        if S not in sol.tree_probs:
            raise ValueError(f"tree: its drafts have probability 0 under {self.tree_law.name} with this model")
        row = sol.coupling.get(S)
        tot = sum(row.values()) if row else 0.0
        if not tot > 0:
            # a valid tree of probability below the LP's resolution (P(S) <= feasibility_error: 1e-310,
            # or 0.0 after underflow): the solver leaves its row empty. Emit y ~ p(. | root), a token
            # of positive target probability; the emitted law moves by at most P(S) per such tree,
            # inside the coupling's own feasibility error
            p = self.model.p(())
            return {(y,): float(p[y]) for y in torch.nonzero(p > 0).flatten().tolist()}
        return {Y: w / tot for Y, w in row.items()}

    def output_distribution(self, tree: DraftTree) -> dict:
        return self._row(tree)

    def verify(self, tree: DraftTree, generator) -> TreeVerdict:
        row = self._row(tree)
        g = generator if isinstance(generator, torch.Generator) else as_generator(generator, purpose="verify")
        Ys = sorted(row)
        w = torch.tensor([row[Y] for Y in Ys], dtype=torch.float64)
        Y = Ys[int(sample_token(w, g))]
        ids, i = [], 0
        for t in Y[:-1]:
            i = tree.nodes[i].child[t]
            ids.append(i)
        return TreeVerdict(tuple(ids), Y[-1])


register("tree_lp", TreeLP)
