"""Input checks shared by the tree rules (the token walk, block, traversal, gbv, univer, tree_lp).

``check_tree`` refuses, with one ``ValueError`` naming the argument and the node, a tree the rules
cannot read (the per-row checks are skipped for a tree whose builder set ``rows_checked``, and every
per-node check for one whose builder set ``checked``: the decoder's own trees): not a ``DraftTree``,
depth 0 (nothing drafted; the walk takes it), a node law the rule does not verify,
a q or p row that is not a distribution ``[V]``, a drafted token outside the vocabulary or of
probability 0 under its node's q row, a node whose drafts disagree with its children or
with the number of drafts its shape gives it. (A rule's ``refusal(tree_law)`` returns why it
cannot verify a tree law, or None; ``supports`` is ``refusal(...) is None`` and
``certify_tree`` quotes the reason.)
"""
from __future__ import annotations

import torch

from .._validate import as_probs, as_probs64
from .tree import DraftTree

__all__ = ["MIXED_REFUSALS", "mixed_refusal", "check_tree", "is_chain_law", "is_mixed_law", "row64"]

# Why each sequence-level rule refuses mixed trees (free sources' one-hot copies beside the model's
# draws, DESIGN.md "Draft sources"): its losslessness is proven for one q row per node. The one
# table: the rules' ``refusal`` and ``decoding.settings`` (which refuses them with sources) read it.
MIXED_REFUSALS = {
    "block": "block verification reads one chain with one q row a position; a mixed tree has a model draft "
             "and a copied draft at one node",
    "traversal": "traversal verification's residual update after a refused child subtracts the node's one q "
                 "row from every sibling's state: it needs i.i.d. siblings, not a one-hot copy beside model draws",
    "gbv": "greedy block verification selects among i.i.d. sequences by one q per node; independent columns "
           "of different laws are not exchangeable",
    "spectr_gbv": "its SpecTr selection and greedy block stage both read one q row per node (i.i.d. sequences)",
    "univer": "its slot weights and state updates read one q row per node ('iid' or 'wor' drafts); "
              "independent columns are refused",
}


def mixed_refusal(rule: str) -> str:
    """Why ``rule`` refuses a mixed tree, one line (``MIXED_REFUSALS``; a rule not in it: it needs
    one q row per node)."""
    why = MIXED_REFUSALS.get(rule, "it is proven lossless for one q row per node")
    return (f"free-source drafts (one-hot copies) beside the model's draws at a node: a mixed tree; {rule} is "
            f"refused: {why} (the token walk verifies mixed trees, free drafts first)")


def is_mixed_law(tree_law) -> bool:
    """Whether ``tree_law`` is a mixed law (``laws.MixedLaw``: free sources' chains appended)."""
    return bool(getattr(tree_law, "mixed", False))


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


def _q_rows(x, what: str, V: int | None, k: int) -> torch.Tensor:
    """The 'independent' law's q rows of a node with k drafts: ``[k, V]``, each a distribution."""
    if x is None:
        raise ValueError(f"tree: {what} is missing")
    rows = as_probs64(x, f"tree: {what}", min_ndim=2)
    if rows.ndim != 2 or rows.shape[0] != k or (V is not None and rows.shape[1] != V):
        raise ValueError(f"tree: {what} has shape {tuple(rows.shape)}, expected ({k}, {V}) (one row per draft)")
    return rows


def _rows_valid(tree: DraftTree) -> bool:
    """Whether every p row ``[V]`` and q row (``[V]``; ``[k, V]`` under 'independent') of the tree is a
    distribution over one V, by one ``as_probs`` over all of them (a tree's rows cost one check, not
    one per row). False: the per-row checks of ``check_tree`` then find the row and name its node."""
    rows = []
    try:
        for i, nd in enumerate(tree.nodes):
            p = tree.p(i)
            if not isinstance(p, torch.Tensor) or p.ndim != 1:
                return False
            rows.append(p.reshape(1, -1))
            km = len(nd.drafts) - nd.free  # the model's drafts (a mixed tree's free drafts have no q row)
            if km > 0:
                q, want = nd.q, (2 if tree.law == "independent" else 1)
                if not isinstance(q, torch.Tensor) or q.ndim != want or (want == 2 and q.shape[0] != km):
                    return False
                rows.append(q.reshape(-1, q.shape[-1]))
        as_probs(torch.cat(rows), "tree")  # [rows, V]
    except (ValueError, RuntimeError, TypeError):
        return False
    return True


def check_tree(tree, kinds: tuple[str, ...], rule: str, *, chain: bool = False, empty_ok: bool = False,
               free_ok: bool = False) -> None:
    """Validate a filled draft tree for a tree rule (see the module notes); ``empty_ok``: a tree
    without drafts is taken (the token walk emits one token from p at its root); ``free_ok``: a
    mixed tree (free-source drafts, ``Node.free``) is taken (the token walk), else refused."""
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree: must be a DraftTree, got {type(tree).__name__}")
    if not empty_ok and (tree.depth_cap < 1 or not tree.nodes[0].drafts):
        raise ValueError("tree: depth 0 (no drafts below the root); a tree rule needs depth >= 1")
    if tree.law not in kinds and not (chain and tree.law in ("iid", "wor", "greedy")):
        raise ValueError(f"tree: drafted by the {tree.law!r} law; {rule} verifies {' or '.join(map(repr, kinds))} drafts")
    if not free_ok:
        for i, nd in enumerate(tree.nodes):
            if nd.free:
                raise ValueError(f"tree: node {i} has free-source drafts (a mixed tree); {rule} verifies the model's "
                                 "drafts alone (the token walk verifies mixed trees)")
    if getattr(tree, "checked", False):  # the decoder built it: rows and structure valid by construction
        return
    # the builder vouches for the rows (DraftTree notes), or one batched check finds them all valid
    trusted = bool(getattr(tree, "rows_checked", False)) or _rows_valid(tree)
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
        km = len(nd.drafts) - nd.free  # the model's drafts; the free ones (one-hot, implied) follow
        if km == 0:
            q = None
        elif tree.law == "independent":  # one q row per model draft, [km, V]
            q = nd.q if trusted else _q_rows(nd.q, f"q rows at node {i}", V, km)
        else:
            q = nd.q if trusted else _row(nd.q, f"q row at node {i}", V)
        k = tree.n_children(i) - nd.free
        short_ok = tree.law in ("wor", "greedy")
        if km != k and not (short_ok and km < k):
            raise ValueError(f"tree: node {i} has {km} model drafts, its shape gives it {k}")
        for j, t in enumerate(nd.drafts):
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < V:
                raise ValueError(f"tree: draft {t!r} at node {i} is not a token id in [0, {V})")
            if j < km and not float(q[j, t] if q.ndim == 2 else q[t]) > 0:
                raise ValueError(f"tree: draft {t} at node {i} has probability 0 under the node's q row "
                                 "(the drafts do not match the tree's law)")
        if set(nd.child) != set(nd.drafts):
            raise ValueError(f"tree: node {i}'s children {sorted(nd.child)} differ from its drafts {sorted(set(nd.drafts))}")
        for t, c in nd.child.items():
            if not 0 < c < len(tree.nodes) or tree.nodes[c].parent != i or tree.nodes[c].token != t:
                raise ValueError(f"tree: node {i}'s child for token {t} is not a node below it")
