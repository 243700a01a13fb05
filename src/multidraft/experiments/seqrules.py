"""Every tree rule against the tree-level ceiling on random small instances (issue 26, item 4).

A *cell* is (law, K, L, V): a tree draft law (``sequences``: K i.i.d. draft sequences;
``kary``: the K-ary tree with i.i.d. drafts at every node; ``chain``: one sequence, K = 1),
its depth L and the vocabulary size V. Instance ``i = 0..n-1`` of a cell is
``TableModel.random(V, seed=derive_seed(seed, i, rule="linear"), style=STYLES[i % 7])`` (that is ``seed + i``).

Each cell has its own results file ``<law>_k<K>_l<L>_v<V>.jsonl`` (``records.JsonlWriter``: a
meta row with config, seed, versions and command, then rows bound to it). Rows are keyed by
(instance, rule):

* ``rule = "ceiling"``: the ceiling LP of the instance (``trees.optimal_tokens``: its value, the
  dual certificate ``upper``, the dual gap, the repaired coupling's feasibility error, the LP
  size, seconds) — the expensive part, computed once per instance;
* every other row: one rule's exact expected tokens per call on the instance and its
  certificate error (``trees.rule_table.certified``: a rule past 1e-12 stops the run), warnings
  the rule raised, seconds. The rules are ``trees.rule_table.rule_names(law)``: the token walks
  and *every registered sequence-level rule* that supports the law; the command line adds the
  variants of ``trees.rule_table.VARIANTS`` (``univer_ot``: UniVer with its LP plan, small V only:
  at most 0.6 s of one core per instance on every cell of GRID, measured).

``run_cell`` writes only the rows that are missing, so rerunning a cell after new rules are
registered adds their certificates and nothing else; a larger ``n`` adds instances.
``report`` makes the markdown table from the JSONL files alone (never recomputing).

    multidraft experiment seqrules RUN_DIR --grid                 # every cell of GRID
    multidraft experiment seqrules RUN_DIR --report               # the table, from the files
    multidraft experiment seqrules RUN_DIR --root                 # item 5: the root trade-off (ROOT_CELLS)
    multidraft experiment seqrules RUN_DIR --law sequences --k 2 --depth 2 --vocab 3 -n 500
    multidraft experiment seqrules RUN_DIR --grid --rules univer_ot  # one rule's rows only, every cell

(the committed study: RUN_DIR = ``docs/results/seq_rules``; the files go where RUN_DIR says).
"""
from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

from .. import trees
from .._validate import as_int, derive_seed
from ..trees import rule_table
from . import records
from .progress import progress as _progress

__all__ = ["AT", "DROPPED", "GRID", "LAWS", "ROOT_CELLS", "ROOT_N", "cell_name", "cell_path", "load_cell", "make_law",
           "report", "root_path", "run_cell", "run_root", "summarize_cell"]

AT = 1e-9  # a rule within this of the ceiling is "at the ceiling" (LP precision)
TOL = 1e-12  # certificate tolerance: a rule past it is not lossless
LAWS = ("sequences", "kary", "chain")
KEY = ("instance", "rule")
CEILING = "ceiling"

