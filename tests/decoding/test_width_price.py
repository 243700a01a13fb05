"""``treeopt.width_price`` / ``chain_vs_tree`` and ``multidraft profile --compare``: what width
costs on a profile's machine and whether the cost model's best tree branches there."""
from __future__ import annotations

import json

import pytest

from multidraft.cli import main
from multidraft.decoding.treeopt import AcceptStats, CostProfile, chain_vs_tree, expected_tokens, step_seconds, width_price


def _flat():   # width almost free: 16 target tokens cost 1.1 of one, a draft level of 4 1.05 of one
    return CostProfile([1, 16], [0.2, 0.22], [1, 4], [0.05, 0.0525], meta={"cpu": "flat", "engine": "transformers"})


def _linear():  # every node a whole forward
    return CostProfile(list(range(1, 17)), [0.2 * n for n in range(1, 17)], [1, 2, 3, 4], [0.05, 0.1, 0.15, 0.2],
                       meta={"cpu": "linear", "engine": "llama.cpp"})


STATS = AcceptStats.from_alphas({1: 0.6, 2: 0.8})


def test_width_price_is_the_ratio_of_interpolated_points():
    w = width_price(_linear(), ns=(2, 4, 16), ms=(2, 4))
    assert w["target"] == pytest.approx({2: 2.0, 4: 4.0, 16: 16.0})
    assert w["draft"] == pytest.approx({2: 2.0, 4: 4.0})
    f = width_price(_flat(), ns=(16,), ms=(4,))
    assert f["target"][16] == pytest.approx(1.1) and f["draft"][4] == pytest.approx(1.05)
    with pytest.raises(ValueError, match="profile"):
        width_price({"target": 1})


def test_cheap_width_branches_and_dear_width_does_not():
    flat = chain_vs_tree(_flat(), STATS, max_nodes=16, max_depth=4)
    assert flat.branches and flat.tree_over_chain > 1.0
    # the best chain is the best of every depth, recomputed here by hand
    rates = [expected_tokens([[0] * i for i in range(1, d + 1)], STATS)
             / step_seconds([[0] * i for i in range(1, d + 1)], _flat()) for d in range(1, 5)]
    assert flat.chain.tokens_per_s == pytest.approx(max(rates))
    lin = chain_vs_tree(_linear(), STATS, max_nodes=16, max_depth=4)
    assert not lin.branches and lin.tree_over_chain == 1.0


def test_chain_vs_tree_needs_single_draft_stats():
    with pytest.raises(ValueError, match="k = 1"):
        chain_vs_tree(_flat(), AcceptStats({2: (0.5, 0.2)}), max_nodes=8, max_depth=3)


def test_profile_compare_cli(tmp_path, capsys):
    a, b = tmp_path / "flat.json", tmp_path / "linear.json"
    a.write_text(_flat().to_json())
    b.write_text(_linear().to_json())
    st = tmp_path / "stats.json"
    st.write_text(STATS.to_json())
    md = tmp_path / "width.md"
    assert main(["profile", "--compare", str(a), str(b), "--accept-stats", str(st), "--verifier", "specinfer",
                 "--k", "2", "--max-nodes", "16", "--max-depth", "4", "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| flat.json") or line.startswith("| linear.json")]
    assert len(rows) == 2
    assert "branches" in rows[0] and "chain of" in rows[1] and "| 1.000x |" in rows[1]
    assert md.read_text().strip() == out.strip()
    # without acceptances: the price of width only
    assert main(["profile", "--compare", str(b)]) == 0
    out = capsys.readouterr().out
    assert "| 16.00 |" in out and "best tree" not in out


def test_profile_compare_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"target": {}}))
    assert main(["profile", "--compare", str(bad)]) == 2
    assert "bad.json" in capsys.readouterr().err
    assert main(["profile", "--compare", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    good = tmp_path / "flat.json"
    good.write_text(_flat().to_json())
    assert main(["profile", "--compare", str(good), "--max-depth", "0"]) == 2
    assert "--max-depth" in capsys.readouterr().err
