"""trees.root_tradeoff: reaching the tree-level ceiling can cost acceptance at the root (issue 26, item 5)."""
from __future__ import annotations

from multidraft import trees


def test_the_ceiling_accepts_less_at_the_root_than_alpha_star():
    """Pinned instance (docs/results/seq_rules): K = 2 i.i.d. sequences, L = 3, V = 2, seed 14."""
    model = trees.TableModel.random(2, seed=14, style="random")
    law = trees.sequences(2, 3)
    r = trees.root_tradeoff(law, model)
    assert abs(r.ceiling - trees.optimal_tokens(law, model).value) <= 1e-9
    # alpha_root is the depth-1 ceiling of the same root drafts
    assert abs(r.alpha_root - (trees.optimal_tokens(trees.sequences(2, 1), model).value - 1)) <= 1e-9
    assert r.root_optimal < r.ceiling - 0.03 and r.ceiling_root_max < r.alpha_root - 0.04
    # every walk of 'optimal' accepts the first token with probability alpha*: it is below root_optimal
    assert trees.expected_tokens(law, model, rules=[])["walk:optimal"] <= r.root_optimal + 1e-9


def test_no_tradeoff_where_the_root_is_everything():
    model = trees.TableModel.random(3, seed=2, style="peaked")
    r = trees.root_tradeoff(trees.sequences(2, 1), model)  # depth 1: the ceiling is 1 + alpha*
    assert abs(r.ceiling - (1 + r.alpha_root)) <= 1e-9 and abs(r.root_optimal - r.ceiling) <= 1e-9
