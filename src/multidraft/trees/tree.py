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

Mixed trees (DESIGN.md "Draft sources"). After the draft model drafted the tree, free sources
(prompt lookup, a suffix index: deterministic proposals that depend only on the committed
context) append their drafts with :meth:`add_free_drafts` / :meth:`add_chains`, at any node,
creating *free-only* nodes (no model drafts, never fed to the draft model, ``slot`` None) where
no node holds the token, at any depth (the depth cap is the model's). ``Node.free`` counts the
free drafts at the end of a node's ``drafts``; ``n_children`` counts them too. The node's ``q``
stays the model's row(s) for its first ``len(drafts) - free`` drafts (its model drafts; a
free-only node has none and ``q`` None) and ``law`` the model's: a free draft's law is the
one-hot row of its token, implied; the token walk verifies free drafts first
(``walk.TokenWalk``, the free-first node rule).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import torch

from .shapes import TreeShape

__all__ = ["DraftTree", "Node", "one_hot_rows"]


def one_hot_rows(tokens: list[int], V: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """The one-hot rows ``[len(tokens), V]`` of ``tokens`` (the law of a deterministic draft)."""
    out = torch.zeros(len(tokens), V, dtype=dtype, device=device)
    if tokens:
        out[torch.arange(len(tokens), device=device), torch.tensor(tokens, dtype=torch.long, device=device)] = 1
    return out


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
    free: int = 0             # mixed trees: free-source (one-hot) drafts at the end of ``drafts``


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
        self._free_cols = 0   # free draft columns handed out (sequences mode: ids shape.k, shape.k + 1, ...)
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
        """How many drafts node i receives: the model's (0 at the depth cap, a shape leaf or a
        free-only node) and the free sources' (``Node.free``)."""
        nd = self.nodes[i]
        return self._model_children(nd) + nd.free

    def _model_children(self, nd: Node) -> int:
        if nd.depth >= self.depth_cap or nd.slot is None:
            return 0
        if self.shape.mode == "sequences":
            return sum(1 for c in nd.cols if c < self.shape.k)
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
        seq = self.shape.mode == "sequences"
        for j, t in enumerate(drafts):
            nid = self._child(i, t, () if seq else nd.slot + (j,), (nd.cols[j],) if seq else ())
            if nid is not None:
                new.append(nid)
        return new

    def _child(self, i: int, t: int, slot, cols: tuple) -> int | None:
        """Node i's child for token t: a new node (``slot``, ``cols``; its id returned), or the
        existing one, which gains ``cols`` (sequences mode; None returned)."""
        nd = self.nodes[i]
        if t in nd.child:
            c = self.nodes[nd.child[t]]
            c.cols = c.cols + cols
            return None
        nid = len(self.nodes)
        self._grow(nid + 1)
        self.nodes.append(Node(t, i, nd.depth + 1, slot, cols))
        nd.child[t] = nid
        row = self._anc[i].clone()
        row[nid] = True
        self._anc[nid] = row
        return nid

    # mixed trees ----------------------------------------------------------------------------
    def add_free_drafts(self, i: int, tokens: list[int]) -> list[int]:
        """Append free-source (deterministic) drafts ``tokens`` at node i, after its model drafts: a
        token that already has a child shares it (as :meth:`add_drafts`), any other creates a
        free-only child. Returns the new node ids. Sequences mode: each free draft is a column of
        its own, numbered after the model's."""
        nd = self.nodes[i]
        m = len(tokens)
        if m == 0:
            return []
        nd.drafts = nd.drafts + [int(t) for t in tokens]
        nd.free += m
        new: list[int] = []
        seq = self.shape.mode == "sequences"
        for t in tokens:
            t = int(t)
            col = (self.shape.k + self._free_cols,) if seq else ()
            self._free_cols += 1
            nid = self._child(i, t, None, col)
            if nid is not None:
                new.append(nid)
        return new

    def add_chains(self, chains) -> list[int]:
        """Append the free sources' ``chains`` (token tuples continuing the root) as deterministic
        drafts: walking each chain from the root, at the node of its prefix its next token x is a
        free draft (law the one-hot row ``e_x``). The chains form a trie: a token proposed by
        several chains at one node is one draft there (the node's free drafts are the distinct
        next tokens, in order of first appearance), so each node's free drafts are a function of
        the path alone. Returns the new node ids."""
        nxt: dict[tuple, list[int]] = {}
        for ch in chains:
            ch = tuple(int(t) for t in ch)
            for d in range(len(ch)):
                toks = nxt.setdefault(ch[:d], [])
                if ch[d] not in toks:
                    toks.append(ch[d])
        at = {(): 0}
        new: list[int] = []
        for prefix in sorted(nxt, key=len):  # a prefix's node exists before its extensions are drafted
            i = at[prefix]
            toks = nxt[prefix]
            new.extend(self.add_free_drafts(i, toks))
            for t in toks:
                at[prefix + (t,)] = self.nodes[i].child[t]
        return new

    def _grow(self, n: int) -> None:
        """Room for n nodes in the ancestor matrix (free drafts go past ``shape.max_nodes()``)."""
        cap = self._anc.shape[0]
        if n <= cap:
            return
        new = max(n, 2 * cap)
        anc = torch.zeros(new, new, dtype=torch.bool)
        anc[:cap, :cap] = self._anc
        self._anc = anc

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
