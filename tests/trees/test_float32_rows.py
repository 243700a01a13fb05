"""Sequence-level rules read a float32 tree as the float64 distributions its rows represent
(each row divided by its float64 sum), as the token-level verifiers do since issue 29: the
emitted law of a float32 tree equals the law of the same tree with normalised float64 rows."""
import pytest
import torch

from multidraft import trees

RULES = ["block", "traversal", "gbv", "spectr_gbv", "univer"]


def _trees(law, seed):
    """The same filled tree twice: float32 rows scaled off 1 (sums 1 +- 1e-6), and their float64
    normalisations."""
    m = trees.TableModel.random(3, seed=seed)
    t32 = law.sample(m, torch.Generator().manual_seed(seed))
    t64 = t32.copy()
    g = torch.Generator().manual_seed(100 + seed)
    p32 = {}
    for i, nd in enumerate(t32.nodes):
        scale = 1.0 + 2e-6 * (torch.rand((), generator=g).item() - 0.5)
        p = (t32.p(i) * scale).float()
        p32[i] = p
        if nd.q is not None:
            q = (nd.q * scale).float()
            nd.q = q
            t64.nodes[i].q = q.double() / q.double().sum()
    t32.set_target(lambda i: p32[i])
    t64.set_target(lambda i: p32[i].double() / p32[i].double().sum())
    return t32, t64


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("law", [trees.chain(2), trees.sequences(2, 2), trees.kary(2, 2)], ids=lambda l: l.name)
def test_a_float32_tree_is_read_as_its_normalised_rows(rule, law):
    r = trees.get(rule)
    if not r.supports(law):
        pytest.skip(f"{rule} does not verify {law.name}")
    for seed in range(3):
        t32, t64 = _trees(law, seed)
        a, b = r.output_distribution(t32), r.output_distribution(t64)
        assert a.keys() == b.keys()
        assert max(abs(a[y] - b[y]) for y in a) < 1e-15
        assert abs(r.expected_tokens(t32) - r.expected_tokens(t64)) < 1e-14


@pytest.mark.parametrize("rule", RULES)
def test_rows_checked_skips_only_the_row_checks(rule):
    """A builder that vouches for its rows (the decoder) gets the same verdicts without the O(V)
    row checks; the structural checks stay, and an unvouched bad row is still refused."""
    r = trees.get(rule)
    law = trees.chain(2) if rule == "block" else trees.sequences(2, 2)
    for seed in range(3):
        tree, _ = _trees(law, seed)
        vouched = tree.copy()
        vouched.rows_checked = True
        for s in range(5):
            assert r.verify(tree, torch.Generator().manual_seed(s)) == r.verify(vouched, torch.Generator().manual_seed(s))
        assert abs(r.expected_tokens(tree) - r.expected_tokens(vouched)) < 1e-15
    bad = tree.copy()
    bad.nodes[0].q = bad.nodes[0].q * 2.0  # not a distribution
    with pytest.raises(ValueError, match="q row at node 0"):
        r.verify(bad, torch.Generator().manual_seed(0))
    depth0 = law.new_tree(0)
    depth0.rows_checked = True
    with pytest.raises(ValueError, match="depth 0"):
        r.verify(depth0, torch.Generator().manual_seed(0))