# (law, K, L, V): the cells run by --grid (500 instances each), in order of priority. Chosen from lp_size
# and the time per instance measured on the project's shared 2-core VM (docs/results/seq_rules/README.md).
GRID = (
    ("chain", 1, 2, 2), ("chain", 1, 2, 3), ("chain", 1, 2, 4), ("chain", 1, 3, 2), ("chain", 1, 3, 3),
    ("sequences", 2, 2, 2), ("kary", 2, 2, 2), ("sequences", 3, 2, 2), ("sequences", 2, 3, 2),
    ("sequences", 2, 2, 3), ("kary", 3, 2, 2), ("chain", 1, 3, 4), ("sequences", 2, 2, 4), ("kary", 2, 2, 3),
    ("sequences", 2, 3, 3),
)
# cells of the aimed grid (V in 2..4, L in 2..3, K in 2..3) left out, and why (the report lists them)
_SLOW = "feasible, not run: {t} per instance of one core measured, {m} min of one core for 500 on a machine shared by 8"
DROPPED = (
    ("sequences", 3, 2, 3, _SLOW.format(t="about 1.3 s", m=11)),
    ("sequences", 3, 3, 2, _SLOW.format(t="about 1.2 s", m=10)),
    ("kary", 2, 2, 4, _SLOW.format(t="about 3 s", m=25)),
    ("sequences", 3, 2, 4, _SLOW.format(t="about 6 s", m=50)),
    ("sequences", 2, 3, 4, _SLOW.format(t="about 7 s", m=60)),
    ("sequences", 3, 3, 3, "LP of 590,490 variables, past MAX_LP_VARIABLES = 300,000"),
    ("sequences", 3, 3, 4, "262,144 draft trees, past MAX_TREES = 200,000"),
    ("kary", 3, 2, 3, "531,441 draft trees, past MAX_TREES"),
    ("kary", 3, 2, 4, "16,777,216 draft trees, past MAX_TREES"),
    ("kary", 2, 3, 2, "LP of 491,520 variables, past MAX_LP_VARIABLES (V = 3, 4: past MAX_TREES)"),
    ("kary", 3, 3, 2, "5.5e11 draft trees (every V)"),
)


def make_law(law: str, k: int, depth: int):
    if law == "sequences":
        return trees.sequences(k, depth)
    if law == "kary":
        return trees.kary(k, depth)
    if law == "chain":
        if k != 1:
            raise ValueError(f"k: a chain has one draft per node (k = 1), got {k}")
        return trees.chain(depth)
    raise ValueError(f"law must be one of {', '.join(LAWS)}, got {law!r}")


def cell_name(law: str, k: int, depth: int, V: int) -> str:
    return f"{law}_k{k}_l{depth}_v{V}"


def cell_path(out_dir, law: str, k: int, depth: int, V: int) -> Path:
    return Path(out_dir) / f"{cell_name(law, k, depth, V)}.jsonl"


def _config(law: str, k: int, depth: int, V: int, n: int) -> dict:
    return {"experiment": "seq_rules", "law": law, "k": k, "depth": depth, "V": V, "n": n,
            "styles": list(trees.STYLES), "tol": TOL, "at": AT, "max_lp_variables": trees.MAX_LP_VARIABLES}


def _instance_law(law: str, k: int, depth: int, model):
    """A fresh tree law whose ``enumerate(model)`` is computed once: the ceiling and every rule's
    certificate read the same list of (tree, probability) (rules only read trees)."""
    tl = make_law(law, k, depth)
    cache: list = []
    orig = tl.enumerate

    def enumerate_once(m, root_token: int = 0, limit: int = trees.MAX_TREES):
        if m is not model or root_token != 0:
            return orig(m, root_token, limit)
        if not cache:
            cache.append(orig(m, root_token, limit))
        return cache[0]

    tl.enumerate = enumerate_once
    return tl


