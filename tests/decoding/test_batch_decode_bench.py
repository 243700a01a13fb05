"""benchmarks/batch_decode.py runs on the tiny pair and writes its rows (never timings asserted)."""
import json

import pytest
from bench_loader import benchmark_module


def test_batch_decode_bench_tiny(tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "bd.jsonl"
    import torch

    n = torch.get_num_threads()
    try:
        with benchmark_module("batch_decode") as mod:
            mod.main(["--lanes", "1,2", "--max-new-tokens", "4", "--reps", "1", "--out", str(out)])
    finally:
        torch.set_num_threads(n)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0]["type"] == "meta" and rows[0]["config"]["pair"] == "tiny" and "versions" in rows[0]
    assert [r["lanes"] for r in rows[1:]] == [1, 2]
    assert all(r["tokens"] == 4 * r["lanes"] and r["lanes_differ"] == 0 for r in rows[1:])
    assert "speedup" in capsys.readouterr().out
