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


def test_paired_difference_from_values():
    import numpy as np
    a, b = [0.9, 0.8, 0.7, 0.95], [0.85, 0.82, 0.6, 0.9]
    m, se, n = report.paired_difference({"values": a}, {"values": b})
    d = np.array(a) - np.array(b)
    assert n == 4 and m == pytest.approx(d.mean()) and se == pytest.approx(np.std(d, ddof=1) / 2)
    assert report.paired_difference({"values": a}, {"values": b[:3]}) is None
    assert report.paired_difference({}, {"values": b}) is None


NEW = dict(ROW, se=0.02, se_mc=0.005, gap=0.1, gap_se=0.03, gap_pct=16.7, gap_pct_se=5.0, values=[0.4, 0.5, 0.6],
           p_tail_max=8e-5, q_tail_max=9e-5, lump_bound_max=8e-5, eval_support=None)


def test_report_prints_bounds_paired_columns_and_old_rows(tmp_path):
    with JsonlWriter(tmp_path / "acceptance.jsonl", {}, 0) as w:
        w.write(**{**NEW, "verifier": "alpha*", "acceptance": 0.6, "se": 0.05, "se_mc": 0.0, "values": [0.5, 0.6, 0.7],
                   "lump_bound_mean": 5e-5})
        w.write(**{**NEW, "verifier": "specinfer", "values": [0.45, 0.5, 0.55]})
        w.write(**NEW)  # naive
    _, rows = read_jsonl(tmp_path / "acceptance.jsonl")
    text = report.summary(rows, "acceptance")
    assert "| **alpha*** | 0.600 |" in text  # alpha* exact to 1e-3 at full V: a number (lump bound mean 5e-5)
    assert "alpha* at full V: every cell exact to 0.001." in text
    assert "0.500 ± 0.0200 (16.7 ± 5.0%)" in text  # acceptance ± se over positions (paired gap ± gap_pct_se)
    assert "tail <= 9e-05 of the mass" in text and "<= 8e-05 at every position" in text
    assert "minus specinfer" in text
    d = report.paired_difference(NEW, {"values": [0.45, 0.5, 0.55]})
    assert f"{d[0]:+.4f} ± {d[1]:.4f}" in text and "WARNING" not in text and "†" not in text
    # --eval-support is reported loudly
    with JsonlWriter(tmp_path / "e" / "acceptance.jsonl", {}, 0) as w:
        w.write(**{**NEW, "verifier": "alpha*", "acceptance": 0.6, "eval_support": 64,
                   "eval_support_warning": "WARNING: --eval-support 64: relumped"})
        w.write(**{**NEW, "eval_support": 64})
    _, rows = read_jsonl(tmp_path / "e" / "acceptance.jsonl")
    text = report.summary(rows, "acceptance")
    assert "**WARNING: --eval-support 64: relumped**" in text and "evaluated with --eval-support 64" in text
    # an old run (no se_mc, gap_se, tails, bounds): still renders, with '-' and the Monte-Carlo-only mark
    old = _run(tmp_path / "old", ROW)
    _, rows = read_jsonl(old / "acceptance.jsonl")
    text = report.summary(rows, "acceptance")
    assert "0.600 ± -" in text and "0.500 ± 0.0100† (16.7 ± -%)" in text and "record no tail masses" in text
    assert main(["report", str(old), "--no-plots"]) == 0


def test_temperature_sweep_prints_paired_gaps(tmp_path):
    """The sweep tables give each verifier's gap to alpha* with its paired error, per temperature."""
    with JsonlWriter(tmp_path / "temperature.jsonl", {}, 0) as w:
        for tt, a, acc, gse in ((0.5, 0.90, 0.885, 0.002), (1.0, 0.80, 0.77, 0.004)):
            base = {**ROW, "t_target": tt, "K": 4}
            w.write(**{**base, "verifier": "alpha*", "acceptance": a, "se": 0.01})
            w.write(**{**base, "verifier": "specinfer", "acceptance": acc, "se": 0.01, "alpha_star": a,
                       "gap": a - acc, "gap_se": gse})
    _, rows = read_jsonl(tmp_path / "temperature.jsonl")
    text = report.summary(rows, "temperature")
    assert "target temperature sweep" in text and "Gap to alpha* in points" in text
    assert "| 0.5 | 1.50 ± 0.20 |" in text and "| 1 | 3.00 ± 0.40 |" in text