def run_cell(law: str, k: int, depth: int, V: int, n: int = 500, seed: int = 0, *, out_dir,
             rules=None, show_progress: bool = True) -> dict:
    """Write the missing (instance, rule) rows of one cell; ``{"ceilings": added, "rules": added,
    "seconds": elapsed}``. ``rules`` restricts the sequence-level rules (default: every registered)."""
    n = as_int(n, "n", minimum=1)
    V = as_int(V, "V", minimum=2)
    make_law(law, k, depth)  # bad cell: refused before any file is touched
    path = cell_path(out_dir, law, k, depth, V)
    t0 = time.perf_counter()
    added = {"ceilings": 0, "rules": 0}
    with records.JsonlWriter(path, _config(law, k, depth, V, n), seed, keyed=("n",)) as w:
        done = w.done(KEY)
        names = rule_table.rule_names(make_law(law, k, depth), rules=rules)
        for i in _progress(range(n), total=n, desc=cell_name(law, k, depth, V), enabled=show_progress):
            todo = [nm for nm in [CEILING, *names] if records.row_key({"instance": i, "rule": nm}, KEY) not in done]
            if not todo:
                continue
            style = trees.STYLES[i % len(trees.STYLES)]
            model = trees.TableModel.random(V, seed=derive_seed(seed, i, rule="linear"), style=style)
            tl = _instance_law(law, k, depth, model)
            base = {"instance": i, "seed": derive_seed(seed, i, rule="linear"), "style": style}
            for nm in todo:
                t = time.perf_counter()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    if nm == CEILING:
                        sol = trees.optimal_tokens(tl, model)
                        row = {"rule": CEILING, "value": sol.value, "upper": sol.upper_bound, "dual_gap": sol.gap,
                               "feasibility_error": sol.feasibility_error, "variables": sol.variables}
                    else:
                        cert = rule_table.certified(nm, tl, model, TOL)
                        row = {"rule": nm, "tokens": cert.expected_tokens, "cert_error": cert.max_abs_error}
                msgs = sorted({str(c.message) for c in caught})
                w.write(**base, **row, warnings=msgs, seconds=round(time.perf_counter() - t, 4))
                added["ceilings" if nm == CEILING else "rules"] += 1
    added["seconds"] = time.perf_counter() - t0
    return added


# ---------------------------------------------------------------- item 5: the root trade-off

ROOT_CELLS = (("chain", 1, 3, 3), ("sequences", 2, 2, 3), ("sequences", 2, 3, 2), ("kary", 2, 2, 2), ("sequences", 2, 2, 2),
              ("sequences", 3, 2, 2), ("kary", 3, 2, 2))
ROOT_N = 100


def root_path(out_dir, law: str, k: int, depth: int, V: int) -> Path:
    return Path(out_dir) / f"root_{cell_name(law, k, depth, V)}.jsonl"


def run_root(law: str, k: int, depth: int, V: int, n: int = ROOT_N, seed: int = 0, *, out_dir,
             show_progress: bool = True) -> int:
    """``trees.root_tradeoff`` on instances 0..n-1 of a cell (same instances as ``run_cell``), one row
    each, missing rows only; returns the rows added."""
    n = as_int(n, "n", minimum=1)
    make_law(law, k, depth)
    config = {"experiment": "seq_rules_root", "law": law, "k": k, "depth": depth, "V": V, "n": n,
              "styles": list(trees.STYLES), "slack": 1e-9}
    added = 0
    with records.JsonlWriter(root_path(out_dir, law, k, depth, V), config, seed, keyed=("n",)) as w:
        done = w.done(("instance",))
        for i in _progress(range(n), total=n, desc="root " + cell_name(law, k, depth, V), enabled=show_progress):
            if records.row_key({"instance": i}, ("instance",)) in done:
                continue
            style = trees.STYLES[i % len(trees.STYLES)]
            model = trees.TableModel.random(V, seed=derive_seed(seed, i, rule="linear"), style=style)
            t = time.perf_counter()
            r = trees.root_tradeoff(_instance_law(law, k, depth, model), model)
            w.write(instance=i, seed=derive_seed(seed, i, rule="linear"), style=style, **r._asdict(), seconds=round(time.perf_counter() - t, 4))
            added += 1
    return added


def _root_section(path, significant: float = 1e-7) -> list[str]:
    meta, rows = records.read_jsonl(path)
    c = meta["config"]
    name = cell_name(c["law"], c["k"], c["depth"], c["V"])
    cost = [r["ceiling"] - r["root_optimal"] for r in rows]
    short = [r["alpha_root"] - r["ceiling_root_max"] for r in rows]
    bad = [r for r, g in zip(rows, cost) if g > significant]
    line = (f"| {name} | {len(rows)} | {len(bad)} | {max(cost, default=0):.6f} | {max(short, default=0):.6f} |")
    if bad:
        w = max(bad, key=lambda r: r["ceiling"] - r["root_optimal"])
        line += (f" seed {w['seed']} ({w['style']}): ceiling {w['ceiling']:.6f}, best root-optimal rule "
                 f"{w['root_optimal']:.6f}; alpha* at the root {w['alpha_root']:.6f}, at the ceiling at most "
                 f"{w['ceiling_root_max']:.6f} |")
    else:
        line += " - |"
    return [line]


