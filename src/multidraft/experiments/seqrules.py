"""Every tree rule against the tree-level ceiling on random small instances (issue 26, item 4).

For instances ``i = 0..n-1`` (``TableModel.random(V, seed=seed + i, style=STYLES[i % 7])``) and
one tree law, ``trees.expected_tokens`` gives every rule's exact tokens per call (token walks
of specinfer / spectr / khisti_is / optimal, block where the law is a chain, traversal) and
the ceiling with its dual bound; one JSON line per instance. ``summarize`` turns the lines into
a markdown table: per rule the mean tokens per call, the mean and largest gap to the ceiling,
the fraction of instances at the ceiling (gap <= 1e-9) and below SpecInfer's walk.

    python -m multidraft.experiments.seqrules --law sequences --k 2 --depth 2 --vocab 3 -n 500 \\
        --out docs/results/seq_rules/sequences_k2_l2_v3.jsonl --markdown docs/results/seq_rules/sequences_k2_l2_v3.md
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from .. import trees

__all__ = ["main", "make_law", "run", "summarize"]

AT = 1e-9  # a rule within this of the ceiling is "at the ceiling" (LP precision)


def make_law(law: str, k: int, depth: int):
    if law == "sequences":
        return trees.sequences(k, depth)
    if law == "kary":
        return trees.kary(k, depth)
    if law == "chain":
        return trees.chain(depth)
    raise ValueError(f"law must be 'sequences', 'kary' or 'chain', got {law!r}")


def run(out, law: str, k: int, depth: int, V: int, n: int, seed: int = 0, progress=None) -> None:
    """Append one JSON line per instance to the open text file ``out``."""
    tl = make_law(law, k, depth)
    for i in range(n):
        style = trees.STYLES[i % len(trees.STYLES)]
        model = trees.TableModel.random(V, seed=seed + i, style=style)
        got = trees.expected_tokens(tl, model)
        rec = {"law": law, "k": k, "depth": depth, "V": V, "seed": seed + i, "style": style, "tokens": got}
        out.write(json.dumps(rec) + "\n")
        out.flush()
        if progress is not None:
            progress(i + 1, n)


def summarize(lines) -> str:
    """A markdown table from JSON lines (strings) of ``run``."""
    recs = [json.loads(s) for s in lines if s.strip()]
    if not recs:
        return "(no instances)\n"
    groups: dict = {}
    for r in recs:
        groups.setdefault((r["law"], r["k"], r["depth"], r["V"]), []).append(r["tokens"])
    out = []
    for (law, k, depth, V), rows in groups.items():
        names = [x for x in rows[0] if not x.startswith("ceiling")]
        out.append(f"### {law}, K = {k}, L = {depth}, V = {V}: {len(rows)} instances\n")
        ceil = sum(r["ceiling"] for r in rows) / len(rows)
        out.append(f"ceiling: mean {ceil:.4f} tokens per call; largest dual gap "
                   f"{max(r['ceiling_upper'] - r['ceiling'] for r in rows):.1e}\n")
        out.append("| rule | mean tokens/call | mean gap to ceiling | largest gap | at ceiling | below walk:specinfer |")
        out.append("|---|---|---|---|---|---|")
        for nm in names:
            gaps = [r["ceiling"] - r[nm] for r in rows]
            mean = sum(r[nm] for r in rows) / len(rows)
            at = sum(g <= AT for g in gaps) / len(rows)
            below = sum(r[nm] < r["walk:specinfer"] - 1e-12 for r in rows) / len(rows) if "walk:specinfer" in rows[0] else float("nan")
            out.append(f"| {nm} | {mean:.4f} | {sum(gaps) / len(gaps):.4f} | {max(gaps):.4f} | {at:.1%} | {below:.1%} |")
        out.append("")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m multidraft.experiments.seqrules", description=__doc__.split("\n")[0])
    ap.add_argument("--law", default="sequences", choices=("sequences", "kary", "chain"))
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=3)
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSONL file (appended)")
    ap.add_argument("--markdown", help="write the summary table of --out here")
    a = ap.parse_args(argv)
    t0 = time.time()

    def progress(i, n):
        if i % 25 == 0 or i == n:
            print(f"{i}/{n} instances, {time.time() - t0:.0f} s", file=sys.stderr)

    with open(a.out, "a", encoding="utf-8") as f:
        run(f, a.law, a.k, a.depth, a.vocab, a.n, a.seed, progress)
    with open(a.out, encoding="utf-8") as f:
        table = summarize(f.readlines())
    if a.markdown:
        with open(a.markdown, "w", encoding="utf-8") as f:
            f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