def _blocks_file(path, rows):
    with JsonlWriter(path, {}, 0) as w:
        for r in rows:
            w.write(**r)
    return path


def test_blocks_paired_with_a_second_baseline(tmp_path, capsys):
    """--blocks-baseline pairs every blocks row with another file's target-only rows, prompt by prompt."""
    row = dict(law="iid", K=2, depth=6, temperature=1.0, acceptance_rate=0.8)
    run = [dict(row, verifier="autoregressive", K=1, depth=0, prompt=p, tokens_per_s=2.0, block_efficiency=1.0) for p in ("a", "b")]
    run += [dict(row, verifier="specinfer", prompt="a", tokens_per_s=4.0, block_efficiency=3.0),
            dict(row, verifier="specinfer", prompt="b", tokens_per_s=6.0, block_efficiency=4.0)]
    _blocks_file(tmp_path / "run" / "blocks.jsonl", run)
    ref = _blocks_file(tmp_path / "quiet.jsonl", [dict(row, verifier="autoregressive", K=1, depth=0, prompt=p,
                                                       tokens_per_s=4.0, block_efficiency=1.0) for p in ("a", "b")])
    assert main(["report", str(tmp_path / "run"), "--no-plots", "--blocks-baseline", str(ref)]) == 0
    text = (tmp_path / "run" / "report.md").read_text()
    assert "Second baseline" in text and "target-only 4.00 ± 0.00 tokens/s on 2 prompt(s)" in text
    # vs its own baseline (2 tok/s): 2x and 3x -> 2.50x; vs the second (4 tok/s): 1x and 1.5x -> 1.25x
    line = next(l for l in text.splitlines() if l.startswith("| specinfer"))
    assert "| 2.50x ± " in line and line.rstrip().endswith("|") and "| 1.25x ± " in line
    capsys.readouterr()
    assert main(["report", str(tmp_path / "run"), "--no-plots", "--blocks-baseline", str(tmp_path / "none.jsonl")]) != 0
    assert "--blocks-baseline: no such file" in _err(capsys)


def test_one_mean_and_interval_nan_at_one_value(tmp_path):
    """One summary of decode rows (findings.mean_ci, used by decode_runs and the report): at n = 1
    the half-width of a 95% t-interval is undefined, NaN, and the report prints it as ``nan``."""
    import math

    from multidraft.experiments import decode_runs, findings

    assert decode_runs.mean_ci is findings.mean_ci
    m, ci = findings.mean_ci([3.0])
    assert m == 3.0 and math.isnan(ci)
    m, ci = findings.mean_ci([2.0, 4.0, None, float("nan")])
    assert m == 3.0 and ci == pytest.approx(findings.t95(2) * 2 ** 0.5 / 2 ** 0.5)
    assert all(math.isnan(x) for x in findings.mean_ci([]))
    row = dict(law="iid", K=2, depth=6, temperature=1.0, acceptance_rate=0.8, prompt="a")
    _blocks_file(tmp_path / "run" / "blocks.jsonl",
                 [dict(row, verifier="autoregressive", K=1, depth=0, tokens_per_s=2.0, block_efficiency=1.0),
                  dict(row, verifier="specinfer", tokens_per_s=4.0, block_efficiency=3.0)])
    assert main(["report", str(tmp_path / "run"), "--no-plots"]) == 0
    line = next(l for l in (tmp_path / "run" / "report.md").read_text().splitlines() if l.startswith("| specinfer"))
    assert "| 3.000 ± nan |" in line and "| 2.00x ± nan |" in line


def _alpha_rows(tmp_path, *alphas):
    """An acceptance file of alpha* rows (K = 2, 3, ...) as runs before the full-V fields wrote them."""
    with JsonlWriter(tmp_path / "acceptance.jsonl", {}, 0) as w:
        for k, a in enumerate(alphas, 2):
            w.write(**{**NEW, "verifier": "alpha*", "K": k, "se_mc": 0.0, "values": [0.5, 0.6, 0.7], **a})
    return tmp_path