# ---------------------------------------------------------------- the report (files only)

def load_cell(path) -> tuple[dict, list[dict]]:
    """``(config, instances)`` of one cell file: one dict per instance with a ceiling row,
    ``{"instance", "seed", "style", "ceiling", "upper", "dual_gap", "tokens": {rule: value}, "warnings": {rule: [..]}}``."""
    meta, rows = records.read_jsonl(path)
    if meta is None or (meta.get("config") or {}).get("experiment") != "seq_rules":
        raise ValueError(f"{path}: not a seq_rules results file (no meta row with experiment 'seq_rules')")
    inst: dict = {}
    for r in rows:
        i = r.get("instance")
        d = inst.setdefault(i, {"instance": i, "seed": r.get("seed"), "style": r.get("style"), "tokens": {}, "warnings": {}})
        if r.get("rule") == CEILING:
            d.update(ceiling=r["value"], upper=r["upper"], dual_gap=r["dual_gap"])
        else:
            d["tokens"][r["rule"]] = r["tokens"]
        if r.get("warnings"):
            d["warnings"][r["rule"]] = r["warnings"]
    return meta["config"], [inst[i] for i in sorted(inst) if "ceiling" in inst[i]]


def _is_walk(name: str) -> bool:
    return name.startswith(rule_table.WALK_PREFIX)


def summarize_cell(config: dict, insts: list[dict]) -> dict:
    """Per rule over the instances that have it: mean tokens, mean / largest gap (and its instance),
    fraction at the ceiling, fraction below ``walk:specinfer``, fraction >= the best walk."""
    rules: list[str] = []
    for d in insts:
        for nm in d["tokens"]:
            if nm not in rules:
                rules.append(nm)
    rules.sort(key=lambda nm: (not _is_walk(nm), nm if not _is_walk(nm) else rule_table.WALKS.index(nm[5:])
                               if nm[5:] in rule_table.WALKS else nm))
    out = {"cell": cell_name(config["law"], config["k"], config["depth"], config["V"]), "n": len(insts),
           "ceiling": _mean([d["ceiling"] for d in insts]), "dual_gap": max((d["dual_gap"] for d in insts), default=math.nan),
           "rules": {}}
    walks = [nm for nm in rules if _is_walk(nm)]
    for nm in rules:
        have = [d for d in insts if nm in d["tokens"]]
        if not have:
            continue
        gaps = [d["ceiling"] - d["tokens"][nm] for d in have]
        j = max(range(len(have)), key=lambda t: gaps[t])
        worst = have[j]
        s = {"n": len(have), "mean": _mean([d["tokens"][nm] for d in have]), "mean_gap": _mean(gaps),
             "max_gap": gaps[j], "at": sum(g <= AT for g in gaps) / len(have),
             "worst": {"instance": worst["instance"], "seed": worst["seed"], "style": worst["style"],
                       "tokens": worst["tokens"][nm], "ceiling": worst["ceiling"]}}
        spec = [d for d in have if "walk:specinfer" in d["tokens"]]
        s["below_specinfer"] = (sum(d["tokens"][nm] < d["tokens"]["walk:specinfer"] - AT for d in spec) / len(spec)
                                if spec else math.nan)
        s["gain_specinfer"] = _mean([d["tokens"][nm] / d["tokens"]["walk:specinfer"] - 1 for d in spec]) if spec else math.nan
        full = [d for d in have if all(w in d["tokens"] for w in walks)]
        if full and walks:
            best = [max(d["tokens"][w] for w in walks) for d in full]
            s["ge_best_walk"] = sum(d["tokens"][nm] >= b - AT for d, b in zip(full, best)) / len(full)
            s["gain_best_walk"] = _mean([d["tokens"][nm] / b - 1 for d, b in zip(full, best)])
            j = max(range(len(full)), key=lambda t: best[t] - full[t]["tokens"][nm])
            s["behind_best_walk"] = {"by": best[j] - full[j]["tokens"][nm], "seed": full[j]["seed"], "style": full[j]["style"],
                                     "tokens": full[j]["tokens"][nm], "best_walk": best[j]}
        out["rules"][nm] = s
    return out


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


