"""The ``optimal`` verifier on real next-token distributions at full vocabulary (V = 151,936).

    .venv/bin/python benchmarks/optimal_verifier_full_vocab.py [--positions 200] [--k 2,4,8]

Teacher forcing on a few HumanEval texts (prompt + canonical solution) with the default model
pair (target and draft), full-vocabulary rows p, q (not lumped). For every K: one i.i.d. draft
tuple per position, then ``verify`` of optimal, specinfer, spectr and khisti_is on the SAME
drafts. Reports, per K: the paired gap (accepted - alpha*) with its standard error over the
positions, the fit error |r - q_sel| distribution, the fit iterations and shortfall, a
chi-square test of the sampled outputs against p (top-10 ranks of p plus a tail bucket,
pooled over positions) and ms per position. Writes docs/optimal_verifier/full_vocab.jsonl.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from scipy import stats

import multidraft as md


def load_pair():
    try:
        from multidraft.models import resolve_pair
    except ImportError:  # older layout
        from multidraft.decoding.models import resolve_pair
    return resolve_pair()


def texts(n):
    from multidraft.datasets import load_problems

    probs = load_problems()
    return [pr["prompt"] + pr["canonical_solution"] for pr in probs[:n]]


@torch.no_grad()
def collect(positions, max_len, seed):
    target, draft, tok = load_pair()
    ps, qs = [], []
    need = positions
    for text in texts(16):
        ids = tok(text, return_tensors="pt").input_ids[:, :max_len]
        lt = target(ids).logits[0].float()
        ld = draft(ids).logits[0].float()
        V = min(lt.shape[-1], ld.shape[-1])
        ps.append(torch.softmax(lt[:, :V], -1))
        qs.append(torch.softmax(ld[:, :V], -1))
        need -= ids.shape[1]
        if need <= 0:
            break
    p = torch.cat(ps)[:positions]
    q = torch.cat(qs)[:positions]
    return p, q


def chi_square(p, tokens, top=10):
    """Pooled chi-square of outputs against p: bucket = rank of the output in its row's p (top ranks + tail)."""
    srt = torch.sort(p, -1, descending=True)
    exp = torch.zeros(top + 1, dtype=torch.float64)
    probs = srt.values[:, :top].double()
    exp[:top] = probs.sum(0)
    exp[top] = (1 - probs.sum(-1)).clamp_min(0).sum()
    rank = (srt.indices == tokens.unsqueeze(-1)).double().argmax(-1)
    obs = torch.bincount(rank.clamp(max=top), minlength=top + 1).double()
    keep = exp > 5
    chi = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    return chi, dof, float(stats.chi2.sf(chi, max(dof, 1)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=200)
    ap.add_argument("--max-len", type=int, default=160)
    ap.add_argument("--k", default="2,4,8")
    ap.add_argument("--verifiers", default="optimal,specinfer,spectr,khisti_is")
    ap.add_argument("--chunk", type=int, default=25, help="positions per verify call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/optimal_verifier/full_vocab.jsonl")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    p, q = collect(args.positions, args.max_len, args.seed)
    N, V = p.shape
    print(f"collected {N} positions, V = {V}, in {time.perf_counter() - t0:.1f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for k in [int(x) for x in args.k.split(",")]:
        g = torch.Generator().manual_seed(args.seed + k)
        drafts = md.drafts.iid(q, k).sample(g)
        alpha = md.optimal_acceptance(p, md.drafts.iid(q, k)).double()
        for name in [s.strip() for s in args.verifiers.split(",") if s.strip()]:
            v = md.verifiers.get(name)
            gv = torch.Generator().manual_seed(args.seed + 100 + k)
            toks, acc, fits = [], [], []
            t1 = time.perf_counter()
            for s0 in range(0, N, args.chunk):
                sl = slice(s0, s0 + args.chunk)
                res = v.verify(p[sl], q[sl], drafts[sl], generator=gv, law="iid")
                toks.append(res.token)
                acc.append((res.accepted_index >= 0).double())
                if name == "optimal":
                    fits.append(v.last_fit)
            ms = 1e3 * (time.perf_counter() - t1) / N
            tok = torch.cat(toks)
            a = torch.cat(acc)
            gap = a - alpha
            se = float(gap.std(unbiased=True)) / math.sqrt(N)
            chi, dof, pval = chi_square(p, tok)
            row = {
                "k": k, "verifier": name, "positions": N, "V": V, "acceptance": float(a.mean()),
                "alpha_star": float(alpha.mean()), "paired_gap": float(gap.mean()), "gap_se": se,
                "chi2": chi, "chi2_dof": dof, "chi2_p": pval, "ms_per_position": ms,
            }
            if fits:
                fe = torch.cat([f.fit_error_max.reshape(-1) for f in fits])
                sh = torch.cat([f.shortfall.reshape(-1) for f in fits])
                row.update({
                    "fit_error_max": float(fe.max()), "fit_error_median": float(fe.median()),
                    "fit_error_p99": float(torch.quantile(fe, 0.99)), "fit_error_le_1e-9": float((fe <= 1e-9).double().mean()),
                    "shortfall_max": float(sh.max()), "shortfall_mean": float(sh.mean()),
                    "exact_acceptance_of_rule": float(torch.cat([f.acceptance.reshape(-1) for f in fits]).mean()),
                    "iterations_max": max(f.iterations for f in fits),
                    "iterations_per_chunk": [f.iterations for f in fits],
                    "layers_mean": float(torch.cat([f.n_layers.reshape(-1) for f in fits]).double().mean()),
                    "fitted_layers_mean": float(torch.cat([f.n_fitted.reshape(-1) for f in fits]).double().mean()),
                    "largest_layer_max": int(torch.cat([f.largest_layer.reshape(-1) for f in fits]).max()),
                })
            rows.append(row)
            extra = ""
            if fits:
                extra = (f" fit err max {row['fit_error_max']:.1e} (p99 {row['fit_error_p99']:.1e}), shortfall max {row['shortfall_max']:.1e},"
                         f" iters max {row['iterations_max']}, layers {row['layers_mean']:.0f} (fitted {row['fitted_layers_mean']:.2f})")
            print(f"K={k} {name:<10} acc {row['acceptance']:.4f} alpha* {row['alpha_star']:.4f} gap {row['paired_gap']:+.4f} +- {se:.4f}"
                  f" chi2 {chi:.1f}/{dof} (p {pval:.2f}) {ms:.1f} ms/pos{extra}", flush=True)
    with out.open("w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    print(f"wrote {out} ({len(rows)} rows) in {time.perf_counter() - t0:.0f} s total")


if __name__ == "__main__":
    main()
