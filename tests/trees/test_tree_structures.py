"""trees/: the draft tree, the sequence model, tree draft laws and the rule registry."""
from __future__ import annotations

import pytest
import torch

import multidraft as md
from multidraft import trees


def test_public_names_and_decoding_reexports():
    from multidraft.decoding import TreeShape, full_tree, parse_tree

    assert TreeShape is trees.TreeShape and full_tree is trees.full_tree and parse_tree is trees.parse_tree
    assert md.trees is trees
    assert "token_walk" in trees.names()


def test_draft_tree_p_rows_on_demand_and_copy():
    shape = trees.TreeShape.from_args([[0], [1], [0, 0]], 2, 2)
    tree = trees.DraftTree(shape, 5, 2, 1, "iid")
    tree.add_drafts(0, [3, 4])
    other = tree.copy()
    other.add_drafts(1, [2])
    assert len(other) == 4 and len(tree) == 3 and tree.nodes[1].drafts == []
    assert tree.ancestors().shape == (3, 3) and bool(other.ancestors()[3, 1]) and not bool(other.ancestors()[3, 2])
    assert other.prefix(3) == (3, 2) and other.path_to(3) == [1, 3]
    with pytest.raises(ValueError, match="no target distribution"):
        tree.p(0)
    calls = []

    def rows(i):
        calls.append(i)
        return torch.full((6,), 1 / 6)

    tree.set_target(rows)
    tree.p(1)
    tree.p(1)
    assert calls == [1]  # computed once, only where read


def test_table_model_styles_and_tables():
    for style in trees.STYLES:
        m = trees.TableModel.random(4, seed=3, style=style)
        for prefix in [(), (1,), (2, 0)]:
            p, q = m.p(prefix), m.q(prefix)
            assert p.dtype == torch.float64 and abs(float(p.sum()) - 1) < 1e-12 and abs(float(q.sum()) - 1) < 1e-12
            assert m.p(prefix) is p  # cached: one tensor per prefix
            again = trees.TableModel.random(4, seed=3, style=style)
            assert torch.equal(again.p(prefix), p) and torch.equal(again.q(prefix), q)
            if style == "same":
                assert torch.equal(p, q)
            if style == "one_hot":
                assert int((p > 0).sum()) == 1
            if style == "q_zero":
                assert bool(((q == 0) & (p > 0)).any()) and bool((q > 0).any())
    law = trees.TableModel.random(3, seed=0).sequence_law((), 3)
    assert law.shape == (3, 3, 3) and abs(float(law.sum()) - 1) < 1e-12
    m = trees.TableModel(2, {(): [0.5, 0.5]}, lambda s: torch.tensor([0.25, 0.75]))
    assert m.q((1, 1))[1] == 0.75
    with pytest.raises(ValueError, match="no row for prefix"):
        m.p((0,))
    with pytest.raises(ValueError, match="style"):
        trees.TableModel.random(3, 0, "spiky")


def test_tree_laws_fill_every_node_and_cap_drafts_by_support():
    m = trees.TableModel(3, lambda s: torch.tensor([0.2, 0.3, 0.5]), lambda s: torch.tensor([0.0, 0.4, 0.6]))
    tree = trees.kary(3, 2, "wor").sample(m, torch.Generator().manual_seed(0))
    assert all(nd.p is not None for nd in tree.nodes)
    inner = [nd for nd in tree.nodes if nd.drafts]
    assert inner and all(len(nd.drafts) == 2 and nd.q is not None for nd in inner)  # 3 asked, 2 nonzero tokens
    listed = trees.sequences(2, 2).enumerate(m)
    assert abs(sum(w for _, w in listed) - 1) < 1e-12
    with pytest.raises(ValueError, match="more than"):
        trees.kary(2, 2).enumerate(trees.TableModel.random(4, 0), limit=10)
    with pytest.raises(ValueError, match="kind"):
        trees.dynamic(2, 2, 5, "independent")  # kary and sequences take it now (test_dynamic_law.py)
    assert trees.sequences(3, 2).node_ks() == {3} and trees.explicit([[0], [1], [0, 0]]).node_ks() == {1, 2}


def test_token_walk_supports_fallbacks_and_errors():
    walk = trees.get("token_walk", verifier="spechub", law="greedy")
    assert walk.supports(trees.explicit([[0], [1], [0, 0]], "greedy"))  # k = 1 nodes use naive
    assert not walk.supports(trees.kary(3, 1, "greedy"))  # spechub takes K = 2 only
    assert not walk.supports(trees.kary(2, 1, "iid"))
    assert walk.verifier_for(1).name == "naive" and walk.verifier_for(3).name == "nss"
    assert walk.verifier_for(2).name == "spechub"
    m = trees.TableModel.random(3, seed=2)
    tree = trees.kary(2, 2, "iid").sample(m, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="law"):
        walk.verify(tree, 0)
    with pytest.raises(ValueError, match="unknown name"):
        trees.get("no_such_rule")
    with pytest.raises(ValueError, match="already registered"):
        trees.register("token_walk", trees.TokenWalk)


def test_verdict_tokens_and_node_records():
    m = trees.TableModel.random(3, seed=5, style="same")  # p == q: specinfer accepts every draft
    tree = trees.kary(2, 2, "iid").sample(m, torch.Generator().manual_seed(0))
    walk = trees.TokenWalk("specinfer", "iid")
    verdict = walk.verify(tree, torch.Generator().manual_seed(0))
    assert len(verdict.path) == 2  # accepted down to a leaf, then a bonus token
    y = verdict.tokens(tree)
    assert len(y) == 3 and y[:2] == tree.prefix(verdict.path[-1])
    recs = walk.node_records(tree, verdict)
    assert [r[2] for r in recs] == [0, 1] and all(r[1] is not None for r in recs)
    assert abs(sum(walk.output_distribution(tree).values()) - 1) < 1e-12
