r"""Block verification of one draft chain (Sun et al., ICLR 2025, arXiv 2403.10444), as a tree rule.

Setting. One chain ``X_1 .. X_L`` drawn from the draft, ``X_i ~ q(. | X^(i-1))``; the target
rows ``p(. | X^i)`` are known at every prefix ``X^i`` (i = 0..L). The rule emits
``Y = (X_1 .. X_tau, y)``.

The weights. Let ``a_0 = 1`` and ``a_i = min(a_(i-1) p(X_i | X^(i-1)) / q(X_i | X^(i-1)), 1)``.
Unrolled, ``a_i q(X^i) = m(X^i) := min_(0<=j<=i) q(X^j) p(X_(j+1..i) | X^j)``: the largest mass
of the prefix X^i that a lossless rule can keep, whatever the prefix's continuation (the
target caps it at p-from-any-earlier-point, the draft at q). At prefix i the mass the target
still wants after X^i but that keeping X^i with weight a_i does not supply is the residual
``r_i(x) = max(a_i p(x | X^i) - q(x | X^i), 0)``, of total ``r_i = sum_x r_i(x)``.

The rule. Scan the chain backwards from the leaf. At the leaf keep everything with
probability ``h_L = a_L`` and add a target sample ``y ~ p(. | X^L)``. At an inner prefix
i (1 <= i < L), reached because every longer prefix was refused, keep ``X^i`` with
probability ``h_i = r_i / (r_i + 1 - a_i)`` and emit ``y ~ r_i(.) / r_i``. At the root
(i = 0, nothing kept) emit ``y ~ r_0(.) / r_0``. Equivalently, with independent uniforms
``eta_i``: ``tau = max{i >= 1 : eta_i <= h_i}`` (0 when none), which is how ``verify`` reads
its generator: L uniforms, then one for the emitted token. Why it is lossless, in short:
the probability that the scan keeps at least X^i, averaged over the draft's continuation of
X^i, is exactly ``a_i`` given X^i; ``1 - a_i`` is the mass of X^i the rule must let the
target regenerate, and ``h_i`` splits it between stopping here (sampling the residual
r_i) and going further back, so that at every prefix the emitted law adds up to p.
``certify.certify_tree`` checks the whole law by enumeration.

Value. The expected number of kept drafts is ``sum_i E[a_i] = sum_(i=1..L) sum_(x^i) m(x^i)``,
so ``E|Y| = 1 + sum_(i=1..L) sum_(x^i) m(x^i)`` (``block_tokens``). Sun et al. prove it
is the largest among all lossless rules that see one chain, and never below token-by-token
speculative sampling (whose kept drafts are ``sum_i E[prod_(j<=i) min(1, p/q)]``).

Degenerate cases (our choices; the paper assumes them away): ``h_i = 0`` when ``r_i = 0``
(then the scan reaches prefix i with probability 0, or ``a_i < 1`` and nothing is owed
there); the root's residual when ``r_0 = 0`` (p = q at the root: the scan reaches the root
with probability 0) is taken as ``p(. | root)``.
"""
from __future__ import annotations

import torch

from .._scan import keep_ratio
from .._validate import as_generator
from ..sampling import sample_token
from ._check import check_tree, is_chain_law, is_mixed_law, mixed_refusal, row64
from .rules import TreeRule, TreeVerdict, register
from .tree import DraftTree

__all__ = ["BlockVerification", "ChainRows", "chain_path", "block_tokens", "chain_weights", "chain_keeps", "chain_stop", "scan_stops",
           "add_scan_law", "scan_tokens", "scan_verify"]


class ChainRows:
    """The rows ``[V]`` of a chain's prefixes (tensors, or laws with ``at(x)`` and ``row()`` such as
    ``trees.gbv.Selection``), read as float64 distributions (``_check.row64``) only
    where needed: ``rows[i]`` converts row i on first use (then keeps it), ``rows.at(i, x)`` reads
    one entry without converting the row (a float32 row: its entry over the row's float64 sum, the
    very numbers of ``row64``). Block verification's scan needs every ``p(X_i | X^(i-1))`` and
    ``q(X_i | X^(i-1))`` but whole rows only at the prefix where it stops."""

    __slots__ = ("_raw", "_rows", "_sums")

    def __init__(self, raw: list, known: dict | None = None):
        self._raw = list(raw)  # [V] each, any float dtype
        self._rows: dict = dict(known or {})  # {i: row64(raw[i])} already converted by the caller
        self._sums: dict = {}

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, i: int) -> torch.Tensor:
        row = self._rows.get(i)
        if row is None:
            raw = self._raw[i]
            row = self._rows[i] = raw.row() if hasattr(raw, "row") else row64(raw)
        return row

    def at(self, i: int, x: int) -> float:
        raw = self._raw[i]
        if hasattr(raw, "at"):  # a lazily computed law (trees.gbv.Selection)
            return raw.at(x)
        if i in self._rows or raw.dtype == torch.float64:
            return float(self[i][x])
        total = self._sums.get(i)
        if total is None:
            total = self._sums[i] = raw.double().sum()  # row64's divisor, bit for bit
        return float(raw[x].double() / total)


