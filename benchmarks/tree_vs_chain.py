"""How much can multi-draft trees gain over single-draft SD on this machine? The cost model's answer.

For every cost profile (``multidraft profile``) and every data set of the study
(``multidraft experiment paper``: per-position acceptances along the target's own
continuations), this prints the fastest tree the cost model finds for each (draft law,
verifier) with K in the study's set, and the fastest chain (single-draft SD, whose per-node
acceptance is alpha*(K = 1) = sum min(p, q)). Nothing is decoded: the acceptances are the
study's exact per-position values and the costs are the profile's measured times, so the
numbers say what the decoder can reach at best on that machine, and ``alpha*`` rows say what no
lossless verifier can beat.

Two acceptance models (``decoding.treeopt``):

``positional``  Sequoia's: every node of the tree has the mean acceptance (the model ``decode
                --tree auto`` optimises).
``along``       the per-position acceptances of consecutive positions of a continuation: a
                step starting at position t uses position t + j at depth j, so easy and hard
                stretches stay together (``expected_tokens_along``). Candidate trees are the
                dynamic program's best tree of every (node budget, depth cap) plus every chain;
                the 95% interval is over 8 contiguous segments of positions (batch means).

``--draft-scale`` repeats the search with the draft's times multiplied by each factor, and
``--free-verify`` with every tree forward costing one target token: how much cheaper drafting
or verifying would have to be before branching pays (the issue asks for multi-draft >= 1.15x
the best single-draft SD).

    .venv/bin/python benchmarks/tree_vs_chain.py                       # docs/results/paper x data/profiles
    .venv/bin/python benchmarks/tree_vs_chain.py --datasets humaneval --draft-scale 1,0.5,0.25,0.1 \\
        --out docs/results/tree_vs_chain/tree_vs_chain.jsonl --markdown docs/results/tree_vs_chain/tree_vs_chain.md
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from multidraft.decoding.treeopt import (AcceptStats, CostProfile, expected_tokens_along, slot_increments,
                                         step_seconds, tree_candidates)
from multidraft.experiments.acceptance import along_alphas, read_along
from multidraft.experiments.findings import t95
from multidraft.experiments.records import JsonlWriter, read_jsonl, versions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import common_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROFILES = ["transformers-bf16", "llama-bf16-q4", "llama-bf16-q4_0", "llama-q4-q4"]
# (law, verifier) families, in table order; "alpha*" is the ceiling of every verifier of that law
FAMILIES = [("iid", "specinfer"), ("iid", "spectr"), ("iid", "khisti_is"), ("iid", "optimal"), ("iid", "alpha*"),
            ("wor", "rrs_wor"), ("wor", "alpha*"), ("greedy", "greedy_optimal"), ("greedy", "alpha*"),
            ("independent", "khisti_is"), ("independent", "alpha*")]
SEGMENTS = 8


def scaled(profile: CostProfile, draft_scale: float = 1.0, free_verify: bool = False) -> CostProfile:
    t1 = profile.target_seconds(1)
    return replace(profile, target_times=[t1] * len(profile.target_nodes) if free_verify else profile.target_times,
                   draft_times=[s * draft_scale for s in profile.draft_times])


def candidates(alphas: dict, max_nodes: int, max_depth: int) -> list:
    """The dynamic program's best tree (mean acceptances) for every (budget, depth cap), and every chain."""
    stats = AcceptStats.from_alphas({k: float(v.mean()) for k, v in alphas.items()})
    return [paths for paths, _ in tree_candidates(stats, max_nodes, max_depth)]


def best_tree(alphas: dict, profile: CostProfile, trees: list, model: str) -> dict:
    """The fastest candidate under one acceptance model, with per-segment rates for its interval."""
    if model == "positional":   # Sequoia's: the slots of the mean acceptances at every position
        means = slot_increments({k: [float(v.mean())] for k, v in alphas.items()})
        slots = {k: np.repeat(s, max(len(p) for p in trees) + 1, axis=0) for k, s in means.items()}
    else:
        slots = slot_increments(alphas)
    best = None
    for paths in trees:
        e = expected_tokens_along(paths, slots)
        sec = step_seconds(paths, profile)
        if best is None or e / sec > best["tokens_per_s"]:
            best = {"paths": paths, "expected_tokens": e, "seconds_per_step": sec, "tokens_per_s": e / sec}
    best["nodes"] = 1 + len(best["paths"])
    best["depth"] = max(len(p) for p in best["paths"])
    return best


