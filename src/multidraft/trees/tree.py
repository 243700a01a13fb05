"""The draft tree of one decoding step: the structure the decoder fills and every tree rule reads.

Node 0 is the root (the last committed token, not yet in any KV cache); below it one node
per *distinct* drafted token under each parent. Every node keeps

* ``token``, ``parent``, ``depth`` (root: -1 parent, depth 0);
* ``drafts``: the full list of its drafts, duplicates included (what a token-level
  verifier sees), and ``child``: token -> child node id (the first draft slot with that token);
* ``q``: the draft distribution its drafts were drawn from, ``[V]`` (``[k, V]`` under the
  'independent' law);
* ``p``: the target distribution after the path to the node, ``[V]``, filled after the
  target pass (``DraftTree.set_target``; read it with ``DraftTree.p(i)``).

``law`` (the draft law kind of every node, from ``drafts.LAW_KINDS``) travels with the tree
so that a rule can check the drafts came from a law it is lossless for.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import torch

from .shapes import TreeShape

__all__ = ["DraftTree", "Node"]


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
    p: object = None          # target distribution after the path to this node: [V] (after the target pass)
    fed: int = -1             # index among the tree entries fed to the draft cache, -1 if not fed
    k: int = 0                # dynamic mode: drafts allotted by ``allocate`` (0 = leaf)
    reach: float = 1.0        # dynamic mode: product of q along the path (root 1)


class DraftTree:
    """The draft tree of one decoding step; node 0 is the root.

    shape      the ``TreeShape`` that decides how many drafts each node receives;
    root_token the last committed token; depth_cap the largest depth drafted this step;
    n_cols     the number of draft columns (draft temperatures); law the draft law kind.

    ``rows_checked`` (default False): set by a builder that makes every q and p row a
    distribution by construction (the decoder: ``sampling.process_logits`` rows); the
    sequence-level rules' input check then skips its O(V) per-row checks and keeps the
    structural ones, as the token walk verifies with ``validate=False``. ``checked`` (default
    False): set by a builder whose trees are valid by construction, rows and structure (the
    decoder's step, on the tree it drafted): every tree rule then skips its per-node input
    check, the token walk's included (``_check.check_tree``).
    """

    def __init__(self, shape: TreeShape, root_token: int, depth_cap: int, n_cols: int = 1, law: str = "iid"):
        if not isinstance(shape, TreeShape):
            raise ValueError(f"shape: must be a TreeShape, got {type(shape).__name__}")
        self.shape = shape
        self.depth_cap = depth_cap
        self.n_cols = n_cols
        self.law = law
        self._target: Callable[[int], torch.Tensor] | None = None
        self.rows_checked = False
        self.checked = False
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
        if self.shape.mode == "dynamic":
            return nd.k
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

    # target rows ------------------------------------------------------------------------
    def set_target(self, rows: Callable[[int], torch.Tensor]) -> None:
        """After the target pass: ``rows(i)`` -> the target distribution ``[V]`` at node i,
        computed on first use by ``p(i)`` (a walk reads only the nodes it visits)."""
        self._target = rows

    def p(self, i: int) -> torch.Tensor:
        """The target distribution ``[V]`` after the path to node i (``Node.p``, filled on demand)."""
        nd = self.nodes[i]
        if nd.p is None:
            if self._target is None:
                raise ValueError(f"tree: node {i} has no target distribution yet (set_target after the target pass)")
            nd.p = self._target(i)
        return nd.p

    def copy(self) -> "DraftTree":
        """An independent copy (nodes and ancestor matrix; q and p rows are shared, never mutated)."""
        new = copy.copy(self)
        new.nodes = [copy.copy(nd) for nd in self.nodes]
        for nd in new.nodes:
            nd.drafts = list(nd.drafts)
            nd.child = dict(nd.child)
        new._anc = self._anc.clone()
        return new

    def prefix(self, i: int) -> tuple[int, ...]:
        """The drafted tokens on the path to node i (root token excluded)."""
        return tuple(self.nodes[j].token for j in self.path_to(i))

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