def test_alpha_interval_rows_render_as_intervals_exact_rows_as_numbers(tmp_path):
    """An alpha* row whose full-V interval is wider than 1e-3 prints as that interval (rounded
    outward) with the table's widest width; one within 1e-3 prints as a number."""
    run = _alpha_rows(tmp_path,
                      dict(law="wor", acceptance=0.574, lump_bound_mean=0.062, lump_bound_max=0.9),  # wide
                      dict(law="wor", acceptance=0.6, lump_bound_mean=4e-4, lump_bound_max=0.03))   # 8e-4 wide
    _, rows = read_jsonl(run / "acceptance.jsonl")
    text = report.summary(rows, "acceptance")
    assert "| **alpha*** | 0.512-0.636 | 0.600 |" in text
    assert "1 of 2 cells are certified intervals, not exact to 0.001; widest 0.124 (K = 2: 0.512-0.636" in text
    assert main(["report", str(run), "--no-plots"]) == 0
    full = (run / "report.md").read_text()
    assert "## alpha* at full vocabulary" in full and "1 of 2 alpha* rows are exact to 0.001" in full
    assert "| acceptance | d | 1 | 1 | wor | 2 | 0.5740 | 0.512-0.636 | 0.1240 | 0.900 |" in full
    # outward rounding: the printed interval contains the certified one
    assert report._outward(0.5119999, 0.6360001) == "0.511-0.637" and report._outward(0.25, 0.75) == "0.250-0.750"


def test_legacy_alpha_rows_get_their_full_v_interval_on_reading(tmp_path):
    """Rows written before alpha_exact existed get it (and the interval) through read_jsonl:
    one-sided for iid and independent (with alpha_lower), two-sided for wor at K >= 2, cut to [0, 1]."""
    run = _alpha_rows(tmp_path,
                      dict(law="iid", acceptance=0.7, lump_bound_mean=0.002),
                      dict(law="independent", acceptance=0.7, alpha_lower=0.6995, lump_bound_mean=0.0004),
                      dict(law="wor", acceptance=0.9995, lump_bound_mean=0.01))
    with open(run / "acceptance.jsonl", "a") as f:  # a run before lump bounds: no interval, left as it is
        f.write(json.dumps({**ROW, "type": "row", "run_id": read_jsonl(run / "acceptance.jsonl")[0]["run_id"],
                            "verifier": "alpha*", "K": 9, "acceptance": 0.6}) + "\n")
    assert "alpha_exact" not in (run / "acceptance.jsonl").read_text()
    _, rows = read_jsonl(run / "acceptance.jsonl")
    iid, ind, wor, old = rows
    assert (iid["alpha_full_lower"], iid["alpha_full_upper"], iid["alpha_exact"]) == (pytest.approx(0.698), 0.7, False)
    assert (ind["alpha_full_lower"], ind["alpha_full_upper"], ind["alpha_exact"]) == (pytest.approx(0.6991), 0.7, True)
    assert (wor["alpha_full_lower"], wor["alpha_full_upper"], wor["alpha_exact"]) == (pytest.approx(0.9895), 1.0, False)
    assert "alpha_exact" not in old and "alpha_full_lower" not in old
    text = report.summary(rows, "acceptance")
    for cells in ("0.697-0.700 |  |  | 0.600 ± - |", " | 0.700 |  |  |", " |  | 0.989-1.000 |  |"):  # iid, independent, wor
        assert "| **alpha*** | " + cells in text
    # a row that carries the fields keeps them (the runner's per-position interval is never recomputed)
    run2 = _alpha_rows(tmp_path / "new", dict(law="iid", acceptance=0.7, lump_bound_mean=0.002,
                                              alpha_full_lower=0.6995, alpha_full_upper=0.7, alpha_exact=True))
    (row,) = read_jsonl(run2 / "acceptance.jsonl")[1]
    assert row["alpha_exact"] is True and row["alpha_full_lower"] == 0.6995
    # a damaged row is left to the schema check, never given an interval
    run3 = _alpha_rows(tmp_path / "bad", dict(law="iid", acceptance=0.7, lump_bound_mean=-1.0))
    (row,) = read_jsonl(run3 / "acceptance.jsonl")[1]
    assert "alpha_exact" not in row
