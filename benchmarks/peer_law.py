"""How far llama-speculative's output law is from the target's, on real positions (issue 13).

At every position the exact output law of llama.cpp's node rule (multidraft.peers:
top-ranked drafts, recursive rejection in a random order; docs/guide/llama_cpp_peer.md) is
computed for K = 1, 2, 4 children and its total-variation distance to the target's p is
reported, with the split threshold off (p_split = 0: exactly K children) and at llama.cpp's
default (p_split = 0.1). The control (the same rule with drafts sampled i.i.d. from q) must
give TV = 0 to rounding. No sampling anywhere: every number is an exact expectation.

Sources of (p, q):
  --source models  (default) full-vocabulary (V = 151,936) distributions recomputed with the
                   default model pair along the first --texts continuations of the committed
                   HumanEval position store (runs/paper/positions; Qwen2.5-Coder 1.5B target /
                   0.5B draft, T = 1: same prompts, seeds and sampled tokens). Every figure is
                   exact for these distributions. Also lumps them the way the store does and
                   reports how far that moves the TV on the same positions.
  --source store   the store itself, every position, on its lumped pairs (support + one
                   "other" token carrying a tail <= 5e-4). The node rule is NOT stable under
                   that lumping once a child with small q is visited after a rejection (the
                   residual (p - q)+ then has a tiny mass of which the tail is a large part):
                   measured on the 234 full-vocabulary positions of --source models, lumping
                   moves the TV by <= 8e-5 for K = 1 and for p_split = 0.1, but by up to 0.011
                   (K = 2) and 0.47 (K = 4) with p_split = 0. Each row therefore also reports
                   tail_sensitivity_max: the largest change of the TV when the "other" token is
                   split into a p-only and a q-only token (rows far from 0 are not trustworthy).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/peer_law.py [--source models|store] [--texts 4] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from multidraft.peers import llama_speculative_law

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import common_args, provenance  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "runs/paper/positions/humaneval__tt1__td1__k0__p1.pt"
KS = (1, 2, 4)
SPLITS = (0.0, 0.1)  # 0: exactly K children; 0.1: llama.cpp's default --draft-p-split
CHUNK = 32


def laws(P: torch.Tensor, Q: torch.Tensor) -> dict[tuple[int, float, str], dict[str, torch.Tensor]]:
    """Per (K, p_split, draft_choice): TV, acceptance and branches of every row of P, Q [n, V]."""
    out = {}
    for k in KS:
        for split in SPLITS:
            for choice in ("top", "sampled"):
                parts = [llama_speculative_law(P[i:i + CHUNK], Q[i:i + CHUNK], k, p_split=split, draft_choice=choice)
                         for i in range(0, P.shape[0], CHUNK)]
                out[(k, split, choice)] = {
                    "tv": torch.cat([x.tv for x in parts]),
                    "acceptance": torch.cat([x.acceptance for x in parts]),
                    "branches": torch.cat([x.branches for x in parts]).double(),
                }
    return out


def summary(res: dict, extra: dict) -> list[dict]:
    rows = []
    for (k, split, choice), r in res.items():
        tv = r["tv"]
        rows.append({
            **extra, "k": k, "p_split": split, "draft_choice": choice, "n_positions": int(tv.numel()),
            "tv_mean": float(tv.mean()), "tv_se": float(tv.std() / tv.numel() ** 0.5) if tv.numel() > 1 else 0.0,
            "tv_median": float(tv.median()), "tv_max": float(tv.max()),
            "acceptance_mean": float(r["acceptance"].mean()), "branches_mean": float(r["branches"].mean()),
        })
    return rows


def print_table(rows: list[dict], title: str) -> None:
    print(title)
    print(f"{'K':>2} {'p_split':>7} {'drafts':>7} {'n':>5} {'TV mean':>9} {'+-SE':>8} {'median':>9} {'max':>9} {'accept':>7} {'children':>8}")
    for r in rows:
        print(f"{r['k']:>2} {r['p_split']:>7g} {r['draft_choice']:>7} {r['n_positions']:>5} {r['tv_mean']:>9.4f} "
              f"{r['tv_se']:>8.4f} {r['tv_median']:>9.4f} {r['tv_max']:>9.4f} {r['acceptance_mean']:>7.3f} {r['branches_mean']:>8.2f}")


def split_tail(P: torch.Tensor, Q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The lumped pairs [n, M+1] (last column the "other" token) with that token split in two:
    one carrying the target's tail and no draft mass, one the draft's tail and no target mass."""
    z = torch.zeros_like(P[:, -1:])
    return torch.cat([P, z], -1), torch.cat([Q[:, :-1], z, Q[:, -1:]], -1)


def from_store(path: Path):
    from multidraft.experiments import store

    ps = store.load(path)
    P, Q = store.lumped(ps)
    meta = {"source": "store", "store": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
            "dataset": ps.info.get("dataset"), "t_target": ps.info.get("t_target"), "t_draft": ps.info.get("t_draft"),
            "models": ps.info.get("settings", {}).get("models"), "eps": ps.info.get("settings", {}).get("eps"),
            "seed": ps.info.get("settings", {}).get("seed"),  # the store's seed (per-text seeds derive from it)
            "p_tail_max": float(ps.p_tail.max()), "q_tail_max": float(ps.q_tail.max())}
    return P, Q, meta