def _best(summary: dict, walk: bool) -> str:
    cands = [(s["mean"], nm) for nm, s in summary["rules"].items() if _is_walk(nm) == walk and s["n"] == summary["n"]]
    if not cands:
        return "-"
    m = max(c[0] for c in cands)
    tied = [nm for v, nm in cands if v >= m - 1e-12]  # in table order (walks in WALKS order)
    return f"{tied[0]} ({m:.4f})" + (f", tied with {', '.join(tied[1:])}" if tied[1:] else "")


def _conjecture(insts: list[dict]) -> tuple[int, int, dict | None]:
    """Instances where another walk beats ``walk:optimal`` by more than AT: (count, of, largest case)."""
    worst, count, of = None, 0, 0
    for d in insts:
        t = d["tokens"]
        if "walk:optimal" not in t:
            continue
        others = [(v, nm) for nm, v in t.items() if _is_walk(nm) and nm != "walk:optimal"]
        if not others:
            continue
        of += 1
        v, nm = max(others)
        if v - t["walk:optimal"] > AT:
            count += 1
            if worst is None or v - t["walk:optimal"] > worst["by"]:
                worst = {"instance": d["instance"], "seed": d["seed"], "style": d["style"], "walk": nm, "tokens": v,
                         "optimal": t["walk:optimal"], "by": v - t["walk:optimal"], "warnings": d["warnings"].get("walk:optimal", [])}
    return count, of, worst


def _verdict_rule(cells: list, rule: str, laws, claim: str) -> str:
    """'at the ceiling' claim of ``rule`` over the cells of ``laws``: holds or its worst instance."""
    seen = [(c, s["rules"][rule]) for c, s, _ in cells if c["law"] in laws and rule in s["rules"]]
    if not seen:
        return (f"- **{claim}**: not measured — `{rule}` has no rows in these files (not registered when they were "
                "written, or not supporting these laws); rerun the grid, then the report.")
    n = sum(s["n"] for _, s in seen)
    c, s = max(seen, key=lambda cs: cs[1]["max_gap"])
    w = s["worst"]
    at = sum(s["at"] * s["n"] for _, s in seen)
    name = cell_name(c["law"], c["k"], c["depth"], c["V"])
    if s["max_gap"] <= AT:
        return f"- **{claim}**: holds on all {n} instances of {len(seen)} cells (largest gap {s['max_gap']:.1e})."
    return (f"- **{claim}**: fails — at the ceiling in {at:.0f} of {n} instances; largest gap {s['max_gap']:.5f} in "
            f"{name}, seed {w['seed']} ({w['style']}): {rule} {w['tokens']:.6f} against the ceiling {w['ceiling']:.6f}.")


def _verdict_improves(cells: list, rule: str, claim: str) -> str:
    seen = [(c, s["rules"][rule]) for c, s, _ in cells if c["law"] != "chain" and rule in s["rules"]]
    if not seen:
        return (f"- **{claim}**: not measured — `{rule}` has no rows in these files; rerun the grid, then the report.")
    n = sum(s["n"] for _, s in seen)
    below = sum(s["below_specinfer"] * s["n"] for _, s in seen)
    ge = sum(s.get("ge_best_walk", 0) * s["n"] for _, s in seen)
    gains = ", ".join(f"{cell_name(c['law'], c['k'], c['depth'], c['V'])} {s['gain_specinfer']:+.2%} / "
                      f"{s.get('gain_best_walk', math.nan):+.2%}" for c, s in seen)
    behind = [(s["behind_best_walk"], c) for c, s in seen if "behind_best_walk" in s]
    worst = ""
    if behind:
        b, c = max(behind, key=lambda bc: bc[0]["by"])
        if b["by"] > AT:
            worst = (f" Furthest behind the best walk: {cell_name(c['law'], c['k'], c['depth'], c['V'])}, seed {b['seed']} "
                     f"({b['style']}): {rule} {b['tokens']:.6f} against {b['best_walk']:.6f}.")
    return (f"- **{claim}** ({n} instances on trees, {len(seen)} cells): below SpecInfer's walk in {below:.0f}, "
            f"at least the best token walk in {ge:.0f}; mean gain over SpecInfer's walk / over the best walk, per "
            f"cell: {gains}.{worst}")


