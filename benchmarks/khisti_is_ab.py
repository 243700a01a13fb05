"""Per-node verify cost of ``khisti_is``: this tree against an older copy of the module, interleaved.

    git show main:src/multidraft/verifiers/khisti_is.py > /tmp/khisti_old.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/khisti_is_ab.py --old /tmp/khisti_old.py --store STORE
        [--synthetic] [--rows 8] [--draws 3] [--repeats 5] [--ks 2,3,4,6,8] [--laws iid,independent] [--out ab.jsonl]

On a shared machine two runs minutes apart see different loads, so this script times, call
after call on the same node, ``specinfer``, the old ``khisti_is`` (the module file given by
``--old``, loaded under another name, unregistered) and this tree's ``khisti_is``, each as
``benchmarks/node_cost.py`` calls a verifier: ``verify(p, q, drafts, generator=g, law=kind,
validate=False)`` on one ``[V]`` row of ``process_logits`` (float32), q ``[V]`` (iid) or
``[K, V]`` (independent, draft j at temperature ``node_cost.IND_TEMPS[j]``), drafts drawn by
``drafts.make`` / ``drafts.independent`` with a fixed seed per (row, draw). Rows: the real rows
of a position store (``node_cost.store_rows``) or ``--synthetic`` (``node_cost.synthetic_rows``:
a Zipf head, LM-like). Two clocks per call: wall (``perf_counter``) and the thread's CPU time
(``thread_time``, robust to waiting for a core on a shared machine, coarse: summed over a
repeat). Per (law, K, method): the median over repeats of the mean ms per node and the ratio
to ``specinfer`` of the same repeat (median over repeats); also how often old and new emitted
the same token for the same generator (they draw the same uniforms; 1.0 expected).
"""
from __future__ import annotations

import argparse
import importlib.util
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

from multidraft._alloc import allocator_state, keep_freed_memory  # noqa: E402
from multidraft._validate import derive_seed  # noqa: E402
from multidraft import drafts as _drafts  # noqa: E402
from multidraft import verifiers as _verifiers  # noqa: E402
from multidraft.sampling import process_logits  # noqa: E402
from _bench import common_args, load_average, provenance  # noqa: E402
from node_cost import IND_TEMPS, store_rows, synthetic_rows  # noqa: E402


def load_old(path: Path):
    """The class ``KhistiIS`` of an older copy of the module, loaded inside the package (its
    relative imports resolve) under another name and without registering it."""
    src = path.read_text().replace("@register\n", "")
    name = "multidraft.verifiers._khisti_is_ab_old"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = str(path)
    sys.modules[name] = mod
    exec(compile(src, str(path), "exec"), mod.__dict__)
    return mod.KhistiIS


