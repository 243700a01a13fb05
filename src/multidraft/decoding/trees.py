"""Draft-tree shapes and the per-step draft tree.

Shapes (``TreeShape``)
    ``paths``      an explicit tree as a list of paths of child indices, as in the tree
                   decoding literature (SpecInfer, Medusa, EAGLE): ``[0]`` is the root's
                   first child, ``[0, 1]`` the second child of that child, and so on. The
                   set must be prefix-closed and each node's child indices must be
                   ``0..k-1``; a node with k children receives K = k drafts.
                   ``full_tree(K, L)`` is the K-ary tree of depth L (K + K^2 + ... + K^L nodes).
    ``sequences``  K independent draft sequences of length L merged into a trie (SpecTr /
                   SpecInfer "K sequences"): the root gets K drafts; a node reached by m of
                   the K sequences gets m drafts, the next tokens of those m sequences.

The draft tree of one step (``DraftTree``) has node 0 = the root (the last committed token,
not yet in any KV cache) and one node per *distinct* drafted token under each parent.
Every node keeps the full list of its drafts, duplicates included (that is what the
verifier sees), and a map token -> child node (the first draft slot with that token).

Losslessness of the walk. At a node the verifier receives drafts that are a fresh draw of
the draft law given the path so far: in ``paths`` mode a node's drafts are drawn only after
the node exists, from q at that node, by the law with its own k; duplicate slots are
never expanded (the walk enters the first matching child, whose subtree is one valid draw
given the path). In ``sequences`` mode the m continuations of the sequences through a node
are, given the path, m draws from q at that node (iid, or each from its own temperature
for the ``independent`` law); m is fixed by earlier levels, so the verifier at that node
is run with a law it is lossless for. By induction the walk outputs each token with the
target's law given the path (the property the tests check end to end).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["TreeShape", "full_tree", "parse_tree", "DraftTree", "Node"]


def full_tree(k: int, depth: int) -> list[list[int]]:
    """The K-ary tree of the given depth as a list of paths, breadth first."""
    paths: list[list[int]] = []
    level: list[list[int]] = [[]]
    for _ in range(depth):
        level = [p + [j] for p in level for j in range(k)]
        paths.extend(level)
    return paths


def parse_tree(tree) -> dict[tuple[int, ...], int]:
    """Validate a list of paths; return {path: number of children} including the root ``()``."""
    if isinstance(tree, (str, bytes)) or not hasattr(tree, "__iter__"):
        raise ValueError(f"tree must be a list of paths such as [[0], [1], [0, 0]] or 'sequences', got {tree!r}")
    paths: set[tuple[int, ...]] = set()
    for raw in tree:
        try:
            path = tuple(int(x) for x in raw)
            if any(isinstance(x, bool) or int(x) != x for x in raw):
                raise TypeError
        except (TypeError, ValueError):
            raise ValueError(f"tree: each path must be a list of non-negative integers, got {raw!r}") from None
        if len(path) == 0:
            raise ValueError("tree: the empty path is the root and must not be listed")
        if any(x < 0 for x in path):
            raise ValueError(f"tree: path {list(path)} has a negative child index")
        if path in paths:
            raise ValueError(f"tree: path {list(path)} is listed twice")
        paths.add(path)
    if not paths:
        raise ValueError("tree must contain at least one path")
    children: dict[tuple[int, ...], int] = {(): 0}
    for path in paths:
        children.setdefault(path, 0)
    for path in sorted(paths, key=len):
        parent = path[:-1]
        if parent and parent not in paths:
            raise ValueError(f"tree: path {list(path)} has no parent path {list(parent)} (paths must be prefix-closed)")
        children[parent] = max(children[parent], path[-1] + 1)
    for path in sorted(paths):
        for j in range(path[-1]):
            if path[:-1] + (j,) not in paths:
                raise ValueError(
                    f"tree: path {list(path)} exists but its sibling {list(path[:-1] + (j,))} does not "
                    "(child indices of a node must be 0..k-1)"
                )
    return children


@dataclass(frozen=True)
class TreeShape:
    """A static tree shape: ``mode`` is 'paths' (``children`` map) or 'sequences' (K, depth)."""

    mode: str
    depth: int
    k: int  # the largest number of drafts at any node
    children: dict = field(default_factory=dict)  # paths mode: {path: n_children}

    @classmethod
    def from_args(cls, tree, k: int, depth: int) -> "TreeShape":
        if tree is None:
            return cls("paths", depth, k, parse_tree(full_tree(k, depth)))
        if isinstance(tree, str):
            if tree != "sequences":
                raise ValueError(f"tree must be None, 'sequences' or a list of paths, got {tree!r}")
            return cls("sequences", depth, k)
        ch = parse_tree(tree)
        return cls("paths", max(len(p) for p in ch), max(ch.values()), ch)

    def max_nodes(self) -> int:
        """An upper bound on the node count of a step's tree, root included."""
        if self.mode == "sequences":
            return 1 + self.k * self.depth
        return len(self.children)