def from_models(path: Path, n_texts: int):
    """Full-vocabulary p, q along the store's first n_texts continuations, recomputed the way
    experiments.collect made them (same prompt encoding, per-text seed, T = 1)."""
    from multidraft.datasets import load_prompts, prompt_ids
    from multidraft.decoding.pair import load_pair
    from multidraft.decoding.continuation import continuation_logits
    from multidraft.experiments import store
    from multidraft._validate import derive_seed
    from multidraft.sampling import process_logits

    ps = store.load(path)
    settings = ps.info["settings"]
    sources = ps.info["sources"]
    texts = list(dict.fromkeys(s["text"] for s in sources))[:n_texts]
    prompts = dict(load_prompts(ps.info["dataset"], 1 << 30, seed=settings["seed"]))  # the whole set
    target, draft, tok = load_pair("transformers")
    Ps, Qs, agree, total = [], [], 0, 0
    for tid in texts:
        ids = prompt_ids(tok, ps.info["dataset"], prompts[tid])
        c = continuation_logits(target, draft, ids, max_new_tokens=settings["new_tokens"],
                                temperature=settings["sample_temperature"], top_k=settings["top_k"],
                                top_p=settings["top_p"], generator=derive_seed(settings["seed"], tid, rule="unit"),
                                eos_token_id=getattr(tok, "eos_token_id", None))
        stored = [s["token"] for s in sources if s["text"] == tid]
        got = [int(t) for t in c.tokens]
        total += len(stored)
        agree += sum(a == b for a, b in zip(stored, got))
        Ps.append(process_logits(c.target_logits, ps.info["t_target"], settings["top_k"], settings["top_p"], dtype=torch.float64))
        Qs.append(process_logits(c.draft_logits, ps.info["t_draft"], settings["top_k"], settings["top_p"], dtype=torch.float64))
        print(f"  {tid}: {len(got)} positions", file=sys.stderr, flush=True)
    P, Q = torch.cat(Ps), torch.cat(Qs)
    meta = {"source": "models", "store": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
            "texts": texts, "dataset": ps.info["dataset"], "t_target": ps.info["t_target"], "t_draft": ps.info["t_draft"],
            "models": settings["models"], "seed": settings["seed"],
            "continuation_tokens_equal_to_store": f"{agree}/{total}"}
    # the store's lumping of these very rows, to measure what lumping does to the TV
    rows = store.truncate(P, Q, eps=settings["eps"], k_max=settings["k_max"])
    lumped = store.lumped(store.from_rows(rows, {}))
    return P, Q, lumped, meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", choices=("models", "store"), default="models")
    ap.add_argument("--store", type=Path, default=STORE)
    ap.add_argument("--texts", type=int, default=4, help="prompts recomputed with --source models (64 positions each)")
    common_args(ap, out=ROOT / "docs/results/peer_law/peer_law.jsonl", helps={"out": "JSONL of the summary rows (appended)"})
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    env = {**provenance(), "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
           "peer": "llama.cpp examples/speculative @ 0c1e57098 (llama-cpp-python 0.3.36)",
           "note": "exact expectations: no random draws"}
    if a.source == "store":
        P, Q, meta = from_store(a.store)
        res = laws(P, Q)
        alt = laws(*split_tail(P, Q))
        rows = summary(res, {**meta, **env, "vocab": "lumped"})
        for row, key in zip(rows, res):
            row["tail_sensitivity_max"] = float((res[key]["tv"] - alt[key]["tv"]).abs().max())
        print_table(rows, f"llama-speculative node law vs p: {meta['dataset']} T = 1, {len(P)} positions (lumped store pairs)")
        print("max |TV(lumped) - TV(tail split into p-only and q-only tokens)|: "
              + ", ".join(f"K={r['k']} split={r['p_split']:g} {r['draft_choice']}: {r['tail_sensitivity_max']:.2e}" for r in rows))
    else:
        P, Q, (LP, LQ), meta = from_models(a.store, a.texts)
        full = laws(P, Q)
        lump = laws(LP, LQ)
        rows = summary(full, {**meta, **env, "vocab": "full"})
        for row, key in zip(rows, full):
            d = (full[key]["tv"] - lump[key]["tv"]).abs()
            row["lumping_tv_abs_diff_max"] = float(d.max())
        print_table(rows, f"llama-speculative node law vs p: {meta['dataset']} T = 1, {len(P)} positions, full V = {P.shape[-1]}")
        print(f"continuation tokens equal to the store's: {meta['continuation_tokens_equal_to_store']}")
        print("max |TV(full) - TV(lumped as in the store)| per row: "
              + ", ".join(f"K={r['k']} split={r['p_split']:g} {r['draft_choice']}: {r['lumping_tv_abs_diff_max']:.2e}" for r in rows))
    ctl = max(r["tv_max"] for r in rows if r["draft_choice"] == "sampled")
    print(f"control (the same rule, drafts sampled i.i.d. from q): max TV to p over every row = {ctl:.2e}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter() - t0
    with open(a.out, "a") as f:
        for r in rows:
            f.write(json.dumps({**r, "wall_s": round(wall, 1)}) + "\n")
    print(f"wrote {len(rows)} rows to {a.out} ({wall:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
