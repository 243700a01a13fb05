"""Tree draft laws: how one step's draft tree is drawn, with sampling and exact enumeration.

A ``TreeLaw`` is a tree shape (``shapes.TreeShape``) and the draft law kind of its nodes:

* ``chain(depth, kind)``           one draft sequence of length L (one draft per node);
* ``sequences(k, depth)``          K i.i.d. draft sequences of length L merged into a trie:
                                   a node reached by m sequences gets m i.i.d. drafts;
* ``kary(k, depth, kind)``         the full K-ary tree of depth L; every node's K children
                                   are a draw of ``kind``: 'iid', 'wor' (without replacement)
                                   or 'greedy' (top K-1 tokens plus one sampled from the rest);
* ``explicit(paths, kind)``        an explicit shape (a list of child-index paths): a node with
                                   k children gets k drafts of ``kind``;
* ``dynamic(k_max, depth, max_nodes, kind, min_gain)``
                                   the decoder's dynamic tree (``tree="dynamic"``): level by
                                   level, before any draft of a level is drawn, every frontier
                                   node v gets k_v in 0..K_MAX drafts from ``shapes.allocate``
                                   (reach = product of q along the path, the node budget
                                   ``max_nodes`` root included, the depth cap, the frontier cut
                                   to the nodes of largest reach, ``min_gain``); then the level's
                                   drafts are drawn ('iid', 'wor' or 'greedy').

The 'independent' kind (one draft distribution per draft column: the decoder's list of draft
temperatures) is taken by ``sequences``, ``kary`` and ``explicit`` with ``cols`` columns
(default K): a node's j-th draft uses column ``DraftTree.draft_cols`` (its sequence's column
in a trie, ``j % cols`` in a shape of paths) and its q row is ``[k, V]``, read from
``TableModel.q(prefix, col)`` (a model with at least ``cols`` draft columns).

Given a sequence model (``tables.TableModel``: q and p after any prefix), ``sample`` draws one
filled ``DraftTree`` (drafts, q and p rows at every node) and ``enumerate`` lists every tree
of positive probability with that probability (small V only), the way the decoder builds
trees: nodes in creation order; a 'wor' / 'greedy' node with more drafts than nonzero tokens
of q gets as many drafts as nonzero tokens; duplicate drafts share one child node. A
dynamic law's levels are drawn node group by node group in the decoder's order
(``decoding.DecoderStep._sample_level``: nodes grouped by their number of drafts, groups in order of
first appearance), so node ids, reach ties at the frontier cut and hence the trees are the
decoder's.
"""
from __future__ import annotations

import torch

from .. import drafts as _drafts
from .._validate import as_int
from .shapes import TreeShape, allocate
from .tables import as_sequence_model
from .tree import DraftTree

__all__ = ["MAX_TREES", "MixedLaw", "TreeLaw", "as_tree_law", "chain", "dynamic", "explicit", "kary", "mixed", "sequences"]

MAX_TREES = 200_000  # enumerate() refuses to list more trees


