"""khisti_is on flat rows: exact acceptance against specinfer and alpha* (issue 12, item 9).

Rows: p = softmax(0.5 z), q = softmax(log p + 0.5 z'), z, z' standard normal (flat: no token
above ~1e-4 at V = 151,936). Acceptance is exact given the drafts (``output_distribution``
+ ``acceptance_given``), averaged over ROWS rows x TUPLES iid draft tuples; 'step' is the
accept step's exact value sum_y min(p, q_I) (no tuple sampling). Variants: 'old' = the
rule before the fix (off='rank', solver='lp'), 'rank' = paper's off-S rule with the lex
tie-break, 'new' = the default (off='ratio', solver='lex'). Also: a small-V table with the
full LP (s = V) to isolate the tournament, and the spread of acceptance under token
permutations (LP vertex choice).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/khisti_is_flat.py [--quick]
"""
from __future__ import annotations

import sys
import time

import torch

import multidraft as md
from multidraft.exact import acceptance_given
from multidraft.verifiers.khisti_is import KhistiIS

VARIANTS = {"old": dict(off="rank", solver="lp"), "rank": dict(off="rank"), "new": {}}


def flat_row(V, seed, sp=0.5, sq=0.5):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(V, generator=g, dtype=torch.float64) * sp
    return torch.softmax(lp, -1), torch.softmax(lp + sq * torch.randn(V, generator=g, dtype=torch.float64), -1)


def step_value(v, p, q, K):
    plan = v._plan(p[None], q[None], K)
    qi = v._q_inf_full(q[None], plan, torch.arange(1), K)[0]
    return float(torch.minimum(p, qi).sum())


def flat_table(Vs, Ks, rows, tuples):
    print(f"flat rows: acceptance (mean of {rows} rows x {tuples} tuples; step = sum min(p, q_I))")
    print(f"{'V':>7} {'K':>2} | {'old':>6} {'rank':>6} {'new':>6} | {'old st':>6} {'new st':>6} | {'specinf':>7} {'alpha*':>6} | s")
    for V in Vs:
        for K in Ks:
            t0 = time.time()
            acc = {k: 0.0 for k in (*VARIANTS, "old st", "new st", "specinfer", "alpha*")}
            for r in range(rows):
                p, q = flat_row(V, r)
                law = md.drafts.iid(q, K)
                acc["alpha*"] += float(md.optimal_acceptance(p, law)) / rows
                g = torch.Generator().manual_seed(1000 + r)
                d = torch.stack([law.sample(generator=g) for _ in range(tuples)])  # [T, K]
                P, Q = p.expand(tuples, V), q.expand(tuples, V)
                for name, kw in VARIANTS.items():
                    v = KhistiIS(**kw)
                    acc[name] += float(acceptance_given(v.output_distribution(P, Q, d, law=law), d).mean()) / rows
                    if name in ("old", "new"):
                        acc[name + " st"] += step_value(v, p, q, K) / rows
                out = md.verifiers.get("specinfer").output_distribution(P, Q, d, law=law)
                acc["specinfer"] += float(acceptance_given(out, d).mean()) / rows
            a = acc
            print(f"{V:>7} {K:>2} | {a['old']:.4f} {a['rank']:.4f} {a['new']:.4f} | {a['old st']:.4f} {a['new st']:.4f} |"
                  f"  {a['specinfer']:.4f} {a['alpha*']:.4f} | {time.time() - t0:.0f}", flush=True)


def small_table(n_inst, Ks):
    """Full LP (s = V) at V = 6: the gap left is the tournament's (exact, all tuples)."""
    print(f"\nsmall V = 6, s = V (no truncation), {n_inst} rows p = softmax(1.5 z), q = softmax(1.5 z'): exact acceptance")
    print(f"{'K':>2} | {'old':>6} {'new':>6} {'rank':>6} | {'specinf':>7} {'alpha*':>6}")
    for K in Ks:
        acc = {k: 0.0 for k in ("old", "new", "rank", "specinfer", "alpha*")}
        for i in range(n_inst):
            g = torch.Generator().manual_seed(i)
            p = torch.softmax(1.5 * torch.randn(6, generator=g, dtype=torch.float64), -1)
            q = torch.softmax(1.5 * torch.randn(6, generator=g, dtype=torch.float64), -1)
            law = md.drafts.iid(q, K)
            for name in ("old", "new", "rank"):
                acc[name] += md.certify(KhistiIS(s=6, **VARIANTS[name]), p, law).acceptance / n_inst
            acc["specinfer"] += md.certify("specinfer", p, law).acceptance / n_inst
            acc["alpha*"] += float(md.optimal_acceptance(p, law)) / n_inst
        a = acc
        print(f"{K:>2} | {a['old']:.4f} {a['new']:.4f} {a['rank']:.4f} |  {a['specinfer']:.4f} {a['alpha*']:.4f}")


def permutation_spread(n_inst, K, n_perm):
    """Max over rows of (max - min) acceptance over token permutations, per solver."""
    print(f"\nLP vertex choice: spread of exact acceptance over {n_perm} token permutations, K = {K}, V = 6, s = 6")
    for solver in ("lp", "lex"):
        worst = 0.0
        for i in range(n_inst):
            g = torch.Generator().manual_seed(100 + i)
            p = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
            q = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
            vals = []
            for j in range(n_perm):
                perm = torch.randperm(6, generator=g) if j else torch.arange(6)
                vals.append(md.certify(KhistiIS(s=6, solver=solver), p[perm], md.drafts.iid(q[perm], K)).acceptance)
            worst = max(worst, max(vals) - min(vals))
        print(f"  solver={solver}: max spread {worst:.2e}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    quick = "--quick" in sys.argv
    flat_table((1000, 151_936), (2, 3, 4, 8), 2 if quick else 4, 8 if quick else 16)
    small_table(10 if quick else 30, (2, 3, 4))
    permutation_spread(5 if quick else 20, 3, 4 if quick else 8)
