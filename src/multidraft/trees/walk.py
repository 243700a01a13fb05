"""The token-level walk: every registered token-level verifier as a tree rule.

From the root, at node u with drafts the verifier decides among u's drafts with p(.|u) and
q(.|u): ``verifier.verify(p, q, drafts, generator=g, law=kind, validate=False)``. When the
output token is one of u's drafts the walk enters the first child holding it (an accepted
token), otherwise it stops (a recovered token). At a node without drafts (a leaf: the whole
path was accepted) one bonus token is sampled from p with ``sampling.sample_token``. The
generator is read in that order, node after node.

A node whose number of drafts k the verifier is not lossless for (a trie node reached by
fewer sequences, a without-replacement node with fewer nonzero tokens than drafts) is
verified with ``naive`` when k = 1, else with ``nss``: both are lossless for every law.

Losslessness. At a node the verifier receives drafts that are a fresh draw of the draft
law given the path so far: in ``paths`` mode a node's drafts are drawn only after the node
exists, from q at that node, by the law with its own k; duplicate slots are never expanded
(the walk enters the first matching child, whose subtree is one valid draw given the path).
In ``sequences`` mode the m continuations of the sequences through a node are, given the
path, m draws from q at that node (iid, or each from its own temperature for the
``independent`` law); m is fixed by earlier levels, so the verifier at that node is run
with a law it is lossless for. In ``dynamic`` mode a node's k is fixed before its drafts are
drawn (``shapes.allocate``). By induction the walk outputs each token with the target's law
given the path; ``certify.certify_tree`` checks the whole emitted sequence by enumeration.
"""
from __future__ import annotations

import torch

from .. import verifiers as _verifiers
from .._validate import as_generator
from ..drafts import law_kind
from ..sampling import sample_token
from ._check import check_tree, row64
from .rules import TreeRule, TreeVerdict, register
from .tree import DraftTree

__all__ = ["TokenWalk", "node_ks"]


def node_ks(v, kind: str, k_max: int) -> list[int]:
    """The numbers of drafts 1..k_max a tree node may have when ``v`` verifies drafts of law
    ``kind``: 1 always (a single draft is verified with 'naive'), k > 1 where ``v.supports``."""
    return [k for k in range(1, k_max + 1) if k == 1 or v.supports(kind, k)]