def _verdict_versus(cells: list, rule: str, other: str, claim: str) -> str:
    """``rule`` against ``other`` instance by instance on the tree cells: how often above / below
    by more than AT, and the largest difference each way (cell, seed, style, both values)."""
    pairs = [(c, d) for c, _, insts in cells if c["law"] != "chain" for d in insts
             if rule in d["tokens"] and other in d["tokens"]]
    if not pairs:
        return f"- **{claim}**: not measured — no instance has rows of both `{rule}` and `{other}`."
    diff = [d["tokens"][rule] - d["tokens"][other] for _, d in pairs]
    cells_seen = {cell_name(c["law"], c["k"], c["depth"], c["V"]) for c, _ in pairs}

    def case(j: int) -> str:
        c, d = pairs[j]
        return (f"{cell_name(c['law'], c['k'], c['depth'], c['V'])}, seed {d['seed']} ({d['style']}): {rule} "
                f"{d['tokens'][rule]:.6f}, {other} {d['tokens'][other]:.6f}")

    hi = max(range(len(diff)), key=lambda j: diff[j])
    lo = min(range(len(diff)), key=lambda j: diff[j])
    out = (f"- **{claim}** ({len(pairs)} instances on trees, {len(cells_seen)} cells): above in "
           f"{sum(x > AT for x in diff)}, below in {sum(x < -AT for x in diff)}")
    if diff[hi] > AT:
        out += f"; furthest above: {case(hi)}"
    if diff[lo] < -AT:
        out += f"; furthest below: {case(lo)}"
    return out + "."


