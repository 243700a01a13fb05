"""The sequence-rules runner: one JSONL file per cell, resumable at (instance, rule), and the
report made from the files alone."""
from __future__ import annotations

import json

import pytest

from multidraft import trees
from multidraft.cli import main as cli_main
from multidraft.experiments import records, seqrules
from multidraft.trees import rule_table


def _rows(path):
    meta, rows = records.read_jsonl(path)
    return meta, rows


def test_a_cell_writes_meta_ceiling_and_rule_rows(tmp_path):
    got = seqrules.run_cell("chain", 1, 2, 2, n=3, out_dir=tmp_path, show_progress=False)
    path = seqrules.cell_path(tmp_path, "chain", 1, 2, 2)
    meta, rows = _rows(path)
    assert meta["config"]["law"] == "chain" and meta["seed"] == 0 and "versions" in meta and "code" in meta
    names = rule_table.rule_names(trees.chain(2))
    assert {"block", "traversal", "walk:specinfer", "walk:optimal"} <= set(names)
    assert got["ceilings"] == 3 and got["rules"] == 3 * len(names) == len(rows) - 3
    ceil = {r["instance"]: r for r in rows if r["rule"] == "ceiling"}
    assert sorted(ceil) == [0, 1, 2] and [ceil[i]["seed"] for i in range(3)] == [0, 1, 2]
    assert [ceil[i]["style"] for i in range(3)] == list(trees.STYLES[:3])
    for r in rows:
        if r["rule"] != "ceiling":
            assert r["cert_error"] <= 1e-12 and r["tokens"] <= ceil[r["instance"]]["upper"] + 1e-12
            if r["rule"] == "block":  # one chain: block verification is the ceiling
                assert abs(r["tokens"] - ceil[r["instance"]]["value"]) <= 1e-9


def test_rerun_adds_only_missing_rows(tmp_path):
    seqrules.run_cell("sequences", 2, 2, 2, n=2, out_dir=tmp_path, rules=[], show_progress=False)
    path = seqrules.cell_path(tmp_path, "sequences", 2, 2, 2)
    _, rows = _rows(path)
    assert {r["rule"] for r in rows} == {"ceiling", "walk:specinfer", "walk:spectr", "walk:khisti_is", "walk:optimal"}
    # rules "registered later" (every sequence-level rule of the registry that takes the law):
    # only their certificates are added, no ceiling LP again
    law = seqrules.make_law("sequences", 2, 2)
    extra = [r for r in rule_table.sequence_rules() if trees.get(r).supports(law)]
    assert "traversal" in extra
    again = seqrules.run_cell("sequences", 2, 2, 2, n=2, out_dir=tmp_path, show_progress=False)
    assert again["ceilings"] == 0 and again["rules"] == 2 * len(extra)
    _, rows2 = _rows(path)
    assert rows2[: len(rows)] == rows and sorted(r["rule"] for r in rows2[len(rows):]) == sorted(extra * 2)
    # nothing missing: nothing written; a larger n adds the new instances only
    assert seqrules.run_cell("sequences", 2, 2, 2, n=2, out_dir=tmp_path, show_progress=False)["rules"] == 0
    more = seqrules.run_cell("sequences", 2, 2, 2, n=3, out_dir=tmp_path, show_progress=False)
    assert more["ceilings"] == 1 and more["rules"] == 4 + len(extra)
    _, rows3 = _rows(path)
    assert len({(r["instance"], r["rule"]) for r in rows3}) == len(rows3)


def test_another_seed_is_refused(tmp_path):
    seqrules.run_cell("chain", 1, 2, 2, n=1, out_dir=tmp_path, show_progress=False)
    with pytest.raises(ValueError, match="seed"):
        seqrules.run_cell("chain", 1, 2, 2, n=1, seed=5, out_dir=tmp_path, show_progress=False)


def test_report_reads_the_files_only(tmp_path, monkeypatch):
    seqrules.run_cell("chain", 1, 2, 2, n=3, out_dir=tmp_path, show_progress=False)
    seqrules.run_cell("sequences", 2, 2, 2, n=3, out_dir=tmp_path, show_progress=False)
    paths = sorted(tmp_path.glob("*.jsonl"))

    def boom(*a, **k):
        raise AssertionError("the report recomputed something")

    monkeypatch.setattr(trees, "optimal_tokens", boom)
    monkeypatch.setattr(rule_table, "certified", boom)
    monkeypatch.setattr(trees, "certify_tree", boom)
    text = seqrules.report(paths)
    assert "| chain_k1_l2_v2 | 3 |" in text and "| sequences_k2_l2_v2 | 3 |" in text
    assert "block verification is optimal on one chain" in text and "holds on all 3 instances" in text
    assert "`spectr_gbv` has no rows" in text or "spectr_gbv" in rule_table.sequence_rules()
    # a row edited in the file changes the report: it is read from there
    path = seqrules.cell_path(tmp_path, "chain", 1, 2, 2)
    lines = path.read_text().splitlines()
    for j, line in enumerate(lines):
        r = json.loads(line)
        if r.get("rule") == "block" and r["instance"] == 1:
            r["tokens"] -= 0.25
            lines[j] = json.dumps(r)
    path.write_text("\n".join(lines) + "\n")
    text2 = seqrules.report(paths)
    assert "block verification is optimal on one chain (Sun et al., 2403.10444)**: fails" in text2
    assert "seed 1 (peaked)" in text2


def test_bad_cells_are_refused(tmp_path):
    with pytest.raises(ValueError, match="law"):
        seqrules.run_cell("star", 2, 2, 2, n=1, out_dir=tmp_path)
    with pytest.raises(ValueError, match="k"):
        seqrules.run_cell("chain", 2, 2, 2, n=1, out_dir=tmp_path)
    with pytest.raises(ValueError, match="n"):
        seqrules.run_cell("chain", 1, 2, 2, n=0, out_dir=tmp_path)
    assert not list(tmp_path.glob("*.jsonl"))


def test_main_grid_and_report(tmp_path, monkeypatch):
    monkeypatch.setattr(seqrules, "GRID", (("chain", 1, 2, 2), ("kary", 2, 2, 2)))
    assert cli_main(["experiment", "seqrules", str(tmp_path), "--grid", "-n", "2", "--report"]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.jsonl")) == ["chain_k1_l2_v2.jsonl", "kary_k2_l2_v2.jsonl"]
    text = (tmp_path / "table.md").read_text()
    assert "| kary_k2_l2_v2 | 2 |" in text and "best token walk" in text


def test_root_study_rows_and_report(tmp_path):
    assert seqrules.run_root("sequences", 2, 3, 2, n=15, out_dir=tmp_path, show_progress=False) == 15
    assert seqrules.run_root("sequences", 2, 3, 2, n=15, out_dir=tmp_path, show_progress=False) == 0
    seqrules.run_cell("sequences", 2, 3, 2, n=1, out_dir=tmp_path, rules=[], show_progress=False)
    text = seqrules.report(sorted(tmp_path.glob("*.jsonl")))
    assert "| sequences_k2_l3_v2 | 15 | " in text and "seed 14 (random)" in text
