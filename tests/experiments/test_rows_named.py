"""``report`` and ``compare-runs`` never drop a row without a word (issue 41, item 8): rows of
another kind than the command reads are refused or named in one line (which rows, why)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from multidraft.cli import main
from multidraft.experiments.records import JsonlWriter
from multidraft.experiments.report import build
from multidraft.experiments.run_diff import compare_files

ROOT = Path(__file__).resolve().parents[2]
ALPHA = dict(dataset="d", t_target=1.0, t_draft=1.0, top_k=None, top_p=None, law="iid", K=4, verifier="alpha*",
             acceptance=0.6, se=0.01, values=[0.5, 0.6, 0.7], n_positions=3)
CELL = dict(ALPHA, verifier="specinfer", acceptance=0.5, alpha_star=0.6, gap_pct=16.7, values=[0.4, 0.5, 0.6])
BLOCK = dict(kind="run", method="specinfer K=2 depth 3", method_kind="tree", verifier="specinfer", rule="token_walk",
             law="iid", k=2, depth=3, temperature=1.0, prompt="p0", block_efficiency=2.5, tokens_per_s=10.0,
             new_tokens=8, target_calls=3, draft_calls=9, seconds=0.8)


def _write(path: Path, rows, config=None) -> Path:
    with JsonlWriter(path, config or {}, 0) as w:
        for r in rows:
            w.write(**r)
    return path


def _one_line(err: str, *needles) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert all(n in lines[0] for n in needles), err
    return lines[0]


# --- report ----------------------------------------------------------------------------------------------
def test_acceptance_rows_under_the_temperature_file_name_are_refused_naming_them(tmp_path, capsys):
    path = _write(tmp_path / "temperature.jsonl", [ALPHA, CELL, dict(ALPHA, K=2), dict(CELL, K=2)])
    assert main(["report", str(tmp_path), "--no-plots"]) == 2  # before: 0, and no table, no word
    line = _one_line(capsys.readouterr().err, f"{path}: none of its 4 rows is on a temperature sweep: one temperature "
                     "pair only (target T = 1, draft T = 1): acceptance rows, not a sweep", "(lines 2-5); rows skipped")
    assert line.split("multidraft report: ", 1)[1] in (tmp_path / "report.md").read_text()
    skipped: list = []
    build(tmp_path, make_plots=False, skipped=skipped)
    assert len(skipped) == 1 and str(path) in skipped[0]
    with pytest.raises(ValueError, match="is on a temperature sweep"):
        build(tmp_path, make_plots=False)


def test_sweep_rows_left_out_of_every_table_are_named_in_one_line(tmp_path, capsys):
    sweep = [dict(ALPHA, t_draft=t, values=None) for t in (0.5, 1.0, 1.5)]
    sweep = [{k: v for k, v in r.items() if v is not None} for r in sweep]
    path = _write(tmp_path / "temperature.jsonl", sweep + [dict(sweep[0], K=2), dict(sweep[1], K=2)])
    notes: list = []
    report = build(tmp_path, make_plots=False, skipped=[], notes=notes)
    msg = f"{path}: 2 of 5 rows in no table: K = 2: the sweep tables show the largest K of each law, 4 (lines 5-6)"
    assert msg in notes and msg in report.read_text()
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    assert f"note: {msg}" in capsys.readouterr().out


def test_a_row_of_another_type_is_named_not_dropped(tmp_path, capsys):
    path = _write(tmp_path / "acceptance.jsonl", [ALPHA, CELL])
    with open(path, "a") as f:
        f.write(json.dumps({"type": "cell", "run_id": json.loads(path.read_text().splitlines()[0])["run_id"]}) + "\n")
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    _one_line(capsys.readouterr().err, f"{path}:4: a row of type 'cell', not a measurement row")


# --- compare-runs ----------------------------------------------------------------------------------------
def test_compare_runs_refuses_files_of_two_kinds_in_one_line(tmp_path, capsys):
    a = _write(tmp_path / "acceptance.jsonl", [ALPHA, CELL])
    b = _write(tmp_path / "blocks.jsonl", [BLOCK])
    assert main(["compare-runs", str(a), str(b)]) != 0
    _one_line(capsys.readouterr().err, f"{a} holds acceptance cells, {b} decode runs (blocks rows)")


def test_compare_runs_names_summary_and_unknown_rows(tmp_path):
    a = _write(tmp_path / "a.jsonl", [BLOCK, dict(kind="summary", method="x"), dict(kind="end", wall_seconds=1.0)])
    b = _write(tmp_path / "b.jsonl", [BLOCK, dict(kind="thing", prompt="p9")])
    out, skipped = [], []
    compare_files(str(a), str(b), print=lambda *x: out.append(" ".join(map(str, x))), skipped=skipped)
    assert f"{a}: 2 rows not compared: 1 of kind 'summary' (the summary of each method, made from its run rows; " \
           "line 3); 1 of kind 'end' (the run's end: wall time, load; line 4)" in out
    assert skipped == [f"{b}:3: a row of kind 'thing', not a run or cell row; row skipped"]


def test_compare_runs_keeps_rules_peers_shapes_and_rounds_apart(tmp_path):
    target = dict(BLOCK, method="target-only", method_kind="target", verifier=None, rule=None, law=None, k=0, depth=0)
    rows = [target, dict(target, method="llama.cpp target-only", method_kind="llama-target"),
            dict(BLOCK, method="block K=2 depth 3", verifier=None, rule="block"),
            dict(BLOCK, method="traversal K=2 depth 3", verifier=None, rule="traversal"),
            BLOCK, dict(BLOCK, method="specinfer seq K=2 depth 3", tree="sequences"),
            dict(BLOCK, round=1, seconds=0.7)]
    a, b = _write(tmp_path / "a.jsonl", rows), _write(tmp_path / "b.jsonl", rows)
    out = []
    compare_files(str(a), str(b), print=lambda *x: out.append(" ".join(map(str, x))), skipped=[])
    assert out[0] == f"{a}: 7 runs; {b}: 7 runs; 7 in both"  # before: 3 runs (the others silently overwritten)


def test_compare_runs_names_cells_in_one_file_only(tmp_path):
    a = _write(tmp_path / "a.jsonl", [ALPHA, CELL], {"experiment": "acceptance"})
    b = _write(tmp_path / "b.jsonl", [ALPHA, dict(ALPHA, t_draft=0.5)], {"experiment": "temperature"})
    out = []
    compare_files(str(a), str(b), print=lambda *x: out.append(" ".join(map(str, x))), skipped=[])
    assert f"{a} was written by `experiment acceptance`, {b} by `experiment temperature`: only the cells of both are compared" in out
    assert f"  1 cells only in {a}, not compared (e.g. d/1.0/1.0/iid/4/specinfer)" in out
    assert f"  1 cells only in {b}, not compared (e.g. d/1.0/0.5/iid/4/alpha*)" in out


def test_compare_runs_on_committed_decode_files(capsys):
    a, b = (str(ROOT / "docs/results/decode_speed" / f) for f in ("llama-bf16-q4.jsonl", "llama-bf16-q4_0.jsonl"))
    assert main(["compare-runs", a, b]) == 0
    out = capsys.readouterr().out
    assert f"{a}: 160 runs; {b}: 240 runs; 80 in both" in out and "llama-target:" in out
