"""Mixed trees (DESIGN.md "Draft sources"): the draft model's tree plus free sources' chains
(one-hot columns), verified by the walk of a verifier under the 'independent' law; path
certificates at 1e-12 for every verifier that takes that law, the p = 0 guarantee, subnormal
masses, and the sequence-level rules' refusals."""
from __future__ import annotations

import pytest
import torch

from multidraft import trees, verifiers
from multidraft.trees import DraftTree, TreeShape

TOL = 1e-12
CHAINS = [(1, 2, 0), (2,), (1, 0)]  # a trie: two chains share the root's draft 1; one goes past the model's depth
BASES = [
    lambda: trees.explicit([[0], [1], [0, 0]], "iid"),
    lambda: trees.sequences(2, 2, "iid"),
    lambda: trees.chain(2, "greedy"),
    lambda: trees.kary(2, 1, "greedy"),
    lambda: trees.explicit([[0], [1], [1, 0]], "independent"),
    lambda: trees.dynamic(2, 2, 4, "iid"),
]


def independent_walks() -> list[str]:
    """Every registered verifier that takes the independent law with several drafts."""
    return [n for n in verifiers.names() if verifiers.get(n).supports("independent", 2)]


def test_the_walks_under_test():
    walks = independent_walks()
    assert {"specinfer", "khisti_is", "lp_optimal", "nss"} <= set(walks)
    assert "optimal" not in walks  # fitted for the iid law only: refused by the decoder with sources


def _certify_every_walk(law, m, walks=None):
    for v in walks or independent_walks():
        rule = trees.TokenWalk(v, "independent")
        if not rule.supports(law):
            continue
        cert = trees.certify_tree(rule, law, m)
        assert cert.max_abs_error < TOL, (v, cert)
        assert cert.expected_tokens >= 1.0


@pytest.mark.parametrize("base", BASES, ids=lambda f: f().name)
def test_mixed_tree_certificates(base):
    m = trees.TableModel.random(V=3, seed=1, cols=2)
    law = trees.mixed(base(), CHAINS)
    assert law.kind == "independent" and law.depth == 3
    _certify_every_walk(law, m)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["iid", "independent"])
def test_mixed_full_kary_certificates(kind):
    """The full 2-ary tree of depth 2 (513 trees a law) with the chains, for the two walks the
    decoder defaults to or recommends; ~10 s each on a loaded 2-core machine."""
    _certify_every_walk(trees.mixed(trees.kary(2, 2, kind), CHAINS), trees.TableModel.random(V=3, seed=1, cols=2),
                        walks=("specinfer", "khisti_is"))


def test_mixed_free_chain_raises_expected_tokens():
    """A chain the target follows is accepted: the mixed tree beats the model's tree alone."""
    m = trees.TableModel.random(V=3, seed=2, style="peaked")
    best = tuple(int(m.p(()).argmax()) for _ in range(1))
    x1 = int(m.p(best).argmax())
    rule = trees.TokenWalk("specinfer", "independent")
    base = trees.chain(1, "iid")
    alone = trees.certify_tree(trees.TokenWalk("specinfer", "iid"), base, m).expected_tokens
    mixed = trees.certify_tree(rule, trees.mixed(base, [best + (x1,)]), m)
    assert mixed.max_abs_error < TOL
    assert mixed.expected_tokens > alone


class _Zeroed:
    """A table model whose target gives token ``z`` the mass ``mass`` everywhere (0, or subnormal)."""

    def __init__(self, m, z: int, mass: float):
        self.V, self.n_cols = m.V, m.n_cols
        self._m, self._z, self._mass = m, z, mass
        self._cache = {}

    def p(self, prefix=()):
        key = tuple(prefix)
        if key not in self._cache:
            row = self._m.p(prefix).clone()
            row[self._z] = 0.0
            row = row / row.sum() * (1.0 - self._mass)
            row[self._z] = self._mass
            self._cache[key] = row
        return self._cache[key]

    def q(self, prefix=(), col=0):
        return self._m.q(prefix, col)


