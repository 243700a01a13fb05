"""Input checks shared by the sequence-level tree rules (block, traversal, tree_lp).

``check_tree`` refuses, with one ``ValueError`` naming the argument, a tree the rules cannot
read (the per-row checks are skipped for a tree whose builder set ``rows_checked``: the decoder): not a ``DraftTree``, depth 0 (nothing drafted), a node law the rule does not verify,
a q or p row that is not a distribution ``[V]``, a drafted token outside the vocabulary or of
probability 0 under its node's q row, a node whose drafts disagree with its children or
with the number of drafts its shape gives it. (A rule's ``refusal(tree_law)`` returns why it
cannot verify a tree law, or None; ``supports`` is ``refusal(...) is None`` and
``certify_tree`` quotes the reason.)
"""
from __future__ import annotations

import torch

from .._validate import as_probs64
from .tree import DraftTree

__all__ = ["check_tree", "is_chain_law", "row64"]


def is_chain_law(tree_law) -> bool:
    """Whether every tree of ``tree_law`` is one chain (one draft at every internal node)."""
    return tree_law.node_ks() <= {1}


def row64(x: torch.Tensor) -> torch.Tensor:
    """A node's row ``[V]`` as the float64 distribution the rules compute with: float64 rows as
    given, other dtypes divided by their float64 sum (``_validate.as_probs64``'s rule, without its
    checks: ``check_tree`` made them). The decoder's float32 rows sum to 1 only to ~1e-7; read
    unnormalised, every rule would be exact for a slightly different p."""
    if x.dtype == torch.float64:
        return x
    x = x.double()
    return x / x.sum()


def _row(x, what: str, V: int | None) -> torch.Tensor:
    if x is None:
        raise ValueError(f"tree: {what} is missing")
    row = as_probs64(x, f"tree: {what}")
    if row.ndim != 1 or (V is not None and row.shape[0] != V):
        raise ValueError(f"tree: {what} has shape {tuple(row.shape)}, expected ({V},)")
    return row


def check_tree(tree, kinds: tuple[str, ...], rule: str, *, chain: bool = False) -> None:
    """Validate a filled draft tree for a sequence-level rule (see the module notes)."""
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree: must be a DraftTree, got {type(tree).__name__}")
    if tree.depth_cap < 1 or not tree.nodes[0].drafts:
        raise ValueError("tree: depth 0 (no drafts below the root); a tree rule needs depth >= 1")
    if tree.law not in kinds and not (chain and tree.law in ("iid", "wor", "greedy")):
        raise ValueError(f"tree: drafted by the {tree.law!r} law; {rule} verifies {' or '.join(map(repr, kinds))} drafts")
    trusted = bool(getattr(tree, "rows_checked", False))  # the builder vouches for the rows (DraftTree notes)
    V = int(tree.p(0).shape[-1]) if trusted else None
    for i, nd in enumerate(tree.nodes):
        if not trusted:
            p = _row(tree.p(i), f"p row at node {i}", V)
            V = p.shape[0]
        if not nd.drafts:
            if nd.child:
                raise ValueError(f"tree: node {i} has children but no drafts")
            continue
        if chain and len(nd.drafts) != 1:
            raise ValueError(f"tree: {rule} verifies one chain, node {i} has {len(nd.drafts)} drafts")
        q = nd.q if trusted else _row(nd.q, f"q row at node {i}", V)
        k = tree.n_children(i)
        if len(nd.drafts) != k and not (tree.law in ("wor", "greedy") and len(nd.drafts) < k):
            raise ValueError(f"tree: node {i} has {len(nd.drafts)} drafts, its shape gives it {k}")
        for t in nd.drafts:
            if not isinstance(t, int) or not 0 <= t < V:
                raise ValueError(f"tree: draft {t!r} at node {i} is not a token id in [0, {V})")
            if not float(q[t]) > 0:
                raise ValueError(f"tree: draft {t} at node {i} has probability 0 under the node's q row "
                                 "(the drafts do not match the tree's law)")
        if set(nd.child) != set(nd.drafts):
            raise ValueError(f"tree: node {i}'s children {sorted(nd.child)} differ from its drafts {sorted(set(nd.drafts))}")
        for t, c in nd.child.items():
            if not 0 < c < len(tree.nodes) or tree.nodes[c].parent != i or tree.nodes[c].token != t:
                raise ValueError(f"tree: node {i}'s child for token {t} is not a node below it")
