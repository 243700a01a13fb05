"""What SpecTr-GBV's rho screen costs on real rows, and the primitives it is built from (issue 27, item 5).

``trees.spectr_gbv`` picks rho at a node with k > 1 i.i.d. drafts from a grid of 33 values; above
``SCREEN_V`` a histogram of log(p / q) bounds every rho's acceptance and only the rhos whose bound
reaches the best are evaluated exactly (``_acceptance_bounds``). This script prints, per (target,
draft) row pair of a position store (``node_cost.store_rows``: the same rows as ``node_cost.py
--trees``) at k drafts:

* ``top p`` / ``top q``: the largest probability of each row (the flat rows are the hard ones);
* ``rhos left``: the rhos the histogram's bounds leave, without and with the refinement of the bins
  straddled by a breakpoint (summed token by token), i.e. how many exact evaluations each saves;
* ``screen ms``: the screen with and without that refinement (the middle of ``--repeats`` calls);

and, at the rows' V, the median ms of the primitives the screen could be written with:
``index_add_`` against ``scatter_add_`` (a histogram; the same sums in the same order on the CPU),
advanced indexing ``x[idx]`` against ``index_select`` (a gather over V), ``torch.nonzero`` against
numpy's ``flatnonzero``.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/screen_cost.py --store STORE --rows 8 --k 2 \\
        --out docs/results/node_cost/issue27_screen.jsonl

Timings are one thread, wall clock; run it on a quiet machine. Writes JSONL (meta first) with
``--out``.
"""
from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import multidraft  # noqa: E402
from multidraft._alloc import keep_freed_memory  # noqa: E402
from multidraft.decoding.profiling import machine_info  # noqa: E402
from multidraft.sampling import process_logits  # noqa: E402
from multidraft.trees import spectr_gbv  # noqa: E402
from _bench import common_args, provenance, timed, write_jsonl  # noqa: E402


def screen_row(p: torch.Tensor, q: torch.Tensor, k: int, repeats: int) -> dict:
    """The screen at one row pair (p, q ``[V]`` float64): rhos left and ms, with and without refining."""
    grid = spectr_gbv._Grid(p, q, k)
    out = {"top_p": float(p.max()), "top_q": float(q.max())}
    keep = spectr_gbv.SCREEN_REFINE
    try:
        for tag, refine in (("unrefined", 0), ("refined", keep)):
            spectr_gbv.SCREEN_REFINE = refine
            out[f"rhos_{tag}"] = len(grid.screen()[0])
            out[f"ms_{tag}"] = timed(grid.screen, repeats)
    finally:
        spectr_gbv.SCREEN_REFINE = keep
    return out


def primitives(V: int, bins: int, repeats: int, seed: int) -> dict:
    """Median ms of the screen's candidate primitives at V tokens and ``bins`` histogram bins."""
    g = torch.Generator().manual_seed(seed)
    w = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 3, -1)  # [V]
    idx = torch.randint(0, bins, (V,), generator=g)  # [V]
    flag = torch.zeros(bins, dtype=torch.bool)
    flag[torch.randint(0, bins, (4,), generator=g)] = True
    hits = flag.index_select(0, idx)  # [V]
    zeros = lambda: torch.zeros(bins, dtype=torch.float64)  # noqa: E731
    a, b = zeros().index_add_(0, idx, w), zeros().scatter_add_(0, idx, w)
    return {"V": V, "bins": bins, "histogram_same_bits": bool(torch.equal(a, b)),
            "index_add_ms": timed(lambda: zeros().index_add_(0, idx, w), repeats),
            "scatter_add_ms": timed(lambda: zeros().scatter_add_(0, idx, w), repeats),
            "advanced_index_ms": timed(lambda: flag[idx], repeats),
            "index_select_ms": timed(lambda: flag.index_select(0, idx), repeats),
            "torch_nonzero_ms": timed(lambda: torch.nonzero(hits), repeats),
            "numpy_flatnonzero_ms": timed(lambda: np.flatnonzero(hits.numpy()), repeats)}


def main(argv=None) -> int:
    import node_cost

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=node_cost.DEFAULT_STORE, help="position store (node_cost.py --store)")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--k", type=int, default=2, help="drafts at the node (> 1)")
    ap.add_argument("--temperature", type=float, default=1.0)
    common_args(ap, repeats=50, seed=0, out=None)
    args = ap.parse_args(argv)
    if args.k < 2:
        ap.error(f"--k: the screen runs at nodes of k > 1 drafts, got {args.k}")
    if not args.store.exists():
        print(f"screen_cost: no position store at {args.store} (--store)", file=sys.stderr)
        return 2
    keep_freed_memory()
    TL, DL, info = node_cost.store_rows(args.store, args.rows, args.seed)
    V = TL.shape[-1]
    meta = {"kind": "meta", "script": "benchmarks/screen_cost.py", "argv": sys.argv[1:] if argv is None else list(argv),
            "seed": args.seed, "k": args.k, "V": V, "threads": torch.get_num_threads(), **provenance(),
            "torch": torch.__version__, "numpy": np.__version__, "multidraft": multidraft.__version__,
            "python": platform.python_version(), "machine": machine_info(),
            "screen_v": spectr_gbv.SCREEN_V, "rows": info}
    print(f"screen_cost: V = {V}, k = {args.k}, {args.rows} rows, {torch.get_num_threads()} thread(s), "
          f"{args.repeats} repeats, seed {args.seed}")
    rows = []
    print(f"{'row':>4}{'top p':>10}{'top q':>10}{'rhos left':>12}{'(refined)':>10}{'screen ms':>11}{'(refined)':>10}")
    for i in range(TL.shape[0]):
        p = process_logits(TL[i], args.temperature).double()
        q = process_logits(DL[i], args.temperature).double()
        r = {"kind": "row", "row": i, **screen_row(p, q, args.k, args.repeats)}
        rows.append(r)
        print(f"{i:>4}{r['top_p']:>10.5f}{r['top_q']:>10.5f}{r['rhos_unrefined']:>12}{r['rhos_refined']:>10}"
              f"{r['ms_unrefined']:>11.3f}{r['ms_refined']:>10.3f}", flush=True)
    bins = spectr_gbv._screen_grid(args.k, spectr_gbv.RHO_POINTS)[2] + 2
    prim = {"kind": "primitives", **primitives(V, bins, args.repeats, args.seed)}
    rows.append(prim)
    print(f"\nprimitives at V = {V}, {bins} bins (median ms): histogram index_add_ {prim['index_add_ms']:.3f}, "
          f"scatter_add_ {prim['scatter_add_ms']:.3f} (same bits: {prim['histogram_same_bits']}); gather x[idx] "
          f"{prim['advanced_index_ms']:.3f}, index_select {prim['index_select_ms']:.3f}; torch.nonzero "
          f"{prim['torch_nonzero_ms']:.3f}, numpy flatnonzero {prim['numpy_flatnonzero_ms']:.3f}")
    if args.out:
        write_jsonl(args.out, meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