def _rows(rows) -> ChainRows:
    return rows if isinstance(rows, ChainRows) else ChainRows(rows)


def chain_keeps(ps, qs, xs: list) -> list[float]:
    """``a[0..L]`` of block verification along one chain (scalars only: O(L), no pass over V but
    the sums of rows that are not float64). ps, qs, xs as in :func:`chain_weights`."""
    ps, qs = _rows(ps), _rows(qs)
    a = [1.0]
    for i in range(len(xs)):
        a.append(keep_ratio(a[i] * ps.at(i, xs[i]), qs.at(i, xs[i])))  # min(a p / q, 1), exact at q = 0
    return a


def chain_stop(i: int, a: list, ps, qs) -> tuple[float, torch.Tensor]:
    """``(h_i, row_i)`` at prefix i: the keep probability and the emitted token's law ``[V]`` when
    the scan stops there (one pass over V for i < L). ``a`` from :func:`chain_keeps`."""
    L = len(a) - 1
    if i == L:
        return (a[L] if L > 0 else 1.0), ps[L]
    res = (a[i] * ps[i] - qs[i]).clamp_min(0.0)  # [V]
    r = float(res.sum())
    row = res / r if r > 0 else ps[i]
    if i == 0:
        return 1.0, row
    den = r + 1.0 - a[i]
    return (r / den if r > 0 and den > 0 else 0.0), row


def chain_weights(ps, qs, xs: list) -> tuple[list[float], list[float], list[torch.Tensor]]:
    """The weights of block verification along one chain of length L.

    ps: L + 1 target rows ``[V]`` (at X^0 .. X^L); qs: L draft rows ``[V]`` (at X^0 .. X^(L-1));
    lists of rows or ``ChainRows``; xs: the L drafted tokens. Returns ``(a, h, rows)``: ``a[0..L]``,
    the keep probabilities ``h[0..L]`` (``h[0] = 1``: the root always ends the scan) and the
    emitted token's law ``rows[0..L]`` (``[V]`` each) when the scan stops at prefix i."""
    ps, qs = _rows(ps), _rows(qs)
    a = chain_keeps(ps, qs, xs)
    h, rows = zip(*(chain_stop(i, a, ps, qs) for i in range(len(xs) + 1)))
    return a, list(h), list(rows)


# the backward scan, given its weights: law, value and one run ---------------------------------

def scan_stops(h: list, start: float = 1.0):
    """``(i, start x P(tau = i))`` for i = L .. 0 (from the leaf back): the scan stops at prefix i
    when every longer prefix was refused and i is kept, ``P(tau = i) = h_i prod_(j > i) (1 - h_j)``."""
    later = start  # start x P(every prefix longer than i refused)
    for i in range(len(h) - 1, -1, -1):
        yield i, later * h[i]
        later *= 1.0 - h[i]


def add_scan_law(law: dict, xs: list, h: list, rows: list, start: float = 1.0) -> None:
    """Add ``start`` x the emitted law of the backward scan (``X^tau`` then ``y ~ rows[tau]``) to ``law``."""
    for i, w in scan_stops(h, start):
        if w <= 0:
            continue
        row = rows[i]
        for y in torch.nonzero(row > 0).flatten().tolist():
            key = tuple(xs[:i]) + (y,)
            law[key] = law.get(key, 0.0) + w * float(row[y])


def scan_tokens(h: list) -> float:
    """E|Y| of the backward scan: ``sum_i (i + 1) P(tau = i)`` (tau drafts kept, one token more)."""
    e = 0.0
    for i, w in scan_stops(h):
        e += w * (i + 1)
    return e


