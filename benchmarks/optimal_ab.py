"""Per-node verify cost of ``optimal``: the lumped rule against the exact scan, interleaved.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/optimal_ab.py --store STORE [--rows 8] [--draws 6]
        [--repeats 5] [--ks 2,3,4,6,8] [--out ab.jsonl]

On a shared machine two runs of ``node_cost.py`` minutes apart see different loads, so this
script times, call after call on the same node, ``specinfer``, ``optimal`` with ``head=None``
(the exact scan over all V tokens: the rule before issue 27) and ``optimal`` with its defaults
(head + lumped q/p bins), ``verify(p, q, drafts, validate=False)`` on one [V] row as
``benchmarks/node_cost.py`` calls it, on the same real rows (``node_cost.store_rows``). Per
(method, K): the median over repeats of the mean ms per node, and the ratio to ``specinfer``
of the same repeat (median over repeats). Also the exact acceptance gap of the lumped rule,
alpha* - sum_y min(p, r), mean and max over the rows (``last_fit.shortfall``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from multidraft import drafts as _drafts  # noqa: E402
from multidraft import verifiers as _verifiers  # noqa: E402
from multidraft.verifiers.optimal import Optimal  # noqa: E402
from node_cost import store_rows, synthetic_rows  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=ROOT / "runs/paper/positions/humaneval__tt1__td1__k0__p1.pt")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--draws", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ks", default="2,3,4,6,8")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.store.is_file():
        TL, DL, src = store_rows(args.store, args.rows, args.seed)
    else:
        TL, DL, src = synthetic_rows(args.rows, 151_936, args.seed)
    P, Q = torch.softmax(TL, -1), torch.softmax(DL, -1)  # float32 rows, as the engine passes them
    methods = {"specinfer": _verifiers.get("specinfer"), "optimal_exact": Optimal(head=None), "optimal": Optimal()}
    meta = {"kind": "meta", "benchmark": "optimal_ab", "rows": args.rows, "draws": args.draws, "repeats": args.repeats,
            "threads": args.threads, "distributions": src, "load_average_before": list(os.getloadavg())}
    lines = [meta]
    print(f"V = {P.shape[-1]}, {args.rows} rows x {args.draws} draws, {args.repeats} repeats, {args.threads} thread(s); load {meta['load_average_before']}")
    print(f"{'K':>2} {'specinfer ms':>12} {'exact ms':>9} {'lumped ms':>9} {'exact/spec':>10} {'lumped/spec':>11} {'exact/lumped':>12} {'gap mean':>9} {'gap max':>9}")
    for k in [int(x) for x in args.ks.split(",")]:
        nodes = []
        for i in range(P.shape[0]):
            for d in range(args.draws):
                g = torch.Generator().manual_seed(args.seed * 1000 + i * 10 + d)
                nodes.append((P[i], Q[i], _drafts.iid(Q[i], k).sample(g), args.seed * 1000 + i * 10 + d))
        per = {m: [] for m in methods}
        for rep in range(args.repeats + 1):
            tot = dict.fromkeys(methods, 0.0)
            for p, q, dr, s in nodes:
                for name, v in methods.items():
                    g = torch.Generator().manual_seed(s)
                    t0 = time.perf_counter()
                    v.verify(p, q, dr, generator=g, law="iid", validate=False)
                    tot[name] += time.perf_counter() - t0
            if rep:  # the first repeat warms up
                for name in methods:
                    per[name].append(1e3 * tot[name] / len(nodes))
        gaps = []
        v = methods["optimal"]
        for i in range(P.shape[0]):
            gaps.append(float(v.fit(P[i], Q[i], k).shortfall))
        med = {m: statistics.median(x) for m, x in per.items()}
        ratio = {m: statistics.median([a / b for a, b in zip(per[m], per["specinfer"])]) for m in methods}
        row = {"kind": "k", "k": k, "ms": med, "ms_repeats": per, "ratio_to_specinfer": ratio,
               "exact_over_lumped": statistics.median([a / b for a, b in zip(per["optimal_exact"], per["optimal"])]),
               "gap_mean": sum(gaps) / len(gaps), "gap_max": max(gaps), "load_average": list(os.getloadavg())}
        lines.append(row)
        print(f"{k:>2} {med['specinfer']:>12.2f} {med['optimal_exact']:>9.2f} {med['optimal']:>9.2f} {ratio['optimal_exact']:>10.1f} "
              f"{ratio['optimal']:>11.1f} {row['exact_over_lumped']:>12.1f} {row['gap_mean']:>9.1e} {row['gap_max']:>9.1e}", flush=True)
    if args.out:
        args.out.write_text("".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    main()