def segment_rates(alphas: dict, profile: CostProfile, paths: list) -> np.ndarray:
    """Tokens/s of one tree on each of SEGMENTS contiguous segments of positions (the along model)."""
    slots = slot_increments(alphas)
    T = next(iter(slots.values())).shape[0]
    edges = np.linspace(0, T, SEGMENTS + 1).astype(int)
    sec = step_seconds(paths, profile)
    return np.array([expected_tokens_along(paths, {k: s[a:b] for k, s in slots.items()}) / sec
                     for a, b in zip(edges[:-1], edges[1:])])


def interval(x: np.ndarray) -> float:
    return float(t95(len(x)) * x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else float("nan")


def emit(text: str, path: str | None) -> None:
    print(text)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n", encoding="utf-8")


def markdown(config: dict, records: list) -> str:
    """The report, from the records alone: the summary, then one table per profile variant."""
    lines = ["# Tree against chain: the best multi-draft tree against the best chain (cost model x study acceptances)", "",
             f"study `{config.get('acceptance')}` at T = {config.get('temperatures')} (target, draft); node budget "
             f"{config.get('max_nodes')}, depth <= {config.get('max_depth')}, K <= {config.get('max_k')}; profile points: "
             f"{config.get('profile_statistic', 'stored')} of the samples; rates as "
             f"ratios to the target alone; `x SD` = against the best chain with alpha*(K = 1) under the same "
             f"model; ± = 95% over {SEGMENTS} contiguous segments of positions", ""]
    lines += summary(records)
    variants: dict = {}
    for r in records:
        variants.setdefault((r["profile"], r["draft_scale"], r["free_verify"]), []).append(r)
    for (pname, scale, free), rs in variants.items():
        lines += [f"## {pname}" + (f", draft x{scale:g}" if scale != 1 else "") + (", free verify" if free else ""), "",
                  "| data set | law | verifier | K | positional x target | positional x SD | along x target | "
                  "along x SD ± 95% | tree (nodes, depth) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            lines.append(f"| {r['dataset']} | {r['law']} | {r['verifier']} | {','.join(map(str, r['ks']))} | "
                         f"{r['positional_x_target']:.3f} | {r['positional_x_sd']:.3f} | {r['along_x_target']:.3f} | "
                         f"{r['along_x_sd']:.3f} ± {r['along_x_sd_ci95']:.3f} | {r['along']['nodes']}, "
                         f"{r['along']['depth']} |")
        lines.append("")
    return "\n".join(lines)


def summary(records: list) -> list:
    """One line per (profile variant, data set): the best chain, the best verifier's tree and alpha*'s."""
    out = ["## Summary (along model)", "",
           "| profile | draft cost | verify | data set | best SD x target (depth) | best verifier x SD ± 95% "
           "(law, verifier, nodes, depth) | alpha* x SD (law) |", "|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in records:
        groups.setdefault((r["profile"], r["draft_scale"], r["free_verify"], r["dataset"]), []).append(r)
    for (pname, scale, free, ds), rs in groups.items():
        sd = next(r for r in rs if r["verifier"].startswith("SD"))
        vs = [r for r in rs if r["verifier"] not in ("alpha*",) and not r["verifier"].startswith("SD")]
        cs = [r for r in rs if r["verifier"] == "alpha*"]
        v = max(vs, key=lambda r: r["along_x_sd"]) if vs else None
        c = max(cs, key=lambda r: r["along_x_sd"]) if cs else None
        out.append(f"| {pname} | x{scale:g} | {'free' if free else 'measured'} | {ds} | "
                   f"{sd['along_x_target']:.2f} ({sd['along']['depth']}) | "
                   + ("-" if v is None else "1.000 (every tree's best is a chain)"
                      if v["along"]["nodes"] == v["along"]["depth"] + 1 else
                      f"{v['along_x_sd']:.3f} ± {v['along_x_sd_ci95']:.3f} ({v['law']}, {v['verifier']}, "
                      f"{v['along']['nodes']}, {v['along']['depth']})") + " | "
                   + (f"{c['along_x_sd']:.3f} ({c['law']})" if c else "-") + " |")
    return out + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--acceptance", default=str(ROOT / "docs/results/paper/acceptance.jsonl"),
                    help="the study's acceptance JSONL (per-position values)")
    ap.add_argument("--profiles", default=",".join(DEFAULT_PROFILES),
                    help="cost profile JSON files, or names of files in data/profiles (comma separated)")
    ap.add_argument("--profile-statistic", default="median", choices=("median", "mean", "min", "stored"),
                    help="recompute each profile's points from its samples by this statistic (as decode --tree auto "
                         "does; 'stored', or a profile without samples: the points as written)")
    ap.add_argument("--datasets", default=None, help="data sets (default: all in the study)")
    ap.add_argument("--temperatures", default="1,1", help="target,draft temperature of the study rows")
    ap.add_argument("--max-k", type=int, default=8, help="largest K per node")
    ap.add_argument("--max-nodes", type=int, default=32, help="node budget per step, root included (<= 64)")
    ap.add_argument("--max-depth", type=int, default=8, help="largest tree depth (<= 8)")
    ap.add_argument("--draft-scale", default="1", help="draft time factors to try (comma separated)")
    ap.add_argument("--free-verify", action="store_true", help="also: every tree forward costs one target token")
    common_args(ap, out=None, out_type=str, helps={"out": "JSONL output (a meta row with the run's provenance first)"})
    ap.add_argument("--markdown", default=None, help="markdown table output")
    ap.add_argument("--summarize", default=None, metavar="JSONL",
                    help="rebuild the markdown from a JSONL this script wrote (nothing recomputed)")
    args = ap.parse_args(argv)
    if args.summarize:
        meta, rows = read_jsonl(args.summarize)
        emit(markdown((meta or {}).get("config", {}), [r for r in rows if r.get("type") == "row"]), args.markdown)
        return 0
    config = {k: v for k, v in vars(args).items() if k not in ("out", "markdown", "summarize")}
    acc = Path(args.acceptance).resolve()
    if acc.is_relative_to(ROOT.resolve()):  # result files name repository paths from the root
        config["acceptance"] = str(acc.relative_to(ROOT.resolve()))

    tt, td = (float(x) for x in args.temperatures.split(","))
    study = read_along(Path(args.acceptance), tt, td)
    if not study:
        ap.error(f"{args.acceptance}: no rows with per-position values at temperatures {tt}, {td}")
    datasets = sorted({d for d, _, _ in study}) if not args.datasets else args.datasets.split(",")
    profiles = {}
    for spec in args.profiles.split(","):
        path = Path(spec) if spec.endswith(".json") else ROOT / "data/profiles" / f"{spec}.json"
        profiles[path.stem] = CostProfile.from_json(path.read_text()).with_statistic(args.profile_statistic,
                                                                                     strict=False)
    scales = [float(x) for x in args.draft_scale.split(",")]
    variants = [(s, False) for s in scales] + ([(1.0, True)] if args.free_verify else [])

    writer = None
    if args.out:
        Path(args.out).unlink(missing_ok=True)   # an analysis, rebuilt whole each time (nothing to resume)
        writer = JsonlWriter(Path(args.out), config, None, kind="tree_vs_chain", versions=versions())
    t0 = time.perf_counter()
    records: list = []
    for pname, base_profile in profiles.items():
        for scale, free in variants:
            profile = scaled(base_profile, scale, free)
            for ds in datasets:
                if 1 not in study.get((ds, "iid", "alpha*"), {}):
                    print(f"{ds}: no alpha*(iid, K = 1) rows; skipped", file=sys.stderr)
                    continue
                sd_alphas = {1: study[(ds, "iid", "alpha*")][1]}
                chains = candidates(sd_alphas, args.max_nodes, args.max_depth)
                base_rate = profile.target_only_rate()
                sd = {m: best_tree(sd_alphas, profile, chains, m) for m in ("positional", "along")}
                sd_segments = segment_rates(sd_alphas, profile, sd["along"]["paths"])
                rows = [("iid", "SD (alpha*, K=1)", sd, sd_segments, [1])]
                for law, ver in FAMILIES:
                    # K = 1 is single-draft SD under every law and verifier: its exact acceptance
                    if not any(1 < k <= args.max_k for k in study.get((ds, law, ver), {})):
                        continue
                    alphas = along_alphas(study, ds, law, ver, range(1, args.max_k + 1))
                    trees = candidates(alphas, args.max_nodes, args.max_depth)
                    res = {m: best_tree(alphas, profile, trees, m) for m in ("positional", "along")}
                    rows.append((law, ver, res, segment_rates(alphas, profile, res["along"]["paths"]), sorted(alphas)))
                for law, ver, res, segments, ks in rows:
                    rec = {"profile": pname, "draft_scale": scale, "free_verify": free, "dataset": ds, "law": law,
                           "verifier": ver, "ks": ks, "target_only_tokens_per_s": base_rate,
                           "positional": res["positional"], "along": res["along"],
                           "positional_x_target": res["positional"]["tokens_per_s"] / base_rate,
                           "positional_x_sd": res["positional"]["tokens_per_s"] / sd["positional"]["tokens_per_s"],
                           "along_x_target": res["along"]["tokens_per_s"] / base_rate,
                           "along_x_sd": res["along"]["tokens_per_s"] / sd["along"]["tokens_per_s"],
                           "along_x_sd_ci95": interval(segments / sd_segments)}
                    records.append(rec)
                    if writer:
                        writer.write(**rec)
            print(f"{pname}, draft x{scale:g}{', free verify' if free else ''}: done "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    if writer:
        writer.close()
    emit(markdown(config, records), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
