"""Block verification of one chain at full vocabulary: milliseconds of thread time per ``verify``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/block_chain.py [--depths 3,8] [--trees 4] [--repeats 3]
        [--vocab 151936] [--dtype float32]

Chains of depth L with float32 rows (the decoder's, ``rows_checked`` set as the decoder sets it)
at V = 151,936: the draft row of a prefix is ``softmax(3 z)``, the target's ``softmax(3 z + 0.3 e)``
(z, e standard normal), so most steps keep the leaf and some scan back. For each depth, the
median thread time of ``trees.get('block').verify`` over ``--trees`` chains x 10 generator seeds x
``--repeats``, split by outcome: the leaf kept (the scan stops at once) or the scan went back.
Thread time, one thread: the figure is the code's, less the machine's load. To compare two
versions, run the script with each version's ``src`` on PYTHONPATH in the same session, e.g.
``git archive <commit> src | tar -x -C /tmp/old`` and ``PYTHONPATH=/tmp/old/src``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from multidraft import trees

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import common_args  # noqa: E402


def make_chain(L: int, V: int, seed: int, dtype=torch.float32) -> trees.DraftTree:
    g = torch.Generator().manual_seed(seed)
    tree = trees.chain(L).new_tree()
    rows: dict = {}
    i = 0
    for _ in range(L):
        z = 3.0 * torch.randn(V, generator=g)
        q = torch.softmax(z, -1).to(dtype)  # [V]
        tree.nodes[i].q = q
        t = int(torch.multinomial(q.double(), 1, generator=g))
        c = tree.add_drafts(i, [t])[0]
        rows[i] = torch.softmax(z + 0.3 * torch.randn(V, generator=g), -1).to(dtype)  # [V]
        i = c
    rows[i] = torch.softmax(3.0 * torch.randn(V, generator=g), -1).to(dtype)
    tree.set_target(lambda j: rows[j])
    tree.rows_checked = True
    return tree


def measure(L: int, V: int, n_trees: int, repeats: int, dtype) -> dict:
    rule = trees.get("block")
    chains = [make_chain(L, V, s, dtype) for s in range(n_trees)]
    for t in chains:  # warm: target rows filled, allocator settled
        rule.verify(t, torch.Generator().manual_seed(0))
    by: dict = {"leaf kept": [], "scan went back": []}
    for _ in range(repeats):
        for t in chains:
            for s in range(10):
                c = time.thread_time()
                v = rule.verify(t, torch.Generator().manual_seed(s))
                c = time.thread_time() - c
                by["leaf kept" if len(v.path) == L else "scan went back"].append(c)
    every = by["leaf kept"] + by["scan went back"]
    return {"all": every, **by}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depths", default="3,8")
    ap.add_argument("--trees", type=int, default=4)
    common_args(ap, repeats=3)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    dtype = getattr(torch, a.dtype)
    for L in (int(x) for x in a.depths.split(",")):
        got = measure(L, a.vocab, a.trees, a.repeats, dtype)
        cells = [f"{k} {1e3 * statistics.median(v):.3f} ms (n={len(v)})" for k, v in got.items() if v]
        print(f"depth {L}, V = {a.vocab:,}, {a.dtype}: median thread time per verify: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
