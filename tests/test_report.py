"""`multidraft report` over bad rows and bad paths: file:line errors, one line, no traceback."""
from __future__ import annotations

import json

import pytest

from multidraft.cli import main
from multidraft.experiments import report
from multidraft.experiments.records import JsonlWriter, read_jsonl

ROW = dict(dataset="d", t_target=1.0, t_draft=1.0, top_k=None, top_p=None, law="iid", K=2, verifier="naive",
           acceptance=0.5, se=0.01, alpha_star=0.6, gap_pct=16.7, n_positions=3)


def _run(tmp_path, *rows):
    with JsonlWriter(tmp_path / "acceptance.jsonl", {}, 0) as w:
        w.write(**{**ROW, "verifier": "alpha*", "acceptance": 0.6, "se": 0.0})
        for r in rows:
            w.write(**r)
    return tmp_path


def _err(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_missing_field_is_file_line(tmp_path, capsys):
    row = dict(ROW)
    del row["se"]
    _run(tmp_path, row)
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    assert "acceptance.jsonl:3: missing field 'se'" in _err(capsys)


def test_verifier_row_needs_alpha_star_and_numbers(tmp_path, capsys):
    row = dict(ROW)
    del row["gap_pct"]
    _run(tmp_path / "a", row)
    assert main(["report", str(tmp_path / "a"), "--no-plots"]) == 2
    assert "acceptance.jsonl:3: missing field 'gap_pct'" in _err(capsys)
    _run(tmp_path / "b", {**ROW, "acceptance": "high"})
    assert main(["report", str(tmp_path / "b"), "--no-plots"]) == 2
    assert "acceptance.jsonl:3: field 'acceptance' must be a number" in _err(capsys)


def test_corrupt_line_is_file_line(tmp_path, capsys):
    run = _run(tmp_path, ROW, ROW)
    lines = (run / "acceptance.jsonl").read_text().splitlines()
    lines[2] = lines[2][:20]
    (run / "acceptance.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(run), "--no-plots"]) == 2
    assert "acceptance.jsonl:3: not valid JSON" in _err(capsys)


def test_out_that_is_a_file_and_run_dir_that_is_a_file(tmp_path, capsys):
    run = _run(tmp_path / "run", ROW)
    f = tmp_path / "f"
    f.write_text("")
    assert main(["report", str(run), "--out", str(f), "--no-plots"]) == 2
    assert str(f) in _err(capsys)
    assert main(["report", str(f)]) == 2
    assert "is a file" in _err(capsys)


def test_summary_is_public_and_reads_new_names(tmp_path):
    run = _run(tmp_path, ROW)
    _, rows = read_jsonl(run / "acceptance.jsonl")
    text = report.summary(rows, "acceptance")
    assert "## Findings" in text and "0.500 ± 0.0100" in text
    with pytest.raises(ValueError, match="kind"):
        report.summary(rows, "nope")
    assert main(["report", str(run), "--no-plots"]) == 0
    assert json.loads((run / "acceptance.jsonl").read_text().splitlines()[1])["acceptance"] == 0.6
