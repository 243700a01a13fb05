"""Tree draft laws: how one step's draft tree is drawn, with sampling and exact enumeration.

A ``TreeLaw`` is a tree shape (``shapes.TreeShape``) and the draft law kind of its nodes:

* ``chain(depth, kind)``           one draft sequence of length L (one draft per node);
* ``sequences(k, depth)``          K i.i.d. draft sequences of length L merged into a trie:
                                   a node reached by m sequences gets m i.i.d. drafts;
* ``kary(k, depth, kind)``         the full K-ary tree of depth L; every node's K children
                                   are a draw of ``kind``: 'iid', 'wor' (without replacement)
                                   or 'greedy' (top K-1 tokens plus one sampled from the rest);
* ``explicit(paths, kind)``        an explicit shape (a list of child-index paths): a node with
                                   k children gets k drafts of ``kind``.

Given a sequence model (``tables.TableModel``: q and p after any prefix), ``sample`` draws one
filled ``DraftTree`` (drafts, q and p rows at every node) and ``enumerate`` lists every tree
of positive probability with that probability (small V only), the way the decoder builds
trees: nodes in creation order; a 'wor' / 'greedy' node with more drafts than nonzero tokens
of q gets as many drafts as nonzero tokens; duplicate drafts share one child node.
"""
from __future__ import annotations

from .. import drafts as _drafts
from .._validate import as_int
from .shapes import TreeShape, full_tree, parse_tree
from .tree import DraftTree

__all__ = ["TreeLaw", "chain", "sequences", "kary", "explicit", "MAX_TREES"]

MAX_TREES = 200_000  # enumerate() refuses to list more trees


class TreeLaw:
    """A tree shape with the draft law ``kind`` of its nodes; ``name`` for tables and errors."""

    def __init__(self, shape: TreeShape, kind: str, name: str):
        self.shape = shape
        self.kind = _drafts.law_kind(kind, "kind")
        if self.kind == "independent":
            raise ValueError("kind: tree draft laws take 'iid', 'wor' or 'greedy' node laws")
        self.name = name

    def __repr__(self) -> str:
        return f"<tree law {self.name}>"

    @property
    def depth(self) -> int:
        return self.shape.depth

    def node_ks(self) -> set[int]:
        """The numbers of drafts the shape gives a node (before any cap by q's support)."""
        if self.shape.mode == "sequences":
            return {self.shape.k}
        return {n for n in self.shape.children.values() if n > 0}

    def new_tree(self, root_token: int = 0) -> DraftTree:
        return DraftTree(self.shape, root_token, self.shape.depth, 1, self.kind)

    def _node(self, tree: DraftTree, i: int, model) -> "_drafts.DraftLaw | None":
        """Fill node i's p and q rows; the law of its drafts, or None for a leaf."""
        nd = tree.nodes[i]
        prefix = tree.prefix(i)
        nd.p = model.p(prefix)
        k = tree.n_children(i)
        if k == 0:
            return None
        nd.q = q = model.q(prefix)  # [V]
        if self.kind in ("wor", "greedy"):
            k = min(k, int((q > 0).sum()))
        return _drafts.make(self.kind, q, k)

    def sample(self, model, generator, root_token: int = 0) -> DraftTree:
        """One draft tree, filled; ``generator`` (a torch.Generator) is read node after node."""
        tree = self.new_tree(root_token)
        i = 0
        while i < len(tree.nodes):
            law = self._node(tree, i, model)
            if law is not None:
                tree.add_drafts(i, law.sample(generator).tolist())
            i += 1
        return tree

    def enumerate(self, model, root_token: int = 0, limit: int = MAX_TREES) -> list[tuple[DraftTree, float]]:
        """Every draft tree of positive probability and its probability (they sum to 1)."""
        out: list[tuple[DraftTree, float]] = []
        node_laws: dict[tuple, tuple] = {}  # prefix -> (tuples, probs) of the node's draft law

        def rec(tree: DraftTree, i: int, w: float) -> None:
            while i < len(tree.nodes):
                law = self._node(tree, i, model)
                if law is not None:
                    key = (tree.prefix(i), tree.n_children(i))
                    if key not in node_laws:
                        tuples, probs = law.enumerate()
                        node_laws[key] = (tuples.tolist(), probs.tolist())
                    tuples, probs = node_laws[key]
                    for t, pt in zip(tuples, probs):
                        branch = tree.copy()
                        branch.add_drafts(i, t)
                        rec(branch, i + 1, w * pt)
                    return
                i += 1
            if len(out) >= limit:
                raise ValueError(f"tree law {self.name}: more than {limit:,} draft trees; enumerate is for small V, K and L")
            out.append((tree, w))

        rec(self.new_tree(root_token), 0, 1.0)
        return out


def chain(depth: int, kind: str = "iid") -> TreeLaw:
    """One draft sequence of length ``depth`` (every law kind draws one draft alike; ``kind``
    names the law a rule is told)."""
    L = as_int(depth, "depth", minimum=1)
    return TreeLaw(TreeShape("paths", L, 1, parse_tree(full_tree(1, L))), kind, f"chain(L={L}, {kind})")


def sequences(k: int, depth: int) -> TreeLaw:
    """K i.i.d. draft sequences of length ``depth`` merged into a trie."""
    K = as_int(k, "k", minimum=1)
    L = as_int(depth, "depth", minimum=1)
    return TreeLaw(TreeShape("sequences", L, K), "iid", f"sequences(K={K}, L={L})")


def kary(k: int, depth: int, kind: str = "iid") -> TreeLaw:
    """The full K-ary tree of depth ``depth``; each node's K drafts by the law ``kind``."""
    K = as_int(k, "k", minimum=1)
    L = as_int(depth, "depth", minimum=1)
    return TreeLaw(TreeShape("paths", L, K, parse_tree(full_tree(K, L))), kind, f"kary(K={K}, L={L}, {kind})")


def explicit(paths, kind: str = "iid") -> TreeLaw:
    """An explicit shape: a list of child-index paths such as ``[[0], [1], [0, 0]]``."""
    shape = TreeShape.from_args(paths, 1, 1)
    return TreeLaw(shape, kind, f"explicit({[list(p) for p in sorted(shape.children) if p]}, {kind})")
