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
    from multidraft.experiments import compare as C

    monkeypatch.setattr(C, "EXACT_MAX_TUPLES", 0)
    rows = C.run(C.builtin_cases(), C.Settings(ks=(2,), laws=("iid",), verifiers=("nss",), samples=20_000), show_progress=False)
    exact = C.run(C.builtin_cases(), C.Settings(ks=(2,), laws=("iid",), verifiers=("nss",)), show_progress=False)
    monkeypatch.undo()
    for r in rows:
        if r["verifier"] == "nss":
            e = next(x for x in exact if x["verifier"] == "nss" and x["case"] == r["case"])
            assert r["method"].startswith("mc") and r["stderr"] > 0
            assert abs(r["acceptance"] - e["acceptance"]) <= 5 * r["stderr"]


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["compare", "--p", "missing.npy", "--q", "missing.npy"], "no such file"),
        (["compare", "--p", "x.npy"], "--p and --q go together"),
        (["compare", "--k", "0"], "every K must be >= 1"),
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
