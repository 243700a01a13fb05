r"""Traversal verification of a draft tree (Weng, Hu et al., NeurIPS 2025, arXiv 2505.12398).

Idea. Token-level walks decide from the root down, so a refused node discards its whole
subtree. Traversal verification decides from the leaves up, on *sequence* probabilities:
a node is kept with a weight that depends on the whole path to it, and a refused node only
changes the state of its parent, whose other children are then tried.

State. Every node u carries a weight ``a(u)`` and a target row ``P(u)`` ``[V]``: at the root
``a = 1``, ``P = p(. | root)``; a child c of u with token t, when it is tried, gets
``a(c) = min(a(u) P(u)[t] / q(t | u), 1)`` and ``P(c) = p(. | c)`` (the target's row). On a
chain these are block verification's weights ``a_i`` (``trees.block``).

Traversal (depth first, children in draft order, each subtree finished before the next
sibling is tried). A node u whose children have all been tried and refused is a leaf of
the remaining tree: keep the path to u with probability ``a(u)`` and emit ``y ~ P(u)``
(the root is always kept). When u is refused, its parent v is updated as in speculative
sampling but at the sequence level:

    r(x) = max(a(v) P(v)[x] - q(x | v), 0),  r = sum_x r(x),
    a(v) <- r / (r + 1 - a(v)),               P(v) <- r(.) / r,

and the traversal goes on with v's next child (or with v itself when none is left). On a
chain this is block verification's backward scan, so the two rules have the same law
(tested); at depth 1 it is recursive rejection sampling with replacement (SpecInfer).

What we could read of the paper, and how ours compares. The stored copies of the paper
(arXiv HTML v1 and v2) and of one summary page (papernotes, NeurIPS 2025) yield only their
openings: the abstract, the start of the introduction and the summary's motivation. From
them: (1) verification runs from the leaves towards the root instead of root-first; (2) a
node's acceptance is decided on the probability of the whole sequence from the root to
it, so a refused ancestor does not by itself discard a descendant; (3) the summary's
example keeps a child whose parent has acceptance 0.5 and whose own ratio p/q is 4/3 with
probability min(0.5 * 4/3, 1) = 2/3 (token-level: 0.5), which is our ``a(c)`` recursion;
(4) the rule is proved lossless and, on a single chain, optimal (there it must coincide in
value with block verification, which is optimal on a chain: ours coincides in law). We
could NOT read Algorithm 1, the definitions of its per-node quantities, the update of a
node after a child's refusal, the order of visits, the theorem statements or the proofs;
the points below marked "unspecified to us" are therefore our reconstruction, certified
lossless by enumeration (``tests/trees/test_seq_rules.py``), not a reading of the paper.
Nothing we could read contradicts this module, so the rule was not changed.

One unaffiliated public reimplementation (found by code search; it says it follows the
paper's pseudocode, we cannot confirm that) matches us on the visit order (first leaf of a
depth-first, first-child-first descent), on ``a(c)`` and on the parent's new row, but sets
the parent's new weight to ``min(r / (1 - q(t | v)), 1)`` (t the refused token) and
renormalises the parent's draft row without t, i.e. siblings drawn without replacement.
That weight is not lossless even on a chain of length 2, where siblings play no part
(``TableModel.random(3, seed=0)``: error 0.02 in the emitted law; pinned in
``tests/trees/test_seq_rules.py``), so it is kept out; ours gives ``r / (r + 1 - a)``, block
verification's. If the paper's trees do draw siblings without replacement, that law is
not supported here yet (see "Supported tree laws").

Points unspecified to us, and our choices:

* Which leaf first, and siblings (unspecified to us): depth first, children in draft
  (slot) order, each subtree finished before the next sibling is tried; so the first
  node decided is the deepest node of the first drafted path.
* The parent's update after a refusal (unspecified to us): the sequence-level residual
  above, chosen because on a chain it reduces to Sun et al.'s backward scan and so reaches
  the chain optimum the paper claims (we did not check other updates).
* When and from where a token is emitted (unspecified to us): once, when a node is kept,
  from that node's current row (its target row when none of its children was tried and
  refused, else its residual); the root is always kept.
* Duplicate drafts. Our trees merge equal drafts of a node into one child (``tree.py``):
  in a K-ary tree the later slots of a repeated token have no subtree of their own. We try
  the node's drafts in slot order; a repeated token is tried as a child without children
  (the subtree under the shared child node is traversed once, at its first slot).
* K i.i.d. sequences. By default (``split=False``) the merged trie is traversed like any
  tree: a node reached by m sequences has m i.i.d. drafts. ``split=True`` traverses the K
  sequences as K separate chains hanging from the root, in sequence order, each node of a
  chain with its own state (shared trie nodes give only their p and q rows). Both are
  lossless (certified); the split form falls below SpecInfer's token walk on the same trie
  in 10 of 30 random V = 3, K = 2, L = 2 instances (e.g. ``TableModel.random(3, seed=1)``:
  2.33764 against 2.34376 tokens per call), the trie form was never below it in 252
  instances (V = 2-3, K = 2-3, L = 2-3, every style), so the trie is the default.
* Degenerate rows: when ``r = 0`` the parent gets ``a = 0`` and keeps its row (a refusal
  happens then with probability 0, or nothing is owed at v); the root is always kept and
  emits from its current row.

Supported tree laws: node drafts i.i.d. (``kary(K, L, 'iid')``, ``explicit(paths, 'iid')``,
``sequences(K, L)``) and every chain; ``certify.certify_tree`` checks each at 1e-12.
Without-replacement and greedy node laws are refused: the parent update above assumes the
next sibling is a fresh draw from q.
"""
from __future__ import annotations

