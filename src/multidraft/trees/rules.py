"""One interface for verifying a whole draft tree, and the registry of tree rules by name.

A tree rule reads a filled ``DraftTree`` (every node's drafts, q row and, after the target
pass, p row) and emits ``Y = (y_1 .. y_tau, y_(tau+1))``: the tokens of an accepted path of
the tree plus one more token (recovered or bonus). It is *lossless* for a tree draft law when
Y followed by target samples up to length L + 1 has exactly the target's sequence law
``p(s) = prod_i p(s_i | s_<i)`` on ``V^(L+1)`` (``certify.certify_tree`` checks this by
enumeration at small V).

    rule.verify(tree, generator) -> TreeVerdict(path, token)
    rule.output_distribution(tree) -> {Y: probability}   # exact law of Y given this tree
    rule.supports(tree_law) -> bool
    rule.expected_tokens(tree) -> float                   # exact E|Y| given this tree
    rule.node_records(tree, verdict) -> [(k, slot, depth)] # per-node records (node-wise rules)
    rule.lazy_rows, rule.node_wise                        # how the rule reads rows, decides


``path`` is the accepted node ids from the root's first child down (``DraftTree.path_to`` of
the last accepted node; empty when nothing was accepted) and ``token`` the token emitted
after it. Rules are registered by name (``register``) and built with options (``get``):
the token-level walk is ``get("token_walk", verifier="specinfer", law="iid")``.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from .tree import DraftTree

__all__ = ["TreeVerdict", "TreeRule", "register", "get", "names", "has_fast_expected_tokens"]


class TreeVerdict(NamedTuple):
    path: tuple       # accepted node ids, root's child first; () when no draft was kept
    token: int        # the token emitted after the accepted path (recovered or bonus)

    def tokens(self, tree: DraftTree) -> tuple[int, ...]:
        """The emitted sequence Y: the accepted path's tokens and the final token."""
        return tuple(tree.nodes[i].token for i in self.path) + (int(self.token),)


class TreeRule:
    """Base class of tree rules: subclasses set ``name`` and implement the three methods.

    Two capabilities tell a caller (the decoder's step) how to hand the rule a tree:

    ``lazy_rows``  True: ``verify`` reads ``tree.p(i)`` only at the nodes it visits, one at a time,
                   in the device and dtype the rows come in (the token walk: the decoder processes
                   a row on the model's device when the walk asks for it). False (the default):
                   the rule reads every node's row, as float64 on the CPU, and draws from the CPU
                   generator (the sequence-level rules); the decoder hands it CPU rows.
    ``node_wise``  True: the rule decides node after node from the root, each visited node by its
                   own token-level verifier, so ``node_records`` are per-node acceptance
                   statistics (``decoding.treeopt.AcceptStats.from_records``). False (the
                   default): the rule decides whole paths; a node's outcome is no statistic of its
                   own, ``node_records`` is empty and the step's record is its accepted length.
    """

    name: str = ""
    # why the rule runs at small V only (None: it runs at a model's vocabulary); the decoder takes
    # the rules without one (``decoding.settings.decoder_rules``)
    small_v_only: str | None = None
    lazy_rows: bool = False
    node_wise: bool = False

    def supports(self, tree_law) -> bool:  # pragma: no cover - interface
        """Whether the rule is lossless for trees drawn by ``tree_law`` (a ``laws.TreeLaw``)."""
        raise NotImplementedError

    def verify(self, tree: DraftTree, generator) -> TreeVerdict:  # pragma: no cover - interface
        """Sample the accepted path and the next token, reading ``generator`` in order."""
        raise NotImplementedError

    def output_distribution(self, tree: DraftTree) -> dict:  # pragma: no cover - interface
        """Exact law of the emitted sequence Y given this tree: ``{tuple of tokens: float}``."""
        raise NotImplementedError

    def expected_tokens(self, tree: DraftTree) -> float:
        """Exact expected length E|Y| of the emitted sequence given this filled tree (accepted
        drafts plus the one final token): the tokens per target call on this tree.

        The default sums over ``output_distribution`` (small V only: it lists every Y); rules
        override it with a form that costs O(nodes x V) at V = 151,936 where they can
        (``has_fast_expected_tokens`` tells which)."""
        return float(sum(len(Y) * w for Y, w in self.output_distribution(tree).items()))

    def node_records(self, tree: DraftTree, verdict: TreeVerdict) -> list[tuple]:
        """``(k, slot, depth)`` of every node a node-wise rule verified (``node_wise``); empty for a
        rule that decides whole paths (the default: its per-step record is the accepted length)."""
        return []

    def __repr__(self) -> str:
        return f"<tree rule {self.name!r}>"


def has_fast_expected_tokens(rule: TreeRule) -> bool:
    """Whether ``rule.expected_tokens`` is a closed form (not the base class's enumeration)."""
    return type(rule).expected_tokens is not TreeRule.expected_tokens


_REGISTRY: dict[str, Callable[..., TreeRule]] = {}


def register(name: str, factory: Callable[..., TreeRule]) -> None:
    """Register a tree rule factory under ``name`` (``get(name, **options)`` calls it)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"tree rule {name!r} is already registered")
    _REGISTRY[name] = factory


def names() -> list[str]:
    """Registered tree rule names, in registration order."""
    return list(_REGISTRY)


def small_v_only(name: str) -> str | None:
    """Why the registered rule ``name`` runs at small V only (its class's ``small_v_only``), or None."""
    return getattr(_REGISTRY[name], "small_v_only", None)


def get(name, **options) -> TreeRule:
    """The tree rule ``name`` built with ``options`` (e.g. ``verifier=``, ``law=`` for 'token_walk');
    a ``TreeRule`` is returned as is."""
    if isinstance(name, TreeRule):
        return name
    if name not in _REGISTRY:
        raise ValueError(f"tree rule: unknown name {name!r}; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY[name](**options)
