"""Speed of the exact ceiling alpha* at full vocabulary size.

Times ``md.optimal_acceptance`` on a batch of 64 realistic (p, q) positions with
V = 151,936, K in {2, 4, 8}, for the four draft laws, as a ratio to one ``torch.sort`` of
the same ``[64, V]`` tensor measured in the same run. Then finds the largest V at which the
full coupling LP (HiGHS) solves within about a minute (K = 2, iid; V doubling) and compares
its time with ``optimal_acceptance`` on that same instance.

    .venv/bin/python benchmarks/optimal_acceptance.py [--batch 64] [--V 151936] [--ks 2,4,8] [--threads 1] [--no-lp]

Columns: ms per batch, ratio to one sort (scaled to the whole batch when fewer rows are timed),
mean alpha*, the largest certified bound width (upper - lower; 0 where exact) and the rows exact.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import multidraft as md
from multidraft import drafts as D
from multidraft._validate import derive_seed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import common_args  # noqa: E402


def realistic(B: int, V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    # heavy-tailed logits (a few likely tokens, a long tail), draft = tempered, perturbed target
    logits = torch.randn(B, V, generator=g, dtype=torch.float64) * 2.0
    logits[:, : max(1, V // 1000)] += 6.0 * torch.rand(B, max(1, V // 1000), generator=g, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits / 1.3 + 0.6 * torch.randn(B, V, generator=g, dtype=torch.float64), -1)
    return p, q


def timeit(fn, reps: int = 3) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def make(kind: str, q: torch.Tensor, K: int, seed: int = 1):
    if kind != "independent":
        return D.make(kind, q, K)
    g = torch.Generator().manual_seed(seed)
    temps = torch.linspace(1.0, 1.6, K, dtype=torch.float64)
    lq = q.log().unsqueeze(-2) / temps.unsqueeze(-1) + 0.2 * torch.randn(*q.shape[:-1], K, q.shape[-1], generator=g, dtype=torch.float64)
    return D.independent(torch.softmax(lq, -1))  # drafts at different temperatures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--V", type=int, default=151_936)
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--laws", default="iid,greedy,wor,independent")
    ap.add_argument("--lp-minute", type=float, default=60.0, help="LP time budget per solve (seconds)")
    ap.add_argument("--slow-batch", type=int, default=None,
                    help="rows timed for wor and independent (default: the whole batch)")
    ap.add_argument("--cap", type=float, default=90.0, help="skip larger K of a law once one run took longer (s)")
    common_args(ap, seed=0, threads=1)
    ap.add_argument("--no-lp", action="store_true", help="skip the LP size search")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.slow_batch is None:
        args.slow_batch = args.batch
    p, q = realistic(args.batch, args.V, args.seed)
    t_sort = timeit(lambda: torch.sort(p, -1, descending=True), 3)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; B = {args.batch}, V = {args.V}")
    print(f"reference: one torch.sort of the [{args.batch}, {args.V}] float64 tensor = {t_sort * 1e3:.1f} ms\n")
    print(f"{'law':>12} {'K':>3} {'ms/batch':>10} {'x sort':>8} {'mean alpha*':>12} {'max width':>10} {'exact rows':>10}")
    for kind in [x.strip() for x in args.laws.split(",") if x.strip()]:
        slow = kind in ("wor", "independent")
        rows = min(args.slow_batch, args.batch) if slow else args.batch
        skip = False
        for K in [int(x) for x in args.ks.split(",")]:
            if skip:
                print(f"{kind:>12} {K:>3} {'skipped (previous K over --cap)':>30}")
                continue
            law = make(kind, q[:rows], K)
            out = {}
            t = timeit(lambda: out.setdefault("a", md.optimal_acceptance(p[:rows], law, return_bounds=True)), 1 if slow else 3)
            b = out["a"]
            note = "" if rows == args.batch else f"   ({rows} of {args.batch} rows; x{args.batch / rows:.0f} for the batch)"
            width = float((b.upper - b.lower).max())
            print(f"{kind:>12} {K:>3} {t * 1e3:10.1f} {t / t_sort * args.batch / rows:8.2f} {float(b.value.mean()):12.6f} "
                  f"{width:10.1e} {int(b.exact.sum()):>5}/{rows}{note}", flush=True)
            skip = t > args.cap
    if args.no_lp:
        return 0
    # the LP at the largest V it solves within the budget
    print("\ncoupling LP (HiGHS), K = 2, iid, one position:")
    V, last = 8, None
    while True:
        pp, qq = realistic(1, V, derive_seed(args.seed, 1, rule="linear"))
        law = D.iid(qq[0], 2)
        md.limits.lp.solve_coupling.__globals__["_CACHE"].clear()
        t0 = time.perf_counter()
        a_lp = md.limits.lp_optimal_acceptance(pp[0], law)
        t_lp = time.perf_counter() - t0
        t_dual = timeit(lambda: md.optimal_acceptance(pp[0], law), 3)
        a = md.optimal_acceptance(pp[0], law)
        print(f"  V = {V:5d}: LP {t_lp:8.3f} s   dual {t_dual * 1e3:8.3f} ms   ratio {t_lp / t_dual:10.0f}x   |alpha_LP - alpha*| = {abs(a_lp - a):.1e}", flush=True)
        last = (V, t_lp, t_dual)
        if t_lp * 4.5 > args.lp_minute:  # the next doubling (4x the tuples) would pass the budget
            break
        V *= 2
    print(f"largest V solved within the budget: {last[0]} (LP {last[1]:.2f} s vs optimal_acceptance {last[2] * 1e3:.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
