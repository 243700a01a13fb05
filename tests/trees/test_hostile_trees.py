"""Hostile inputs to the tree API (issue 41, items 2 and 3): every size is checked by its ends
before any work, with the decoder's one bound (``trees.MAX_TREE_NODES``), and every tree rule,
the token walk included, checks the tree it is given once (rows, drafts in range, parents),
unless the decoder marked it ``checked``; each refusal is one ``ValueError`` naming the argument
or the node. A guard turns a hang into a failure."""
from __future__ import annotations


import pytest
import torch

import multidraft as md
from multidraft import drafts, trees
from multidraft.trees import _check

from alarm import guard
from table_draft import TableDraft

CAP = trees.MAX_TREE_NODES - 1  # drafted nodes a step: the decoder's bound (decoding.settings via TreeShape.from_args)




def _refused(call, arg: str, exc=ValueError) -> str:
    """``call()`` raises ``exc`` at once, in one line naming ``arg`` first."""
    with guard(20):
        with pytest.raises(exc) as ei:
            call()
    msg = str(ei.value)
    assert "\n" not in msg, msg
    assert msg.startswith(arg), msg
    return msg


# --- item 2: sizes ---------------------------------------------------------------------------------
SIZES = [
    ("kary(1000, 3)", lambda: trees.kary(1000, 3), "depth"),
    ("kary(2, 30)", lambda: trees.kary(2, 30), "depth"),
    ("kary(10**6, 1)", lambda: trees.kary(10**6, 1), "k"),
    ("chain(10**9)", lambda: trees.chain(10**9), "depth"),
    ("sequences(10**5, 10**5)", lambda: trees.sequences(10**5, 10**5), "k"),
    ("sequences(2, 10**5)", lambda: trees.sequences(2, 10**5), "depth"),
    ("dynamic(10**6, 3, 16)", lambda: trees.dynamic(10**6, 3, 16), "k"),
    ("dynamic(2, 3, 10**9)", lambda: trees.dynamic(2, 3, 10**9), "max_nodes"),
    ("full_tree(1000, 3)", lambda: trees.full_tree(1000, 3), "depth"),
    ("TreeShape sequences", lambda: trees.TreeShape("sequences", 10**5, 10**5), "k"),
    ("TreeShape paths", lambda: trees.TreeShape("paths", 10**9, 10**9), "children"),
    ("TreeShape paths wide", lambda: trees.TreeShape("paths", 1, 5000, {(): 5000, **{(j,): 0 for j in range(5000)}}),
     "children"),
    ("TreeShape dynamic", lambda: trees.TreeShape("dynamic", 3, 2, {}, 10**9), "max_nodes"),
    ("TreeShape mode", lambda: trees.TreeShape("nosuch", 1, 1), "mode"),
    ("TableModel.random V", lambda: trees.TableModel.random(10**12, 0).p(), "V"),
    ("TableModel V", lambda: trees.TableModel(10**12, {}, {}), "V"),
    ("TableModel.random cols", lambda: trees.TableModel.random(3, 0, cols=10**9), "cols"),
    ("sequence_law n", lambda: trees.TableModel.random(3, 0).sequence_law((), 10**6), "n"),
    ("sequence_law 3^60", lambda: trees.TableModel.random(3, 0).sequence_law((), 60), "n"),
    ("optimal_tokens max_variables", lambda: trees.optimal_tokens(trees.chain(1), trees.TableModel.random(2, 0),
                                                                  max_variables=10**12), "max_variables"),
    ("iid(q, 10**9).sample", lambda: drafts.iid(torch.tensor([0.5, 0.5]), 10**9).sample(0), "k"),
    ("iid(q, 10**5).sample(num_samples=10**4)",
     lambda: drafts.iid(torch.tensor([0.5, 0.5]), 10**5).sample(0, num_samples=10**4), "num_samples"),
    ("optimal_acceptance(p, iid(q, 10**30))",
     lambda: md.optimal_acceptance(torch.tensor([0.5, 0.5], dtype=torch.float64),
                                   drafts.iid(torch.tensor([0.4, 0.6], dtype=torch.float64), 10**30)), "k"),
    ("make('iid', q, 10**30)", lambda: drafts.make("iid", torch.tensor([0.4, 0.6]), 10**30), "k"),
]


@pytest.mark.parametrize("call,arg", [(c, a) for _, c, a in SIZES], ids=[n for n, _, _ in SIZES])
def test_sizes_are_refused_by_their_ends_in_one_line(call, arg):
    _refused(call, arg)