@dataclass
class Node:
    token: int
    parent: int
    depth: int
    slot: tuple = ()          # paths mode: the shape path this node was drawn into
    cols: tuple = ()          # which draft columns (temperatures / sequences) its drafts use
    drafts: list = field(default_factory=list)      # drafted tokens, duplicates kept
    child: dict = field(default_factory=dict)       # token -> node id (first slot)
    q: object = None          # draft distribution its drafts came from: [V], or [k, V] (independent)
    fed: int = -1             # index among the tree entries fed to the draft cache, -1 if not fed


class DraftTree:
    """The draft tree of one decoding step; node 0 is the root."""

    def __init__(self, shape: TreeShape, root_token: int, depth_cap: int, n_cols: int):
        self.shape = shape
        self.depth_cap = depth_cap
        self.n_cols = n_cols
        root_cols = tuple(range(shape.k)) if shape.mode == "sequences" else ()
        self.nodes: list[Node] = [Node(root_token, -1, 0, (), root_cols)]
        cap = shape.max_nodes()
        self._anc = torch.zeros(cap, cap, dtype=torch.bool)  # ancestor-or-self
        self._anc[0, 0] = True

    def __len__(self) -> int:
        return len(self.nodes)

    def n_children(self, i: int) -> int:
        """How many drafts node i receives (0 at the depth cap or a shape leaf)."""
        nd = self.nodes[i]
        if nd.depth >= self.depth_cap:
            return 0
        if self.shape.mode == "sequences":
            return len(nd.cols)
        return self.shape.children.get(nd.slot, 0)

    def draft_cols(self, i: int, k: int) -> tuple:
        """Draft-temperature column of each of node i's k drafts."""
        nd = self.nodes[i]
        if self.shape.mode == "sequences":
            return tuple(c % self.n_cols for c in nd.cols[:k])
        return tuple(j % self.n_cols for j in range(k))

    def add_drafts(self, i: int, drafts: list[int]) -> list[int]:
        """Record node i's drafts; create one child per distinct token; return the new node ids."""
        nd = self.nodes[i]
        nd.drafts = list(drafts)
        new: list[int] = []
        for j, t in enumerate(drafts):
            if t in nd.child:
                if self.shape.mode == "sequences":
                    c = self.nodes[nd.child[t]]
                    c.cols = c.cols + (nd.cols[j],)
                continue
            nid = len(self.nodes)
            if self.shape.mode == "sequences":
                child = Node(t, i, nd.depth + 1, (), (nd.cols[j],))
            else:
                child = Node(t, i, nd.depth + 1, nd.slot + (j,), ())
            self.nodes.append(child)
            nd.child[t] = nid
            row = self._anc[i].clone()
            row[nid] = True
            self._anc[nid] = row
            new.append(nid)
        return new

    # tensors for the forward passes ----------------------------------------------------------
    def tokens(self) -> torch.Tensor:
        return torch.tensor([n.token for n in self.nodes], dtype=torch.long)

    def depths(self) -> torch.Tensor:
        return torch.tensor([n.depth for n in self.nodes], dtype=torch.long)

    def ancestors(self, rows=None, cols=None) -> torch.Tensor:
        """Ancestor-or-self matrix ``[len(rows), len(cols)]`` (bool); default all nodes."""
        n = len(self.nodes)
        a = self._anc[:n, :n]
        if rows is not None:
            a = a[torch.as_tensor(rows, dtype=torch.long)]
        if cols is not None:
            a = a[:, torch.as_tensor(cols, dtype=torch.long)]
        return a

    def path_to(self, i: int) -> list[int]:
        """Node ids from the root's first child down to node i."""
        out = []
        while i > 0:
            out.append(i)
            i = self.nodes[i].parent
        return out[::-1]
