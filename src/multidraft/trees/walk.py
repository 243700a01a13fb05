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

Mixed nodes: free drafts first (DESIGN.md "Draft sources"). A node of a mixed tree has its
model drafts D (``drafts[:k]``, drawn by the model's law L with the node's q, as without free
sources) followed by ``free`` deterministic drafts x_1..x_m from the free sources (a function of
the path alone; law the one-hot row e_x). The node is verified by the *free-first* rule:

    r_0 = p;  for i = 1..m: output x_i with probability r_(i-1)(x_i) (u_i < r_(i-1)(x_i), u_i one
    uniform of the generator), else r_i = r_(i-1) with x_i set to 0, renormalised;
    if no free draft was output: the verifier V of the walk (lossless for L) on target r_m with
    the model's drafts D and q as drawn (a node without model drafts: y ~ r_m).

Proof of losslessness. Write P_i = prod_(j<i) (1 - r_(j-1)(x_j)) for the probability that x_1..x_(i-1)
were all refused. Since r_i = r_(i-1) (1 - e_(x_i)) / (1 - r_(i-1)(x_i)), induction gives
P_(i+1) r_i = P_i (r_(i-1) - r_(i-1)(x_i) e_(x_i)), i.e. P_(i+1) r_i + P_i r_(i-1)(x_i) e_(x_i) = P_i r_(i-1).
The output law is sum_i P_i r_(i-1)(x_i) e_(x_i) + P_(m+1) r_m (the second term because V is
lossless for the target r_m whatever that target is: D is a draw of L given the path, independent
of the x's and of the uniforms), which telescopes to P_1 r_0 = p. For one-hot drafts this is
SpecInfer's multi-round residual rule (Miao et al., ASPLOS 2024): the acceptance
min(1, r(x)/q(x)) with q = e_x is r(x), and the residual norm(max(0, r - e_x)) is r with x
zeroed. Repeated free tokens: r(x) = 0 after the first refusal, never output. The p = 0
guarantee: a free token with r(x) = 0 is never output (u < 0 never holds) and is 0 in r_m, so a
lossless V never emits it. r_(i-1)(x_i) is computed as p(x_i) / (p(x_i) + sum_(j>i) p(x_j) + R),
R = the float64 mass of p outside the free tokens (p as float64, any dtype: the ratio does not
read p's normalisation; ``_free_first``), exactly 0, so the ratio exactly 1 (always accepted),
when no other mass remains.

Cost: a node without free drafts is verified as before; a node with free drafts pays one O(V)
float64 sum of p on its device (R = that sum less the copies' masses; one transfer of m + 1
scalars and m uniforms), and only when every free draft is refused the residual row (one O(V)
copy) and the model's verifier on it (sampling from it at a free-only node). An accepted copy
writes nothing of size V. The node's law stays the model's: no per-draft q rows are built for
the free drafts.
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
        check_tree(tree, (self.law,), "token_walk", empty_ok=True, free_ok=True)

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
                y = self._verify_node(p, nd, g)
                c = nd.child.get(y)
                if c is not None:
                    path.append(c)
                    i = c
                    continue
                return TreeVerdict(tuple(path), y)
            return TreeVerdict(tuple(path), int(sample_token(p, g)))

    def _verify_node(self, p: torch.Tensor, nd, g) -> int:
        """The output token of node ``nd`` with target ``p`` ``[V]`` (free drafts first, module notes)."""
        k = len(nd.drafts) - nd.free
        if nd.free:
            xs, acc, idx, R = _free_first(p, nd.drafts[k:])
            u = torch.rand(len(xs), dtype=torch.float64, generator=g, device=g.device).cpu().tolist()  # [m]
            for x, a, ui in zip(xs, acc, u):
                if ui < a:
                    return x  # an accepted copy: no O(V) write
            p = p.index_fill(0, idx, 0.0)  # [V] the residual r_m, unnormalised (R > 0: some copy was refused with probability > 0)
            if k == 0:
                return int(sample_token(p, g))  # inverse CDF of the row's own cumulative sum
        dr = torch.tensor(nd.drafts[:k], dtype=torch.long, device=p.device)  # [k]
        v = self.verifier_for(k)
        return int(v.verify(p, nd.q, dr, generator=g, law=self.law, validate=False).token)

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
    def _exact_node_law(self, p: torch.Tensor, q, drafts: list, free: int) -> torch.Tensor:
        """Exact float64 law ``[V]`` (CPU) of a node's output: the verifier's on (p, q, drafts), or with
        ``free`` free drafts at the end the free-first composition (module notes):
        ``sum_i P_i a_i e_(x_i) + P_(m+1) out_V(r_m)``, out_V the model verifier's exact output law on
        the target r_m (r_m itself at a node without model drafts)."""
        k = len(drafts) - free
        if not free:
            dr = torch.tensor(drafts, dtype=torch.long, device=p.device)
            return self.verifier_for(k).output_distribution(p, q, dr, law=self.law).double().cpu()
        xs, acc, idx, R = _free_first(p, drafts[k:])
        out = torch.zeros(p.shape[-1], dtype=torch.float64, device="cpu")  # [V], the law is on the CPU
        w = 1.0
        for x, a in zip(xs, acc):
            out[x] += w * a
            w *= 1.0 - a
        if w > 0.0:
            r = p.index_fill(0, idx, 0.0).double()  # [V] r_m, float64, as every verifier reads the row: row / its sum
            r = r / r.sum()
            if k:
                dr = torch.tensor(drafts[:k], dtype=torch.long, device=p.device)
                sub = self.verifier_for(k).output_distribution(r, q, dr, law=self.law).double().cpu()
            else:
                sub = r.cpu()
            out += w * sub
        return out

    def _node_law(self, p: torch.Tensor, q, drafts: list, free: int = 0) -> torch.Tensor:
        """Exact float64 law ``[V]`` of a node's output (``_exact_node_law``; memoised by the
        identity of the p and q rows, which are kept alive with the entry)."""
        key = (id(p), id(q), tuple(drafts), free)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is p and hit[1] is q:
            return hit[2]
        out = self._exact_node_law(p, q, drafts, free)
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
            out = self._node_law(p, nd.q, nd.drafts, nd.free) if nd.drafts else row64(p.cpu())  # a leaf: p as the law it represents
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
            out = self._node_law(tree.p(i), nd.q, nd.drafts, nd.free)  # [V] float64
            for t, c in nd.child.items():
                rc = w * float(out[t])
                reach[c] = rc
                total += rc
        return total


EXACT_R_BELOW = 1e-6  # R = S - sum_i p(x_i) is replaced by the float64 sum of the zeroed row where it is below this share of S


def _free_first(p: torch.Tensor, free: list) -> tuple[list, list, torch.Tensor, float]:
    """The free-first rule's numbers at a node with target ``p`` ``[V]`` and free drafts ``free``
    (module notes): the distinct free tokens x_1..x_m in order, their acceptance probabilities
    r_(i-1)(x_i) (float64; 0 for a token the target gives 0), their ids ``[m]`` on p's device (the
    residual's unnormalised mass is ``p.index_fill(0, ids, 0)``, built by the caller only when every
    copy is refused: zeroing is exact, and every verifier reads a row as the float64 law it
    represents, row / its float64 sum) and the remaining mass R (r_m is that mass / R).

    R = S - sum_i p(x_i), S the float64 sum of p: one O(V) read and one transfer of m + 1 scalars,
    no O(V) write. Its rounding is that of a float64 sum of V terms, as the sum of the zeroed row's
    would be (the acceptances, hence the output law, move by that order, ~1e-16 of S). Where R is
    at most ``EXACT_R_BELOW`` of S (no mass, or little, outside the copies) R is the float64 sum of
    the zeroed row itself, so it is exactly 0 when no other mass remains: the last copy with mass
    is then accepted with probability exactly 1 and the empty residual is never read."""
    xs = list(dict.fromkeys(int(t) for t in free))
    idx = torch.tensor(xs, dtype=torch.long, device=p.device)  # [m]
    host = torch.cat([p[idx].double(), p.sum(dtype=torch.float64).reshape(1)]).cpu().tolist()  # [m + 1]
    v, S = host[:-1], host[-1]
    R = S
    for vi in v:
        R -= vi
    if not R > EXACT_R_BELOW * S:
        R = float(p.index_fill(0, idx, 0.0).sum(dtype=torch.float64))
    acc = [0.0] * len(xs)
    tail = R  # sum of p outside x_1..x_i, from the last i down
    for i in range(len(xs) - 1, -1, -1):
        den = v[i] + tail
        acc[i] = v[i] / den if den > 0.0 else 0.0
        tail = den
    return xs, acc, idx, R


register("token_walk", TokenWalk)