class TreeLaw:
    """A tree shape with the draft law ``kind`` of its nodes; ``name`` for tables and errors.

    ``cols``: the number of draft columns (the decoder's draft temperatures) of the
    'independent' kind, default the shape's K; 1 for the other kinds.
    """

    def __init__(self, shape: TreeShape, kind: str, name: str, cols: int | None = None):
        if not isinstance(shape, TreeShape):
            raise ValueError(f"shape: must be a TreeShape, got {type(shape).__name__}")
        self.shape = shape
        self.kind = _drafts.law_kind(kind, "kind")
        if self.kind == "independent":
            if shape.mode == "dynamic":
                raise ValueError("kind: dynamic trees take 'iid', 'wor' or 'greedy' node laws, not 'independent' "
                                 "(as the decoder)")
            cols = shape.k if cols is None else as_int(cols, "cols", minimum=1)
            if shape.mode == "paths" and shape.k > cols:
                raise ValueError(f"cols: a node has {shape.k} children but the law has only {cols} draft columns")
        elif cols not in (None, 1):
            raise ValueError(f"cols: draft columns belong to the 'independent' kind, not {self.kind!r}")
        self.cols = 1 if cols is None else cols
        self.name = name

    def __repr__(self) -> str:
        return f"<tree law {self.name}>"

    @property
    def depth(self) -> int:
        return self.shape.depth

    def node_ks(self) -> set[int]:
        """The numbers of drafts the shape gives a node (before any cap by q's support); every
        k in 1..K_MAX for a dynamic tree (the allocator may choose any of them)."""
        if self.shape.mode == "sequences":
            return {self.shape.k}
        if self.shape.mode == "dynamic":
            return set(range(1, self.shape.k + 1))
        return {n for n in self.shape.children.values() if n > 0}

    def new_tree(self, root_token: int = 0) -> DraftTree:
        return DraftTree(self.shape, root_token, self.shape.depth, self.cols, self.kind)

    def _check_model(self, model) -> None:
        as_sequence_model(model)
        have = getattr(model, "n_cols", 1)
        if self.kind == "independent" and have < self.cols:
            raise ValueError(f"model: {have} draft column(s) but {self.name} reads {self.cols}")

    def _node(self, tree: DraftTree, i: int, model) -> _drafts.DraftLaw | None:
        """Fill node i's p and q rows; the law of its drafts, or None for a leaf."""
        nd = tree.nodes[i]
        prefix = tree.prefix(i)
        nd.p = model.p(prefix)
        k = tree.n_children(i)
        if k == 0:
            return None
        if self.kind == "independent":
            nd.q = q = torch.stack([model.q(prefix, c) for c in tree.draft_cols(i, k)])  # [k, V]
            return _drafts.independent(q)
        if nd.q is None:  # a dynamic node's q is set by its level's allocation
            nd.q = model.q(prefix)  # [V]
        q = nd.q
        if self.kind in ("wor", "greedy"):
            k = min(k, int((q > 0).sum()))
        return _drafts.make(self.kind, q, k)

    # dynamic trees: one level's allocation and the decoder's order ------------------------
    def _allocate(self, tree: DraftTree, level: list[int], model) -> list[int]:
        """Every k of ``level`` from its q rows and reaches (``shapes.allocate`` with the room
        left in the node budget), before any of its drafts is drawn; the nodes that get drafts,
        in the decoder's sampling order (grouped by k, groups in order of first appearance)."""
        shape = tree.shape
        for i in level:
            nd = tree.nodes[i]
            nd.p = model.p(tree.prefix(i))
            nd.q = model.q(tree.prefix(i))  # [V]
        q = torch.stack([tree.nodes[i].q for i in level])  # [n, V]
        reach = torch.tensor([tree.nodes[i].reach for i in level], dtype=torch.float64)  # [n]
        ks = allocate(q, reach, shape.k, shape.budget - len(tree), self.kind, shape.min_gain).tolist()
        groups: dict[int, list[int]] = {}
        for r, i in enumerate(level):
            nd = tree.nodes[i]
            nd.k = int(ks[r]) if nd.depth < tree.depth_cap else 0
            if nd.k > 0:
                groups.setdefault(nd.k, []).append(i)
        return [i for rows in groups.values() for i in rows]

    def _next_level(self, tree: DraftTree, level: list[int]) -> list[int]:
        """After a level's drafts: the reaches of its new nodes and the next frontier (the new
        nodes under the depth cap of largest reach, as many as the budget has room for)."""
        new = sorted(c for i in level for c in tree.nodes[i].child.values())
        for i in new:
            nd = tree.nodes[i]
            par = tree.nodes[nd.parent]
            nd.reach = par.reach * float(par.q[nd.token])
        room = tree.shape.budget - len(tree)
        cand = sorted((i for i in new if tree.nodes[i].depth < tree.depth_cap), key=lambda i: -tree.nodes[i].reach)
        return sorted(cand[:max(0, room)])

    def _fill_p(self, tree: DraftTree, model) -> DraftTree:
        for i, nd in enumerate(tree.nodes):
            if nd.p is None:
                nd.p = model.p(tree.prefix(i))
        return tree

    def sample(self, model, generator, root_token: int = 0) -> DraftTree:
        """One draft tree, filled; ``generator`` (a torch.Generator) is read node after node
        (a dynamic tree: level after level, each level's nodes in the decoder's order)."""
        self._check_model(model)
        tree = self.new_tree(root_token)
        if self.shape.mode == "dynamic":
            level = [0] if tree.depth_cap > 0 else []
            while level:
                for i in self._allocate(tree, level, model):
                    tree.add_drafts(i, self._node(tree, i, model).sample(generator).tolist())
                level = self._next_level(tree, level)
            return self._fill_p(tree, model)
        i = 0
        while i < len(tree.nodes):
            law = self._node(tree, i, model)
            if law is not None:
                tree.add_drafts(i, law.sample(generator).tolist())
            i += 1
        return tree

    def enumerate(self, model, root_token: int = 0, limit: int = MAX_TREES) -> list[tuple[DraftTree, float]]:
        """Every draft tree of positive probability and its probability (they sum to 1)."""
        self._check_model(model)
        out: list[tuple[DraftTree, float]] = []
        node_laws: dict[tuple, tuple] = {}  # (prefix, k, columns) -> (tuples, probs) of the node's draft law

        def emit(tree: DraftTree, w: float) -> None:
            if len(out) >= limit:
                raise ValueError(f"tree law {self.name}: more than {limit:,} draft trees; enumerate is for small V, K and L")
            out.append((tree, w))

        def branches(tree: DraftTree, i: int, law) -> list:
            k = tree.n_children(i)
            key = (tree.prefix(i), k, tree.draft_cols(i, k) if self.kind == "independent" else ())
            if key not in node_laws:
                tuples, probs = law.enumerate()
                node_laws[key] = list(zip(tuples.tolist(), probs.tolist()))
            return node_laws[key]

        def rec(tree: DraftTree, i: int, w: float) -> None:
            while i < len(tree.nodes):
                law = self._node(tree, i, model)
                if law is not None:
                    for t, pt in branches(tree, i, law):
                        branch = tree.copy()
                        branch.add_drafts(i, t)
                        rec(branch, i + 1, w * pt)
                    return
                i += 1
            emit(tree, w)

        def rec_dynamic(tree: DraftTree, level: list[int], order: list[int], j: int, w: float) -> None:
            if j == len(order):  # the level is drawn: allocate the next one, or the tree is complete
                nxt = self._next_level(tree, level)
                if not nxt:
                    emit(self._fill_p(tree, model), w)
                    return
                rec_dynamic(tree, nxt, self._allocate(tree, nxt, model), 0, w)
                return
            i = order[j]
            law = self._node(tree, i, model)
            for t, pt in branches(tree, i, law):
                branch = tree.copy()
                branch.add_drafts(i, t)
                rec_dynamic(branch, level, order, j + 1, w * pt)

        root = self.new_tree(root_token)
        if self.shape.mode == "dynamic":
            if root.depth_cap > 0:
                rec_dynamic(root, [0], self._allocate(root, [0], model), 0, 1.0)
            else:
                emit(self._fill_p(root, model), 1.0)
        else:
            rec(root, 0, 1.0)
        return out


