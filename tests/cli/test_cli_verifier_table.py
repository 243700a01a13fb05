import json

import numpy as np
import pytest

from multidraft.cli import main
from multidraft.experiments.records import read_jsonl


def test_compare_builtin_table(capsys):
    assert main(["compare", "--k", "1,2", "--laws", "iid,wor"]) == 0
    out = capsys.readouterr().out
    assert "case peaked" in out and "case flat" in out and "naive" in out and "alpha*" in out


def test_compare_user_files_json_and_jsonl(tmp_path, capsys):
    p = np.array([0.1, 0.2, 0.3, 0.4])
    q = np.array([0.4, 0.3, 0.2, 0.1])
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "q.npy", q)
    out_file = tmp_path / "rows.jsonl"
    rc = main(["compare", "--p", str(tmp_path / "p.npy"), "--q", str(tmp_path / "q.npy"), "--k", "1",
               "--laws", "iid", "--json", "--out", str(out_file), "--seed", "3"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    naive = next(r for r in rows if r["verifier"] == "naive")
    assert naive["acceptance"] == pytest.approx(1 - 0.5 * np.abs(p - q).sum(), abs=1e-12)
    meta, saved = read_jsonl(out_file)
    assert meta["seed"] == 3 and "torch" in meta["versions"] and len(saved) == len(rows)


def test_compare_monte_carlo_path(tmp_path, capsys, monkeypatch):
    from multidraft.experiments import verifier_table as C

    monkeypatch.setattr(C, "EXACT_MAX_TUPLES", 0)
    rows = C.run(C.builtin_cases(), C.CompareConfig(ks=(2,), laws=("iid",), verifiers=("nss",), samples=20_000), show_progress=False)
    exact = C.run(C.builtin_cases(), C.CompareConfig(ks=(2,), laws=("iid",), verifiers=("nss",)), show_progress=False)
    monkeypatch.undo()
    for r in rows:
        if r["verifier"] == "nss":
            e = next(x for x in exact if x["verifier"] == "nss" and x["case"] == r["case"])
            assert r["method"].startswith("mc") and r["se"] > 0
            assert abs(r["acceptance"] - e["acceptance"]) <= 5 * r["se"]


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["compare", "--p", "missing.npy", "--q", "missing.npy"], "no such file"),
        (["compare", "--p", "x.npy"], "--p and --q go together"),
        (["compare", "--k", "0"], "--k must be >= 1"),
        (["compare", "--laws", "bogus"], "unknown draft law"),
        (["compare", "--verifiers", "nope"], "unknown verifier"),
    ],
)
def test_compare_user_errors(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_compare_rejects_unnormalised_file(tmp_path, capsys):
    np.save(tmp_path / "p.npy", np.array([0.5, 0.6]))
    np.save(tmp_path / "q.npy", np.array([0.5, 0.5]))
    assert main(["compare", "--p", str(tmp_path / "p.npy"), "--q", str(tmp_path / "q.npy")]) == 2
    assert "p must sum to 1" in capsys.readouterr().err


def _one_line(capsys):
    err = capsys.readouterr().err
    lines = [l for l in err.strip().splitlines() if "error" in l]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def test_compare_out_that_is_a_directory(tmp_path, capsys):
    assert main(["compare", "--k", "1", "--laws", "iid", "--out", str(tmp_path)]) == 2
    line = _one_line(capsys)
    assert str(tmp_path) in line and "is a directory" in line


def test_compare_out_is_bound_to_its_settings(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    base = ["compare", "--laws", "iid", "--verifiers", "naive,specinfer", "--out", str(out), "--json"]
    assert main(base + ["--k", "1"]) == 0
    _, first = read_jsonl(out)
    capsys.readouterr()
    assert main(base + ["--k", "1", "--samples", "1000"]) == 2  # another setting: refused, naming it
    assert "samples 200000 -> 1000" in _one_line(capsys)
    assert main(base + ["--k", "1,2"]) == 0  # more K: only the missing rows are appended
    _, rows = read_jsonl(out)
    assert rows[: len(first)] == first and {r["K"] for r in rows[len(first):]} == {2}
    keys = [(r["case"], r["law"], r["K"], r["verifier"]) for r in rows]
    assert len(keys) == len(set(keys))
    assert all({"law", "K", "acceptance", "se"} <= set(r) and "draft_law" not in r and "stderr" not in r for r in rows)


def test_compare_sizes_first(capsys):
    from multidraft.experiments import verifier_table as C

    cases = C.builtin_cases()
    pl = C.plan(cases, C.CompareConfig(ks=(8,), laws=("iid",)))
    assert all(c.alpha_method == "dual" and c.tuples == 6**8 for c in pl.cells)
    assert all(m == "mc" for c in pl.cells for _, m in c.verifiers)
    assert all("lp_optimal" not in [n for n, _ in c.verifiers] for c in pl.cells)
    assert any("skipped lp_optimal" in n for n in pl.notes)
    # asked for by name where its LP cannot be built: refused up front, one line
    assert main(["compare", "--k", "50", "--laws", "iid", "--verifiers", "lp_optimal"]) == 2
    line = _one_line(capsys)
    assert "lp_optimal" in line and "10^38" in line
    # the dual stands in for the LP and says so in the method column
    rows = C.run(cases, C.CompareConfig(ks=(8,), laws=("iid",), verifiers=("naive",), samples=10), show_progress=False)
    a = [r for r in rows if r["verifier"] == "alpha*"]
    assert a and all(r["method"] == "dual (LP too large)" and r["acceptance"] is not None for r in a)
    assert "LP being too large" in C.format_table(rows)
