"""Per-node cost of multi-draft decoding at full vocabulary, against one target forward.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/node_cost.py [--rows 12] [--draws 6] [--repeats 5]
        [--verifiers ...] [--laws ...] [--ks 1,2,3,4,6,8] [--threads 1] [--synthetic] [--out node_cost.jsonl]

What one tree node costs the decoder (``decoding/engine.py``), phase by phase, exactly as the
engine calls it for a node that is alone on its level (the conservative case: a level of
several nodes processes its draft logits as one batch):

* ``draft_proc``: ``sampling.process_logits`` of the node's draft logits ``[1, V]`` (one call per
  draft-temperature column: K calls for the independent law, which draws draft j at its own
  temperature), plus the ``(q > 0).sum`` the engine reads for the wor and greedy laws;
* ``draft_sample``: ``drafts.make(kind, q, k)`` (or ``drafts.independent``) and ``.sample(g)``;
* ``target_proc``: ``process_logits`` of the node's target logits ``[V]``;
* ``verify``: ``verifier.verify(p, q, drafts, generator=g, law=kind, validate=False)``.

Distributions. By default real rows of the experiment store (``--store``, the Qwen2.5-Coder
1.5B / 0.5B pair on HumanEval at T = 1, V = 151,936): the stored support of each position is
put back at its token ids and the lumped tail mass (at most 1e-4) is spread over the other
tokens with log-normal weights (distinct values over orders of magnitude, like a real tail; an
even spread would be one giant tie); the logits are ``log`` of that row, so ``process_logits``
at T = 1 gives it back. ``--logits-dtype bfloat16`` rounds the logits to bf16 first, as a bf16
transformers model emits them (many exact ties).
``--rows`` positions are taken evenly spaced in the order of the target's largest probability
(peaked to flat rows). ``--synthetic`` (or a missing store) draws Zipf-headed logits instead
(rank r gets ``-s log r`` plus noise, s in [0.8, 1.6] across rows, the draft a noisy copy).
``--flat-rows`` (default 3) appends flat rows, Zipf exponents 0.2..0.5 (near-uniform targets, as
at a high temperature: most drafts refused, residuals built; issue 39 item 4); ``--rows 0
--flat-rows N`` times flat rows alone.

With ``--top-k`` / ``--top-p`` both models' logits are cut as ``decode --top-k/--top-p`` does
(a node then has min(K, tokens kept) drafts under the wor and greedy laws, as in the engine,
which verifies a node the verifier cannot take with ``naive`` (one draft) or ``nss``).

The stored rows are HumanEval positions at T = 1: mostly peaked, so most first drafts are
accepted and ``verify`` rarely builds a residual; ``--synthetic`` gives flatter rows.

Statistic (``--clock wall``, the default: ``time.perf_counter``; ``--clock thread``:
``time.thread_time``, the CPU time of the calling thread, for a shared machine whose cores are
oversubscribed, where wall time counts the waits for a core). After one warm-up repeat (discarded), one repeat runs every row with ``--draws`` fixed seeds (a fresh generator per (row,
draw), the same in every repeat, so every repeat does the same work, rejections included);
each phase's time is summed over the repeat; the median over ``--repeats`` repeats, divided by
rows x draws, is the mean cost per node. torch runs with ``--threads`` threads (default 1:
one core, the engine's share on the 2-core machine).

Reference forwards: one target forward of one token from the committed cost profiles,
``data/profiles/*.json`` (``target.seconds`` at 1 node): the transformers bf16 profile and
every llama.cpp profile present (``llama-*.json``); when no llama.cpp profile of a BF16 target
is present, the llama.cpp BF16 target step measured for issue 13 (113 ms) is used as well.
A (verifier, law, K) whose per-node cost exceeds ``--budget`` (10%) of a reference is flagged.

``lp_optimal`` is skipped: it solves a linear program over all draft tuples, a small-V reference.

Whole trees (``--trees``): the per-step cost of every registered sequence-level tree rule
(``trees.names()`` but ``token_walk`` and ``tree_lp``, an LP over whole trees at small V; rules
added later are picked up from the registry) against one token-level walk with ``optimal``
(``trees.TokenWalk``) on the same filled trees: chain(L), sequences(K, L) and kary(K, L)
(``--tree-k``, ``--tree-depth``, default K = 2, L = 3) at the same rows: every node's (p, q)
is one of the rows above, chosen by the node's prefix (a fixed hash), so p and q at a node are
one target/draft pair. ``--trees`` draws ``--tree-count`` trees per law (fixed seeds, filled
before timing) and times ``rule.verify(tree, g)`` per tree (median over ``--repeats`` of the
summed time / trees); a rule that does not support a law prints its refusal.

Mixed nodes (``--mixed``; issue 39 item 4): the verify cost of one node of a mixed tree at the
same rows, through ``trees.TokenWalk.verify`` on a one-level tree (the accepted child is a leaf,
so every case pays the same bonus sample from p): ``model`` a node with ``--mixed-k`` iid drafts
and no copy (what a node without free drafts pays); ``independent`` the same drafts plus one
one-hot copy under the 'independent' law (``[k + 1, V]`` q rows: how main verified mixed nodes
before the free-first rule; only verifiers that take that law); ``free_first`` the same node
verified free drafts first (the copy, then the model's verifier on the residual); ``free_only``
a node with the copy alone. The copy is the target's most probable token (``hit``: mostly
accepted) or its least probable one (``miss``: refused, the residual and the model verifier
run). ``--mixed-verifiers`` (default specinfer,optimal).

Allocator note: glibc hands freed multi-MB temporaries back to the OS and the next call pays
page faults for them (about 1 ms per MB on the 2-core VM). The decoder keeps them in the process
(``multidraft._alloc.keep_freed_memory``, called when a decoder is built) and so does this script
before it times; ``MULTIDRAFT_MALLOC=default`` (or glibc's own ``MALLOC_*`` variables) leaves
glibc's defaults, to measure the difference. The JSONL meta records which (``allocator``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from multidraft._alloc import allocator_state, keep_freed_memory  # noqa: E402
from multidraft._validate import derive_seed  # noqa: E402
from multidraft import drafts as _drafts  # noqa: E402
from multidraft import verifiers as _verifiers  # noqa: E402
from multidraft.sampling import process_logits  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from _bench import CLOCKS, common_args, load_average, provenance  # noqa: E402

DEFAULT_STORE = ROOT / "runs/paper/positions/humaneval__tt1__td1__k0__p1.pt"
LLAMA_BF16_STEP_S = 0.113  # issue 13: llama.cpp, BF16 GGUF of the 1.5B target, 2 threads, measured
SKIP = {"lp_optimal": "a linear program over all draft tuples: small-V reference only"}
IND_TEMPS = (1.0, 0.7, 1.3, 0.5, 0.8, 1.2, 0.6, 1.1)
_clock = time.perf_counter  # --clock: wall (default) or thread (CPU time of this thread)


# ---------------------------------------------------------------------------------------
# distributions
def store_rows(path: Path, n: int, seed: int = 0, tail_sigma: float = 2.0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``n`` (target, draft) logit rows ``[n, V]`` float32 from a position store.

    The stored support keeps its values; the lumped tail mass (<= 1e-4 of the row) is spread
    over the other tokens with log-normal weights (``exp(tail_sigma * z)``, z standard normal,
    the draft's z a noisy copy of the target's), so tail values are distinct and spread over
    orders of magnitude like a real LM tail (an even spread would make one giant tie)."""
    from multidraft.experiments import store

    ps = store.load(path)
    V = int(ps.info["V"])
    N = len(ps)
    off = ps.offsets.tolist()
    top = torch.tensor([float(ps.p[off[i]:off[i + 1]].max()) for i in range(N)])
    order = torch.argsort(top)
    pick = order[torch.linspace(0, N - 1, n).round().long()].tolist()
    g = torch.Generator().manual_seed(seed)
    tl, dl = [], []
    for i in pick:
        ids = ps.ids[off[i]:off[i + 1]].long()
        z = torch.randn(V, generator=g, dtype=torch.float64)
        zd = 0.8 * z + 0.6 * torch.randn(V, generator=g, dtype=torch.float64)
        for vals, tail, zz, out in ((ps.p, ps.p_tail, z, tl), (ps.q, ps.q_tail, zd, dl)):
            w = (tail_sigma * zz).exp()
            w[ids] = 0.0
            full = w * (float(tail[i]) / float(w.sum()))
            full[ids] = vals[off[i]:off[i + 1]].double()
            full = full.clamp_min(1e-30)
            out.append((full / full.sum()).log().float())
    info = {"source": "store", "store": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
            "positions": pick, "target_top1": [float(top[i]) for i in pick],
            "support_sizes": [off[i + 1] - off[i] for i in pick],
            "tail": f"lumped tail mass spread with log-normal weights exp({tail_sigma} z), seed {seed}"}
    return torch.stack(tl), torch.stack(dl), info