def report(paths) -> str:
    """The markdown report of the cell files ``paths`` (read only, never recomputed)."""
    cells, roots = [], []
    for p in sorted(Path(p) for p in paths):
        if p.name.startswith("root_"):
            roots.append(p)
            continue
        config, insts = load_cell(p)
        cells.append((config, summarize_cell(config, insts), insts))
    if not cells:
        return "(no cell files)\n"
    out = ["# Sequence-level rules against the tree-level ceiling: the table", "",
           "Generated by `multidraft experiment seqrules RUN_DIR --report` from the JSONL files of RUN_DIR "
           "(nothing recomputed). Gaps are in tokens per call (ceiling minus rule); \"at ceiling\": within "
           f"{AT:g}; \"below SpecInfer\": below `walk:specinfer` by more than {AT:g}; \">= best walk\": at least the best "
           "of the token walks on the same instance; \"worst\": the instance (seed, style) of the largest gap.", "",
           "## Per cell: best rules", "",
           "| cell | instances | ceiling (mean) | largest dual gap | best token walk | best sequence-level rule |",
           "|---|---|---|---|---|---|"]
    for c, s, _ in cells:
        out.append(f"| {s['cell']} | {s['n']} | {s['ceiling']:.4f} | {s['dual_gap']:.1e} | {_best(s, True)} | {_best(s, False)} |")
    out += ["", "## Per cell and rule", ""]
    for c, s, insts in cells:
        out += [f"### {s['cell']}: {c['law']}, K = {c['k']}, L = {c['depth']}, V = {c['V']} ({s['n']} instances)", "",
                "| rule | instances | mean tokens/call | mean gap | largest gap | at ceiling | below SpecInfer | >= best walk | mean gain over best walk | worst (seed, style) |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for nm, r in s["rules"].items():
            w = r["worst"]
            out.append(f"| {nm} | {r['n']} | {r['mean']:.4f} | {r['mean_gap']:.4f} | {r['max_gap']:.4f} | {r['at']:.1%} | "
                       f"{r['below_specinfer']:.1%} | {r.get('ge_best_walk', math.nan):.1%} | "
                       f"{r.get('gain_best_walk', math.nan):+.2%} | {w['seed']} ({w['style']}) |")
        cnt, of, worst = _conjecture(insts)
        if worst is not None:
            out += ["", f"`walk:optimal` is beaten by another walk in {cnt} of {of} instances; largest: seed {worst['seed']} "
                        f"({worst['style']}), {worst['walk']} {worst['tokens']:.6f} against {worst['optimal']:.6f}"
                        + (f" (the optimal verifier warned: {'; '.join(worst['warnings'])})" if worst["warnings"] else "") + "."]
        elif of:
            out += ["", f"`walk:optimal` is the best walk in all {of} instances."]
        out.append("")
    # the claims, from the data
    trees_only = [(c, i) for c, _, i in cells if c["law"] != "chain"]  # on a chain every walk is the same single-draft rule
    cnt = sum(_conjecture(i)[0] for _, i in trees_only)
    of = sum(_conjecture(i)[1] for _, i in trees_only)
    worsts = [(_conjecture(i)[2], c) for c, i in trees_only if _conjecture(i)[2] is not None]
    out += ["## The claims, from these files", "",
            _verdict_rule(cells, "block", ("chain",), "block verification is optimal on one chain (Sun et al., 2403.10444)"),
            _verdict_rule(cells, "spectr_gbv", ("sequences",), "SpecTr-GBV is optimal for i.i.d. draft sequences (Lin et al., 2604.25925)"),
            _verdict_improves(cells, "traversal", "traversal verification improves on token-level verification (Weng, Hu et al., 2505.12398)"),
            _verdict_improves(cells, "univer", "UniVer improves on token-level verification (Weng, Hu, Yairi, 2605.04543)"),
            _verdict_improves(cells, "univer_ot", "UniVer with its LP plan (`univer_ot`) improves on token-level verification"),
            _verdict_versus(cells, "univer_ot", "traversal", "UniVer's LP plan (`univer_ot`) against traversal (= `univer`'s "
                            "residual plan on these i.i.d. trees)"),
            _verdict_improves(cells, "gbv", "GBV improves on token-level verification (Thomas & Pal, 2602.16961)")]
    if worsts:
        w, c = max(worsts, key=lambda wc: wc[0]["by"])
        out.append(f"- **the per-node optimum (`walk:optimal`) is always the best token walk**: false — beaten in {cnt} of "
                   f"{of} tree instances; largest in {cell_name(c['law'], c['k'], c['depth'], c['V'])}, seed {w['seed']} "
                   f"({w['style']}): {w['walk']} {w['tokens']:.6f} against `walk:optimal` {w['optimal']:.6f}.")
    else:
        out.append(f"- **the per-node optimum (`walk:optimal`) is always the best token walk**: holds on all {of} tree instances.")
    at_all = []
    for nm in sorted({nm for _, s, _ in cells for nm in s["rules"]}):
        ss = [s["rules"][nm] for c, s, _ in cells if nm in s["rules"] and c["law"] != "chain"]
        if ss and all(x["max_gap"] <= AT for x in ss):
            at_all.append(nm)
    out.append(f"- rules at the ceiling on every tree instance (chains aside): {', '.join(at_all) if at_all else 'none'}.")
    if roots:
        out += ["", "## Item 5: does the ceiling pay at the root?", "",
                "`trees.root_tradeoff` per instance (LPs on the ceiling's constraints, HiGHS tolerance 1e-10): "
                "\"costly\" counts instances where the best rule that accepts the first token with probability "
                "alpha* (the root's optimum, as every walk of `optimal`) stays more than 1e-7 below the ceiling.", "",
                "| cell | instances | costly | largest cost (tokens/call) | largest root shortfall of the ceiling | worst |",
                "|---|---|---|---|---|---|"]
        for p in roots:
            out += _root_section(p)
    out += ["", "## Cells left out of the grid", "", "| cell | why |", "|---|---|"]
    for law, k, depth, V, why in DROPPED:
        out.append(f"| {cell_name(law, k, depth, V)} | {why} |")
    return "\n".join(out) + "\n"
