"""Where one ``optimal`` verify call spends its time, stage by stage (issue 27).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/optimal_stages.py --store STORE [--rows 8] [--draws 6]
        [--repeats 3] [--ks 2,4,8] [--route numpy|torch] [--clock thread|wall] [--out stages.jsonl]

Calls ``verify(p, q, drafts, validate=False)`` on single [V] float32 rows as
``benchmarks/node_cost.py`` does (the same store rows, ``node_cost.store_rows``; synthetic rows when
the store is missing) and times, with wrappers around the module's functions, the stages nested
inside it (each stage's time includes the stages it calls):

* ``prologue``: ``rows64`` of p and q (the base class's float64 normalisation);
* ``plan_lumped``: the whole lumped plan, with inside it ``head`` (the 64 tokens of largest p + q),
  ``bin_keys`` (the q/p bin of every token), ``units`` (unit rows, their plan, c and the bound;
  numpy route only) and ``unit_plan`` (the prefix scan, layers and level-race fit of the unit rows);
* ``rest``: the call minus prologue and plan (argument checks, scatter-adds of the bins, the race,
  the accept coin, a residual after a rejection).

``--route torch`` switches ``optimal.NUMPY_ON_CPU`` off (the batched torch route, as the first round
of issue 27 ran on CPU). Per K: the median over repeats of each stage's summed time / nodes, and
``specinfer``'s verify on the same nodes in the same repeats. ``--clock thread`` (default) times
with ``time.thread_time``, the CPU time of this thread (wall time on a shared machine counts waits).
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

from multidraft import drafts as _drafts  # noqa: E402
from multidraft._validate import derive_seed  # noqa: E402
from multidraft import verifiers as _verifiers  # noqa: E402
from multidraft.verifiers import base as _base  # noqa: E402
from multidraft.verifiers import optimal as O  # noqa: E402
from _bench import CLOCKS, common_args, load_average, provenance  # noqa: E402
from node_cost import store_rows, synthetic_rows  # noqa: E402

STAGES = {"prologue": (_base, "rows64"), "plan_lumped": (O, "_plan_lumped"), "head": (O, "_head_numpy"),
          "bin_keys": (O, "_bin_keys"), "units": (O, "_units_numpy"), "unit_plan": (O, "_plan")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=ROOT / "runs/paper/positions/humaneval__tt1__td1__k0__p1.pt")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--draws", type=int, default=6)
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--route", choices=("numpy", "torch"), default="numpy")
    common_args(ap, repeats=3, clock="thread", seed=0, out=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    clock = CLOCKS[args.clock]
    O.NUMPY_ON_CPU = args.route == "numpy"
    if args.store.is_file():
        TL, DL, src = store_rows(args.store, args.rows, args.seed)
    else:
        TL, DL, src = synthetic_rows(args.rows, 151_936, args.seed)
    P, Q = torch.softmax(TL, -1), torch.softmax(DL, -1)
    acc = {}

    def wrap(name, mod, fn):
        f = getattr(mod, fn)

        def timed(*a, **k):
            t0 = clock()
            try:
                return f(*a, **k)
            finally:
                acc[name] = acc.get(name, 0.0) + clock() - t0
        setattr(mod, fn, timed)

    for name, (mod, fn) in STAGES.items():
        wrap(name, mod, fn)
    v, s = O.Optimal(), _verifiers.get("specinfer")
    meta = {"kind": "meta", "benchmark": "optimal_stages", "route": args.route, "clock": args.clock, "rows": args.rows,
            "draws": args.draws, "repeats": args.repeats, "distributions": src, **provenance(),
            "load_average_before": load_average()}
    lines = [meta]
    print(f"V = {P.shape[-1]}, {args.rows} rows x {args.draws} draws, {args.repeats} repeats, 1 thread, {args.route} route, "
          f"{args.clock} clock; load {meta['load_average_before']}; ms per node (a stage includes the stages it calls)")
    cols = ["verify", "prologue", "plan_lumped", "head", "bin_keys", "units", "unit_plan", "rest", "specinfer"]
    print(f"{'K':>2} " + " ".join(f"{c:>11}" for c in cols))
    for k in [int(x) for x in args.ks.split(",")]:
        nodes = []
        for i in range(P.shape[0]):
            for d in range(args.draws):
                seed = derive_seed(args.seed, i, d, rule="linear", weights=(1000, 10, 1))
                nodes.append((P[i], Q[i], _drafts.iid(Q[i], k).sample(torch.Generator().manual_seed(seed)), seed))
        per = []
        for rep in range(args.repeats + 1):
            acc.clear()
            tv = ts = 0.0
            for p, q, dr, seed in nodes:
                t0 = clock()
                v.verify(p, q, dr, generator=torch.Generator().manual_seed(seed), law="iid", validate=False)
                tv += clock() - t0
            got = dict(acc)
            for p, q, dr, seed in nodes:
                t0 = clock()
                s.verify(p, q, dr, generator=torch.Generator().manual_seed(seed), law="iid", validate=False)
                ts += clock() - t0
            if rep:  # the first repeat warms up
                row = {c: 1e3 * got.get(c, 0.0) / len(nodes) for c in STAGES}
                row["verify"] = 1e3 * tv / len(nodes)
                row["specinfer"] = 1e3 * ts / len(nodes)
                row["rest"] = row["verify"] - row["prologue"] - row["plan_lumped"]
                per.append(row)
        med = {c: statistics.median(r[c] for r in per) for c in cols}
        lines.append({"kind": "k", "k": k, "ms": med, "ms_repeats": per, "load_average": load_average()})
        print(f"{k:>2} " + " ".join(f"{med[c]:>11.3f}" for c in cols), flush=True)
    if args.out:
        args.out.write_text("".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    main()
