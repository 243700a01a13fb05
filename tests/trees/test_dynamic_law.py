"""The dynamic tree law (``trees.dynamic``) and the independent law on trees: exact enumeration,
certificates of the token walk for every verifier that supports the law, and agreement with
the decoder's allocation (``shapes.allocate`` level by level; the decoder's own ``_draft_tree``
on a table model)."""
from __future__ import annotations

import pytest
import torch

import multidraft as md
from multidraft import trees

from table_draft import TableDraft

torch.set_num_threads(1)
TOL = 1e-12
KINDS = ("iid", "wor", "greedy")


def _walks(kind: str, law):
    """Every registered verifier whose walk is lossless for ``law`` at every node k it may get."""
    out = []
    for name in md.verifiers.names():
        v = md.verifiers.get(name)
        if kind in v.laws:
            rule = trees.TokenWalk(v, kind)
            if rule.supports(law):
                out.append(rule)
    return out


def _certify_all(law, model, kind):
    rules = _walks(kind, law)
    assert rules, f"no verifier supports {law!r}"
    for rule in rules:
        cert = trees.certify_tree(rule, law, model)
        assert cert.max_abs_error < TOL, (rule, law, model.style, model.seed, cert)
        assert 1.0 <= cert.expected_tokens <= law.depth + 1 + 1e-12
    return rules


# --- the dynamic law: shape of its trees --------------------------------------------------------
def _replay(tree, model, law):
    """Rebuild the decoder's allocation from the model's q rows and the tree's tokens alone:
    at each level ``allocate`` over the frontier (reach = product of q along the path, room =
    budget - nodes so far), the next frontier the new nodes under the depth cap of largest reach.
    Asserts every node's k and number of drafts; returns the ks in level order."""
    shape = law.shape
    level, count, seen = [0], 1, []

    def reach(i):
        r, prefix = 1.0, ()
        for j in tree.path_to(i):
            r *= float(model.q(prefix)[tree.nodes[j].token])
            prefix = prefix + (tree.nodes[j].token,)
        return r

    framed = set()
    while level:
        q = torch.stack([model.q(tree.prefix(i)) for i in level])  # [n, V]
        r = torch.tensor([reach(i) for i in level], dtype=torch.float64)
        ks = trees.allocate(q, r, shape.k, shape.budget - count, law.kind, shape.min_gain).tolist()
        new = []
        for i, k in zip(level, ks):
            framed.add(i)
            nd = tree.nodes[i]
            assert nd.k == k and len(nd.drafts) == k, (i, nd.k, nd.drafts, k)
            assert sorted(nd.child) == sorted(set(nd.drafts))
            new.extend(nd.child.values())
            seen.append(k)
        count += len(new)
        room = shape.budget - count
        cand = sorted((i for i in sorted(new) if tree.nodes[i].depth < shape.depth), key=lambda i: -reach(i))
        level = sorted(cand[:max(0, room)])
    assert count == len(tree.nodes) <= shape.budget
    for i, nd in enumerate(tree.nodes):
        if i not in framed:
            assert nd.k == 0 and not nd.drafts
        assert nd.depth <= shape.depth
        assert torch.equal(nd.p, model.p(tree.prefix(i)))
    return seen


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("style", ["random", "peaked", "q_zero", "mixed"])
def test_sampled_dynamic_trees_allocate_as_the_decoder(kind, style):
    law = trees.dynamic(3, 3, 7, kind)
    ks = set()
    for seed in range(6):
        m = trees.TableModel.random(4, seed, style)
        g = torch.Generator().manual_seed(seed)
        for _ in range(3):
            ks.update(_replay(law.sample(m, g), m, law))
    assert len(ks) >= 2  # the allocation really varies k