class TokenWalk(TreeRule):
    """The root-first walk of a token-level ``verifier`` over trees whose node drafts follow ``law``.

    ``verifier``: a registered name or a ``Verifier``; ``law``: a kind from
    ``drafts.LAW_KINDS`` (None: the verifier's only law, else its default law).
    """

    name = "token_walk"
    lazy_rows = True   # reads p only at the nodes it visits, on the rows' own device
    node_wise = True   # each visited node is decided by its own token-level verifier
    _MEMO = 4096  # exact node laws kept (output_distribution over many trees sharing nodes)
    _MEMO_ELEMS = 1 << 22  # ... and at most this many row elements held by the memo (p, q, law: 3 V
    # each; ~100 MB in float64): at V = 151,936 that is 9 nodes, not 4,096 x 3.6 MB

    def __init__(self, verifier, law=None):
        self.verifier = verifier if isinstance(verifier, _verifiers.Verifier) else _verifiers.get(verifier)
        v = self.verifier
        if law is None:
            law = v.laws[0] if len(v.laws) == 1 else v.default_law
        self.law = law_kind(law, "law")
        self._by_k: dict[int, object] = {}
        self._memo: dict = {}
        self._memo_elems = 0

    def __repr__(self) -> str:
        return f"<tree rule 'token_walk' verifier={self.verifier.name!r} law={self.law!r}>"

    def verifier_for(self, k: int):
        """The token-level verifier used at a node with k drafts (the fallbacks above)."""
        v = self._by_k.get(k)
        if v is None:
            main = self.verifier
            if main.supports(self.law, k):
                v = main
            elif k == 1:
                v = _verifiers.get("naive")
            else:
                v = _verifiers.get("nss")
            self._by_k[k] = v
        return v

    def supports(self, tree_law) -> bool:
        """Lossless for ``tree_law`` when its node law is this walk's law and the verifier takes
        every number of drafts the tree law's shape gives a node (as the decoder requires)."""
        if tree_law.kind != self.law:
            return False
        ks = tree_law.node_ks()
        allowed = node_ks(self.verifier, self.law, max(ks, default=1))
        return all(k in allowed for k in ks)

    def _check_tree(self, tree: DraftTree) -> None:
        """The one input check of the tree rules (``_check.check_tree``: rows, drafts in range,
        parents; every per-node check skipped for a tree the decoder marked ``checked``), taking a
        tree without drafts (one token from p at the root)."""
        check_tree(tree, (self.law,), "token_walk", empty_ok=True)

    # sampling path --------------------------------------------------------------------------
    def verify(self, tree: DraftTree, generator) -> TreeVerdict:
        self._check_tree(tree)
        g = generator if isinstance(generator, torch.Generator) else as_generator(generator, tree.p(0).device, purpose="verify")
        path: list[int] = []
        i = 0
        while True:
            nd = tree.nodes[i]
            p = tree.p(i)  # [V]
            if nd.drafts:
                dr = torch.tensor(nd.drafts, dtype=torch.long, device=p.device)  # [k]
                v = self.verifier_for(len(nd.drafts))
                y = int(v.verify(p, nd.q, dr, generator=g, law=self.law, validate=False).token)
                c = nd.child.get(y)
                if c is not None:
                    path.append(c)
                    i = c
                    continue
                return TreeVerdict(tuple(path), y)
            return TreeVerdict(tuple(path), int(sample_token(p, g)))

    def node_records(self, tree: DraftTree, verdict: TreeVerdict) -> list[tuple]:
        """``(k, slot, depth)`` of every node the walk verified: its number of drafts, the first
        draft slot holding the token it output when the walk entered that child, else None."""
        out = []
        visited = (0,) + tuple(verdict.path)
        for j, i in enumerate(visited):
            nd = tree.nodes[i]
            if not nd.drafts:
                continue
            slot = nd.drafts.index(tree.nodes[visited[j + 1]].token) if j + 1 < len(visited) else None
            out.append((len(nd.drafts), slot, nd.depth))
        return out

    # exact path -----------------------------------------------------------------------------
    def _node_law(self, p: torch.Tensor, q: torch.Tensor, drafts: list) -> torch.Tensor:
        """Exact float64 law ``[V]`` of the verifier's output at a node (memoised by the identity
        of the p and q rows, which are kept alive with the entry)."""
        key = (id(p), id(q), tuple(drafts))
        hit = self._memo.get(key)
        if hit is not None and hit[0] is p and hit[1] is q:
            return hit[2]
        v = self.verifier_for(len(drafts))
        dr = torch.tensor(drafts, dtype=torch.long, device=p.device)
        out = v.output_distribution(p, q, dr, law=self.law).double().cpu()
        size = 3 * out.numel()
        if len(self._memo) >= self._MEMO or self._memo_elems + size > self._MEMO_ELEMS:
            self._memo.clear()
            self._memo_elems = 0
        self._memo[key] = (p, q, out)
        self._memo_elems += size
        return out

    def output_distribution(self, tree: DraftTree) -> dict:
        self._check_tree(tree)
        law: dict[tuple, float] = {}

        def walk(i: int, prefix: tuple, w: float) -> None:
            nd = tree.nodes[i]
            p = tree.p(i)
            out = self._node_law(p, nd.q, nd.drafts) if nd.drafts else row64(p.cpu())  # a leaf: p as the law it represents
            for y in torch.nonzero(out > 0).flatten().tolist():
                m = w * float(out[y])
                c = nd.child.get(y) if nd.drafts else None
                if c is not None:
                    walk(c, prefix + (y,), m)
                else:
                    law[prefix + (y,)] = law.get(prefix + (y,), 0.0) + m

        walk(0, (), 1.0)
        return law

    def expected_tokens(self, tree: DraftTree) -> float:
        """Exact E|Y| in O(nodes x V): ``1 + sum over non-root nodes c of P(the walk enters c)``,
        with ``P(enter c) = P(enter parent u) x out_u(token of c)``, ``out_u`` ``[V]`` the exact law of
        the verifier's output at u (``verifier_for(k)``: the main verifier or its naive / nss
        fallback) and c the first child holding that token (``Node.child``). The final token
        (recovered, or the bonus sampled from p at a leaf) is the 1."""
        self._check_tree(tree)
        reach = {0: 1.0}
        total = 1.0
        for i, nd in enumerate(tree.nodes):  # a parent is created before its children
            w = reach.get(i, 0.0)
            if not nd.drafts or w <= 0.0:
                continue
            out = self._node_law(tree.p(i), nd.q, nd.drafts)  # [V] float64
            for t, c in nd.child.items():
                rc = w * float(out[t])
                reach[c] = rc
                total += rc
        return total


register("token_walk", TokenWalk)
