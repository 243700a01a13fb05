"""Per-node verify cost of ``optimal``: the lumped rule against the exact scan, interleaved.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/optimal_ab.py --store STORE [--rows 8] [--draws 6]
        [--repeats 5] [--ks 2,3,4,6,8] [--clock wall|thread] [--no-exact] [--out ab.jsonl]

On a shared machine two runs of ``node_cost.py`` minutes apart see different loads, so this
script times, call after call on the same node, ``specinfer``, ``optimal`` with ``head=None``
(the exact scan over all V tokens: the rule before issue 27) and ``optimal`` with its defaults
(head + lumped q/p bins), ``verify(p, q, drafts, validate=False)`` on one [V] row as
``benchmarks/node_cost.py`` calls it, on the same real rows (``node_cost.store_rows``). Per
(method, K): the median over repeats of the mean ms per node, and the ratio to ``specinfer``
of the same repeat (median over repeats). Also the exact acceptance gap of the lumped rule,
alpha* - sum_y min(p, r), mean and max over the rows (``last_fit.shortfall``).
``--clock thread`` times with ``time.thread_time`` (CPU time of this thread: on a machine whose
cores are shared, wall time also counts the waits for a core); ``--no-exact`` leaves out the
exact scan (150-400 ms a call on a loaded machine). ``--torch-route`` adds ``optimal_torch``: the
lumped rule with ``optimal.NUMPY_ON_CPU`` off, i.e. the batched-torch route that the first round
of issue 27 ran on CPU too (and that a GPU runs), timed on the same nodes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from multidraft._alloc import allocator_state, keep_freed_memory  # noqa: E402
from multidraft._validate import derive_seed  # noqa: E402
from multidraft import drafts as _drafts  # noqa: E402
from multidraft import verifiers as _verifiers  # noqa: E402
from multidraft.verifiers import optimal as _optimal  # noqa: E402
from multidraft.verifiers.optimal import Optimal  # noqa: E402
from _bench import CLOCKS, common_args, load_average, provenance  # noqa: E402
from node_cost import store_rows, synthetic_rows  # noqa: E402


class _TorchRoute(Optimal):
    """``optimal`` (lumped, defaults) with the numpy route switched off for its own calls."""

    def verify(self, *a, **kw):
        old, _optimal.NUMPY_ON_CPU = _optimal.NUMPY_ON_CPU, False
        try:
            return super().verify(*a, **kw)
        finally:
            _optimal.NUMPY_ON_CPU = old


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=ROOT / "runs/paper/positions/humaneval__tt1__td1__k0__p1.pt")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--draws", type=int, default=6)
    ap.add_argument("--ks", default="2,3,4,6,8")
    common_args(ap, repeats=5, threads=1, seed=0, clock="wall", out=None)
    ap.add_argument("--no-exact", action="store_true", help="leave out optimal with head=None (the exact scan)")
    ap.add_argument("--torch-route", action="store_true", help="also time the lumped rule on the torch route (optimal_torch)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the decoder does (multidraft._alloc; MULTIDRAFT_MALLOC=default: glibc's defaults)
    if args.store.is_file():
        TL, DL, src = store_rows(args.store, args.rows, args.seed)
    else:
        TL, DL, src = synthetic_rows(args.rows, 151_936, args.seed)
    P, Q = torch.softmax(TL, -1), torch.softmax(DL, -1)  # float32 rows, as the engine passes them
    methods = {"specinfer": _verifiers.get("specinfer"), "optimal_exact": Optimal(head=None), "optimal": Optimal()}
    if args.no_exact:
        del methods["optimal_exact"]
    if args.torch_route:
        methods["optimal_torch"] = _TorchRoute()
    clock = CLOCKS[args.clock]
    meta = {"kind": "meta", "benchmark": "optimal_ab", "rows": args.rows, "draws": args.draws, "repeats": args.repeats,
            "threads": args.threads, "clock": args.clock, "distributions": src, **provenance(),
            "load_average_before": load_average(), "allocator": allocator_state()}
    lines = [meta]
    print(f"V = {P.shape[-1]}, {args.rows} rows x {args.draws} draws, {args.repeats} repeats, {args.threads} thread(s), "
          f"{args.clock} clock; load {meta['load_average_before']}")
    nan = float("nan")
    print(f"{'K':>2} {'specinfer ms':>12} {'exact ms':>9} {'torch ms':>9} {'lumped ms':>9} {'exact/spec':>10} {'torch/spec':>10} {'lumped/spec':>11} "
          f"{'exact/lumped':>12} {'torch/lumped':>12} {'gap mean':>9} {'gap max':>9}")
    for k in [int(x) for x in args.ks.split(",")]:
        nodes = []
        for i in range(P.shape[0]):
            for d in range(args.draws):
                s = derive_seed(args.seed, i, d, rule="linear", weights=(1000, 10, 1))
                nodes.append((P[i], Q[i], _drafts.iid(Q[i], k).sample(torch.Generator().manual_seed(s)), s))
        per = {m: [] for m in methods}
        for rep in range(args.repeats + 1):
            tot = dict.fromkeys(methods, 0.0)
            for p, q, dr, s in nodes:
                for name, v in methods.items():
                    g = torch.Generator().manual_seed(s)
                    t0 = clock()
                    v.verify(p, q, dr, generator=g, law="iid", validate=False)
                    tot[name] += clock() - t0
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
               "exact_over_lumped": statistics.median([a / b for a, b in zip(per["optimal_exact"], per["optimal"])]) if "optimal_exact" in per else nan,
               "torch_over_numpy": statistics.median([a / b for a, b in zip(per["optimal_torch"], per["optimal"])]) if "optimal_torch" in per else nan,
               "gap_mean": sum(gaps) / len(gaps), "gap_max": max(gaps), "load_average": load_average()}
        lines.append(row)
        print(f"{k:>2} {med['specinfer']:>12.2f} {med.get('optimal_exact', nan):>9.2f} {med.get('optimal_torch', nan):>9.2f} {med['optimal']:>9.2f} "
              f"{ratio.get('optimal_exact', nan):>10.1f} {ratio.get('optimal_torch', nan):>10.1f} {ratio['optimal']:>11.2f} "
              f"{row['exact_over_lumped']:>12.1f} {row['torch_over_numpy']:>12.2f} {row['gap_mean']:>9.1e} {row['gap_max']:>9.1e}", flush=True)
    if args.out:
        args.out.write_text("".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    main()