def nodes_for(TL, DL, kind, k, draws, seed):
    out = []
    for i in range(TL.shape[0]):
        p = process_logits(TL[i], 1.0)
        if kind == "independent":
            q = torch.stack([process_logits(DL[i:i + 1], IND_TEMPS[j % len(IND_TEMPS)])[0] for j in range(k)])  # [K, V]
        else:
            q = process_logits(DL[i:i + 1], 1.0)[0]  # [V]
        for d in range(draws):
            g = torch.Generator().manual_seed(derive_seed(seed, i, d, rule="linear", weights=(1_000_003, 1009, 1)))
            law = _drafts.independent(q.unsqueeze(0)) if kind == "independent" else _drafts.make(kind, q.unsqueeze(0), k)
            out.append((p, q, law.sample(g)[0], derive_seed(seed, i, d, rule="linear", weights=(7919, 101, 1))))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True, help="an older khisti_is.py (e.g. git show main:...)")
    ap.add_argument("--store", type=Path, default=ROOT / "runs/paper/positions/humaneval__tt1__td1__k0__p1.pt")
    ap.add_argument("--synthetic", action="store_true", help="node_cost's Zipf-headed synthetic rows")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--ks", default="2,3,4,6,8")
    ap.add_argument("--laws", default="iid,independent")
    common_args(ap, repeats=5, threads=1, seed=0, out=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the decoder does (multidraft._alloc; MULTIDRAFT_MALLOC=default: glibc's defaults)
    if args.synthetic or not args.store.is_file():
        TL, DL, src = synthetic_rows(args.rows, 151_936, args.seed)
    else:
        TL, DL, src = store_rows(args.store, args.rows, args.seed)
    methods = {"specinfer": _verifiers.get("specinfer"), "old": load_old(args.old)(), "new": _verifiers.get("khisti_is")}
    meta = {"kind": "meta", "benchmark": "khisti_is_ab", "old": str(args.old), "rows": args.rows, "draws": args.draws,
            "repeats": args.repeats, "threads": torch.get_num_threads(), "distributions": src,
            **provenance(), "cpu_count": os.cpu_count(),
            "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}, "allocator": allocator_state(),
            "load_average_before": load_average()}
    lines = [meta]
    print(f"V = {TL.shape[-1]}, {args.rows} rows ({src['source']}) x {args.draws} draws, {args.repeats} repeats, "
          f"{torch.get_num_threads()} thread(s); load {meta['load_average_before']}")
    print(f"{'law':<12}{'K':>2} | {'spec ms':>8} {'old ms':>8} {'new ms':>8} | {'old/spec':>8} {'new/spec':>8} {'new/old':>8} |"
          f" {'spec cpu':>8} {'old cpu':>8} {'new cpu':>8} {'new/spec':>8} | same tok")
    for kind in args.laws.split(","):
        for k in [int(x) for x in args.ks.split(",")]:
            nodes = nodes_for(TL, DL, kind, k, args.draws, args.seed)
            wall = {m: [] for m in methods}
            cpu = {m: [] for m in methods}
            same = 0
            for rep in range(args.repeats + 1):  # the first is a warm-up
                w = dict.fromkeys(methods, 0.0)
                c = dict.fromkeys(methods, 0.0)
                agree = 0
                for p, q, d, s in nodes:
                    tok = {}
                    for m, v in methods.items():
                        g = torch.Generator().manual_seed(s)
                        t0, c0 = time.perf_counter(), time.thread_time()
                        tok[m] = int(v.verify(p, q, d, generator=g, law=kind, validate=False).token)
                        c[m] += time.thread_time() - c0
                        w[m] += time.perf_counter() - t0
                    agree += tok["old"] == tok["new"]
                if rep:
                    for m in methods:
                        wall[m].append(1e3 * w[m] / len(nodes))
                        cpu[m].append(1e3 * c[m] / len(nodes))
                    same = agree / len(nodes)
            med = {m: statistics.median(wall[m]) for m in methods}
            medc = {m: statistics.median(cpu[m]) for m in methods}
            ratio = {m: statistics.median(a / b for a, b in zip(wall[m], wall["specinfer"])) for m in methods}
            ratioc = {m: statistics.median(a / b for a, b in zip(cpu[m], cpu["specinfer"])) for m in methods}
            new_old = statistics.median(a / b for a, b in zip(wall["new"], wall["old"]))
            row = {"kind": "ab", "law": kind, "k": k, "wall_ms": med, "cpu_ms": medc, "wall_ratio_to_specinfer": ratio,
                   "cpu_ratio_to_specinfer": ratioc, "new_over_old_wall": new_old, "same_token": same,
                   "wall_ms_repeats": wall, "cpu_ms_repeats": cpu}
            lines.append(row)
            print(f"{kind:<12}{k:>2} | {med['specinfer']:8.3f} {med['old']:8.3f} {med['new']:8.3f} | {ratio['old']:8.1f} {ratio['new']:8.1f}"
                  f" {new_old:8.2f} | {medc['specinfer']:8.3f} {medc['old']:8.3f} {medc['new']:8.3f} {ratioc['new']:8.1f} | {same:.3f}", flush=True)
    meta["load_average_after"] = load_average()
    if args.out:
        with open(args.out, "w") as f:
            for r in lines:
                f.write(json.dumps(r) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
