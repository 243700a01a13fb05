r"""Rules that decide a tree's nodes one after another, leaves first: traversal and UniVer.

Such a rule visits the nodes in a fixed post-order (a child's subtree before the next sibling, a
node after its children). A node is *decided* when everything decided before it was refused: it
keeps the path to it with probability ``keep`` (the root: 1, it always ends the walk) and then
emits one token from its row ``[V]``. The sequence of decisions ``(path, keep, row, leaf)``
(``path``: node ids from the root's first child down, ``()`` at the root; ``leaf``: the node has
no child to try, so the walk has just entered it) depends on the tree only, not on the
randomness: the states are those after every earlier decision refused, the only way to reach a
decision. So a rule gives one generator of its decisions and these three readers serve it:

* ``first_kept``: one run, reading one uniform per non-root decision and one for the emitted
  token (``sampling.sample_token``), in that order;
* ``decisions_law``: the exact law of Y, ``P(stop at d) = keep_d prod_(e before d) (1 - keep_e)``;
* ``decisions_tokens``: E|Y|, with ``|Y| = len(path) + 1`` at a decision.

The generator is read lazily: a decision (and the rows it needs) is computed only when the reader
gets there. The exact readers stop, on entering a leaf, once the probability w of getting there is
not positive (w can dip below 0 by rounding, where a keep weight ``r / (r + 1 - a)`` comes out as
1 + 2^-52: a node then emits only while w > 0, as the recursions these readers replaced did).
"""
from __future__ import annotations

import torch

from ..sampling import sample_token
from .rules import TreeVerdict
from .tree import DraftTree

__all__ = ["decisions_law", "decisions_tokens", "first_kept"]


def first_kept(decisions, g: torch.Generator) -> TreeVerdict:
    """The verdict of one run: the first decision that keeps its node (the root always does)."""
    for path, keep, row, _ in decisions:
        if not path or float(torch.rand((), generator=g, dtype=torch.float64, device=g.device)) < keep:
            return TreeVerdict(path, int(sample_token(row, g)))
    raise AssertionError("unreachable: the root is decided last and always kept")  # pragma: no cover


def _reached(decisions):
    """``(path, keep, row, w)``: the decisions reached with w > 0, w the probability that every
    earlier one refused; none after a leaf reached with w <= 0."""
    w = 1.0
    for path, keep, row, leaf in decisions:
        if leaf and w <= 0:
            return
        if w > 0:
            yield path, keep, row, w
        w = w * (1.0 - keep)


def decisions_law(tree: DraftTree, decisions) -> dict:
    """``{Y: probability}``: the exact law of the emitted sequence."""
    law: dict = {}
    for path, keep, row, w in _reached(decisions):
        if keep > 0:
            prefix = tuple(tree.nodes[j].token for j in path)
            for y in torch.nonzero(row > 0).flatten().tolist():
                key = prefix + (y,)
                law[key] = law.get(key, 0.0) + w * keep * float(row[y])
    return law


def decisions_tokens(decisions) -> float:
    """E|Y|: ``sum_d P(stop at d) (len(path_d) + 1)``, no pass over V."""
    total = 0.0
    for path, keep, _, w in _reached(decisions):
        if keep > 0:
            total += w * keep * (len(path) + 1)
    return total