def synthetic_rows(n: int, V: int, seed: int, lo: float = 0.8, hi: float = 1.6) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``n`` Zipf-headed (target, draft) logit rows ``[n, V]``: exponent s from ``lo`` to ``hi`` across
    rows (rank r gets ``-s log r`` plus noise, at random token ids), the draft a noisy copy."""
    g = torch.Generator().manual_seed(seed)
    tl, dl = [], []
    for i in range(n):
        s = lo + (hi - lo) * i / max(1, n - 1)
        r = torch.arange(1, V + 1, dtype=torch.float64)
        base = -s * r.log() + 0.3 * torch.randn(V, generator=g, dtype=torch.float64)
        perm = torch.randperm(V, generator=g)
        t = torch.empty(V, dtype=torch.float64).scatter_(0, perm, base)
        d = t + 0.5 * torch.randn(V, generator=g, dtype=torch.float64)
        tl.append(t.float())
        dl.append(d.float())
    return torch.stack(tl), torch.stack(dl), {"source": "synthetic", "zipf_exponents": [lo + (hi - lo) * i / max(1, n - 1) for i in range(n)]}


FLAT_EXPONENTS = (0.2, 0.5)  # --flat-rows: Zipf exponents of the flat rows (near-uniform p, as at a high temperature)


def flat_rows(n: int, V: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``n`` flat (target, draft) logit rows ``[n, V]`` (issue 39 item 4: "include flat rows"): Zipf
    exponents 0.2..0.5, so the target's largest probability is ~1e-4..1e-2 and its mass is spread over
    the whole vocabulary, as a high temperature gives (many drafts refused, residuals built)."""
    TL, DL, info = synthetic_rows(n, V, seed + 7919, *FLAT_EXPONENTS)
    return TL, DL, {"source": "flat", "zipf_exponents": info["zipf_exponents"]}


