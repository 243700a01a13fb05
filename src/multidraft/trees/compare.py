"""Every rule's exact expected tokens per call on one instance, next to the tree-level ceiling.

``expected_tokens(tree_law, model)`` returns ``{name: E|Y|}`` for the token-level walks of
``WALKS`` (named ``walk:<verifier>``), the sequence-level rules of ``RULES`` that support the
law, and ``ceiling`` (``ceiling.optimal_tokens``'s value) with ``ceiling_upper`` (its dual
certificate). Each rule's value is its exact ``certify_tree`` expectation, and its
certificate's error is checked (``ValueError`` past ``tol``: a rule that is not lossless
has no place in a comparison). Nothing is printed.
"""
from __future__ import annotations

from .block import BlockVerification
from .ceiling import optimal_tokens
from .certify import certify_tree
from .traversal import TraversalVerification
from .walk import TokenWalk

__all__ = ["RULES", "WALKS", "expected_tokens"]

WALKS = ("specinfer", "spectr", "khisti_is", "optimal")
RULES = ("block", "traversal")


def expected_tokens(tree_law, model, walks=WALKS, rules=RULES, tol: float = 1e-12) -> dict:
    """``{name: expected tokens per call}`` on (``tree_law``, ``model``); see the module notes."""
    out: dict = {}
    todo = []
    for v in walks:
        rule = TokenWalk(v, tree_law.kind)
        if rule.supports(tree_law):
            todo.append((f"walk:{v}", rule))
    makers = {"block": BlockVerification, "traversal": TraversalVerification}
    for r in rules:
        if r not in makers:
            raise ValueError(f"rules: unknown sequence-level rule {r!r}; choose from {', '.join(makers)}")
        rule = makers[r]()
        if rule.supports(tree_law):
            todo.append((r, rule))
    for name, rule in todo:
        cert = certify_tree(rule, tree_law, model)
        if cert.max_abs_error > tol:
            raise ValueError(f"rules: {name} is not lossless on {tree_law.name} (error {cert.max_abs_error:.3g})")
        out[name] = cert.expected_tokens
    sol = optimal_tokens(tree_law, model)
    out["ceiling"] = sol.value
    out["ceiling_upper"] = sol.upper_bound
    return out