def test_the_tree_laws_take_the_decoders_bound_and_no_more():
    """The laws accept trees of ``MAX_TREE_NODES - 1`` drafted nodes (the decoder's bound:
    ``TreeShape.from_args``, which ``decoding.Settings`` calls) and refuse one more."""
    with guard(20):
        assert trees.kary(CAP, 1).shape.max_nodes() == CAP + 1
        assert trees.chain(CAP).depth == CAP
        assert trees.sequences(CAP, 1).shape.max_nodes() == CAP + 1
        assert trees.dynamic(trees.MAX_DYNAMIC_NODES - 1, 2, trees.MAX_DYNAMIC_NODES).shape.budget == trees.MAX_DYNAMIC_NODES
    for law, arg in ((lambda: trees.kary(CAP + 1, 1), "k"), (lambda: trees.chain(CAP + 1), "depth"),
                     (lambda: trees.sequences(CAP + 1, 1), "k")):
        assert f"the limit is {CAP}" in _refused(law, arg)
    _refused(lambda: trees.TreeShape.from_args(None, CAP + 1, 1), "k")  # the decoder's own check
    _refused(lambda: trees.TreeShape.from_args("sequences", CAP + 1, 1), "k")


def test_the_ceiling_counts_a_dynamic_trees_drafts():
    """``lp_size`` of a dynamic law counts its node budget (it counted no drafts)."""
    trees_, per, n = trees.lp_size(trees.dynamic(2, 3, 8), 3)
    assert trees_ == 3**7 and per == 8 * 3 and n == trees_ * per


def test_sizes_at_the_bounds_still_work():
    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    with guard(20):
        assert drafts.iid(q, 1000).sample(0).shape == (1000,)
        assert 0 < md.optimal_acceptance(p, drafts.iid(q, 10**9)) <= 1
        m = trees.TableModel.random(1, 0)
        assert m.sequence_law((), trees.MAX_TREE_NODES).shape == (1,) * trees.MAX_TREE_NODES  # no deep recursion
        assert trees.TableModel.random(3, 0).sequence_law((), 3).sum().item() == pytest.approx(1.0, abs=1e-12)


# --- item 3: every tree rule checks the tree it is given ------------------------------------------
WALK = dict(verifier="specinfer", law="iid")


def _tree(law=None, seed: int = 1):
    m = trees.TableModel.random(V=3, seed=0, cols=2)
    return (law or trees.kary(2, 2)).sample(m, torch.Generator().manual_seed(seed))


def _nan_q():
    t = _tree()
    t.nodes[1].q = torch.tensor([float("nan"), 0.5, 0.5], dtype=torch.float64)
    return t


def _nan_p():
    t = _tree()
    t.nodes[0].p = torch.tensor([float("nan"), 0.5, 0.5], dtype=torch.float64)
    return t


def _retoken(token):
    t = _tree()
    nd = t.nodes[0]
    old = nd.drafts[0]
    c = nd.child.pop(old)
    nd.drafts = [token if d == old else d for d in nd.drafts]
    nd.child[token] = c
    t.nodes[c].token = token
    return t


def _bad_parent():
    t = _tree()
    t.nodes[t.nodes[0].child[t.nodes[0].drafts[0]]].parent = 5
    return t


BAD_TREES = [
    ("NaN q row", _nan_q, "tree: q row at node 1"),
    ("NaN p row", _nan_p, "tree: p row at node 0"),
    ("draft 7 at V = 3", lambda: _retoken(7), "tree: draft 7 at node 0"),
    ("draft -1", lambda: _retoken(-1), "tree: draft -1 at node 0"),
    ("a child's parent", _bad_parent, "tree: node 0's child"),
    ("None", lambda: None, "tree: must be a DraftTree"),
]


@pytest.mark.parametrize("make,want", [(m, w) for _, m, w in BAD_TREES], ids=[n for n, _, _ in BAD_TREES])
@pytest.mark.parametrize("method", ["verify", "output_distribution", "expected_tokens"])
def test_the_token_walk_refuses_a_bad_tree_naming_the_node(make, want, method):
    walk = trees.get("token_walk", **WALK)
    tree = make()
    args = (tree, torch.Generator().manual_seed(0)) if method == "verify" else (tree,)
    msg = _refused(lambda: getattr(walk, method)(*args), "tree")
    assert msg.startswith(want), msg


def test_a_sequence_rule_refuses_the_same_trees_alike():
    """The walk's check is the sequence rules' one (``_check.check_tree``): same trees, same lines."""
    walk, traversal = trees.get("token_walk", **WALK), trees.get("traversal")
    for _, make, want in BAD_TREES:
        a = _refused(lambda: walk.verify(make(), torch.Generator().manual_seed(0)), "tree")
        b = _refused(lambda: traversal.verify(make(), torch.Generator().manual_seed(0)), "tree")
        assert a == b