def scan_verify(a: list, ps, qs, g: torch.Generator) -> tuple[int, int]:
    """One run of the backward scan: ``(tau, y)``. Reads L uniforms ``eta_1 .. eta_L`` then one for
    the emitted token; h_i and the residual at prefix i are computed only when the scan reaches i
    (so a step whose leaf is kept costs no residual, and with ``ChainRows`` no row conversion but
    the leaf's): the same numbers as ``chain_weights``."""
    ps, qs = _rows(ps), _rows(qs)
    L = len(a) - 1
    eta = torch.rand(L, generator=g, dtype=torch.float64, device=g.device).tolist()  # eta_1 .. eta_L
    for i in range(L, -1, -1):
        h, row = chain_stop(i, a, ps, qs)
        if i == 0 or eta[i - 1] < h:
            return i, int(sample_token(row, g))
    raise AssertionError("unreachable: the root always ends the scan")  # pragma: no cover


def block_tokens(tree_law, model) -> float:
    """Block verification's expected tokens per call on a chain law, from the closed form
    ``1 + sum_(i=1..L) sum_(x^i) min_(0<=j<=i) q(x^j) p(x_(j+1..i) | x^j)`` (small V)."""
    if not is_chain_law(tree_law):
        raise ValueError(f"tree_law: block_tokens needs a chain law, got {tree_law.name}")
    L, V = tree_law.depth, model.V
    total = 1.0
    # level i: for every prefix x^i of positive draft probability the list c_j = q(x^j) p(x_(j+1..i) | x^j),
    # j = 0..i (its last entry is q(x^i)); m(x^i) = min_j c_j.
    level = {(): [1.0]}
    for _ in range(L):
        nxt = {}
        for pre, cs in level.items():
            p, q = model.p(pre), model.q(pre)
            qpre = cs[-1]
            for x in range(V):
                if float(q[x]) <= 0:
                    continue
                c = [cj * float(p[x]) for cj in cs] + [qpre * float(q[x])]
                nxt[pre + (x,)] = c
        total += sum(min(c) for c in nxt.values())
        level = nxt
    return total


def chain_path(tree: DraftTree):
    """``(ids, xs, ps, qs)`` of a chain (one draft a node, checked by the caller): node ids from the
    root, drafted tokens, and the target and draft rows of the prefixes as ``ChainRows``
    (converted to float64 where they are read)."""
    ids, xs, ps, qs = [0], [], [tree.p(0)], []
    i = 0
    while tree.nodes[i].drafts:
        nd = tree.nodes[i]
        t = nd.drafts[0]
        qs.append(nd.q)
        xs.append(t)
        i = nd.child[t]
        ids.append(i)
        ps.append(tree.p(i))
    return ids, xs, ChainRows(ps), ChainRows(qs)


class BlockVerification(TreeRule):
    """Block verification of one draft chain (see the module notes); no options."""

    name = "block"

    def refusal(self, tree_law):
        if is_mixed_law(tree_law):
            return mixed_refusal(self.name)
        if not is_chain_law(tree_law):
            return ("block verification reads one chain (one draft per node); use chain(L) or "
                    "sequences(1, L), or 'traversal' / 'tree_lp' for trees")
        return None

    def supports(self, tree_law) -> bool:
        return self.refusal(tree_law) is None

    def _chain(self, tree: DraftTree):
        check_tree(tree, ("iid", "wor", "greedy"), "block", chain=True)
        return chain_path(tree)

    def output_distribution(self, tree: DraftTree) -> dict:
        _, xs, ps, qs = self._chain(tree)
        _, h, rows = chain_weights(ps, qs, xs)
        law: dict = {}
        add_scan_law(law, xs, h, rows)
        return law

    def expected_tokens(self, tree: DraftTree) -> float:
        """Exact E|Y| in O(L x V): ``sum_i (i + 1) P(tau = i)`` (``scan_tokens``)."""
        _, xs, ps, qs = self._chain(tree)
        _, h, _ = chain_weights(ps, qs, xs)
        return scan_tokens(h)

    def verify(self, tree: DraftTree, generator) -> TreeVerdict:
        """The backward scan, lazily (``scan_verify``): a row is converted to float64 and a
        residual computed only at the prefix where the scan stops; the same uniforms and the same
        numbers as ``chain_weights``."""
        ids, xs, ps, qs = self._chain(tree)
        g = generator if isinstance(generator, torch.Generator) else as_generator(generator, tree.p(0).device, purpose="verify")
        tau, y = scan_verify(chain_keeps(ps, qs, xs), ps, qs, g)
        return TreeVerdict(tuple(ids[1 : tau + 1]), y)


register("block", BlockVerification)
