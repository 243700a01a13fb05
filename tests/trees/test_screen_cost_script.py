"""benchmarks/screen_cost.py (issue 27, item 5) runs on a small position store above SCREEN_V: a row
per pair with the rhos the screen leaves (refining never leaves more) and the primitives' line."""
from __future__ import annotations

import json

import torch
from bench_loader import benchmark_module

from multidraft.experiments import store


def test_screen_cost_on_a_small_store(tmp_path, capsys):
    V, n = 5000, 3
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(n, V, generator=g, dtype=torch.float64) * 3
    lp[:, 0] += 12.0  # a heavy head token, as on real code rows
    P = torch.softmax(lp, -1)
    Q = torch.softmax(lp + 0.5 * torch.randn(n, V, generator=g, dtype=torch.float64), -1)
    info = {"dataset": "synthetic", "V": V, "t_target": 1.0, "t_draft": 1.0,
            "settings": {"top_k": None, "top_p": None, "eps": 1e-6}}
    path = tmp_path / "s.pt"
    store.save(store.from_rows(store.truncate(P, Q, eps=1e-6, k_max=8), info), path)
    out = tmp_path / "screen.jsonl"
    with benchmark_module("screen_cost") as mod:
        assert mod.main(["--store", str(path), "--rows", "3", "--k", "2", "--repeats", "1", "--out", str(out)]) == 0
        assert mod.main(["--store", str(tmp_path / "missing.pt")]) == 2
    text = capsys.readouterr()
    assert "primitives at V = 5000" in text.out and "no position store" in text.err
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0]["kind"] == "meta" and rows[0]["V"] == V and rows[0]["k"] == 2
    pairs = [r for r in rows if r["kind"] == "row"]
    assert len(pairs) == 3
    assert all(1 <= r["rhos_refined"] <= r["rhos_unrefined"] for r in pairs)
    (prim,) = [r for r in rows if r["kind"] == "primitives"]
    assert prim["histogram_same_bits"] and prim["V"] == V