# ---------------------------------------------------------------------------------------
# references
def references(profiles: Path) -> list[dict]:
    refs = []
    for f in sorted(profiles.glob("*.json")):
        try:
            d = json.loads(f.read_text())
            nodes, secs = d["target"]["nodes"], d["target"]["seconds"]
            s = secs[nodes.index(1)]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        meta = d.get("meta", {})
        engine = meta.get("engine", "transformers")
        dtype = meta.get("dtype", "?")
        refs.append({"name": f"{engine} {dtype}", "seconds": float(s), "from": str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f),
                     "engine": engine, "dtype": dtype})
    if not any(r["engine"] == "llama.cpp" and "bf16" in str(r["dtype"]).lower() for r in refs):
        refs.append({"name": "llama.cpp BF16", "seconds": LLAMA_BF16_STEP_S, "from": "issue 13 (measured, 113 ms)",
                     "engine": "llama.cpp", "dtype": "BF16"})
    return refs


# ---------------------------------------------------------------------------------------
# whole trees: sequence-level tree rules against one token-level walk with `optimal`
TREE_SKIP = {"token_walk": "the reference itself (TokenWalk with optimal)",
             "tree_lp": "an LP over whole draft trees and emitted sequences: small V only"}


def tree_model(TL, DL, T=1.0):
    """A ``trees.TableModel`` at the rows' V: the (p, q) pair of a prefix is row
    ``hash(prefix) % n`` of (TL, DL) after ``process_logits`` at T (cached per prefix)."""
    from multidraft import trees

    n = TL.shape[0]

    def pick(prefix):
        code = 0
        for t in prefix:
            code = (code * 1_000_003 + int(t) + 1) % (1 << 61)
        return (code + len(prefix)) % n

    return trees.TableModel(TL.shape[-1], lambda s: process_logits(TL[pick(s)], T), lambda s: process_logits(DL[pick(s)], T))


