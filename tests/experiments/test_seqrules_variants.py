"""Rule variants in the claims grid: ``univer_ot`` (UniVer's LP plan) is compared under its own name,
only where asked, and ``--grid --rules univer_ot`` adds that rule's rows and nothing else."""
from __future__ import annotations

import pytest

from multidraft import trees
from multidraft.cli import main as cli_main
from multidraft.experiments import records, seqrules
from multidraft.trees import rule_table


def test_a_variant_is_its_rule_with_options_and_only_compared_when_asked():
    law = trees.kary(2, 2)
    rule = rule_table.build_rule("univer_ot", law)
    assert isinstance(rule, trees.UniVer) and rule.plan == "ot"
    assert "univer_ot" not in rule_table.rule_names(law) and "univer_ot" not in rule_table.sequence_rules()
    assert rule_table.rule_names(law, walks=(), rules=["univer_ot", "traversal"]) == ["univer_ot", "traversal"]
    model = trees.TableModel.random(3, seed=0, style="random")
    got = rule_table.expected_tokens(trees.kary(2, 1, "wor"), model, walks=(), rules=["univer_ot"])
    assert abs(got["univer_ot"] - got["ceiling"]) <= 1e-9  # depth 1: the LP plan is at 1 + alpha*
    with pytest.raises(ValueError, match="rules: unknown sequence-level rule 'univer_lp'"):
        rule_table.rule_names(law, rules=["univer_lp"])


def test_grid_with_one_rule_adds_only_its_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(seqrules, "GRID", (("kary", 2, 2, 2),))
    seqrules.run_cell("kary", 2, 2, 2, n=2, out_dir=tmp_path, show_progress=False)
    path = seqrules.cell_path(tmp_path, "kary", 2, 2, 2)
    _, before = records.read_jsonl(path)
    assert "univer_ot" not in {r["rule"] for r in before}  # run_cell's default: the registered rules only
    assert cli_main(["experiment", "seqrules", str(tmp_path), "--grid", "-n", "2", "--rules", "univer_ot", "--report"]) == 0
    _, after = records.read_jsonl(path)
    assert after[: len(before)] == before
    assert [(r["instance"], r["rule"]) for r in after[len(before):]] == [(0, "univer_ot"), (1, "univer_ot")]
    assert all(r["cert_error"] <= 1e-12 for r in after[len(before):])
    text = (tmp_path / "table.md").read_text()
    assert "| univer_ot | 2 |" in text and "UniVer with its LP plan (`univer_ot`) improves" in text
    line = next(x for x in text.splitlines() if "UniVer's LP plan (`univer_ot`) against traversal" in x)
    rows = {(r["instance"], r["rule"]): r["tokens"] for r in after if r["rule"] != "ceiling"}
    above = sum(rows[(i, "univer_ot")] > rows[(i, "traversal")] + seqrules.AT for i in (0, 1))
    assert f"(2 instances on trees, 1 cells): above in {above}, below in " in line
