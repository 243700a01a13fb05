"""Mixed trees (DESIGN.md "Draft sources"): the draft model's tree plus free sources' chains,
verified by the token walk free drafts first (``trees.TokenWalk``): path certificates at 1e-12
for every registered token-level verifier under each law it takes, the p = 0 guarantee, p(x) = 1,
subnormal masses, float32 rows, the sampling path against the exact law, and the sequence-level
rules' refusals."""
from __future__ import annotations

import pytest
import torch

from multidraft import trees, verifiers
from multidraft.trees import DraftTree, TreeShape

TOL = 1e-12
# a trie: two chains share the root's draft 1 and diverge below it; one goes past the model's depth;
# at V = 3 the free tokens equal model drafts at some nodes and not at others
CHAINS = [(1, 2, 0), (2,), (1, 0)]
BASES = {
    "iid": [lambda: trees.chain(2, "iid"), lambda: trees.explicit([[0], [1], [0, 0]], "iid"), lambda: trees.sequences(2, 2, "iid"),
            lambda: trees.dynamic(2, 2, 3, "iid")],
    "wor": [lambda: trees.chain(2, "wor"), lambda: trees.kary(2, 1, "wor"), lambda: trees.explicit([[0], [1], [0, 0]], "wor")],
    "greedy": [lambda: trees.chain(2, "greedy"), lambda: trees.kary(2, 1, "greedy")],
    "independent": [lambda: trees.chain(2, "independent"), lambda: trees.explicit([[0], [1], [1, 0]], "independent")],
}
WALKS = [(n, kind) for n in verifiers.names() for kind in verifiers.get(n).laws]


def _certified(v: str, kind: str, m, chains=CHAINS) -> int:
    """Certify the walk of ``v`` under ``kind`` on every base of that law with ``chains``; the
    number of laws certified."""
    rule = trees.TokenWalk(v, kind)
    n = 0
    for base in BASES[kind]:
        law = trees.mixed(base(), chains)
        if not rule.supports(law):
            continue
        cert = trees.certify_tree(rule, law, m)
        assert cert.max_abs_error < TOL, (v, kind, law.name, cert)
        assert cert.expected_tokens >= 1.0
        n += 1
    return n


@pytest.mark.parametrize("v,kind", WALKS, ids=lambda x: str(x))
def test_mixed_tree_certificates_every_walk(v, kind):
    """Every registered verifier, under every law it takes, is exact on mixed trees (its own law
    at the model's drafts, free drafts first)."""
    m = trees.TableModel.random(V=3, seed=1, cols=2, style="mixed")
    assert _certified(v, kind, m) >= 1


def test_the_mixed_law_is_the_models():
    law = trees.mixed(trees.kary(2, 1, "wor"), CHAINS)
    assert law.kind == "wor" and law.depth == 3 and law.node_ks() == {2}
    assert trees.TokenWalk("rrs_wor", "wor").supports(law) and trees.TokenWalk("optimal", "iid").supports(
        trees.mixed(trees.kary(3, 1, "iid"), CHAINS))


@pytest.mark.slow
@pytest.mark.parametrize("v,kind", [("specinfer", "iid"), ("optimal", "iid"), ("rrs_wor", "wor")])
def test_mixed_full_kary_certificates(v, kind):
    """The full 2-ary tree of depth 2 with the chains, for the decoder's defaults."""
    law = trees.mixed(trees.kary(2, 2, kind), CHAINS)
    cert = trees.certify_tree(trees.TokenWalk(v, kind), law, trees.TableModel.random(V=3, seed=1))
    assert cert.max_abs_error < TOL, cert


def test_mixed_free_chain_raises_expected_tokens():
    """A chain the target follows is accepted: the mixed tree beats the model's tree alone."""
    m = trees.TableModel.random(V=3, seed=2, style="peaked")
    best = tuple(int(m.p(()).argmax()) for _ in range(1))
    x1 = int(m.p(best).argmax())
    rule = trees.TokenWalk("specinfer", "iid")
    base = trees.chain(1, "iid")
    alone = trees.certify_tree(rule, base, m).expected_tokens
    mixed = trees.certify_tree(rule, trees.mixed(base, [best + (x1,)]), m)
    assert mixed.max_abs_error < TOL
    assert mixed.expected_tokens > alone


class _Pinned:
    """A table model whose target gives token ``z`` the mass ``mass`` everywhere (0, subnormal, or
    1: a one-hot target)."""

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


def _pinned(seed: int, z: int, mass: float):
    base = trees.TableModel.random(V=3, seed=seed, cols=2)
    return trees.TableModel(3, _Pinned(base, z, mass).p, [lambda s, c=c: base.q(s, c) for c in range(2)])