class MixedLaw(TreeLaw):
    """A mixed tree law (DESIGN.md "Draft sources"): every tree of ``base`` (any shape and law)
    with the free ``chains`` appended after it is drafted (``DraftTree.add_chains``: deterministic
    drafts, one-hot laws, after each node's model drafts).

    The chains are fixed: a free source's proposals depend only on the committed context (here
    the root), never on the model's draws, so given the path to a node its free drafts are fixed
    and its model drafts are a fresh draw of the model's law. The token walk verifies such a node
    free drafts first, then the model's drafts with the model's verifier on the residual target
    (``walk.TokenWalk``: lossless for every verifier lossless for the model's law, SpecInfer's
    multi-round residual rule for one-hot drafts). So ``kind``, ``cols`` and ``node_ks`` are the
    base law's (the model's drafts a node gets; free drafts need no verifier of their own).
    ``depth`` is the deeper of the model's depth and the longest chain.

    The sequence-level rules refuse these laws (their ``refusal`` says why, ``_check.is_mixed_law``):
    'block' reads one chain; 'traversal', 'gbv', 'spectr_gbv' and 'univer' are proven lossless where
    one q row covers every draft of a node (i.i.d. or without-replacement siblings), and a one-hot
    copy beside the model's draws is a draft of another law (``trees.MIXED_REFUSALS``)."""

    mixed = True

    def __init__(self, base: TreeLaw, chains):
        base = as_tree_law(base, "base")
        self.base = base
        self.chains = [tuple(int(t) for t in ch) for ch in chains]
        if not all(self.chains):
            raise ValueError("chains: every chain must hold at least one token")
        self.shape, self.kind, self.cols = base.shape, base.kind, base.cols
        self.name = f"mixed({base.name}, chains={[list(c) for c in self.chains]})"

    @property
    def depth(self) -> int:
        return max([self.base.depth] + [len(c) for c in self.chains])

    def node_ks(self) -> set[int]:
        """Every number of model drafts a node may get (the base law's; free drafts come on top)."""
        return self.base.node_ks()

    def _mix(self, tree: DraftTree, model) -> DraftTree:
        tree.add_chains(self.chains)
        return self.base._fill_p(tree, model)

    def sample(self, model, generator, root_token: int = 0) -> DraftTree:
        return self._mix(self.base.sample(model, generator, root_token), model)

    def enumerate(self, model, root_token: int = 0, limit: int = MAX_TREES) -> list[tuple[DraftTree, float]]:
        return [(self._mix(t, model), w) for t, w in self.base.enumerate(model, root_token, limit)]


