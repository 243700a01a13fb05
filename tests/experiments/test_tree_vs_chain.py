"""benchmarks/tree_vs_chain.py on a synthetic study: chains against trees, rebuilt from its JSONL."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from multidraft.decoding.treeopt import CostProfile
from bench_loader import benchmark_module



@pytest.fixture(scope="module")
def tc():
    with benchmark_module("tree_vs_chain") as mod:
        yield mod


def _study(path: Path, a1, a2):
    rows = [{"type": "meta", "run_id": "r", "config": {}}]
    for law, ver, k, vals in [("iid", "alpha*", 1, a1), ("iid", "alpha*", 2, a2), ("iid", "specinfer", 2, a2)]:
        rows.append({"type": "row", "run_id": "r", "dataset": "toy", "t_target": 1.0, "t_draft": 1.0, "top_k": None,
                     "top_p": None, "law": law, "verifier": ver, "K": k, "values": list(map(float, vals))})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _profile(path: Path, free: bool):
    nodes = [1, 2, 4, 8, 16, 32]
    target = [0.1] * 6 if free else [0.1 * n for n in nodes]      # width free, or each node a full forward
    path.write_text(CostProfile(nodes, target, [1, 8], [0.01, 0.01]).to_json())


def test_branching_pays_only_when_width_is_cheap(tc, tmp_path):
    rng = np.random.default_rng(0)
    a1 = rng.uniform(0.2, 0.6, 200)
    a2 = np.minimum(1.0, a1 + 0.3)          # a second draft adds 0.3: worth a node only if nodes are cheap
    _study(tmp_path / "acc.jsonl", a1, a2)
    _profile(tmp_path / "free.json", True)
    _profile(tmp_path / "dear.json", False)
    out, md = tmp_path / "tc.jsonl", tmp_path / "tc.md"
    assert tc.main(["--acceptance", str(tmp_path / "acc.jsonl"), "--profiles",
                    f"{tmp_path / 'free.json'},{tmp_path / 'dear.json'}", "--max-nodes", "12", "--max-depth", "3",
                    "--out", str(out), "--markdown", str(md)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()][1:]
    got = {(r["profile"], r["verifier"]): r for r in rows}
    assert set(got) == {(p, v) for p in ("free", "dear") for v in ("SD (alpha*, K=1)", "specinfer", "alpha*")}
    for p in ("free", "dear"):
        assert got[(p, "SD (alpha*, K=1)")]["along_x_sd"] == pytest.approx(1.0)
        sd = got[(p, "SD (alpha*, K=1)")]
        assert sd["along"]["paths"] == [[0] * j for j in range(1, sd["along"]["depth"] + 1)]   # a chain
    assert got[("free", "alpha*")]["along_x_sd"] > 1.2
    assert any(len(p) == 1 and p[0] == 1 for p in got[("free", "alpha*")]["along"]["paths"])   # branches at the root
    assert got[("dear", "alpha*")]["along_x_sd"] < got[("free", "alpha*")]["along_x_sd"]
    # a tree that is a chain has the chain's rate: never below SD beyond rounding
    assert all(r["along_x_sd"] >= 1 - 1e-12 for r in rows)
    text = md.read_text()
    assert "## Summary" in text and "| free | x1 | measured | toy |" in text
    # the report is rebuilt from the JSONL alone
    md2 = tmp_path / "again.md"
    assert tc.main(["--summarize", str(out), "--markdown", str(md2)]) == 0
    assert md2.read_text() == text


def test_no_rows_is_a_clear_error(tc, tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text(json.dumps({"type": "meta", "run_id": "r"}) + "\n")
    with pytest.raises(SystemExit):
        tc.main(["--acceptance", str(tmp_path / "empty.jsonl")])
    assert "no rows with per-position values" in capsys.readouterr().err
