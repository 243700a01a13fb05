"""Damaged data refused with the file and line (issue 29, item 4), as a hostile user would try it.

Every damaged file or row gives one line naming the file (and the line, for JSONL rows), a
non-zero exit of the CLI and no traceback; ``report`` and ``compare-runs`` leave the damaged
rows out (saying which and why) and still render the good ones. A run directory is held by
one process at a time; a refused resume prints both differing values in full; adding K values
to a run extends it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import multidraft
from multidraft.cli import main
from multidraft.experiments import records, store
from multidraft.experiments.records import (
    JsonlWriter,
    check_binding,
    lock_run_dir,
    read_jsonl,
)

SRC = str(Path(multidraft.__file__).resolve().parents[1])

ALPHA_ROW = dict(dataset="d", t_target=1.0, t_draft=1.0, top_k=None, top_p=None, law="iid", K=2, verifier="alpha*",
                 acceptance=0.6, se=0.01, values=[0.5, 0.6, 0.7], n_positions=3)
GOOD = dict(ALPHA_ROW, verifier="naive", acceptance=0.5, alpha_star=0.6, gap_pct=16.7, values=[0.4, 0.5, 0.6])
BLOCK = dict(verifier="specinfer", law="iid", K=2, depth=3, temperature=1.0, prompt="p0", block_efficiency=2.5,
             tokens_per_s=10.0, acceptance_rate=0.6, new_tokens=8, target_calls=3, draft_calls=9, seconds=0.8)


def _one_line(err: str, *needles) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], err
    return lines[0]


def _write(path: Path, rows, config=None) -> Path:
    with JsonlWriter(path, config or {}, 0) as w:
        for r in rows:
            w.write(**r)
    return path


def _raw_line(path: Path, text: str) -> int:
    """Append a raw line (what a hand edit or another tool could leave) with this file's run id; its line number."""
    meta, _ = read_jsonl(path)
    obj = text.replace("RUN_ID", meta["run_id"])
    with open(path, "a", encoding="utf-8") as f:
        f.write(obj + "\n")
    return len(path.read_text().splitlines())