@pytest.mark.parametrize("kind", KINDS)
def test_enumerated_dynamic_trees_are_the_decoders_and_sum_to_one(kind):
    law = trees.dynamic(2, 2, 5, kind, min_gain=0.05)
    for seed in range(3):
        m = trees.TableModel.random(3, seed, "mixed")
        listed = law.enumerate(m)
        assert abs(sum(w for _, w in listed) - 1) < 1e-12
        keys = set()
        for tree, w in listed:
            assert w > 0
            _replay(tree, m, law)
            keys.add(tuple((nd.token, nd.parent, tuple(nd.drafts)) for nd in tree.nodes))
        assert len(keys) == len(listed)  # distinct trees


def test_sampling_frequencies_match_enumeration():
    law = trees.dynamic(2, 2, 4, "iid")
    m = trees.TableModel.random(3, 5, "random")
    key = lambda t: tuple((nd.token, nd.parent, tuple(nd.drafts)) for nd in t.nodes)
    exact = {}
    for t, w in law.enumerate(m):
        exact[key(t)] = exact.get(key(t), 0.0) + w
    g = torch.Generator().manual_seed(0)
    n = 2000
    counts: dict = {}
    for _ in range(n):
        k = key(law.sample(m, g))
        assert k in exact
        counts[k] = counts.get(k, 0) + 1
    for k, w in exact.items():
        assert abs(counts.get(k, 0) / n - w) < 5 * (w * (1 - w) / n) ** 0.5 + 2e-3


def test_min_gain_and_budget_shape_the_tree():
    m = trees.TableModel.random(3, 0, "peaked")
    wide = trees.dynamic(2, 2, 6, "iid").enumerate(m)
    thin = trees.dynamic(2, 2, 6, "iid", min_gain=0.3).enumerate(m)
    assert all(len(t.nodes) <= 6 for t, _ in wide + thin)
    drafts = lambda listed: sum(w * sum(len(nd.drafts) for nd in t.nodes) for t, w in listed)
    assert drafts(thin) < drafts(wide)
    # budget 1: the root only, no drafts; the walk samples one token from p
    (root, w), = trees.dynamic(2, 2, 1, "iid").enumerate(m)
    assert w == 1.0 and len(root.nodes) == 1 and root.nodes[0].k == 0


def test_dynamic_law_errors():
    with pytest.raises(ValueError, match="independent"):
        trees.dynamic(2, 2, 5, "independent")
    with pytest.raises(ValueError, match="min_gain"):
        trees.dynamic(2, 2, 5, "iid", min_gain=1.0)
    law = trees.dynamic(3, 2, 6, "wor")
    assert law.node_ks() == {1, 2, 3}
    assert not trees.TokenWalk("spectr", "iid").supports(law)  # the law's kind is 'wor'


