"""The ``optimal`` verifier on real next-token distributions at full vocabulary (V = 151,936).

    .venv/bin/python benchmarks/optimal_verifier_full_vocab.py [--positions 200] [--k 2,4,8]

Teacher forcing on a few HumanEval texts (prompt + canonical solution) with the default model
pair (target and draft), full-vocabulary rows p, q (not lumped). For every K: one i.i.d. draft
tuple per position, then ``verify`` of optimal, specinfer, spectr and khisti_is on the SAME
drafts. Reports, per K: the paired gap (accepted - alpha*) with its standard error over the
positions, the fit error |r - q_sel| distribution, the fit iterations and shortfall, a
chi-square test of the sampled outputs against p (top-10 ranks of p plus a tail bucket,
pooled over positions) and ms per position. Writes docs/results/optimal_verifier/full_vocab.jsonl.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from scipy import stats

import multidraft as md
from multidraft._validate import derive_seed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import common_args, load_average, provenance, timed  # noqa: E402


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
def collect(positions, max_len, n_texts, cache):
    """(p, q) float32 [N, V] from teacher forcing, cached in ``cache`` (a .pt file) keyed by the settings."""
    key = {"positions": positions, "max_len": max_len, "n_texts": n_texts}
    path = Path(cache) if cache else None
    if path is not None and path.is_file():
        obj = torch.load(path)
        if obj.get("key") == key:
            print(f"positions from cache {path}")
            return obj["p"], obj["q"], obj["meta"], None
    target, draft, tok = load_pair()
    ps, qs, meta = [], [], []
    per = -(-positions // n_texts)  # positions taken from each text (the first ones after the prompt start)
    for i, text in enumerate(texts(n_texts)):
        ids = tok(text, return_tensors="pt").input_ids[:, :max_len]
        lt = target(ids).logits[0].float()
        ld = draft(ids).logits[0].float()
        V = min(lt.shape[-1], ld.shape[-1])
        n = min(per, ids.shape[1])
        # spread the positions over the whole text (prompt and solution)
        take = torch.linspace(0, ids.shape[1] - 1, n).round().long().unique()
        ps.append(torch.softmax(lt[take, :V], -1))
        qs.append(torch.softmax(ld[take, :V], -1))
        meta += [(i, int(t)) for t in take]
    p = torch.cat(ps)[:positions].contiguous()
    q = torch.cat(qs)[:positions].contiguous()
    meta = meta[:positions]
    if path is not None:
        torch.save({"key": key, "p": p, "q": q, "meta": meta}, path)
    return p, q, meta, (target, draft, tok)


@torch.no_grad()
def node_cost(models, p, q, k, prefix, repeats, seed):
    """ms of one target forward (one token, KV cache of ``prefix`` tokens) vs one ``optimal`` verify of one [V] row."""
    from multidraft.decoding import kv

    target, draft, tok = models if models is not None else load_pair()
    text = texts(1)[0]
    ids = tok(text, return_tensors="pt").input_ids
    while ids.shape[1] < prefix + 1:
        ids = torch.cat([ids, ids], 1)
    ids = ids[:, : prefix + 1]
    cache = kv.new_cache(target)
    target(ids[:, :prefix], past_key_values=cache, use_cache=True)
    empty = torch.zeros(0, dtype=torch.long)

    def fwd():
        target(ids[:, prefix:], past_key_values=cache, use_cache=True)
        kv.keep(cache, prefix, empty)

    t_fwd = timed(fwd, repeats)
    v = md.verifiers.get("optimal")
    g = torch.Generator().manual_seed(seed)
    out = {"prefix_tokens": prefix, "target_forward_ms": t_fwd}
    for kk in k:
        rows = []
        for i in range(min(repeats, p.shape[0])):
            pi, qi = p[i].float().contiguous(), q[i].float().contiguous()
            dr = md.drafts.iid(qi, kk).sample(g)
            rows.append(timed(lambda: v.verify(pi, qi, dr, generator=g, law="iid", validate=False), 1))
        rows.sort()
        out[f"verify_ms_k{kk}"] = rows[len(rows) // 2]
        out[f"ratio_k{kk}"] = rows[len(rows) // 2] / t_fwd
    return out


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
    ap.add_argument("--positions", type=int, default=240)
    ap.add_argument("--max-len", type=int, default=256, help="tokens of each text teacher-forced")
    ap.add_argument("--texts", type=int, default=4, help="HumanEval texts (prompt + canonical solution); positions spread evenly")
    ap.add_argument("--cache", default="/tmp/multidraft_full_vocab_positions.pt", help="cache of the (p, q) rows ('' for none)")
    ap.add_argument("--draws", type=int, default=1, help="draft tuples per position (rows repeated)")
    ap.add_argument("--node-cost", action="store_true", help="also time one optimal verify of one [V] row vs one target forward")
    ap.add_argument("--prefix", type=int, default=200, help="KV-cache length for --node-cost")
    ap.add_argument("--k", default="2,4,8")
    ap.add_argument("--verifiers", default="optimal,specinfer,spectr,khisti_is")
    ap.add_argument("--chunk", type=int, default=25, help="positions per verify call")
    common_args(ap, seed=0, out="docs/results/optimal_verifier/full_vocab.jsonl", out_type=str, threads=1)
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    p, q, meta, models = collect(args.positions, args.max_len, args.texts, args.cache)
    n_pos, V = p.shape
    print(f"collected {n_pos} positions from {len(set(t for t, _ in meta))} texts, V = {V}, in {time.perf_counter() - t0:.1f} s", flush=True)
    ks = [int(x) for x in args.k.split(",")]
    nc = None
    if args.node_cost:
        nc = node_cost(models, p, q, ks, args.prefix, 9, args.seed)
        print("node cost: " + ", ".join(f"{a} {b:.3g}" for a, b in nc.items()), flush=True)
    del models
    # float32 softmax rows over 151,936 tokens sum to 1 only to ~1e-4: renormalise in float64
    p, q = p.double(), q.double()
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    if args.draws > 1:
        p, q = p.repeat(args.draws, 1), q.repeat(args.draws, 1)
    N = p.shape[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for k in ks:
        g = torch.Generator().manual_seed(derive_seed(args.seed, k, rule="linear"))
        drafts = md.drafts.iid(q, k).sample(g)
        alpha = md.optimal_acceptance(p, md.drafts.iid(q, k)).double()
        for name in [s.strip() for s in args.verifiers.split(",") if s.strip()]:
            v = md.verifiers.get(name)
            gv = torch.Generator().manual_seed(derive_seed(args.seed, 100, k, rule="linear"))
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
                "chi2": chi, "chi2_dof": dof, "chi2_p": pval, "ms_per_position": ms, "draws": args.draws,
                "threads": torch.get_num_threads(), "load_avg_1min": (load_average() or [None])[0],
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
    if nc is not None:
        rows.append({"node_cost": nc, "threads": torch.get_num_threads(), "load_avg_1min": (load_average() or [None])[0]})
    with out.open("w") as fh:
        fh.write(json.dumps({"command": "benchmarks/optimal_verifier_full_vocab.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                             "positions": n_pos, "texts": args.texts, "max_len": args.max_len, "V": V, **provenance()}) + "\n")
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    print(f"wrote {out} ({len(rows)} rows) in {time.perf_counter() - t0:.0f} s total")


if __name__ == "__main__":
    main()