def tree_costs(TL, DL, k, depth, count, repeats, seed, T=1.0, verifier="optimal", out=None):
    """Per-step ms of every registered tree rule against TokenWalk(verifier) on the same trees;
    prints one table and returns its rows."""
    from multidraft import trees

    model = tree_model(TL, DL, T)
    laws = [trees.chain(depth), trees.sequences(k, depth), trees.kary(k, depth)]
    rules = [(n, None) for n in trees.names() if n not in TREE_SKIP]
    rows = []
    print(f"\nwhole trees: V = {TL.shape[-1]}, {count} trees per law, {repeats} repeats; reference: token walk with {verifier!r}")
    for n, why in TREE_SKIP.items():
        print(f"skipped: {n} ({why})")
    print(f"{'law':<24}{'rule':<14}{'ms/step':>9}{'walk ms':>9}{'ratio':>8}{'tokens':>8}{'walk tok':>9}")
    for law in laws:
        built = [law.sample(model, torch.Generator().manual_seed(derive_seed(seed, j, rule="linear", weights=(7919, 1)))) for j in range(count)]
        for tree in built:  # process_logits rows, as the decoder's: marked checked, as the engine marks its trees
            tree.checked = True  # (no rule re-checks them: a rule's input checks are not its cost)
        nodes = statistics.mean(len(t) for t in built)
        ref = trees.TokenWalk(verifier, law=law.kind)

        def timed(rule):
            reps, toks = [], 0
            for rep in range(repeats + 1):
                t = 0.0
                toks = 0
                for j, tree in enumerate(built):
                    g = torch.Generator().manual_seed(derive_seed(seed, j, rule="linear", weights=(1_000_003, 1)))
                    t0 = _clock()
                    verdict = rule.verify(tree, g)
                    t += _clock() - t0
                    toks += len(verdict.path) + 1
                if rep:
                    reps.append(t)
            return 1e3 * statistics.median(reps) / count, toks / count

        if not ref.supports(law):
            print(f"{law.name:<24}reference walk refuses this law")
            continue
        ref_ms, ref_tok = timed(ref)
        for name, _ in rules:
            try:
                rule = trees.get(name)
            except (TypeError, ValueError) as exc:
                print(f"{law.name:<24}{name:<14}cannot be built without options: {exc}")
                continue
            if not rule.supports(law):
                why = rule.refusal(law) if hasattr(rule, "refusal") else "unsupported"
                print(f"{law.name:<24}{name:<14}refuses: {str(why)[:60]}")
                continue
            ms, tok = timed(rule)
            row = {"kind": "tree", "law": law.name, "rule": name, "nodes_mean": nodes, "ms_per_step": ms,
                   "walk_ms_per_step": ref_ms, "ratio_to_walk": ms / ref_ms, "tokens_per_step": tok,
                   "walk_tokens_per_step": ref_tok, "walk_verifier": verifier}
            rows.append(row)
            print(f"{law.name:<24}{name:<14}{ms:9.2f}{ref_ms:9.2f}{ms / ref_ms:8.2f}{tok:8.2f}{ref_tok:9.2f}", flush=True)
    return rows


