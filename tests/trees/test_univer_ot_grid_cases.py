"""Two instances of the claims grid (docs/results/seq_rules) that tell UniVer's LP plan
(``univer_ot``) from traversal (= UniVer's residual plan on i.i.d. trees), recomputed exactly:
the LP plan can be far above traversal and above every token walk, and it can be below
traversal (locally optimal plans at every node are not the best plan for the tree)."""
from __future__ import annotations

from multidraft import trees

TOL = 1e-12


def _tokens(rule, law, model) -> float:
    cert = trees.certify_tree(rule, law, model)
    assert cert.max_abs_error <= TOL
    return cert.expected_tokens


def test_the_lp_plan_far_above_traversal_and_the_best_walk():
    """kary_k3_l2_v2, seed 282 (flat), the instance where traversal is furthest behind the best
    walk: univer_ot 2.979452, the walk of `optimal` 2.974979, traversal 2.578530."""
    law, model = trees.kary(3, 2), trees.TableModel.random(2, seed=282, style="flat")
    ot = _tokens(trees.get("univer", plan="ot"), law, model)
    walk = _tokens(trees.TokenWalk("optimal", "iid"), law, model)
    trav = _tokens(trees.get("traversal"), law, model)
    assert abs(ot - 2.979452) <= 1e-6 and abs(walk - 2.974979) <= 1e-6 and abs(trav - 2.578530) <= 1e-6
    assert ot > walk > trav


def test_the_lp_plan_below_traversal():
    """sequences_k2_l2_v4, seed 482 (mixed), the largest shortfall of univer_ot against traversal
    in the grid: 1.805805 against 1.843584 tokens per call."""
    law, model = trees.sequences(2, 2), trees.TableModel.random(4, seed=482, style="mixed")
    ot = _tokens(trees.get("univer", plan="ot"), law, model)
    trav = _tokens(trees.get("traversal"), law, model)
    assert abs(ot - 1.805805) <= 1e-6 and abs(trav - 1.843584) <= 1e-6
    assert ot < trav - 0.03
