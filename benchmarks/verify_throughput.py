"""Throughput of batched ``verify`` at LLM scale, against references measured in the same run.

    .venv/bin/python benchmarks/verify_throughput.py [--batch 256] [--vocab 151936] [--k 4 | --ks 2,4,8]
        [--verifiers ...] [--no-loops]

For each of specinfer, rrs_wor, spectr, khisti_is and optimal (when registered): ms per batch of
``verify`` with validate=True and validate=False, against (a) one ``torch.softmax`` over
the same [B, V] logits (what the target already pays per step) and (b) a straightforward
per-position Python loop of the same rule with early exit (research-repo style; written
here, one per verifier). (p, q) pairs are realistic: q is a perturbed, tempered p, so
most first drafts are accepted; the measured first-draft acceptance is printed. Every
timing, the references included, runs with the same number of torch threads (--threads).

Every verifier's row also prints its time against one ``torch.sort`` of the same [B, V] rows
(``/sort``: setup + verify is everything a verify call does) and, once per K, the float64
prologue alone (``_residual.rows64`` of p and q, what a rule that reads float64 rows pays
before its own work).

For ``optimal`` the setup (sort, prefix scan, layers, level fit) is part of every verify
call; its rows also print the time against one ``torch.sort`` of the same [B, V] rows, the
layers per row, the fitted layers, the fit iterations, the largest fit error |r - q_sel|
and the largest shortfall alpha* - acceptance of the fitted rule (exact, per row).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import multidraft as md
from multidraft._validate import derive_seed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import CLOCKS, common_args  # noqa: E402


# ---------------------------------------------------------------------------------------
# per-position reference loops (float32 rows, scalar decisions, early exit)
def loop_specinfer(p, q, drafts, g, wor=False):
    B, K = drafts.shape
    out = torch.empty(B, dtype=torch.long)
    for b in range(B):
        res, qb = p[b], q[b]
        for i in range(K):
            x = int(drafts[b, i])
            if float(torch.rand((), generator=g)) * float(qb[x]) <= float(res[x]):
                out[b] = x
                break
            res = (res - qb).clamp_min(0)
            res = res / res.sum()
            if wor:
                qb = qb.clone()
                qb[x] = 0
                qb = qb / qb.sum()
        else:
            out[b] = int(torch.multinomial(res, 1, generator=g))
    return out


def loop_rrs_wor(p, q, drafts, g):
    return loop_specinfer(p, q, drafts, g, wor=True)


def _rho_bisect(pb, qb, K, steps=50):
    lo, hi = 1.0, float(K)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        beta = float(torch.minimum(pb / mid, qb).sum())
        if 1 - (1 - beta) ** K <= mid * beta:
            hi = mid
        else:
            lo = mid
    return hi


def loop_spectr(p, q, drafts, g):
    B, K = drafts.shape
    out = torch.empty(B, dtype=torch.long)
    for b in range(B):
        pb, qb = p[b], q[b]
        rho = _rho_bisect(pb, qb, K)
        for i in range(K):
            x = int(drafts[b, i])
            if float(torch.rand((), generator=g)) * rho * float(qb[x]) <= float(pb[x]):
                out[b] = x
                break
        else:
            m = torch.minimum(pb / rho, qb)
            beta = float(m.sum())
            gamma = (1 - (1 - beta) ** K) / beta if beta > 0 else K
            res = (pb - gamma * m).clamp_min(0)
            out[b] = int(torch.multinomial(res / res.sum(), 1, generator=g))
    return out


LOOPS = {"specinfer": loop_specinfer, "rrs_wor": loop_rrs_wor, "spectr": loop_spectr}
LAWS = {"specinfer": "iid", "rrs_wor": "wor", "spectr": "iid", "khisti_is": "iid", "optimal": "iid"}


# ---------------------------------------------------------------------------------------
def make_pair(B, V, seed, noise, temp):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g) * 2.5
    logits[:, :64] += 6 * torch.rand(B, 64, generator=g)  # a peaked head, like an LLM step
    p = torch.softmax(logits, -1)
    q = torch.softmax((logits + noise * torch.randn(B, V, generator=g)) / temp, -1)
    return logits, p, q


def draw(law, q, K, g):
    if law == "wor":
        return md.drafts.without_replacement(q, K).sample(g)
    return md.drafts.iid(q, K).sample(g)


_clock = time.perf_counter  # --clock


def timeit(fn, repeats):
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = _clock()
        fn()
        ts.append(_clock() - t0)
    ts.sort()
    return 1e3 * ts[len(ts) // 2]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", "-B", type=int, default=256)
    ap.add_argument("--vocab", "-V", type=int, default=151_936)
    ap.add_argument("--k", "-K", type=int, default=4)
    ap.add_argument("--ks", default=None, help="comma-separated K values, one table each (overrides --k)")
    ap.add_argument("--no-loops", action="store_true", help="skip the per-position loop references")
    ap.add_argument("--loop-repeats", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.6, help="std of the logit perturbation of q")
    ap.add_argument("--temp", type=float, default=1.1, help="temperature of q")
    ap.add_argument("--verifiers", default="specinfer,rrs_wor,spectr,khisti_is,optimal")
    common_args(ap, clock="wall", repeats=3, seed=0, threads=1, helps={
        "threads": "torch intra-op threads for every timing, references included (default 1: on a shared "
                   "2-core machine intra-op threads waiting on each other dominate; 0 keeps torch's default)"})
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    global _clock
    _clock = CLOCKS[args.clock]
    B, V = args.batch, args.vocab
    ks = [int(x) for x in args.ks.split(",")] if args.ks else [args.k]

    logits, p, q = make_pair(B, V, args.seed, args.noise, args.temp)
    tv = 0.5 * (p - q).abs().sum(-1)
    print(f"B={B} V={V} K={','.join(map(str, ks))} threads={torch.get_num_threads()} seed={args.seed} clock={args.clock}")
    print(f"first-draft acceptance 1 - TV(p, q): mean {float((1 - tv).mean()):.3f}")
    t_soft = timeit(lambda: torch.softmax(logits, -1), args.repeats)
    print(f"reference torch.softmax [B, V]: {t_soft:.1f} ms")
    ratio = q / p
    t_sort = timeit(lambda: torch.sort(ratio, -1, descending=True), args.repeats)
    print(f"reference torch.sort [B, V] (one sort of the same rows): {t_sort:.1f} ms")
    from multidraft.verifiers._residual import rows64

    t_pro = timeit(lambda: (rows64(p), rows64(q)), args.repeats)
    print(f"float64 prologue rows64(p), rows64(q): {t_pro:.1f} ms ({t_pro / t_sort:.2f}x sort)")
    have = md.verifiers.names()
    for K in ks:
        run_k(args, have, K, p, q, t_soft, t_sort)


def run_k(args, have, K, p, q, t_soft, t_sort):
    print()
    header = f"{'verifier':<10} {'K':>2} {'validate':>8} {'ms/batch':>9} {'/softmax':>9} {'/sort':>7} {'loop ms':>9} {'/loop':>7} {'accept':>7}"
    print(header)
    print("-" * len(header))
    for name in [s.strip() for s in args.verifiers.split(",") if s.strip()]:
        if name not in have:
            print(f"{name:<10} missing: not registered in multidraft.verifiers.names()")
            continue
        v = md.verifiers.get(name)
        law = LAWS.get(name, "iid")
        g = torch.Generator().manual_seed(derive_seed(args.seed, 1, rule="linear"))
        drafts = draw(law, q, K, g)
        loop_ms = None
        if name in LOOPS and not args.no_loops:
            gl = torch.Generator().manual_seed(derive_seed(args.seed, 2, rule="linear"))
            loop_ms = timeit(lambda: LOOPS[name](p, q, drafts, gl), args.loop_repeats)
        for validate in (True, False):
            gv = torch.Generator().manual_seed(derive_seed(args.seed, 3, rule="linear"))
            res = {}

            def run():
                res["v"] = v.verify(p, q, drafts, generator=gv, law=law, validate=validate)

            ms = timeit(run, args.repeats)
            acc = float((res["v"].accepted_index >= 0).double().mean())
            lp = f"{loop_ms:9.1f} {ms / loop_ms:7.2f}" if loop_ms else f"{'-':>9} {'-':>7}"
            print(f"{name:<10} {K:>2} {str(validate):>8} {ms:9.1f} {ms / t_soft:9.3f} {ms / t_sort:7.2f} {lp} {acc:7.3f}", flush=True)
            fit = getattr(v, "last_fit", None)
            if name == "optimal" and fit is not None:
                print(
                    f"{'':<10} setup+verify / torch.sort {ms / t_sort:.2f}x; layers/row mean {float(fit.n_layers.double().mean()):.0f} "
                    f"(fitted {float(fit.n_fitted.double().mean()):.2f}, largest {int(fit.largest_layer.max())} tokens); "
                    f"fit iterations {fit.iterations} (converged {fit.converged}); max |r - q_sel| {float(fit.fit_error_max.max()):.2g}; "
                    f"shortfall max {float(fit.shortfall.max()):.2g}, alpha* mean {float(fit.alpha_star.mean()):.4f}"
                )
    if "khisti_is" in have and "khisti_is" in args.verifiers:
        print("(khisti_is: no per-position loop reference is written here; compare with softmax)")


if __name__ == "__main__":
    main()
