"""trees.rule_table is driven by the rule registry: a rule registered later joins every comparison,
a rule that is not lossless is refused, token_walk and tree_lp are not compared as rules."""
from __future__ import annotations

import pytest

from multidraft import trees
from multidraft.trees import rule_table, rules
from multidraft.trees.traversal import TraversalVerification


class _Copy(TraversalVerification):
    name = "copy_of_traversal"


class _AlwaysZero(trees.TreeRule):
    """Emits token 0 and accepts nothing: not lossless unless p puts all mass on 0."""

    name = "always_zero"

    def supports(self, tree_law):
        return tree_law.shape.mode == "sequences"

    def verify(self, tree, generator):
        return trees.TreeVerdict((), 0)

    def output_distribution(self, tree):
        return {(0,): 1.0}


def test_every_registered_rule_but_the_walk_and_the_lp():
    got = rule_table.sequence_rules()
    assert "token_walk" not in got and "tree_lp" not in got
    assert {"block", "traversal"} <= set(got)
    assert set(got) == set(trees.names()) - {"token_walk", "tree_lp"}


def test_a_rule_registered_later_is_compared(monkeypatch):
    monkeypatch.setitem(rules._REGISTRY, "copy_of_traversal", _Copy)
    law, model = trees.sequences(2, 2), trees.TableModel.random(2, seed=3)
    names = rule_table.rule_names(law)
    assert names[:4] == ["walk:specinfer", "walk:spectr", "walk:khisti_is", "walk:optimal"]
    assert "copy_of_traversal" in names and "block" not in names  # block: one chain only
    got = rule_table.expected_tokens(law, model)
    assert got["copy_of_traversal"] == got["traversal"]
    assert got["ceiling"] <= got["ceiling_upper"] + 1e-12
    assert all(v <= got["ceiling_upper"] + 1e-12 for v in got.values())
    only = rule_table.expected_tokens(law, model, rules=["copy_of_traversal"], walks=(), ceiling=False)
    assert only == {"copy_of_traversal": got["traversal"]}


def test_a_lossy_rule_is_refused(monkeypatch):
    monkeypatch.setitem(rules._REGISTRY, "always_zero", _AlwaysZero)
    law, model = trees.sequences(2, 2), trees.TableModel.random(3, seed=1)
    with pytest.raises(ValueError, match="always_zero is not lossless"):
        rule_table.expected_tokens(law, model)
    # a chain is not among the laws it supports: not compared there, nothing raised
    assert "always_zero" not in rule_table.expected_tokens(trees.chain(2), model)


def test_bad_names():
    law = trees.chain(2)
    with pytest.raises(ValueError, match="rules: unknown sequence-level rule 'nope'"):
        rule_table.rule_names(law, rules=["nope"])
    with pytest.raises(ValueError, match="rules: unknown sequence-level rule 'tree_lp'"):
        rule_table.rule_names(law, rules=["tree_lp"])
    with pytest.raises(ValueError, match="name: 'token_walk' is not compared"):
        rule_table.build_rule("token_walk", law)
    assert isinstance(rule_table.build_rule("walk:spectr", law), trees.TokenWalk)
