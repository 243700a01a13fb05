"""Every rule's exact expected tokens per call on one instance, next to the tree-level ceiling.

The rules compared are found in the registry (``rules.names``), so a rule registered later
joins every comparison without a change here:

* every registered rule except ``EXCLUDED`` ('token_walk' needs a verifier, it appears as the
  walks below; 'tree_lp' is the ceiling itself), built with no options (``rules.get(name)``),
  that ``supports`` the tree law — the *sequence-level rules*;
* the token-level walk of each verifier in ``WALKS``, named ``walk:<verifier>``, where it
  supports the law;
* ``ceiling`` (``ceiling.optimal_tokens``'s value) with ``ceiling_upper`` (its dual certificate);
* on request only (``rules=[...]``), the *variants* of ``VARIANTS``: a registered rule built with
  options, under a name of its own (``univer_ot``: ``get('univer', plan='ot')``, small V only).

``rule_names(tree_law)`` lists the rules in that order, ``certified(name, tree_law, model)``
gives one rule's ``certify_tree`` certificate (``ValueError`` when its error is past ``tol``:
a rule that is not lossless has no place in a comparison), and
``expected_tokens(tree_law, model)`` returns ``{name: E|Y|}`` for all of them and the
ceiling. Nothing is printed.
"""
from __future__ import annotations

from .ceiling import TreeLP, optimal_tokens
from .certify import TreeCertificate, certify_tree
from .laws import as_tree_law
from .rules import TreeRule, get, names
from .tables import as_sequence_model
from .walk import TokenWalk

__all__ = ["EXCLUDED", "VARIANTS", "WALKS", "build_rule", "certified", "expected_tokens", "rule_names", "sequence_rules"]

WALKS = ("specinfer", "spectr", "khisti_is", "optimal")
EXCLUDED = (TokenWalk.name, TreeLP.name)  # the walk needs a verifier (WALKS); the LP is the ceiling itself
WALK_PREFIX = "walk:"
VARIANTS = {"univer_ot": ("univer", {"plan": "ot"})}  # name -> (registered rule, options); compared when asked


def sequence_rules() -> list[str]:
    """Registered rule names compared as sequence-level rules (registration order)."""
    return [n for n in names() if n not in EXCLUDED]


def build_rule(name: str, tree_law) -> TreeRule:
    """The rule called ``name`` in a comparison: ``walk:<verifier>`` is ``TokenWalk(verifier,
    tree_law.kind)``, a name of ``VARIANTS`` its rule built with its options, any other name the
    registered rule built with no options."""
    if not isinstance(name, str):
        raise ValueError(f"name must be a rule name (a string), got {name!r}")
    if name.startswith(WALK_PREFIX):
        return TokenWalk(name[len(WALK_PREFIX):], tree_law.kind)
    if name in VARIANTS:
        base, options = VARIANTS[name]
        return get(base, **options)
    if name in EXCLUDED or name not in names():
        raise ValueError(f"name: {name!r} is not compared; choose 'walk:<verifier>' or one of "
                         f"{', '.join(sequence_rules() + list(VARIANTS))}")
    return get(name)


def rule_names(tree_law, walks=WALKS, rules=None) -> list[str]:
    """The rules compared on ``tree_law``: ``walk:<v>`` for each supporting verifier of ``walks``,
    then each rule of ``rules`` (default: every ``sequence_rules()``; names of ``VARIANTS`` are
    taken too) that supports the law."""
    as_tree_law(tree_law)
    if rules is None:
        rules = sequence_rules()
    else:
        known = sequence_rules() + list(VARIANTS)
        for r in rules:
            if r not in known:
                raise ValueError(f"rules: unknown sequence-level rule {r!r}; choose from {', '.join(known)}")
    out = []
    for v in walks:
        if TokenWalk(v, tree_law.kind).supports(tree_law):
            out.append(WALK_PREFIX + v)
    for r in rules:
        if build_rule(r, tree_law).supports(tree_law):
            out.append(r)
    return out


def certified(name: str, tree_law, model, tol: float = 1e-12) -> TreeCertificate:
    """``certify_tree`` of the rule ``name`` (see ``build_rule``); ``ValueError`` when it is not
    lossless to ``tol``."""
    cert = certify_tree(build_rule(name, tree_law), tree_law, model)
    if not cert.max_abs_error <= tol:
        raise ValueError(f"rules: {name} is not lossless on {tree_law.name} (error {cert.max_abs_error:.3g} > {tol:g})")
    return cert


def expected_tokens(tree_law, model, walks=WALKS, rules=None, tol: float = 1e-12, ceiling: bool = True) -> dict:
    """``{name: expected tokens per call}`` on (``tree_law``, ``model``) for ``rule_names(tree_law,
    walks, rules)``, plus ``ceiling`` and ``ceiling_upper`` unless ``ceiling=False``; see the
    module notes."""
    as_tree_law(tree_law)
    as_sequence_model(model)
    out: dict = {}
    for name in rule_names(tree_law, walks, rules):
        out[name] = certified(name, tree_law, model, tol).expected_tokens
    if ceiling:
        sol = optimal_tokens(tree_law, model)
        out["ceiling"] = sol.value
        out["ceiling_upper"] = sol.upper_bound
    return out