# ---------------------------------------------------------------------------------------
# one node, as the engine does it
def mixed_costs(TL, DL, T, k, draws, repeats, seed, names):
    """Per-node verify cost of mixed nodes (module notes, ``--mixed``): rows of dicts."""
    from multidraft import trees as _trees

    V = TL.shape[-1]
    shape = _trees.TreeShape.from_args(None, k + 1, 1)  # room for k drafts and a copy
    P = [process_logits(TL[i], T) for i in range(TL.shape[0])]  # [V] each
    Q = [process_logits(DL[i], T) for i in range(DL.shape[0])]  # [V] each
    copies = {"hit": [int(p.argmax()) for p in P], "miss": [int(p.argmin()) for p in P]}

    def tree_for(case, i, copy, g):
        p, q = P[i], Q[i]
        toks = _drafts.make("iid", q.unsqueeze(0), k).sample(g)[0].tolist() if case != "free_only" else []
        law = "independent" if case == "independent" else "iid"
        t = _trees.DraftTree(shape, 0, 1, 1, law)
        if case == "independent":
            t.nodes[0].q = torch.cat([q.expand(k, V), _trees.one_hot_rows([copy], V, q.dtype)])  # [k + 1, V]
            t.add_drafts(0, toks + [copy])
        else:
            if toks:
                t.nodes[0].q = q
                t.add_drafts(0, toks)
            if case != "model":
                t.add_chains([(copy,)])
        t.set_target(lambda j: p)
        t.checked = True
        return t

    out = []
    for name in names:
        v = _verifiers.get(name)
        for case, which in (("model", None), ("independent", "hit"), ("independent", "miss"), ("free_first", "hit"),
                            ("free_first", "miss"), ("free_only", "hit"), ("free_only", "miss")):
            if case == "independent" and not v.supports("independent", k + 1):
                out.append({"kind": "mixed_node", "verifier": name, "case": case, "copy": which,
                            "refused": f"{name} does not take the independent law"})
                print(f"{name:<15}{case:<12}{which or '':<5} refused ({name} does not take the independent law)", flush=True)
                continue
            rule = _trees.TokenWalk(v, "independent" if case == "independent" else "iid")
            per_rep = []
            for rep in range(repeats + 1):
                tot = 0.0
                for i in range(len(P)):
                    for d in range(draws):
                        g = torch.Generator().manual_seed(derive_seed(seed, i, d, rule="linear", weights=(1_000_003, 1009, 1)))
                        t = tree_for(case, i, copies[which][i] if which else None, g)
                        t0 = _clock()
                        rule.verify(t, g)
                        tot += _clock() - t0
                if rep:
                    per_rep.append(tot)
            ms = 1e3 * statistics.median(per_rep) / (len(P) * draws)
            out.append({"kind": "mixed_node", "verifier": name, "case": case, "copy": which, "k": k, "verify_ms": ms})
            print(f"{name:<15}{case:<12}{which or '':<5} k={k} verify {ms:8.2f} ms", flush=True)
    return out


def run_node(v, kind, k, tl, dl, T, g, clock, top_k=None, top_p=None):
    """Draft a node with k drafts from draft logits dl [V] and verify at target logits tl [V]."""
    t0 = _clock()
    logits = dl.unsqueeze(0)  # [1, V]: the node's level
    if kind == "independent":
        temps = [IND_TEMPS[j % len(IND_TEMPS)] for j in range(k)]
        q = {c: process_logits(logits, temps[c], top_k, top_p) for c in range(k)}
        nnz = None
    else:
        q = {0: process_logits(logits, T, top_k, top_p)}
        nnz = (q[0] > 0).sum(-1).tolist() if kind in ("wor", "greedy") else None
    t1 = _clock()
    kk = min(k, nnz[0]) if nnz is not None else k
    ridx = torch.zeros(1, dtype=torch.long)
    if kind == "independent":
        qs = torch.stack([q[c].index_select(0, ridx) for c in range(k)], dim=-2)
        law = _drafts.independent(qs)
    else:
        qs = q[0].index_select(0, ridx)
        law = _drafts.make(kind, qs, kk)
    toks = law.sample(g).tolist()
    node_q = qs[0]
    t2 = _clock()
    p = process_logits(tl, T, top_k, top_p)
    t3 = _clock()
    dr = torch.tensor(toks[0], dtype=torch.long)
    if len(toks[0]) != k and not v.supports(kind, len(toks[0])):  # the engine's _verifier_for
        v = _verifiers.get("naive" if len(toks[0]) == 1 else "nss")
    y = int(v.verify(p, node_q, dr, generator=g, law=kind, validate=False).token)
    t4 = _clock()
    clock[0] += t1 - t0
    clock[1] += t2 - t1
    clock[2] += t3 - t2
    clock[3] += t4 - t3
    return y, y in toks[0]


PHASES = ("draft_proc", "draft_sample", "target_proc", "verify")