def mixed(base: TreeLaw, chains) -> MixedLaw:
    """The trees of ``base`` with the free ``chains`` appended (:class:`MixedLaw`)."""
    return MixedLaw(base, chains)


def as_tree_law(tree_law, name: str = "tree_law") -> TreeLaw:
    """``tree_law`` if it is a ``TreeLaw``, else one ``ValueError`` naming ``name``."""
    if not isinstance(tree_law, TreeLaw):
        raise ValueError(f"{name}: must be a tree draft law (trees.chain, sequences, kary, explicit or dynamic), "
                         f"got {type(tree_law).__name__}")
    return tree_law


def chain(depth: int, kind: str = "iid") -> TreeLaw:
    """One draft sequence of length ``depth`` (every law kind draws one draft alike; ``kind``
    names the law a rule is told)."""
    L = as_int(depth, "depth", minimum=1)
    return TreeLaw(TreeShape.from_args(None, 1, L), kind, f"chain(L={L}, {kind})")  # sized before it is built


def _cols_name(kind: str, cols: int | None) -> str:
    return f", cols={cols}" if kind == "independent" and cols is not None else ""


def sequences(k: int, depth: int, kind: str = "iid", cols: int | None = None) -> TreeLaw:
    """K draft sequences of length ``depth`` merged into a trie: i.i.d. ('iid'), or sequence s
    drawn from draft column ``s % cols`` ('independent')."""
    K = as_int(k, "k", minimum=1)
    L = as_int(depth, "depth", minimum=1)
    kind = _drafts.law_kind(kind, "kind")
    if kind not in ("iid", "independent"):
        raise ValueError(f"kind: K sequences are drawn 'iid' or 'independent', not {kind!r}")
    name = f"sequences(K={K}, L={L})" if kind == "iid" else f"sequences(K={K}, L={L}, independent{_cols_name(kind, cols)})"
    return TreeLaw(TreeShape.from_args("sequences", K, L), kind, name, cols)  # K x L drafted nodes at most


def kary(k: int, depth: int, kind: str = "iid", cols: int | None = None) -> TreeLaw:
    """The full K-ary tree of depth ``depth``; each node's K drafts by the law ``kind``."""
    K = as_int(k, "k", minimum=1)
    L = as_int(depth, "depth", minimum=1)
    return TreeLaw(TreeShape.from_args(None, K, L), kind,  # sized before it is built
                   f"kary(K={K}, L={L}, {kind}{_cols_name(kind, cols)})", cols)


def explicit(paths, kind: str = "iid", cols: int | None = None) -> TreeLaw:
    """An explicit shape: a list of child-index paths such as ``[[0], [1], [0, 0]]``."""
    if paths is None or isinstance(paths, (str, bytes)):  # from_args reads None and names as other shapes
        raise ValueError(f"paths: must be a list of child-index paths such as [[0], [1], [0, 0]], got {paths!r}")
    shape = TreeShape.from_args(paths, 1, 1)
    return TreeLaw(shape, kind, f"explicit({[list(p) for p in sorted(shape.children) if p]}, {kind}"
                                f"{_cols_name(kind, cols)})", cols)


def dynamic(k_max: int, depth: int, max_nodes: int, kind: str = "iid", min_gain: float = 0.0) -> TreeLaw:
    """The decoder's dynamic tree: at most ``k_max`` drafts a node, depth ``depth``, ``max_nodes``
    nodes root included; each level's k's from ``shapes.allocate`` before the level is drawn."""
    K = as_int(k_max, "k_max", minimum=1)
    L = as_int(depth, "depth", minimum=1)
    N = as_int(max_nodes, "max_nodes", minimum=1)
    g = float(min_gain)
    if not 0 <= g < 1:
        raise ValueError(f"min_gain must be in [0, 1), got {min_gain}")
    return TreeLaw(TreeShape("dynamic", L, K, {}, N, g), kind,
                   f"dynamic(K={K}, L={L}, N={N}, {kind}" + (f", min_gain={g:g})" if g else ")"))