# --- report: every damaged row class is skipped with file:line, the good rows still render -------------------
BAD_ROWS = {
    "acceptance null": (dict(GOOD, acceptance=None), "field 'acceptance' must be a number in [0, 1], got null"),
    "values a string": (dict(GOOD, values="x"), "field 'values' must be a list of numbers in [0, 1], got \"x\""),
    "values entry out of range": (dict(GOOD, values=[0.5, 2.0, 0.1]), "field 'values' must be a list of numbers in [0, 1], entry 1 is 2.0"),
    "acceptance above 1": (dict(GOOD, acceptance=1.5), "field 'acceptance' must be a number in [0, 1], got 1.5"),
    "acceptance below 0": (dict(GOOD, acceptance=-0.1), "field 'acceptance' must be a number in [0, 1], got -0.1"),
    "negative count": (dict(GOOD, n_positions=-3), "field 'n_positions' must be an integer >= 0, got -3"),
    "K zero": (dict(GOOD, K=0), "field 'K' must be an integer >= 1, got 0"),
    "K not an integer": (dict(GOOD, K=2.5), "field 'K' must be an integer >= 1, got 2.5"),
    "se a string": (dict(GOOD, se="small"), "field 'se' must be a number >= 0, got \"small\""),
    "negative se": (dict(GOOD, se=-0.01), "field 'se' must be a number >= 0, got -0.01"),
    "missing dataset": ({k: v for k, v in GOOD.items() if k != "dataset"}, "missing field 'dataset' (a string)"),
    "verifier a number": (dict(GOOD, verifier=7), "field 'verifier' must be a string, got 7"),
    # issue 41: a law the tables do not know was dropped from every table without a word
    "unknown law": (dict(GOOD, law="beam"), "field 'law' must be one of 'iid', 'wor', 'greedy', 'independent', got \"beam\""),
    "missing alpha_star": ({k: v for k, v in GOOD.items() if k != "alpha_star"}, "missing field 'alpha_star'"),
    "duplicated row": (dict(GOOD), "duplicate of line 3"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_report_skips_a_damaged_row_naming_file_line_and_field(case, tmp_path, capsys):
    bad, needle = BAD_ROWS[case]
    path = _write(tmp_path / "acceptance.jsonl", [ALPHA_ROW, GOOD, bad])
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err, f"{path}:4: ", needle, "row skipped")
    assert "1 damaged row(s) left out" in captured.out
    text = (tmp_path / "report.md").read_text()
    # the good rows are rendered; the damaged one is listed, not in the tables
    assert "| naive | 0.500 ± 0.0100" in text and "| **alpha*** | 0.600 ± - |" in text
    assert "## Rows left out" in text and line.split("multidraft report: ", 1)[1] in text


@pytest.mark.parametrize("raw, needle", [
    ('{"type": "row", "run_id": "RUN_ID", "dataset": "d", "t_target": 1.0, "t_draft": 1.0, "law": "iid", "K": 2, '
     '"verifier": "alpha*", "acceptance": NaN, "se": 0.0}', "field 'acceptance' must be a number in [0, 1], got NaN"),
    ('{"type": "row", "run_id": "RUN_ID", "dataset": "d", "t_target": Infinity, "t_draft": 1.0, "law": "wor", "K": 2, '
     '"verifier": "alpha*", "acceptance": 0.5, "se": 0.0}', "field 't_target' must be a number >= 0, got Infinity"),
    ('{"type": "row", "run_id": "RUN_ID", "dataset": "d", "t_target": 1.0, "t_draft": 1.0, "law": "wor", "K": true, '
     '"verifier": "alpha*", "acceptance": 0.5, "se": 0.0}', "field 'K' must be an integer >= 1, got true"),
])
def test_report_skips_non_finite_and_boolean_numbers(raw, needle, tmp_path, capsys):
    path = _write(tmp_path / "acceptance.jsonl", [ALPHA_ROW, GOOD])
    n = _raw_line(path, raw)
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    _one_line(capsys.readouterr().err, f"{path}:{n}: ", needle)


BAD_BLOCKS = {
    "block efficiency null": (dict(BLOCK, block_efficiency=None), "field 'block_efficiency' must be a number >= 0, got null"),
    "negative tokens/s": (dict(BLOCK, tokens_per_s=-4.0), "field 'tokens_per_s' must be a number >= 0 or null, got -4.0"),
    "negative calls": (dict(BLOCK, target_calls=-1), "field 'target_calls' must be an integer >= 0, got -1"),
    "prompt a number": (dict(BLOCK, prompt=3), "field 'prompt' must be a string, got 3"),
    "acceptance rate above 1": (dict(BLOCK, acceptance_rate=1.2), "field 'acceptance_rate' must be a number in [0, 1] or null"),
    "duplicated run": (dict(BLOCK), "duplicate of line 2"),
}


@pytest.mark.parametrize("case", list(BAD_BLOCKS))
def test_report_skips_damaged_blocks_rows(case, tmp_path, capsys):
    bad, needle = BAD_BLOCKS[case]
    path = _write(tmp_path / "blocks.jsonl", [BLOCK, dict(BLOCK, prompt="p1", block_efficiency=3.5), bad])
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    _one_line(capsys.readouterr().err, f"{path}:4: ", needle)
    line = next(x for x in (tmp_path / "report.md").read_text().splitlines() if x.startswith("| specinfer"))
    assert "| 2 | 3.000 ± " in line  # the two good prompts, mean block efficiency 3


@pytest.mark.parametrize("config, needle", [
    (None, "meta row: field 'config' must be an object, got null"),
    ([1, 2], "meta row: field 'config' must be an object, got [1, 2]"),
    ({"models": "x"}, "meta row: config: field 'models' must be an object or null, got \"x\""),
    ({"eps": "tiny"}, "meta row: config: field 'eps' must be a number in [0, 1] or null, got \"tiny\""),
])
def test_report_with_a_damaged_meta_row_renders_the_rows(config, needle, tmp_path, capsys):
    path = _write(tmp_path / "acceptance.jsonl", [ALPHA_ROW, GOOD])
    lines = path.read_text().splitlines()
    meta = json.loads(lines[0])
    meta["config"] = config
    path.write_text("\n".join([json.dumps(meta)] + lines[1:]) + "\n")
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    _one_line(capsys.readouterr().err, f"{path}:1: ", needle)
    assert "0.500 ± 0.0100" in (tmp_path / "report.md").read_text()


def test_report_stage_rows_and_blocks_baseline_are_checked(tmp_path, capsys):
    _write(tmp_path / "acceptance.jsonl", [ALPHA_ROW, GOOD])
    stages = _write(tmp_path / "stages.jsonl", [dict(stage="collect", seconds=60.0, complete=True, config=None),
                                               dict(stage="acceptance", seconds="long", complete=True)])
    base = _write(tmp_path / "base.jsonl", [dict(BLOCK, verifier="autoregressive", tokens_per_s="fast"),
                                            dict(BLOCK, verifier="autoregressive", prompt="p0", tokens_per_s=5.0)])
    _write(tmp_path / "blocks.jsonl", [BLOCK])
    assert main(["report", str(tmp_path), "--no-plots", "--blocks-baseline", str(base)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2, err
    assert f"{stages}:3: field 'seconds' must be a number >= 0 or null" in err
    assert f"{base}:2: field 'tokens_per_s' must be a number >= 0 or null" in err
    assert "| collect | - | 60 |" in (tmp_path / "report.md").read_text()


def test_rows_without_values_are_named_not_dropped_silently(tmp_path, capsys):
    rows = [{k: v for k, v in r.items() if k != "values"} for r in (ALPHA_ROW, GOOD)]
    _write(tmp_path / "acceptance.jsonl", rows)
    assert main(["report", str(tmp_path), "--no-plots"]) == 0  # valid rows of an older run: a note, not an error
    out = capsys.readouterr().out
    assert "2 of 2 rows have no per-position values (field 'values'" in out and "claims table" in out
    assert "2 of 2 rows have no per-position values" in (tmp_path / "report.md").read_text()


def test_the_schema_spells_the_library_s_law_kinds():
    from multidraft.drafts import LAW_KINDS
    from multidraft.experiments.records import LAW_NAMES

    assert LAW_NAMES == LAW_KINDS


def test_report_with_only_damaged_rows_is_one_line(tmp_path, capsys):
    _write(tmp_path / "acceptance.jsonl", [dict(GOOD, acceptance=None)])
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    _one_line(capsys.readouterr().err, "acceptance.jsonl:2: field 'acceptance'", "no valid rows")


def test_library_readers_raise_the_first_damaged_row(tmp_path):
    from multidraft.experiments import report

    _write(tmp_path / "acceptance.jsonl", [ALPHA_ROW, dict(GOOD, values="x")])
    with pytest.raises(ValueError, match=r"acceptance.jsonl:3: field 'values'"):
        report.load_run(tmp_path)
    skipped: list = []
    run = report.load_run(tmp_path, skipped)
    assert len(run["acceptance.jsonl"][1]) == 1 and len(skipped) == 1
    # the readers and the writer share one schema: every field the writer's key names is in it
    from multidraft.experiments import acceptance

    assert acceptance.KEY == records.SCHEMAS["acceptance"].key
    assert set(acceptance.KEY) <= {f.name for f in records.SCHEMAS["acceptance"].fields} | {"top_k", "top_p"}


# --- compare-runs: the same schema ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad, needle", [
    (dict(GOOD, acceptance=None), "field 'acceptance' must be a number in [0, 1], got null"),
    (dict(GOOD, values="x"), "field 'values' must be a list of numbers"),
    (dict(GOOD, K=-2), "field 'K' must be an integer >= 1, got -2"),
    (dict(GOOD, law="beam"), "field 'law' must be one of"),
    (dict(GOOD, law="iid"), "duplicate of line 3"),
])
def test_run_diff_skips_damaged_rows(bad, needle, tmp_path, capsys):
    a = _write(tmp_path / "a.jsonl", [ALPHA_ROW, GOOD])
    b = _write(tmp_path / "b.jsonl", [ALPHA_ROW, GOOD, bad])
    assert main(["compare-runs", str(a), str(b)]) == 2
    captured = capsys.readouterr()
    _one_line(captured.err, f"{b}:4: ", needle)
    assert "2 cells; " in captured.out and "identical per-position values in 2 of 2 cells" in captured.out


def test_run_diff_skips_damaged_blocks_rows(tmp_path, capsys):
    a = _write(tmp_path / "a.jsonl", [BLOCK])
    b = _write(tmp_path / "b.jsonl", [BLOCK, dict(BLOCK, prompt="p1", target_calls="three")])
    assert main(["compare-runs", str(a), str(b)]) == 2
    captured = capsys.readouterr()
    _one_line(captured.err, f"{b}:3: field 'target_calls' must be an integer >= 0")
    assert "1 runs; " in captured.out and "1 in both" in captured.out


# --- position stores ---------------------------------------------------------------------------------------
def _store(tmp_path) -> tuple[Path, dict]:
    g = torch.Generator().manual_seed(3)
    P = torch.softmax(torch.randn(4, 12, generator=g, dtype=torch.float64) * 2, -1)
    Q = torch.softmax(torch.randn(4, 12, generator=g, dtype=torch.float64) * 2, -1)
    ps = store.from_rows(store.truncate(P, Q, eps=1e-3, k_max=3), {"dataset": "d", "t_target": 1.0, "t_draft": 1.0, "V": 12})
    path = tmp_path / "s.pt"
    store.save(ps, path)
    return path, torch.load(path, weights_only=True)


def _swap_offsets(d):
    o = d["offsets"].clone()
    o[1], o[2] = d["offsets"][2], d["offsets"][1]
    d["offsets"] = o


def _nan_row(d):
    p = d["p"].clone()
    p[int(d["offsets"][2]): int(d["offsets"][3])] = float("nan")
    d["p"] = p


def _shift_mass(d):
    q = d["q"].clone()
    q[int(d["offsets"][1])] += 0.25
    d["q"] = q


STORE_DAMAGE = {
    "swapped offsets": (_swap_offsets, "offsets decrease at position"),
    "2-D p": (lambda d: d.update(p=d["p"][:, None].expand(-1, 2).contiguous()), "p must be 1-D, got shape"),
    "NaN rows": (_nan_row, "position 2: p is NaN, infinite or outside [0, 1]"),
    "infinite tail": (lambda d: d.update(q_tail=torch.full_like(d["q_tail"], float("inf"))), "position 0: q_tail is NaN"),
    "float ids": (lambda d: d.update(ids=d["ids"].float()), "ids must hold integers, got dtype torch.float32"),
    "integer probabilities": (lambda d: d.update(q=d["q"].long()), "q must hold floating-point probabilities"),
    "ids beyond V": (lambda d: d.update(ids=d["ids"] + 100), "token ids must lie in [0, 12)"),
    "short tail": (lambda d: d.update(p_tail=d["p_tail"][:2]), "p_tail has 2 entries for 4 positions"),
    "offsets past the end": (lambda d: d.update(offsets=d["offsets"] + 1), "offsets must run from 0 to the"),
    "mass not 1": (_shift_mass, "position 1: q and its tail sum to"),
    "info not JSON": (lambda d: d.update(info="{nope"), "info is not JSON"),
    "info a list": (lambda d: d.update(info="[1, 2]"), "info must be an object"),
}


@pytest.mark.parametrize("case", list(STORE_DAMAGE))
def test_damaged_position_store_is_one_value_error_naming_the_file(case, tmp_path):
    path, d = _store(tmp_path)
    assert store.load(path) is not None  # the undamaged store loads
    damage, needle = STORE_DAMAGE[case]
    damage(d)
    torch.save(d, path)
    with pytest.raises(ValueError) as e:
        store.load(path)
    msg = str(e.value)
    assert str(path) in msg and needle in msg and "\n" not in msg


# --- .npy / .npz inputs of compare and bound --------------------------------------------------------------
def _arrays(tmp_path) -> dict:
    d = tmp_path
    np.save(d / "p.npy", np.array([0.5, 0.3, 0.2]))
    np.save(d / "q.npy", np.array([0.2, 0.3, 0.5]))
    np.savez(d / "one.npz", a=np.array([0.5, 0.3, 0.2]))
    np.savez(d / "two.npz", a=np.array([0.5, 0.5]), b=np.array([0.5, 0.5]))
    np.save(d / "empty.npy", np.zeros(0))
    np.save(d / "p2d.npy", np.full((2, 3), 1 / 3))
    np.save(d / "q3d.npy", np.full((1, 2, 3), 1 / 3))
    np.save(d / "nan.npy", np.array([np.nan, 0.5, 0.5]))
    np.save(d / "text.npy", np.array(["a", "b", "c"]))
    np.save(d / "bool.npy", np.array([True, False, False]))
    np.save(d / "objects.npy", np.array([{"a": 1}, 2, 3], dtype=object), allow_pickle=True)
    np.save(d / "sum.npy", np.array([0.5, 0.5, 0.5]))
    np.save(d / "short.npy", np.array([0.5, 0.5]))
    (d / "garbage.npy").write_bytes(b"\x93NUMPY garbage")
    (d / "adir.npy").mkdir()
    return d


BAD_ARRAYS = [
    ("two.npz", "p", "is an .npz archive of 2 arrays (a, b)"),
    ("empty.npy", "p", "is empty (shape (0,))"),
    ("empty.npy", "q", "is empty (shape (0,))"),
    ("p2d.npy", "p", "must hold a 1-D array, got shape (2, 3)"),
    ("nan.npy", "p", "has a NaN or infinite entry (at index 0)"),
    ("text.npy", "q", "holds dtype <U1; expected floating-point numbers"),
    ("bool.npy", "p", "holds dtype bool"),
    ("objects.npy", "p", "is not a readable .npy/.npz array"),
    ("garbage.npy", "q", "is not a readable .npy/.npz array"),
    ("sum.npy", "p", "must sum to 1"),
    ("short.npy", "q", "V = "),
    ("adir.npy", "p", "expected a .npy file, found a directory"),
    ("missing.npy", "q", "no such file"),
]


@pytest.mark.parametrize("command", ["compare", "bound"])
@pytest.mark.parametrize("name, flag, needle", BAD_ARRAYS)
def test_bad_array_input_is_one_line_naming_the_flag_and_file(command, name, flag, needle, tmp_path, capsys):
    d = _arrays(tmp_path)
    args = {"p": str(d / "p.npy"), "q": str(d / "q.npy"), flag: str(d / name)}
    assert main([command, "--p", args["p"], "--q", args["q"], "--k", "1"]) == 2
    line = _one_line(capsys.readouterr().err, name, needle)
    if name != "short.npy":
        assert f"--{flag}" in line
    assert "allow_pickle" not in line  # numpy's advice to unpickle is never relayed


def test_bound_takes_a_2d_q_but_not_3d_and_one_array_npz_works(tmp_path, capsys):
    d = _arrays(tmp_path)
    assert main(["bound", "--p", str(d / "p.npy"), "--q", str(d / "q3d.npy"), "--k", "1"]) == 2
    _one_line(capsys.readouterr().err, "--q", "q3d.npy", "must hold a 1-D or 2-D array, got shape (1, 2, 3)")
    assert main(["bound", "--p", str(d / "one.npz"), "--q", str(d / "q.npy"), "--k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["acceptance"] == pytest.approx(0.2 + 0.3 + 0.2)
    assert main(["compare", "--p", str(d / "one.npz"), "--q", str(d / "q.npy"), "--k", "1", "--json",
                 "--verifiers", "naive"]) == 0


# --- the run directory's lock -------------------------------------------------------------------------------
def _holder(run_dir: Path, lock: str = "lock_run_dir"):
    """A second process holding the lock of ``run_dir`` (or of a results file) until its stdin closes."""
    code = (f"import sys; from multidraft.experiments.records import {lock}\n"
            f"with {lock}({str(run_dir)!r}):\n    print('held', flush=True); sys.stdin.read()\n")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_naming_the_directory_and_holder(tmp_path):
    run = tmp_path / "run"
    proc = _holder(run)
    try:
        with pytest.raises(records.RunDirLocked) as e:
            with lock_run_dir(run):
                pass
        assert e.value.filename == str(run) and f"pid {proc.pid}" in str(e.value)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    with lock_run_dir(run):  # released when the holder exits
        with lock_run_dir(run):  # re-entrant in one process (paper -> acceptance)
            assert (run / records.LOCK_NAME).read_text().strip() == str(os.getpid())
    with lock_run_dir(run):  # and released on exit of the with block
        pass


def test_compare_out_is_held_by_one_process(tmp_path, capsys):
    """Issue 41: ``compare --out`` took no lock; two runs on one file could both write its rows."""
    out = tmp_path / "rows.jsonl"
    proc = _holder(out, "lock_results_file")
    try:
        assert main(["compare", "--k", "1", "--laws", "iid", "--verifiers", "naive", "--samples", "200",
                     "--out", str(out)]) != 0
        line = _one_line(capsys.readouterr().err, str(out), "results file is in use by another multidraft process",
                         f"pid {proc.pid}")
        assert line.startswith("multidraft compare: error:") and not out.exists()
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert main(["compare", "--k", "1", "--laws", "iid", "--verifiers", "naive", "--samples", "200",
                 "--out", str(out)]) == 0
    assert out.exists() and (tmp_path / f".{out.name}{records.LOCK_NAME}").exists()


@pytest.fixture
def tiny(tiny_resolved):
    return tiny_resolved


@pytest.fixture
def textfile(corpus_file):
    return corpus_file


def _argv(run_dir, textfile, *extra, k="1-2"):
    return ["experiment", "acceptance", str(run_dir), "--datasets", f"file:{textfile}", "--texts", "2",
            "--new-tokens", "4", "--k", k, "--draws", "10", "--verifiers", "naive", "--laws", "iid,wor",
            "--no-progress", *extra]


def test_concurrent_run_of_one_directory_is_refused_before_any_work(tiny, textfile, tmp_path, capsys):
    run = tmp_path / "run"
    proc = _holder(run)
    try:
        assert main(_argv(run, textfile)) != 0
        line = _one_line(capsys.readouterr().err, str(run), "in use by another multidraft process", f"pid {proc.pid}")
        assert line.startswith("multidraft experiment: error:")
        assert tiny == [] and not (run / "acceptance.jsonl").exists()  # no model loaded, nothing written
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


# --- resume diffs in full, extending K ----------------------------------------------------------------------------
def test_refused_resume_prints_both_values_in_full(tmp_path):
    long_a = "/models/" + "x" * 60 + "/target-a"
    long_b = "/models/" + "x" * 60 + "/target-b"
    cfg = {"models": {"target": long_a, "draft": "d"}, "positions": {"sample_temperature": 1.0, "new_tokens": 64},
           "note": "y" * 80 + "1"}
    f = tmp_path / "a.jsonl"
    _write(f, [dict(GOOD)], cfg)
    new = {"models": {"target": long_b, "draft": "d"}, "positions": {"sample_temperature": 0.7, "new_tokens": 64},
           "note": "y" * 80 + "2"}
    with pytest.raises(ValueError) as e:
        check_binding(f, new, 0)
    msg = str(e.value)
    assert f'models.target "{long_a}" -> "{long_b}"' in msg
    assert "positions.sample_temperature 1.0 -> 0.7" in msg and "new_tokens" not in msg
    assert f'note "{"y" * 80}1" -> "{"y" * 80}2"' in msg and "..." not in msg


def test_cli_resume_with_another_sample_temperature_shows_both(tiny, textfile, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_argv(run, textfile)) == 0
    capsys.readouterr()
    assert main(_argv(run, textfile, "--sample-temperature", "0.7")) == 2
    _one_line(capsys.readouterr().err, "positions.sample_temperature 1.0 -> 0.7")
    assert tiny == [1]


def test_extending_a_run_by_new_k_values_works(tiny, textfile, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_argv(run, textfile, k="1-2")) == 0
    before = (run / "acceptance.jsonl").read_text()
    stores = sorted((run / "positions").glob("*.pt"))
    assert [store.load(s).info["settings"]["k_max"] for s in stores] == [2]
    capsys.readouterr()
    assert main(_argv(run, textfile, k="1-3")) == 0
    err = capsys.readouterr().err
    assert "collecting it again for K <= 3" in err and "Traceback" not in err
    after = (run / "acceptance.jsonl").read_text()
    assert after.startswith(before)  # the old rows are kept as they were
    _, rows = read_jsonl(run / "acceptance.jsonl")
    new = rows[len(before.splitlines()) - 1:]
    assert {r["K"] for r in new} == {3} and {(r["law"], r["verifier"]) for r in new} >= {("iid", "alpha*"), ("wor", "alpha*")}
    keys = [tuple(r[f] for f in records.SCHEMAS["acceptance"].key) for r in rows]
    assert len(set(keys)) == len(keys)
    ps = store.load(stores[0])
    assert ps.info["settings"]["k_max"] == 3 and ps.info["sources"] == json.loads(json.dumps(ps.info["sources"]))
    assert tiny == [1, 1]  # the models were loaded again for the wider stores
    # a smaller K set again needs nothing: the stores serve it
    assert main(_argv(run, textfile, k="2")) == 0 and tiny == [1, 1]
    assert main(["report", str(run), "--no-plots"]) == 0
    assert "K=3" in (run / "report.md").read_text()


def test_a_damaged_store_in_a_run_directory_is_one_line_before_any_model_loads(tiny, textfile, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_argv(run, textfile)) == 0
    path = next((run / "positions").glob("*.pt"))
    d = torch.load(path, weights_only=True)
    _nan_row(d)
    torch.save(d, path)
    capsys.readouterr()
    assert main(_argv(run, textfile, "--verifiers", "naive,specinfer")) == 2
    _one_line(capsys.readouterr().err, str(path), "is a damaged position store (position 2: p is NaN")
    assert tiny == [1]


def test_a_damaged_study_row_is_refused_naming_file_line(tmp_path):
    from multidraft.experiments.acceptance import read_along

    path = _write(tmp_path / "acceptance.jsonl", [ALPHA_ROW, GOOD, dict(GOOD, verifier="specinfer", values="x")])
    with pytest.raises(ValueError, match=r"acceptance.jsonl:4: field 'values' must be a list of numbers"):
        read_along(path, 1.0, 1.0)
    path = _write(tmp_path / "b.jsonl", [ALPHA_ROW, GOOD])
    assert set(read_along(path, 1.0, 1.0)) == {("d", "iid", "alpha*"), ("d", "iid", "naive")}