@pytest.mark.parametrize("mass", [0.0, 5e-324, 1e-310, 1.0])
def test_free_token_of_target_mass_zero_subnormal_or_one(mass):
    """The p = 0 guarantee: a copied token the target gives 0 is never emitted; subnormal masses and
    p(x) = 1 exactly (the copy always accepted) are exact too, for every walk."""
    m = _pinned(3, 2, mass)
    for v, kind in (("specinfer", "iid"), ("optimal", "iid"), ("rrs_wor", "wor"), ("greedy_optimal", "greedy"),
                    ("spechub", "greedy"), ("khisti_is", "independent")):
        assert _certified(v, kind, m, [(2, 2), (2, 1, 2), (0,)]) >= 1, (v, kind)
        if mass in (0.0, 1.0):
            rule = trees.TokenWalk(v, kind)
            law = trees.mixed(BASES[kind][0](), [(2, 2), (2, 1, 2)])
            if not rule.supports(law):
                continue
            for tree, _ in law.enumerate(m):
                for y, py in rule.output_distribution(tree).items():
                    if mass == 0.0:
                        assert 2 not in y or py == 0.0, (v, y, py)
                    else:  # p(2) = 1 at every node: the walk emits 2s only
                        assert set(y) == {2} or py == 0.0, (v, y, py)


def test_float32_rows_read_as_the_laws_they_represent():
    """A tree with float32 p and q rows has the exact law of the same tree with its rows divided
    by their float64 sums (``_check.row64``), for the free-first nodes too."""
    m = trees.TableModel.random(V=5, seed=7)
    law = trees.mixed(trees.kary(2, 1, "iid"), [(1, 2), (3,)])
    t64 = law.sample(m, torch.Generator().manual_seed(0))
    t32 = t64.copy()
    for a, b in zip(t64.nodes, t32.nodes):
        b.p = a.p.float() * 1.0000001
        if a.q is not None:
            b.q = a.q.float()
        a.p = b.p.double() / b.p.double().sum()
        if a.q is not None:
            a.q = b.q.double() / b.q.double().sum()
    for v in ("specinfer", "optimal", "khisti_is"):
        rule = trees.TokenWalk(v, "iid")
        got, want = rule.output_distribution(t32), rule.output_distribution(t64)
        assert set(got) == set(want) and max(abs(got[y] - want[y]) for y in want) < TOL, v


@pytest.mark.parametrize("v,kind", [("specinfer", "iid"), ("rrs_wor", "wor")])
def test_sampling_path_follows_the_exact_law(v, kind):
    """The walk's verify (the uniforms, the residual, the model verifier on it) draws Y with the
    law output_distribution computes: empirical frequencies within 5 standard errors."""
    m = trees.TableModel.random(V=3, seed=8)
    law = trees.mixed(trees.kary(2, 1, kind), [(1, 0), (2,)])
    rule = trees.TokenWalk(v, kind)
    tree = law.sample(m, torch.Generator().manual_seed(1))
    want = rule.output_distribution(tree)
    g = torch.Generator().manual_seed(2)
    n = 2000
    counts: dict = {}
    for _ in range(n):
        y = rule.verify(tree, g).tokens(tree)
        counts[y] = counts.get(y, 0) + 1
    assert set(counts) <= {y for y, w in want.items() if w > 0}
    for y, w in want.items():
        se = (w * (1 - w) / n) ** 0.5
        assert abs(counts.get(y, 0) / n - w) <= 5 * se + 1e-9, (y, counts.get(y, 0) / n, w)