@pytest.mark.parametrize("mass", [0.0, 5e-324, 1e-310])
def test_one_hot_draft_of_target_mass_zero_or_subnormal(mass):
    """The p = 0 guarantee: a copied token the target gives 0 is never emitted; subnormal masses
    are exact too (certificates at 1e-12, and the zero-mass token absent from every output law)."""
    base = trees.TableModel.random(V=3, seed=3, cols=2)
    m = trees.TableModel(3, _Zeroed(base, 2, mass).p, [lambda s, c=c: base.q(s, c) for c in range(2)])
    law = trees.mixed(trees.kary(2, 1, "iid"), [(2, 2), (2, 1, 2)])
    for v in ("specinfer", "khisti_is", "lp_optimal"):
        rule = trees.TokenWalk(v, "independent")
        cert = trees.certify_tree(rule, law, m)
        assert cert.max_abs_error < TOL, (v, mass, cert)
        if mass == 0.0:
            for tree, w in law.enumerate(m):
                for y, py in rule.output_distribution(tree).items():
                    assert 2 not in y or py == 0.0, (v, y, py)


def test_sampled_mixed_tree_walk_never_emits_zero_mass_copy():
    base = trees.TableModel.random(V=3, seed=4, cols=1)
    m = trees.TableModel(3, _Zeroed(base, 0, 0.0).p, base.q)
    law = trees.mixed(trees.chain(1, "iid"), [(0, 0)])
    rule = trees.TokenWalk("specinfer", "independent")
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        verdict = rule.verify(law.sample(m, g), g)
        assert verdict.token != 0


def test_as_independent_columns():
    m = trees.TableModel.random(V=4, seed=5)
    g = torch.Generator().manual_seed(0)
    t = trees.kary(3, 1, "iid").sample(m, g)
    q = t.nodes[0].q
    t.as_independent()
    assert t.law == "independent" and t.model_law == "iid"
    assert t.nodes[0].q.shape == (3, 4) and t.nodes[0].q.stride(0) == 0  # one row repeated, a view
    assert torch.equal(t.nodes[0].q[1], q)
    g2 = trees.kary(2, 1, "greedy").sample(m, g)
    g2.as_independent()
    assert torch.equal(g2.nodes[0].q, trees.one_hot_rows(g2.nodes[0].drafts, 4))
    w = trees.kary(2, 1, "wor").sample(m, g)
    with pytest.raises(ValueError, match="without replacement"):
        w.as_independent()


def test_add_chains_structure_and_growth():
    shape = TreeShape.from_args(None, 1, 1)
    t = DraftTree(shape, 9, 1, 1, "iid")
    t.nodes[0].q = torch.full((5,), 0.2, dtype=torch.float64)
    t.add_drafts(0, [3])
    with pytest.raises(ValueError, match="as_independent"):
        t.add_chains([(3, 4)], 5)
    t.as_independent()
    new = t.add_chains([(3, 4, 1, 2), (1,), (3, 0)], 5)
    assert shape.max_nodes() == 2 and len(t) == 7  # past the shape's budget: the ancestor matrix grew
    root = t.nodes[0]
    assert root.drafts == [3, 3, 1] and root.free == 2  # the copy of the model's 3 shares its child
    assert torch.equal(root.q[1:], trees.one_hot_rows([3, 1], 5))
    n3 = t.nodes[root.child[3]]
    assert n3.drafts == [4, 0] and n3.fed == -1 and t.n_children(root.child[3]) == 2
    assert all(t.nodes[i].slot is None for i in new)
    deep = t.nodes[-1]
    assert t.prefix(len(t) - 1) == (3, 4, 1, 2) and deep.depth == 4
    anc = t.ancestors()
    assert anc.shape == (7, 7) and bool(anc[len(t) - 1, root.child[3]]) and not bool(anc[len(t) - 1, root.child[1]])


def test_sequences_free_columns_numbered_after_the_model():
    m = trees.TableModel.random(V=3, seed=6)
    t = trees.sequences(2, 1, "iid").sample(m, torch.Generator().manual_seed(0))
    t.as_independent()
    t.add_chains([(0, 1)], 3)
    cols = {c for nd in t.nodes for c in nd.cols}
    assert {0, 1} <= cols and max(cols) >= 2


@pytest.mark.parametrize("name", ["gbv", "traversal", "univer", "block", "spectr_gbv"])
def test_sequence_rules_refuse_mixed_trees(name):
    """Each sequence-level rule's losslessness needs one q row per node (i.i.d. siblings, or one
    chain): independent columns of different laws (a one-hot copy beside the model's draws)
    are refused, with the reason."""
    rule = trees.get(name)
    for base in (trees.sequences(2, 2), trees.chain(2)):
        law = trees.mixed(base, [(1, 2)])
        assert not rule.supports(law)
        assert rule.refusal(law)