# --- certificates ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_dynamic_walk_certificates_fast(kind):
    for seed, style in ((0, "random"), (1, "q_zero")):
        m = trees.TableModel.random(3, seed, style)
        _certify_all(trees.dynamic(2, 2, 5, kind), m, kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("style", ["random", "peaked", "flat", "one_hot", "same", "q_zero", "mixed"])
def test_dynamic_walk_certificates_slow(kind, style):
    cases = [(3, 2, 2, 4, 0.0), (3, 3, 2, 6, 0.0), (3, 3, 3, 5, 0.02), (4, 2, 2, 5, 0.0), (3, 2, 3, 7, 0.1)]
    for seed, (V, K, L, N, g) in enumerate(cases):
        m = trees.TableModel.random(V, seed, style)
        _certify_all(trees.dynamic(K, L, N, kind, min_gain=g), m, kind)


def test_a_k_chosen_after_the_draws_is_caught():
    """Negative control: letting the root's k depend on its own drafts (k = 1 after the draw,
    keeping the draft of larger p) breaks the walk's law, and the certificate sees it (so the
    certificates above can fail)."""
    m = trees.TableModel.random(3, 2, "random")
    law = trees.dynamic(2, 1, 3, "iid")
    rule = trees.TokenWalk("specinfer", "iid")
    assert trees.certify_tree(rule, law, m).max_abs_error < TOL
    p0 = m.p(())
    cheat = []
    for tree, w in law.enumerate(m):
        if tree.nodes[0].k == 2:
            best = max(tree.nodes[0].drafts, key=lambda t: float(p0[t]))
            t = law.new_tree()
            t.nodes[0].k, t.nodes[0].q, t.nodes[0].p = 1, m.q(()), p0
            t.add_drafts(0, [best])
            t.nodes[1].p = m.p((best,))
            tree = t
        cheat.append((tree, w))
    assert any(t.nodes[0].k == 1 for t, _ in cheat)
    got = {}
    for tree, w in cheat:
        for y, py in rule.output_distribution(tree).items():
            got[y[:1]] = got.get(y[:1], 0.0) + w * py
    err = max(abs(got.get((x,), 0.0) - float(p0[x])) for x in range(3))
    assert err > 1e-6


# --- the independent law -----------------------------------------------------------------------
def _independent_verifiers():
    return [n for n in md.verifiers.names() if "independent" in md.verifiers.get(n).laws]


def test_table_model_columns():
    m = trees.TableModel.random(3, 0, "random", cols=3)
    one = trees.TableModel.random(3, 0, "random")
    assert m.n_cols == 3 and one.n_cols == 1
    assert torch.equal(m.q((1,), 0), one.q((1,)))  # column 0 is the one-column model's q
    assert not torch.equal(m.q((1,), 1), m.q((1,), 2))
    assert m.q((1,), 2) is m.q((1,), 2)
    with pytest.raises(ValueError, match="col"):
        one.q((), 1)
    t = trees.TableModel(2, {(): [0.5, 0.5]}, [{(): [1.0, 0.0]}, {(): [0.25, 0.75]}])
    assert t.n_cols == 2 and float(t.q((), 1)[1]) == 0.75 and float(t.q()[0]) == 1.0
    with pytest.raises(ValueError, match="draft column 1"):
        t.q((0,), 1)


def _independent_laws(more: bool = False):
    laws = [trees.kary(2, 2, "independent"), trees.sequences(2, 2, "independent"),
            trees.explicit([[0], [1], [0, 0], [0, 1], [1, 0]], "independent")]
    return laws + [trees.sequences(3, 2, "independent", cols=2)] if more else laws


def test_independent_trees_use_their_columns():
    m = trees.TableModel.random(3, 4, "random", cols=3)
    for law in _independent_laws(more=True):
        listed = law.enumerate(m)
        assert abs(sum(w for _, w in listed) - 1) < 1e-12
        for tree, _ in listed:
            for i, nd in enumerate(tree.nodes):
                if nd.drafts:
                    cols = tree.draft_cols(i, len(nd.drafts))
                    want = torch.stack([m.q(tree.prefix(i), c) for c in cols])
                    assert torch.equal(nd.q, want)
    # sequences mode: the m sequences through a node keep their own columns
    law = trees.sequences(3, 2, "independent", cols=3)
    for tree, _ in law.enumerate(m):
        for nd in tree.nodes[1:]:
            assert len(nd.cols) == sum(1 for t in tree.nodes[nd.parent].drafts if t == nd.token)


@pytest.mark.parametrize("law", _independent_laws(), ids=lambda law: law.name)
def test_independent_walk_certificates_fast(law):
    m = trees.TableModel.random(3, 1, "random", cols=3)
    rules = _certify_all(law, m, "independent")
    names = {r.verifier.name for r in rules}
    assert {"specinfer", "nss", "lp_optimal"} <= names <= set(_independent_verifiers())


def test_independent_law_errors():
    with pytest.raises(ValueError, match="cols"):
        trees.kary(3, 1, "independent", cols=2)
    with pytest.raises(ValueError, match="cols"):
        trees.kary(2, 1, "iid", cols=2)
    with pytest.raises(ValueError, match="wor"):
        trees.sequences(2, 2, "wor")
    m = trees.TableModel.random(3, 0, "random")
    with pytest.raises(ValueError, match="column"):
        trees.kary(2, 1, "independent").enumerate(m)
    assert not trees.TokenWalk("specinfer", "iid").supports(trees.kary(2, 1, "independent"))


@pytest.mark.slow
@pytest.mark.parametrize("style", ["random", "peaked", "flat", "one_hot", "same", "q_zero", "mixed"])
def test_independent_walk_certificates_slow(style):
    laws = _independent_laws(more=True) + [trees.kary(3, 1, "independent"), trees.chain(3, "independent"),
                                           trees.sequences(2, 3, "independent")]
    # every law at V = 3 with two seeds; V = 4 with one, without the laws whose trees are too many
    # for the sweep (4^3 tuples a node; depth-3 sequences: ~20 s a style alone on a 2-core machine)
    for seed, V in ((0, 3), (1, 3), (0, 4)):
        m = trees.TableModel.random(V, seed, style, cols=3)
        for law in laws:
            if V == 4 and (law.shape.k == 3 or law.depth == 3 and law.shape.mode == "sequences"):
                continue
            _certify_all(law, m, "independent")


# --- the decoder itself on a table model ---------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_decoders_dynamic_trees_are_trees_of_the_law(kind):
    """``DecoderStep.draft`` on a table model builds trees that the law lists, node ids, drafts
    and k's included, and whose allocation replays from the model's rows."""
    engine = pytest.importorskip("multidraft.decoding.engine")
    K, L, N = 3, 2, 7
    s = engine.Settings.from_args(verifier="nss", k=K, depth=L, tree="dynamic", max_nodes=N, draft_law=kind)
    law = trees.dynamic(K, L, N, kind)
    key = lambda t: tuple((nd.token, nd.parent, tuple(nd.drafts), nd.k) for nd in t.nodes)
    for seed in range(3):
        m = trees.TableModel.random(3, seed, "random")
        listed = {key(t) for t, _ in law.enumerate(m)}
        g = torch.Generator().manual_seed(seed)
        for _ in range(20):
            step = engine.DecoderStep(None, TableDraft(m), s, g)
            tree = step.serve(step.draft(0, L))
            assert key(tree) in listed
            for i, nd in enumerate(tree.nodes):
                nd.p = m.p(tree.prefix(i))
            _replay(tree, m, law)


def _uneven_level_model():
    """Root q near uniform (every root gets 3 drafts); below it tokens 0 and 2 are confident and
    token 1 is not, so a level of three nodes gets ks [1, 2, 1]: the decoder draws it grouped by k
    (nodes 1, 3, then 2), which fixes the children's node ids."""
    conf, unsure = [0.9, 0.05, 0.05], [0.5, 0.45, 0.05]

    def q(prefix):
        if not prefix:
            return [0.34, 0.33, 0.33]
        return unsure if prefix[0] == 1 else conf

    return trees.TableModel(3, lambda s: [0.2, 0.3, 0.5], q)


@pytest.mark.parametrize("kind", KINDS)
def test_the_decoders_node_order_on_an_uneven_level(kind):
    engine = pytest.importorskip("multidraft.decoding.engine")
    K, L, N = 3, 2, 8
    s = engine.Settings.from_args(verifier="nss", k=K, depth=L, tree="dynamic", max_nodes=N, draft_law=kind)
    law = trees.dynamic(K, L, N, kind)
    m = _uneven_level_model()
    key = lambda t: tuple((nd.token, nd.parent, tuple(nd.drafts), nd.k) for nd in t.nodes)
    listed = {key(t) for t, _ in law.enumerate(m)}
    g = torch.Generator().manual_seed(0)
    uneven = 0
    for _ in range(30):
        step = engine.DecoderStep(None, TableDraft(m), s, g)
        tree = step.serve(step.draft(0, L))
        assert key(tree) in listed
        uneven += [nd.k for nd in tree.nodes if nd.depth == 1] == [1, 2, 1]
    assert uneven > 0