def test_the_walk_takes_every_law_it_verifies_and_a_tree_without_drafts():
    walk_ind = trees.get("token_walk", verifier="nss", law="independent")
    t = _tree(trees.kary(2, 2, "independent"))
    assert t.nodes[0].q.shape == (2, 3)
    walk_ind.verify(t, torch.Generator().manual_seed(0))
    assert abs(sum(walk_ind.output_distribution(t).values()) - 1) < 1e-12
    bad = _tree(trees.kary(2, 2, "independent"))
    bad.nodes[0].q = bad.nodes[0].q[:1]  # one row for two drafts
    _refused(lambda: walk_ind.verify(bad, 0), "tree: q rows at node 0")
    empty = trees.dynamic(2, 2, 5, "iid", min_gain=0.999).sample(trees.TableModel.random(3, 0), torch.Generator())
    assert not empty.nodes[0].drafts
    assert trees.get("token_walk", **WALK).verify(empty, torch.Generator().manual_seed(0)).path == ()


NONE_CALLS = [
    ("explicit(None)", lambda m, law, walk: trees.explicit(None), "paths", ValueError),
    ("TreeLaw(None)", lambda m, law, walk: trees.TreeLaw(None, "iid", "x"), "shape", ValueError),
    ("DraftTree(None)", lambda m, law, walk: trees.DraftTree(None, 0, 1), "shape", ValueError),
    ("certify_tree(walk, None, m)", lambda m, law, walk: trees.certify_tree(walk, None, m), "tree_law", ValueError),
    ("certify_tree(None, law, m)", lambda m, law, walk: trees.certify_tree(None, law, m), "rule", ValueError),
    ("certify_tree(walk, law, None)", lambda m, law, walk: trees.certify_tree(walk, law, None), "model", ValueError),
    ("law.sample(None)", lambda m, law, walk: law.sample(None, torch.Generator()), "model", ValueError),
    ("law.enumerate(None)", lambda m, law, walk: law.enumerate(None), "model", ValueError),
    ("optimal_tokens(None, m)", lambda m, law, walk: trees.optimal_tokens(None, m), "tree_law", ValueError),
    ("optimal_tokens(law, None)", lambda m, law, walk: trees.optimal_tokens(law, None), "model", ValueError),
    ("expected_tokens(None, m)", lambda m, law, walk: trees.expected_tokens(None, m), "tree_law", ValueError),
    ("expected_tokens(law, None)", lambda m, law, walk: trees.expected_tokens(law, None), "model", ValueError),
    ("TableModel(3, None, None)", lambda m, law, walk: trees.TableModel(3, None, None), "target", ValueError),
    ("full_tree(None, 2)", lambda m, law, walk: trees.full_tree(None, 2), "k", ValueError),
    ("tree_nodes(None, 2, 2)", lambda m, law, walk: trees.tree_nodes(None, 2, 2), "mode", ValueError),
]


@pytest.mark.parametrize("call,arg,exc", [(c, a, e) for _, c, a, e in NONE_CALLS], ids=[n for n, *_ in NONE_CALLS])
def test_the_tree_api_refuses_none_in_one_line(call, arg, exc):
    m = trees.TableModel.random(3, 0)
    _refused(lambda: call(m, trees.kary(2, 1), trees.get("token_walk", **WALK)), arg, exc)


def test_a_tree_marked_checked_is_not_checked_again():
    """``DraftTree.checked`` (set by the decoder on the tree it drafted) skips every per-node check."""
    t = _nan_q()
    t.checked = True
    _check.check_tree(t, ("iid",), "token_walk")  # not re-read: the builder vouches for it




def test_the_decoder_marks_its_tree_and_no_rule_rechecks_it(monkeypatch):
    """The decoder's hot path: ``DecoderStep.verify`` marks the tree it drafted, and the walk then
    reads no row for its input check (a tree from elsewhere is checked)."""
    engine = pytest.importorskip("multidraft.decoding.engine")

    calls = []
    for name in ("as_probs", "as_probs64"):  # the batched row check and the per-row one
        real = getattr(_check, name)
        monkeypatch.setattr(_check, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    m = trees.TableModel.random(3, 0)
    s = engine.Settings.from_args(verifier="specinfer", k=2, depth=2)
    step = engine.DecoderStep(None, TableDraft(m), s, torch.Generator().manual_seed(0))
    tree = step.serve(step.draft(0, 2))
    logits = torch.stack([m.p(tree.prefix(i)).log() for i in range(len(tree))])  # [N, V]
    step.verify(tree, logits)
    assert tree.checked and calls == []
    other = _tree()
    step.verify(other, torch.zeros(len(other), 3))
    assert not other.checked and calls  # not this step's tree: checked as any caller's