def test_free_only_node_rejected_stops_there():
    """A free-only node whose copies are all refused samples the residual, which holds none of its
    children: the walk stops (path ends at that node)."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    t = DraftTree(TreeShape.from_args(None, 1, 1), 0, 0, 1, "iid")
    t.add_chains([(1, 2)])
    t.set_target(lambda i: p)
    rule = trees.TokenWalk("specinfer", "iid")
    law = rule.output_distribution(t)
    want = {(0,): 0.5, (2,): 0.2, (1, 0): 0.15, (1, 1): 0.09, **{(1, 2, y): 0.06 * float(p[y]) for y in range(3)}}
    assert set(law) == set(want) and all(abs(law[y] - w) < TOL for y, w in want.items()), law
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        verdict = rule.verify(t, g)
        last = t.nodes[verdict.path[-1] if verdict.path else 0]
        assert not last.drafts or verdict.token not in last.drafts  # a refused copy: stop, never a child


def test_add_chains_structure_and_growth():
    shape = TreeShape.from_args(None, 1, 1)
    t = DraftTree(shape, 9, 1, 1, "iid")
    t.nodes[0].q = torch.full((5,), 0.2, dtype=torch.float64)
    t.add_drafts(0, [3])
    new = t.add_chains([(3, 4, 1, 2), (1,), (3, 0)])
    assert shape.max_nodes() == 2 and len(t) == 7  # past the shape's budget: the ancestor matrix grew
    root = t.nodes[0]
    assert root.drafts == [3, 3, 1] and root.free == 2  # the copy of the model's 3 shares its child
    assert root.q.shape == (5,) and t.law == "iid"  # the node keeps the model's law and row
    n3 = t.nodes[root.child[3]]
    assert n3.drafts == [4, 0] and n3.fed == -1 and t.n_children(root.child[3]) == 2 and n3.q is None
    assert all(t.nodes[i].slot is None for i in new)
    deep = t.nodes[-1]
    assert t.prefix(len(t) - 1) == (3, 4, 1, 2) and deep.depth == 4
    anc = t.ancestors()
    assert anc.shape == (7, 7) and bool(anc[len(t) - 1, root.child[3]]) and not bool(anc[len(t) - 1, root.child[1]])


def test_sequences_free_columns_numbered_after_the_model():
    m = trees.TableModel.random(V=3, seed=6)
    t = trees.sequences(2, 1, "iid").sample(m, torch.Generator().manual_seed(0))
    t.add_chains([(0, 1)])
    cols = {c for nd in t.nodes for c in nd.cols}
    assert {0, 1} <= cols and max(cols) >= 2


@pytest.mark.parametrize("name", ["gbv", "traversal", "univer", "block", "spectr_gbv"])
def test_sequence_rules_refuse_mixed_trees(name):
    """Each sequence-level rule's losslessness needs one q row per node (i.i.d. siblings, or one
    chain): a one-hot copy beside the model's draws is refused, with the reason, by the law and
    by the tree."""
    rule = trees.get(name)
    for base in (trees.sequences(2, 2), trees.chain(2)):
        law = trees.mixed(base, [(1, 2)])
        assert not rule.supports(law)
        assert "mixed tree" in rule.refusal(law) and trees.MIXED_REFUSALS[name] in rule.refusal(law)
    assert rule.supports(trees.chain(2))  # the same chain without the copies is taken
    tree = trees.mixed(trees.chain(2), [(1, 2)]).sample(trees.TableModel.random(V=3, seed=0), torch.Generator())
    with pytest.raises(ValueError, match="free-source drafts"):
        rule.verify(tree, torch.Generator())


def test_free_first_remaining_mass_without_a_row_copy():
    """``_free_first``'s R (the float64 sum less the copies' masses) is the float64 sum of the zeroed
    row to rounding; where little or no mass remains it is that sum itself: exactly 0, and the last
    copy with mass accepted with probability exactly 1, when the copies hold the whole row (also
    beside subnormal and zero entries)."""
    from multidraft.trees.walk import _free_first

    g = torch.Generator().manual_seed(4)
    for V, dt in ((151_936, torch.float32), (1000, torch.float64), (7, torch.float16)):
        p = torch.softmax(3.0 * torch.randn(V, generator=g, dtype=torch.float64), -1).to(dt)
        free = [int(p.argmax()), 3, int(p.argmax()), 5]
        xs, acc, idx, R = _free_first(p, free)
        exact = float(p.index_fill(0, idx, 0.0).sum(dtype=torch.float64))
        assert xs == list(dict.fromkeys(free)) and idx.tolist() == xs
        assert abs(R - exact) <= 1e-15 * float(p.sum(dtype=torch.float64)), (V, R, exact)
    for rest in (0.0, 1e-310, 5e-324):
        p = torch.tensor([0.0, 0.75, rest, 0.25, 0.0], dtype=torch.float64)
        xs, acc, idx, R = _free_first(p, [3, 1])
        assert R == rest and acc[-1] == (1.0 if rest == 0.0 else 0.75 / (0.75 + rest))
        assert acc[0] == 0.25 / (0.25 + 0.75 + rest)


def test_accepted_copy_writes_no_residual_row(monkeypatch):
    """An accepted copy costs one O(V) read: the residual row (``index_fill``) is built only when
    every copy at the node is refused (counted, not timed)."""
    calls = []
    real = torch.Tensor.index_fill

    def counting(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)

    p = torch.tensor([0.1, 0.8, 0.1], dtype=torch.float64)
    t = DraftTree(TreeShape.from_args(None, 1, 1), 0, 0, 1, "iid")
    t.add_chains([(1,)])
    t.set_target(lambda i: p)
    rule = trees.TokenWalk("specinfer", "iid")
    monkeypatch.setattr(torch.Tensor, "index_fill", counting)
    g = torch.Generator().manual_seed(0)
    refused = 0
    for _ in range(200):
        verdict = rule.verify(t, g)
        refused += not verdict.path
    assert 10 <= refused <= 70  # p(1) = 0.8: about 40 refusals of 200
    assert len(calls) == refused
