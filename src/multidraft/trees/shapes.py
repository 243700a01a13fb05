"""Draft-tree shapes: explicit paths, K sequences, dynamic trees and their node allocator.

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

Dynamic trees (``TreeShape`` mode ``dynamic``; ``generate(..., tree="dynamic", k=K_MAX,
depth=L_MAX, max_nodes=N)``). The tree is built level by level; after the draft forward of
a level every frontier node v has its draft distribution q_v, and ``allocate`` decides, for
the whole level at once and before any draft of the level is drawn, how many drafts k_v
(0..K_MAX) each node gets: node v has reach r(v) (the product of q along its path, the
proxy for "the walk gets here"; the root has r = 1), the j-th draft at v is worth
r(v) * (c_j(q_v) - c_{j-1}(q_v)) with c_k the coverage proxy (iid / wor:
sum_x q(x) (1 - (1 - q(x))^k); greedy: the mass of the k most likely tokens), and the
largest values across the level win until the step's node budget (``N`` nodes, root
included) is spent; with ``min_gain`` g > 0 only values >= g are granted, so confident nodes
stay chains and the budget is left for depth instead of being spent on the first level. A node
with k_v = 0 is a leaf. Lossless because k_v is a function of
information fixed before v's drafts are drawn (the path, the q's of this and earlier
levels, tokens drawn at earlier levels, the remaining budget): given that information the
verifier at v receives a fresh draw of the law with k_v drafts, for which it is lossless
(the decoder refuses a verifier that is not lossless for some k <= K_MAX), and by
induction over depth the walk outputs the target's law. What must not happen, and cannot
here since the engine assigns every k of a level before it samples the level: k_v depending
on v's own drafts or on any draw at v's level or later.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .._errors import ArgumentError
from .._validate import as_int

__all__ = ["TreeShape", "full_tree", "parse_tree", "coverage", "allocate", "tree_nodes", "DEFAULT_MAX_NODES",
           "MAX_DYNAMIC_NODES", "MAX_TREE_NODES", "LLAMA_CPP_TREE_NODES"]


def full_tree(k: int, depth: int) -> list[list[int]]:
    """The K-ary tree of the given depth as a list of paths, breadth first (sized first: at most
    ``MAX_TREE_NODES - 1`` paths)."""
    k, depth = as_int(k, "k", minimum=1), as_int(depth, "depth", minimum=0)
    _check_size("full", k, depth)
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


DEFAULT_MAX_NODES = 16
# The most nodes of one step's tree, root included, for every shape: the target's logits of a step
# are nodes x V float32 (0.6 GB at V = 151,936) and the draft's as many again, beside a nodes^2
# attention mask. Checked by ``TreeShape.from_args`` from the sizes alone, before any tree is
# built, so generate, decode, demo, blocks and profile all get it from here.
MAX_TREE_NODES = 1024
# llama.cpp takes at most 255 new entries a batch (256 sequences, ``decoding.llamacpp``): the
# commands check a tree against it (``TreeShape.max_nodes() <= LLAMA_CPP_TREE_NODES``) when they
# run on that engine, also before any model loads.
LLAMA_CPP_TREE_NODES = 256
MAX_DYNAMIC_NODES = LLAMA_CPP_TREE_NODES  # dynamic trees run on both engines


def tree_nodes(mode: str, k: int, depth: int, cap: int = MAX_TREE_NODES) -> int:
    """Drafted nodes (root excluded) of the ``mode`` 'full' (K + K^2 + ... + K^L) or 'sequences'
    (K * L, an upper bound on the trie) tree, from the sizes alone: nothing is built, and the
    count stops above ``cap`` (the result is then ``cap + 1``), so huge K or L cost nothing."""
    if mode not in ("full", "sequences"):
        raise ValueError(f"mode: must be 'full' or 'sequences', got {mode!r}")
    k, depth = as_int(k, "k", minimum=1), as_int(depth, "depth", minimum=0)
    if mode == "sequences":
        return min(k * depth, cap + 1)
    total, level = 0, 1
    for _ in range(depth):
        level *= k
        total += level
        if total > cap:
            return cap + 1
    return total


def _check_size(mode: str, k: int, depth: int) -> None:
    """``ArgumentError`` naming ``k`` (when K alone is too many) or ``depth`` when the tree of
    these sizes has more than ``MAX_TREE_NODES - 1`` drafted nodes."""
    cap = MAX_TREE_NODES - 1
    if tree_nodes(mode, k, depth, cap) > cap:
        what = (f"{k:,} sequences of length {depth:,} have up to {k * depth:,}" if mode == "sequences" else
                f"a full {k:,}-ary tree of depth {depth:,} has more than {cap}")
        raise ArgumentError("k" if k > cap else "depth",
                            f": {what} drafted nodes a step (k = {k:,}, depth = {depth:,}); the limit is {cap} "
                            f"(about 2 x {MAX_TREE_NODES} x V floats of logits a step)")


def coverage(q: torch.Tensor, k_max: int, kind: str = "iid") -> torch.Tensor:
    """Coverage proxy ``c_k(q)`` for k = 1..k_max: ``[n, V] -> [n, k_max]`` (one batched op).

    iid / wor: ``sum_x q(x) (1 - (1 - q(x))^k)``, the chance that a draw from q lands among
    k iid drafts (a lower bound for wor); greedy: the mass of the k most likely tokens.
    Non-decreasing in k with non-increasing increments (concave), in [0, 1].
    """
    q = q.double()
    if kind == "greedy":
        kk = min(k_max, q.shape[-1])
        top = torch.topk(q, kk, dim=-1).values.cumsum(-1)
        if kk < k_max:
            top = torch.cat([top, top[:, -1:].expand(-1, k_max - kk)], dim=-1)
        return top
    # c_k = sum_x q(x) - sum_x q(x) (1 - q(x))^k: k_max passes over [n, V], no [n, V, k_max] temporary
    keep = (1 - q).clamp_min(0)  # [n, V]
    miss = q.clone()  # q (1 - q)^j, j = 0 .. k
    out = torch.empty(q.shape[0], k_max, dtype=q.dtype, device=q.device)
    total = q.sum(-1)
    for j in range(k_max):
        miss.mul_(keep)
        out[:, j] = total - miss.sum(-1)
    return out


def allocate(q: torch.Tensor, reach: torch.Tensor, k_max: int, budget: int, kind: str = "iid",
             min_gain: float = 0.0) -> torch.Tensor:
    """Drafts per frontier node, decided for a whole level at once: ``ks`` ``[n]`` (long).

    q      ``[n, V]`` draft distributions of the level's nodes (known before any of their
           drafts is drawn); reach ``[n]`` their reach scores r(v).
    The j-th draft at row v is worth ``reach[v] * (c_j - c_{j-1})`` (``coverage``); the
    ``budget`` largest positive values across the level are granted (increments are
    non-increasing, so granting the top values gives each row a prefix 1..k_v); a value below
    ``min_gain`` is never granted (a draft must be worth that many expected tokens). A row
    gets at most k_max drafts and never more than its number of nonzero tokens for the
    wor / greedy laws; the sum of ``ks`` is at most ``budget``.
    """
    n = q.shape[0]
    if n == 0 or budget <= 0 or k_max <= 0:
        return torch.zeros(n, dtype=torch.long)
    c = coverage(q, k_max, kind)  # [n, k_max]
    inc = torch.diff(c, dim=-1, prepend=torch.zeros_like(c[:, :1]))  # [n, k_max]
    gain = reach.double().to(c.device).view(n, 1) * inc
    if kind in ("wor", "greedy"):
        nnz = (q > 0).sum(-1, keepdim=True)  # [n, 1]
        j = torch.arange(1, k_max + 1, device=c.device).view(1, -1)
        gain = gain.masked_fill(j > nnz, 0.0)
    flat = gain.flatten()
    m = min(int(budget), flat.numel())
    vals, idx = torch.topk(flat, m)
    idx = idx[(vals > 0) & (vals >= min_gain)]
    ks = torch.bincount(idx // k_max, minlength=n)
    return ks.cpu().long()


@dataclass(frozen=True)
class TreeShape:
    """A tree shape: ``mode`` is 'paths' (``children`` map), 'sequences' (K, depth) or
    'dynamic' (at most ``k`` drafts per node, depth ``depth``, ``budget`` nodes root included)."""

    mode: str
    depth: int
    k: int  # the largest number of drafts at any node
    children: dict = field(default_factory=dict)  # paths mode: {path: n_children}
    budget: int = 0  # dynamic mode: node budget of a step's tree, root included
    min_gain: float = 0.0  # dynamic mode: least value reach * coverage increment a draft needs

    def __post_init__(self):
        """Every size checked by its ends before any tree is built, with the decoder's bounds
        (``MAX_TREE_NODES`` nodes a step, ``MAX_DYNAMIC_NODES`` for a dynamic tree): one
        ``ValueError`` naming the field."""
        if self.mode not in ("paths", "sequences", "dynamic"):
            raise ValueError(f"mode: must be 'paths', 'sequences' or 'dynamic', got {self.mode!r}")
        k = as_int(self.k, "k", minimum=1)
        depth = as_int(self.depth, "depth", minimum=0)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "depth", depth)
        if self.mode == "paths":
            if not isinstance(self.children, dict) or () not in self.children:
                raise ValueError("children: a 'paths' shape needs a dict {path: number of children} with the root () "
                                 "(TreeShape.from_args builds it from a list of paths)")
            if len(self.children) > MAX_TREE_NODES:
                raise ArgumentError("children", f": {len(self.children):,} nodes; the limit is {MAX_TREE_NODES} "
                                                "nodes a step, root included (trees.MAX_TREE_NODES)")
        elif self.mode == "sequences":
            _check_size("sequences", k, depth)
        else:
            if k > MAX_DYNAMIC_NODES - 1:  # the allocator's tables are [nodes, k]
                raise ArgumentError("k", f": {k:,} drafts per node; at most {MAX_DYNAMIC_NODES - 1} "
                                         "(a dynamic tree has at most that many drafted nodes)")
            budget = as_int(self.budget, "max_nodes", minimum=1)
            if budget > MAX_DYNAMIC_NODES:
                raise ArgumentError("max_nodes", f"must be <= {MAX_DYNAMIC_NODES}, got {budget}")
            object.__setattr__(self, "budget", budget)

    @classmethod
    def from_args(cls, tree, k: int, depth: int, max_nodes: int | None = None,
                  min_gain: float = 0.0) -> "TreeShape":
        if tree is None or isinstance(tree, str):  # the sizes are read: integers, checked by their ends
            k, depth = as_int(k, "k", minimum=1), as_int(depth, "depth", minimum=1)
        if tree is None:
            _check_size("full", k, depth)  # from the sizes: before full_tree builds anything
            return cls("paths", depth, k, parse_tree(full_tree(k, depth)))
        if isinstance(tree, str):
            if tree not in ("sequences", "dynamic"):
                raise ValueError(f"tree must be None, 'sequences', 'dynamic' or a list of paths, got {tree!r}")
            if tree == "dynamic":
                if max_nodes is None:
                    max_nodes = DEFAULT_MAX_NODES
                return cls("dynamic", depth, k, {}, max_nodes, float(min_gain))
            _check_size("sequences", k, depth)
            return cls("sequences", depth, k)
        if hasattr(tree, "__len__") and len(tree) > MAX_TREE_NODES - 1:
            raise ValueError(f"tree: {len(tree):,} paths; the limit is {MAX_TREE_NODES - 1} drafted nodes a step "
                             f"(trees.MAX_TREE_NODES, root included)")
        ch = parse_tree(tree)
        return cls("paths", max(len(p) for p in ch), max(ch.values()), ch)

    def max_nodes(self) -> int:
        """An upper bound on the node count of a step's tree, root included."""
        if self.mode == "sequences":
            return 1 + self.k * self.depth
        if self.mode == "dynamic":
            return self.budget
        return len(self.children)