import torch

from .._scan import keep_ratio
from .._validate import as_generator
from ._check import check_tree, is_chain_law, is_mixed_law, mixed_refusal, row64
from ._postorder import decisions_law, decisions_tokens, first_kept
from .rules import TreeRule, TreeVerdict, register
from .tree import DraftTree

__all__ = ["TraversalVerification"]


class _Slot:
    """One node of the traversed tree: the DraftTree node id (its p and q rows) and its
    children slots, in the order they are tried."""

    __slots__ = ("kids", "node")

    def __init__(self, node: int, kids: list):
        self.node = node
        self.kids = kids


def _trie(tree: DraftTree, i: int) -> _Slot:
    nd = tree.nodes[i]
    kids, seen = [], set()
    for t in nd.drafts:
        c = nd.child[t]
        kids.append(_Slot(c, []) if t in seen else _trie(tree, c))
        seen.add(t)
    return _Slot(i, kids)


def _split(tree: DraftTree) -> _Slot:
    root = tree.nodes[0]
    kids = []
    for col in root.cols:
        i, chain = 0, []
        while tree.nodes[i].drafts:
            nd = tree.nodes[i]
            t = nd.drafts[nd.cols.index(col)]
            i = nd.child[t]
            chain.append(i)
        sub = None
        for c in reversed(chain):
            sub = _Slot(c, [sub] if sub is not None else [])
        kids.append(sub)
    return _Slot(0, kids)


def _residual_update(a: float, P: torch.Tensor, q: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The parent's (a, P) after one of its children was refused."""
    res = (a * P - q).clamp_min(0.0)  # [V]
    r = float(res.sum())
    if r <= 0:
        return 0.0, P
    return r / (r + 1.0 - a), res / r


class TraversalVerification(TreeRule):
    """Traversal verification (see the module notes). ``split``: traverse K i.i.d. sequences
    as separate chains instead of their trie (default False; only read for ``sequences(K, L)``)."""

    name = "traversal"

    def __init__(self, split: bool = False):
        if not isinstance(split, bool):
            raise ValueError(f"split must be True or False, got {split!r}")
        self.split = split

    def refusal(self, tree_law):
        if is_mixed_law(tree_law):
            return mixed_refusal(self.name)
        if tree_law.kind != "iid" and not is_chain_law(tree_law):
            return (f"its nodes draw {tree_law.kind!r} drafts; traversal verification needs i.i.d. node drafts: "
                    "use kary(K, L, 'iid'), explicit(paths, 'iid'), sequences(K, L) or a chain")
        return None

    def supports(self, tree_law) -> bool:
        return self.refusal(tree_law) is None

    @staticmethod
    def _refused(a: float, P: torch.Tensor, q: torch.Tensor, t: int) -> tuple[float, torch.Tensor]:
        """The parent's new (a, P) after its child with token t was refused (P, q: ``[V]``);
        t is unused by this rule (a hook for the variants tested against it)."""
        return _residual_update(a, P, q)

    def _structure(self, tree: DraftTree) -> _Slot:
        chainlike = isinstance(tree, DraftTree) and all(len(nd.drafts) <= 1 for nd in tree.nodes)
        check_tree(tree, ("iid",), "traversal", chain=chainlike)
        if tree.shape.mode == "sequences" and self.split:
            return _split(tree)
        return _trie(tree, 0)

    def _decisions(self, tree: DraftTree, s: _Slot, path: tuple, a: float, P: torch.Tensor):
        """The traversal's decisions below and at slot s (``_postorder``): ``(path, keep, row, leaf)``
        in post-order, each child tried with ``a(c)``, the parent updated after each refusal."""
        nd = tree.nodes[s.node]
        Q = row64(nd.q) if s.kids else None  # [V]
        for kid in s.kids:
            t = tree.nodes[kid.node].token
            ac = keep_ratio(a * float(P[t]), float(Q[t]))  # min(a P(t) / Q(t), 1)
            yield from self._decisions(tree, kid, path + (kid.node,), ac, row64(tree.p(kid.node)))
            a, P = self._refused(a, P, Q, t)
        yield path, (a if path else 1.0), P, not s.kids

    def _walk(self, tree: DraftTree):
        return self._decisions(tree, self._structure(tree), (), 1.0, row64(tree.p(0)))

    def output_distribution(self, tree: DraftTree) -> dict:
        return decisions_law(tree, self._walk(tree))

    def expected_tokens(self, tree: DraftTree) -> float:
        """Exact E|Y| in O(nodes x V). The traversal's states (a, P) do not depend on the
        randomness (only on which subtrees were refused, in a fixed order), so its decisions are
        followed once; a node kept with probability ``w x keep`` emits ``depth + 1`` tokens (its
        path and one token from its row, whatever that token)."""
        return decisions_tokens(self._walk(tree))

    def verify(self, tree: DraftTree, generator) -> TreeVerdict:
        walk = self._walk(tree)  # checks the tree (before the generator is read)
        g = generator if isinstance(generator, torch.Generator) else as_generator(generator, tree.p(0).device, purpose="verify")
        return first_kept(walk, g)


register("traversal", TraversalVerification)