def measure(name, kind, k, TL, DL, T, draws, repeats, seed, top_k=None, top_p=None):
    v = _verifiers.get(name)
    n = TL.shape[0]
    per_rep = []
    acc = 0
    for rep in range(repeats + 1):  # the first is a warm-up
        clock = [0.0, 0.0, 0.0, 0.0]
        a = 0
        for i in range(n):
            for d in range(draws):
                g = torch.Generator().manual_seed(derive_seed(seed, i, d, rule="linear", weights=(1_000_003, 1009, 1)))
                _, hit = run_node(v, kind, k, TL[i], DL[i], T, g, clock, top_k, top_p)
                a += hit
        if rep:
            per_rep.append(clock)
            acc = a
    nodes = n * draws
    med = {ph: statistics.median(c[j] for c in per_rep) / nodes for j, ph in enumerate(PHASES)}
    total = statistics.median(sum(c) for c in per_rep) / nodes
    return med, total, acc / nodes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=DEFAULT_STORE)
    ap.add_argument("--synthetic", action="store_true", help="Zipf-headed synthetic logits instead of stored rows")
    ap.add_argument("--vocab", type=int, default=151_936, help="V for --synthetic")
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--flat-rows", type=int, default=3,
                    help="flat rows (Zipf exponents 0.2..0.5, near-uniform p) appended to the others (0: none)")
    ap.add_argument("--logits-dtype", choices=("float32", "bfloat16"), default="float32",
                    help="bfloat16: round the logits to bf16 (as a bf16 model emits them), then float32")
    ap.add_argument("--draws", type=int, default=6, help="fixed seeds per row in each repeat")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--verifiers", default=None, help="comma-separated (default: every registered one but lp_optimal)")
    ap.add_argument("--laws", default=None, help="comma-separated law kinds (default: every law the verifier supports)")
    ap.add_argument("--ks", default="1,2,3,4,6,8")
    ap.add_argument("--top-k", type=int, default=None, help="top-k for target and draft (as decode --top-k)")
    ap.add_argument("--top-p", type=float, default=None, help="top-p for target and draft (as decode --top-p)")
    ap.add_argument("--budget", type=float, default=0.10, help="flag above this fraction of a target forward")
    ap.add_argument("--profiles", type=Path, default=ROOT / "data/profiles", help="folder of cost profiles (*.json)")
    common_args(ap, repeats=5, threads=1, seed=0, out=None, clock="wall",
                helps={"out": "JSONL: one meta line, then one line per (verifier, law, K)"})
    ap.add_argument("--trees", action="store_true", help="whole trees: every tree rule against the optimal token walk")
    ap.add_argument("--trees-only", action="store_true", help="--trees and skip the per-node table")
    ap.add_argument("--tree-k", type=int, default=2)
    ap.add_argument("--tree-depth", type=int, default=3)
    ap.add_argument("--tree-count", type=int, default=8, help="trees per law")
    ap.add_argument("--mixed", action="store_true", help="mixed nodes (free drafts beside the model's): verify costs")
    ap.add_argument("--mixed-only", action="store_true", help="--mixed and skip the per-node table")
    ap.add_argument("--mixed-k", type=int, default=4, help="model drafts at a --mixed node")
    ap.add_argument("--mixed-verifiers", default="specinfer,optimal")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the decoder does (multidraft._alloc; MULTIDRAFT_MALLOC=default: glibc's defaults)
    global _clock
    _clock = CLOCKS[args.clock]
    if args.rows <= 0:
        TL = DL = torch.empty(0, args.vocab)
        src = {"source": "none"}
    elif args.synthetic or not args.store.is_file():
        TL, DL, src = synthetic_rows(args.rows, args.vocab, args.seed)
    else:
        TL, DL, src = store_rows(args.store, args.rows, args.seed)
    if args.flat_rows > 0:  # flat rows after the others (every table averages over all rows)
        FT, FD, finfo = flat_rows(args.flat_rows, TL.shape[-1], args.seed)
        TL, DL = torch.cat([TL, FT]), torch.cat([DL, FD])
        src["flat_rows"] = {"n": args.flat_rows, **finfo}
    if args.logits_dtype == "bfloat16":
        TL, DL = TL.bfloat16().float(), DL.bfloat16().float()
    src["logits_dtype"] = args.logits_dtype
    V = TL.shape[-1]
    refs = references(args.profiles)
    ks = [int(x) for x in args.ks.split(",") if x.strip()]
    names = args.verifiers.split(",") if args.verifiers else [n for n in _verifiers.names() if n not in SKIP]
    laws_filter = set(args.laws.split(",")) if args.laws else None

    meta = {
        "kind": "meta", "benchmark": "node_cost", "seed": args.seed, "V": V, "rows": TL.shape[0], "draws": args.draws,
        "repeats": args.repeats, "statistic": "median over repeats of the summed phase times / (rows x draws)", "clock": args.clock,
        "torch_threads": torch.get_num_threads(), "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
        "independent_temperatures": list(IND_TEMPS),
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}, "allocator": allocator_state(),
        "ks": ks, "budget": args.budget, "references": refs, "distributions": src,
        "skipped": SKIP, **provenance(), "cpu_count": os.cpu_count(), "load_average_before": load_average(),
        "git": _git_head(),
    }
    print(f"V = {V}, {TL.shape[0]} rows ({src['source']}), {args.draws} draws x {args.repeats} repeats, "
          f"torch threads {torch.get_num_threads()}, T = {args.temperature}, top-k {args.top_k}, top-p {args.top_p}; "
          f"load {meta['load_average_before']}")
    for r in refs:
        print(f"reference: {r['name']}: {1e3 * r['seconds']:.1f} ms per target forward ({r['from']})")
    for n, why in SKIP.items():
        print(f"skipped: {n} ({why})")
    hdr = f"{'verifier':<15}{'law':<12}{'K':>2} {'d.proc':>7}{'d.samp':>7}{'t.proc':>7}{'verify':>8}{'total':>8}  acc  " + \
        "".join(f"{'%' + r['name']:>18}" for r in refs)
    print(hdr)
    rows_out = []
    flagged = []
    for name in (names if not (args.trees_only or args.mixed_only) else []):
        v = _verifiers.get(name)
        for kind in v.laws:
            if laws_filter and kind not in laws_filter:
                continue
            for k in ks:
                if not v.supports(kind, k):
                    continue
                med, total, acc = measure(name, kind, k, TL, DL, args.temperature, args.draws, args.repeats, args.seed,
                                          args.top_k, args.top_p)
                pct = {r["name"]: total / r["seconds"] for r in refs}
                over = [r["name"] for r in refs if total > args.budget * r["seconds"]]
                row = {"kind": "node", "verifier": name, "law": kind, "k": k,
                       **{f"{ph}_ms": 1e3 * med[ph] for ph in PHASES}, "total_ms": 1e3 * total,
                       "acceptance": acc, "fraction_of_forward": pct, "over_budget": over}
                rows_out.append(row)
                if over:
                    flagged.append(row)
                print(f"{name:<15}{kind:<12}{k:>2} " + "".join(f"{1e3 * med[ph]:7.2f}" for ph in PHASES[:3]) +
                      f"{1e3 * med['verify']:8.2f}{1e3 * total:8.2f} {acc:4.2f}  " +
                      "".join(f"{100 * pct[r['name']]:17.1f}{'!' if r['name'] in over else ' '}" for r in refs), flush=True)
    print(f"\n{len(flagged)} of {len(rows_out)} (verifier, law, K) above {100 * args.budget:.0f}% of some reference forward (!)")
    for ref in refs:
        over = [r for r in rows_out if ref["name"] in r["over_budget"]]
        print(f"  over {100 * args.budget:.0f}% of {ref['name']} ({1e3 * args.budget * ref['seconds']:.1f} ms): {len(over)}"
              + (": " + ", ".join(f"{r['verifier']}/{r['law']}/K={r['k']} {r['total_ms']:.1f}" for r in over) if over else ""))
    if args.mixed or args.mixed_only:
        rows_out += mixed_costs(TL, DL, args.temperature, args.mixed_k, args.draws, args.repeats, args.seed,
                                args.mixed_verifiers.split(","))
    if args.trees or args.trees_only:
        rows_out += tree_costs(TL, DL, args.tree_k, args.tree_depth, args.tree_count, args.repeats, args.seed, args.temperature)
    if args.out:
        meta["load_average_after"] = load_average()
        with open(args.out, "w") as f:
            for r in [meta] + rows_out:
                f.write(json.dumps(r) + "\n")
        print(f"wrote {args.out}")


def _git_head():
    try:
        import subprocess

        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    main()
