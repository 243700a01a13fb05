"""Path certificates: a tree rule's emitted sequence against the target's sequence law.

``certify_tree(rule, tree_law, model)`` enumerates every draft tree T of ``tree_law`` with its
probability P(T), takes the rule's exact law of the emitted sequence Y given T, continues each
Y by target samples up to length L + 1, and compares the mixture with the target's law
``p(s) = prod_i p(s_i | s_<i)`` on ``V^(L+1)`` (the validity notion of block verification).
It returns the largest absolute error over the ``V^(L+1)`` sequences and the expected number
of tokens per call, ``E|Y| = sum_T P(T) sum_Y P(Y | T) |Y|`` (block efficiency).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .laws import as_tree_law
from .rules import TreeRule
from .tables import as_sequence_model

__all__ = ["TreeCertificate", "certify_tree", "emitted_law"]


class TreeCertificate(NamedTuple):
    max_abs_error: float     # max over s in V^(L+1) of |P(Y + continuation = s) - p(s)|
    expected_tokens: float   # E|Y|: tokens per target call
    trees: int               # draft trees enumerated


def _check_args(rule, tree_law, model) -> None:
    if not isinstance(rule, TreeRule):
        raise ValueError(f"rule: must be a tree rule (trees.get(name)), got {type(rule).__name__}")
    as_tree_law(tree_law)
    as_sequence_model(model)


def emitted_law(rule, tree_law, model) -> tuple[dict, int]:
    """The exact law of Y over all trees: ``({Y: probability}, number of trees)``."""
    _check_args(rule, tree_law, model)
    law: dict[tuple, float] = {}
    trees = tree_law.enumerate(model)
    for tree, w in trees:
        for y, py in rule.output_distribution(tree).items():
            law[y] = law.get(y, 0.0) + w * py
    return law, len(trees)


def certify_tree(rule, tree_law, model) -> TreeCertificate:
    """Exact certificate of ``rule`` (a ``rules.TreeRule``) on ``tree_law`` (a ``laws.TreeLaw``)
    with the sequence model ``model`` (``tables.TableModel``); small V, K and L only."""
    _check_args(rule, tree_law, model)
    if not rule.supports(tree_law):
        why = rule.refusal(tree_law) if hasattr(rule, "refusal") else None
        raise ValueError(f"rule: {rule!r} is not lossless for {tree_law!r}" + (f" ({why})" if why else ""))
    n = tree_law.depth + 1
    V = model.V
    want = model.sequence_law((), n)  # first: it refuses a law too large to hold before any tree is enumerated
    law, count = emitted_law(rule, tree_law, model)
    got = torch.zeros((V,) * n, dtype=torch.float64)
    mean = 0.0
    for y, py in law.items():
        if not 1 <= len(y) <= n:
            raise ValueError(f"rule: emitted {len(y)} tokens {list(y)}; a tree of depth {n - 1} allows 1..{n}")
        got[y] += py * model.sequence_law(y, n - len(y))
        mean += py * len(y)
    err = float((got - want).abs().max())
    return TreeCertificate(err, mean, count)
