"""benchmarks/gpu_verify.py (issue 27 item 6) works: a tiny CPU run through --device cpu prints a
row for every verifier it times and a softmax reference; without CUDA the default device
refuses with a message and status 2. The GPU run itself is never part of the tests."""
from __future__ import annotations

import json

import pytest
import torch
from bench_loader import benchmark_module



def load():
    with benchmark_module("gpu_verify") as mod:
        return mod


def test_gpu_verify_runs_tiny_on_cpu(tmp_path, capsys):
    mod = load()
    out = tmp_path / "g.jsonl"
    rc = mod.main(["--device", "cpu", "--vocab", "48", "--batches", "1,2", "--ks", "2", "--repeats", "1",
                   "--verifiers", "specinfer,spectr,khisti_is", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "torch.softmax" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["kind"] == "meta" and rows[0]["device"] == "cpu"
    got = {(r["verifier"], r["B"], r["K"]) for r in rows[1:]}
    assert got == {(n, b, 2) for n in ("specinfer", "spectr", "khisti_is") for b in (1, 2)}
    assert all(r["ms_per_node"] > 0 for r in rows[1:])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_gpu_verify_without_cuda_says_so(capsys):
    assert load().main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err
