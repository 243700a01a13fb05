"""``TreeRule.expected_tokens``: the closed forms of the token walk, block and traversal equal the
base class's enumeration (``sum |Y| P(Y | tree)``) to 1e-12, tree by tree, on small-V trees of
every tree law (chain, K sequences, K-ary with every node law, explicit, dynamic, independent).
"""
from __future__ import annotations

import pytest
import torch

from multidraft import trees, verifiers
from multidraft.trees import TreeRule

TOL = 1e-12


def _laws():
    return [
        trees.chain(3), trees.chain(2, "wor"),
        trees.sequences(2, 2), trees.sequences(3, 2), trees.sequences(2, 2, "independent"),
        trees.kary(2, 2, "iid"), trees.kary(2, 2, "wor"), trees.kary(3, 1, "greedy"),
        trees.kary(2, 2, "independent"),
        trees.explicit([[0], [1], [0, 0]], "iid"),
        trees.dynamic(2, 2, 5, "iid"), trees.dynamic(2, 2, 5, "wor"),
    ]


def _rules(law):
    out = []
    for v in verifiers.names():
        if v == "lp_optimal":
            continue  # the LP reference: slow, and checked by its own tests
        w = trees.TokenWalk(v, law.kind) if law.kind in verifiers.get(v).laws else None
        if w is not None and w.supports(law):
            out.append(w)
    for name in ("block", "traversal"):
        r = trees.get(name)
        if r.supports(law):
            out.append(r)
    return out


def _default(rule, tree) -> float:
    return TreeRule.expected_tokens(rule, tree)


@pytest.mark.parametrize("style", ["random", "peaked", "q_zero", "one_hot", "same", "mixed"])
def test_fast_forms_equal_the_enumeration_tree_by_tree(style, one_thread):
    g = torch.Generator().manual_seed(7)
    checked = set()
    for law in _laws():
        cols = law.cols if law.kind == "independent" else 1
        model = trees.TableModel.random(3, seed=len(checked), style=style, cols=cols)
        rules = _rules(law)
        assert rules, law
        for _ in range(4):
            tree = law.sample(model, g)
            for rule in rules:
                assert trees.has_fast_expected_tokens(rule), rule
                fast, slow = rule.expected_tokens(tree), _default(rule, tree)
                assert abs(fast - slow) <= TOL, (law, style, rule, fast, slow)
                checked.add((law.name, repr(rule)))
    assert any("block" in r for _, r in checked) and any("traversal" in r for _, r in checked)


def test_mean_of_the_fast_form_is_the_certificate_value(one_thread):
    """Averaged over every tree of the law, the fast form gives ``certify_tree``'s E|Y|."""
    model = trees.TableModel.random(3, seed=2)
    for law in (trees.sequences(2, 2), trees.kary(2, 2), trees.chain(3)):
        for rule in _rules(law):
            mean = sum(w * rule.expected_tokens(t) for t, w in law.enumerate(model))
            cert = trees.certify_tree(rule, law, model)
            assert abs(mean - cert.expected_tokens) <= 1e-12, (law, rule)


def test_fast_form_at_full_vocabulary_is_quick():
    """V = 151,936: one K = 2, L = 2 trie of every walk and traversal by the fast form (a
    closed form over the trie's nodes; no enumeration of Y: the default would list ~V^2 sequences).
    Checked by which form runs, not in seconds."""
    V = 151_936
    g = torch.Generator().manual_seed(0)

    class Rows:
        V = 151_936

        def __init__(self):
            self.cache = {}

        def _row(self, key, temp):
            if key not in self.cache:
                x = torch.randn(V, generator=g, dtype=torch.float64) * temp
                self.cache[key] = torch.softmax(x, -1)
            return self.cache[key]

        def p(self, prefix):
            return self._row(("p",) + tuple(prefix), 3.0)

        def q(self, prefix, col=0):
            return self._row(("q",) + tuple(prefix), 3.0)

    model = Rows()
    law = trees.sequences(2, 2)
    tree = law.sample(model, g)
    for rule in [trees.TokenWalk(v, "iid") for v in ("specinfer", "spectr", "khisti_is")] + [trees.get("traversal")]:
        assert trees.has_fast_expected_tokens(rule), rule  # the closed form, not the base class's enumeration
        e = rule.expected_tokens(tree)
        assert 1.0 <= e <= 3.0
