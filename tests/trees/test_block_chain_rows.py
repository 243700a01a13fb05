"""Block verification's lazy chain (``trees.block.ChainRows``): entries read without converting a
row are the float64 rows' entries bit for bit, the weights need no row converted, and a scan
that keeps the leaf converts the leaf's target row only; ``benchmarks/block_chain.py`` runs."""
from __future__ import annotations


import torch

from multidraft.trees import block
from multidraft.trees._check import row64
from bench_loader import benchmark_module



def _rows(n, V, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.softmax(3.0 * torch.randn(V, generator=g), -1).to(dtype) for _ in range(n)]  # [V] each


def test_entries_are_the_float64_rows_entries_bit_for_bit():
    for dtype in (torch.float32, torch.float64):
        raw = _rows(3, 5000, 1, dtype)
        rows = block.ChainRows(raw)
        for i in range(3):
            for x in (0, 17, 4999):
                assert rows.at(i, x) == float(row64(raw[i])[x])
        if dtype == torch.float64:
            assert all(rows[i] is raw[i] for i in range(3))  # float64 rows are used as given
            continue
        assert not rows._rows  # nothing converted to read them
        assert torch.equal(rows[1], row64(raw[1])) and list(rows._rows) == [1]


def test_the_scan_converts_only_the_rows_it_reads():
    V, L = 3000, 3
    ps = _rows(L + 1, V, 2)
    qs = [p.clone() for p in ps[:L]]  # q = p at every prefix: every a_i = 1, the leaf is always kept
    xs = [int(torch.argmax(q)) for q in qs]
    prs, qrs = block.ChainRows(ps), block.ChainRows(qs)
    a = block.chain_keeps(prs, qrs, xs)
    assert a == [1.0] * (L + 1) and not prs._rows and not qrs._rows
    tau, y = block.scan_verify(a, prs, qrs, torch.Generator().manual_seed(0))
    assert tau == L and 0 <= y < V
    assert list(prs._rows) == [L] and not qrs._rows
    # the lists of rows the other rules pass give the same scan
    same = block.scan_verify(block.chain_keeps(ps, qs, xs), [row64(p) for p in ps], [row64(q) for q in qs],
                             torch.Generator().manual_seed(0))
    assert same == (tau, y)


def test_the_benchmark_runs(capsys):
    n = torch.get_num_threads()
    try:
        with benchmark_module("block_chain") as mod:
            assert mod.main(["--depths", "2", "--trees", "1", "--repeats", "1", "--vocab", "64"]) == 0
    finally:
        torch.set_num_threads(n)
    out = capsys.readouterr().out
    assert out.startswith("depth 2, V = 64, float32: median thread time per verify: all ") and "(n=10)" in out
