"""``multidraft report RUN_DIR``: a Markdown report with PNG plots, from the JSONL files alone.

Reads ``acceptance.jsonl``, ``temperature.jsonl`` and ``blocks.jsonl`` (whichever exist);
never loads a model or a position store. Writes ``report.md`` and ``plots/*.png`` into the
output directory (default: the run directory).

Every row is checked against the schema the runners write (``records.SCHEMAS``, defined next
to the writer): a damaged row (a missing field, a wrong type, ``null`` where a number belongs,
an acceptance outside [0, 1], a negative count) or one that repeats an earlier row's key is
left out, named by ``file:line`` with the field and what was expected, and listed at the end of
the report; the good rows are rendered. Rows without per-position ``values`` (older runs) are
kept, and the report says that the claims table leaves them out.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from .. import _optional
from ..drafts import SHARED_Q_KINDS
from . import plots
from .findings import claims_table, mean_ci
from .findings import paired as paired_difference  # noqa: F401 (public name of this module)
from .records import SCHEMAS, ensure_dir, meta_problem, read_jsonl, results_path, target_alone_row, valid_rows, write_file

__all__ = ["FILES", "KINDS", "build", "load_run", "check_rows", "values_note", "summary", "paired_difference",
           "tail_note"]

FILES = ("acceptance.jsonl", "temperature.jsonl", "blocks.jsonl")
KINDS = tuple(f.split(".")[0] for f in FILES)
HEADLINE = ("specinfer", "rrs_wor", "spectr", "khisti_is")
ALPHA = "alpha*"
LAW_ORDER = tuple(SHARED_Q_KINDS) + ("independent",)

# the fields of every kind of row: ONE schema, next to the writer (records.SCHEMAS)
FIELDS = {kind: SCHEMAS[kind] for kind in KINDS}


def check_rows(path, rows, lines, kind: str, skipped: list | None = None) -> list[dict]:
    """The rows of ``path`` that satisfy the schema the runners write (``records.SCHEMAS[kind]``),
    duplicates of an earlier row's key left out. Each row left out adds one ``file:line: field,
    what was expected; row skipped`` line to ``skipped``; without a list, the first one is a
    ``ValueError``."""
    good, bad = valid_rows(path, rows, lines, kind)
    if bad and skipped is None:
        raise ValueError(bad[0])
    if skipped is not None:
        skipped += bad
    return good


def _meta(path, meta, skipped: list | None) -> dict | None:
    """The meta row, or None (with a message) when it is damaged: the rows still count."""
    if meta is None:
        return None
    msg = meta_problem(meta)
    if msg is None:
        return meta
    with open(path, "rb") as f:  # the meta row is the file's first row (records.read_jsonl)
        n = next((i for i, raw in enumerate(f, 1) if raw.strip()), 1)
    line = f"{path}:{n}: meta row: {msg}; its config, seed and versions are left out of the report"
    if skipped is None:
        raise ValueError(line)
    skipped.append(line)
    return None


def load_run(run_dir: str | Path, skipped: list | None = None,
             line_of: dict | None = None) -> dict[str, tuple[dict | None, list[dict]]]:
    """``{file name: (meta, rows)}`` for the results files of a run, each row checked against
    the schema (:func:`check_rows`). With a list ``skipped``, damaged rows (and rows of another
    ``type`` than ``row``) are left out and one line per row (``file:line``, the field, what was
    expected) is added to it; without one, the first damaged row is a ``ValueError`` naming
    ``file:line``. A file that is not JSONL (an unreadable line) is always a ``ValueError``.
    ``line_of``: filled with ``{file name: {id(row): line}}`` for the rows returned."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FileNotFoundError(2, "run directory does not exist", str(run_dir))
    if not run_dir.is_dir():
        raise NotADirectoryError(20, "run directory is a file, not a directory", str(run_dir))
    out = {}
    for f in FILES:
        if results_path(run_dir / f).exists():  # or its .gz sibling
            torn: list = []
            meta, rows, lines = read_jsonl(run_dir / f, line_numbers=True, torn=torn)
            if torn and skipped is None:
                raise ValueError(torn[0])
            if torn:
                skipped += torn
            other = [f"{results_path(run_dir / f)}:{n}: a row of type {_fmt_value(r.get('type'))}, not a measurement "
                     "row (type 'row'); row skipped" for r, n in zip(rows, lines) if r.get("type", "row") != "row"]
            if other and skipped is None:
                raise ValueError(other[0])
            if other:
                skipped += other
            keep = [i for i, r in enumerate(rows) if r.get("type", "row") == "row"]
            rows, lines = [rows[i] for i in keep], [lines[i] for i in keep]
            meta = _meta(run_dir / f, meta, skipped)
            rows = check_rows(run_dir / f, rows, lines, f.split(".")[0], skipped)
            if line_of is not None:
                line_of[f] = {id(r): n for r, n in zip(rows, lines)}
            if rows:
                out[f] = (meta, rows)
    if not out and skipped:
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        raise ValueError(f"run directory {run_dir} has no valid rows: {skipped[0]}{more}")
    if not out:
        raise ValueError(f"run directory {run_dir} has no results (none of {', '.join(FILES)} with "
                         "rows); run `multidraft experiment ...` first")
    return out


def values_note(name: str, rows) -> str | None:
    """A line saying how many rows lack per-position ``values`` (the findings' paired differences
    leave them out), or None when every row has them."""
    n = sum("values" not in r for r in rows)
    if not n:
        return None
    return (f"{name}: {n} of {len(rows)} rows have no per-position values (field 'values', written by runs "
            "before it existed): the claims table and the paired differences leave them out")


def _num(x, nd=3) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}f}"


def _pm(r, field="acceptance", err="se", nd=3, end=4) -> str:
    """``value ± err`` of a row, ``-`` for a missing field (rows of older runs). A verifier row
    without ``se_mc`` is from before errors over positions: its ``se`` is Monte-Carlo only (marked †)."""
    old = field == "acceptance" and err == "se" and r.get("verifier") != ALPHA and "se_mc" not in r
    return f"{_num(r.get(field), nd)} ± {_num(r.get(err), end)}" + ("†" if old else "")


def _alpha_cell(r) -> str:
    """alpha* value ± its proved lump bound (``-`` when the row has no bound); for the
    independent law also the width of its certified bounds."""
    s = f"{_num(r.get('acceptance'))} ± {_num(r.get('lump_bound_max'), 4)}"
    mean = r.get("lump_bound_mean")
    if isinstance(mean, (int, float)) and isinstance(r.get("lump_bound_max"), (int, float)) and r["lump_bound_max"] > 10 * mean:
        s += f" (mean {mean:.1e})"  # the without-replacement bound is loose at a few very peaked positions
    if r.get("bound_width_max") is not None:
        s += f" (width <= {r['bound_width_max']:.1e})"
    return s


def tail_note(rows) -> str:
    """One line stating, from the rows, the largest tail masses in force and the alpha* lump bound."""
    def mx(f):
        xs = [r[f] for r in rows if isinstance(r.get(f), (int, float))]
        return max(xs) if xs else None
    pt, qt, lb = mx("p_tail_max"), mx("q_tail_max"), mx("lump_bound_max")
    if pt is None and qt is None and lb is None:
        return "Truncation: these rows record no tail masses or lump bound (older run): - ."
    tail = max(x for x in (pt, qt) if x is not None) if (pt is not None or qt is not None) else None
    s = (f"Truncation: tail <= {'-' if tail is None else format(tail, '.3g')} of the mass "
         f"(max p tail {'-' if pt is None else format(pt, '.3g')}, max q tail {'-' if qt is None else format(qt, '.3g')}); "
         f"proved |alpha*_stored - alpha*_full| <= {'-' if lb is None else format(lb, '.3g')} at every position.")
    es = sorted({r["eval_support"] for r in rows if r.get("eval_support") is not None})
    if es:
        s += f" **WARNING: evaluated with --eval-support {', '.join(map(str, es))} (relumped: hidden truncation).**"
    return s


def _group(rows, fields):
    g = defaultdict(list)
    for r in rows:
        g[tuple(r.get(f) for f in fields)].append(r)
    return g


def _cfg_label(ds, tt, td, tk, tp) -> str:
    s = f"{ds}, target T={tt:g}, draft T={td:g}"
    if tk:
        s += f", top-k={tk}"
    if tp not in (None, 1, 1.0):
        s += f", top-p={tp:g}"
    return s


def _slug(*parts) -> str:
    return "_".join(str(p).replace(".", "p").replace("/", "-").replace(":", "-").replace("*", "star") for p in parts)


def _verifier_order(rows) -> list[str]:
    seen = []
    for r in rows:
        if r["verifier"] != ALPHA and r["verifier"] not in seen:
            seen.append(r["verifier"])
    return seen


# ---------------------------------------------------------------------------------------
def _acceptance_section(rows, out_dir: Path, make_plots: bool, lines: list[str]) -> list[str]:
    findings: list[str] = []
    for (ds, tt, td, tk, tp), grp in _group(rows, ("dataset", "t_target", "t_draft", "top_k", "top_p")).items():
        label = _cfg_label(ds, tt, td, tk, tp)
        lines.append(f"### {label}\n")
        by = {(r["law"], r["K"], r["verifier"]): r for r in grp}
        laws = [law for law in LAW_ORDER if any(k[0] == law for k in by)]
        ks = sorted({r["K"] for r in grp})
        names = _verifier_order(grp)
        # single-draft SD: its acceptance sum_x min(p, q) is exactly alpha* at K = 1 (any law)
        sd = next((by[(law, 1, ALPHA)] for law in laws if (law, 1, ALPHA) in by), None)
        sd = sd or next((by[(law, 1, "naive")] for law in laws if (law, 1, "naive") in by), None)
        n_pos = max(r.get("n_positions", 0) for r in grp)
        lines.append(
            f"{n_pos} positions. Cells: mean acceptance ± standard error over positions "
            f"(paired gap to alpha* in percent of alpha* ± its paired standard error); alpha* cells: value ± proved "
            f"lump bound (its largest over positions; the mean too where the largest is 10x the mean; for the "
            f"independent law also the width of alpha*'s certified bounds). Single-draft SD acceptance sum min(p, q) (= alpha* at K = 1): "
            f"{_num(sd['acceptance']) if sd else '-'}.\n"
        )
        for w in sorted({r["eval_support_warning"] for r in grp if r.get("eval_support_warning")}):
            lines.append(f"**{w}**\n")
        for law in laws:
            temps = next((r.get("independent_temperatures") for r in grp if r["law"] == law and r.get("independent_temperatures")), None)
            lines.append(f"**{law} drafts**" + (f" (draft k at temperature t_k, t = {', '.join(f'{t:g}' for t in temps)})"
                                                 if law == "independent" and temps else "") + "\n")
            lines.append("| verifier | " + " | ".join(f"K={k}" for k in ks) + " |")
            lines.append("|---|" + "---|" * len(ks))
            a_cells = [_alpha_cell(by[(law, k, ALPHA)]) if (law, k, ALPHA) in by else "" for k in ks]
            lines.append("| **alpha*** | " + " | ".join(a_cells) + " |")
            for n in names:
                cells = []
                for k in ks:
                    r = by.get((law, k, n))
                    cells.append("" if r is None else f"{_pm(r)} ({_pm(r, 'gap_pct', 'gap_pct_se', 1, 1)}%)")
                if any(cells):
                    lines.append(f"| {n} | " + " | ".join(cells) + " |")
            law_rows = [r for r in grp if r["law"] == law]
            lines.append("\n" + tail_note(law_rows) + "\n")
            if any(r["verifier"] != ALPHA and "se_mc" not in r for r in law_rows):
                lines.append("† row of an older run: its error is the Monte-Carlo error only (no error over positions; "
                             "paired gap errors -).\n")
            base = "specinfer" if any((law, k, "specinfer") in by for k in ks) else None
            if base:
                diff_rows = []
                for n in names:
                    if n == base:
                        continue
                    cells = []
                    for k in ks:
                        a, b = by.get((law, k, n)), by.get((law, k, base))
                        d = paired_difference(a, b) if a and b else None
                        cells.append("" if a is None or b is None else ("-" if d is None else f"{d[0]:+.4f} ± {d[1]:.4f}"))
                    if any(cells):
                        diff_rows.append(f"| {n} | " + " | ".join(cells) + " |")
                if diff_rows:
                    lines.append(f"Each verifier minus {base}, {law} drafts (paired over the same positions, ± SE; "
                                 "from the rows' rounded per-position values):\n")
                    lines.append("| verifier | " + " | ".join(f"K={k}" for k in ks) + " |")
                    lines.append("|---|" + "---|" * len(ks))
                    lines += diff_rows + [""]
            if make_plots:
                series = {ALPHA: ([k for k in ks if (law, k, ALPHA) in by], [by[(law, k, ALPHA)]["acceptance"] for k in ks if (law, k, ALPHA) in by], None)}
                for n in names:
                    kk = [k for k in ks if (law, k, n) in by]
                    series[n] = (kk, [by[(law, k, n)]["acceptance"] for k in kk], [by[(law, k, n)]["se"] for k in kk])
                p = plots.lines(out_dir / "plots" / f"acceptance_{_slug(ds, tt, td, law)}.png", series,
                                title=f"acceptance vs K, {law} drafts ({label})", xlabel="K (drafts)",
                                ylabel="acceptance P(output in drafts)", emphasize=[ALPHA])
                lines.append(f"![acceptance vs K, {law}](plots/{p.name})\n")
        # with vs without replacement
        if "iid" in laws and "wor" in laws:
            if make_plots:
                series = {}
                for law in SHARED_Q_KINDS:
                    kk = [k for k in ks if (law, k, ALPHA) in by]
                    if kk:
                        series[f"alpha* {law}"] = (kk, [by[(law, k, ALPHA)]["acceptance"] for k in kk], None)
                for n, law in (("specinfer", "iid"), ("rrs_wor", "wor"), ("greedy_optimal", "greedy")):
                    kk = [k for k in ks if (law, k, n) in by]
                    if kk:
                        series[f"{n} ({law})"] = (kk, [by[(law, k, n)]["acceptance"] for k in kk], [by[(law, k, n)]["se"] for k in kk])
                p = plots.lines(out_dir / "plots" / f"laws_{_slug(ds, tt, td)}.png", series,
                                title=f"with vs without replacement ({label})", xlabel="K (drafts)", ylabel="acceptance")
                lines.append(f"![with vs without replacement](plots/{p.name})\n")
        findings += _findings(label, by, laws, ks, names, sd)
    return findings


def _findings(label, by, laws, ks, names, sd) -> list[str]:
    out = [f"**{label}**"]
    multi = [k for k in ks if k >= 2]
    for law in laws:
        parts = []
        for n in HEADLINE:
            g = [by[(law, k, n)]["gap_pct"] for k in multi if (law, k, n) in by]
            if g:
                parts.append(f"`{n}` {sum(g) / len(g):.2f}% (max {max(g):.2f}%)")
        if parts:
            out.append(f"- gap to alpha* with {law} drafts, mean over K = {multi[0]}..{multi[-1]}: " + ", ".join(parts))
        else:
            out.append(f"- {law} drafts: none of {', '.join(HEADLINE)} supports this law in this run")
    if "iid" in laws and "wor" in laws:
        diffs = [(k, by[("wor", k, ALPHA)]["acceptance"] - by[("iid", k, ALPHA)]["acceptance"]) for k in multi if ("wor", k, ALPHA) in by and ("iid", k, ALPHA) in by]
        if diffs:
            wins = sum(d > 0 for _, d in diffs)
            dmax = max(diffs, key=lambda t: t[1])
            out.append(
                f"- without vs with replacement: alpha*(wor) - alpha*(iid) > 0 at {wins}/{len(diffs)} values of K "
                f"(largest +{dmax[1]:.4f} at K = {dmax[0]})"
            )
        vd = [(k, by[("wor", k, "rrs_wor")]["acceptance"] - by[("iid", k, "specinfer")]["acceptance"]) for k in multi
              if ("wor", k, "rrs_wor") in by and ("iid", k, "specinfer") in by]
        if vd:
            out.append(
                "- rrs_wor (wor) - specinfer (iid): " + ", ".join(f"K={k}: {d:+.4f}" for k, d in vd)
            )
    if sd is not None:
        s = sd["acceptance"]
        for law in laws:
            parts = []
            for n in names:
                if n == "naive":
                    continue
                fr = []
                for k in multi:
                    r, a = by.get((law, k, n)), by.get((law, k, ALPHA))
                    if r and a and a["acceptance"] - s > 1e-9:
                        fr.append((r["acceptance"] - s) / (a["acceptance"] - s))
                if fr:
                    parts.append(f"`{n}` {100 * sum(fr) / len(fr):.0f}%")
            if parts:
                out.append(
                    f"- position between single-draft SD (0%) and alpha* (100%), {law} drafts, mean over K: " + ", ".join(parts)
                )
    # paired gap error where the row has one (same positions), else the row's se
    above = [(k, n) for (law, k, n), r in by.items() if n != ALPHA and r.get("acceptance", 0) > r.get("alpha_star", 1)
             + 3 * (r["gap_se"] if r.get("gap_se") is not None else r.get("se", 0)) + 1e-9]
    out.append("- no verifier is above alpha* beyond 3 (paired) standard errors" if not above else f"- ABOVE alpha* (check!): {above}")
    return out + [""]


def _fmt_value(v) -> str:
    return "null" if v is None else repr(v)


def _line_ranges(nums) -> str:
    """``3-10, 15``: sorted line numbers as ranges (the first eight, then the count)."""
    nums, out = sorted(nums), []
    for n in nums:
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in out]
    return ", ".join(text[:8]) + (f", ... ({len(nums)} lines in all)" if len(text) > 8 else "")


def _left_out_temperature(rows, shown: set) -> dict[str, list[dict]]:
    """``{why: rows}`` for the valid rows of a temperature file that no sweep table shows
    (:func:`_temperature_section` shows, per data set, top-k/top-p and law, the largest K on the
    two sweep lines through the fixed temperatures)."""
    why: dict[str, list[dict]] = defaultdict(list)
    for (_ds, _tk, _tp, _law), g in _group(rows, ("dataset", "top_k", "top_p", "law")).items():
        k = max(r["K"] for r in g)
        pairs = {(r["t_target"], r["t_draft"]) for r in g if r["K"] == k}
        for r in g:
            if id(r) in shown:
                continue
            if r["K"] != k:
                why[f"K = {r['K']}: the sweep tables show the largest K of each law, {k}"].append(r)
            elif len(pairs) == 1:
                (tt, td), = pairs
                why[f"one temperature pair only (target T = {tt:g}, draft T = {td:g}): acceptance rows, not a sweep "
                    "(`multidraft experiment acceptance` writes them to acceptance.jsonl)"].append(r)
            else:
                why["off both sweep lines (neither its target nor its draft temperature is the fixed one of a sweep, "
                    "or the sweep has under two points with an alpha* row)"].append(r)
    return why


def _temperature_section(rows, out_dir: Path, make_plots: bool, lines: list[str]) -> set:
    """The sweep tables of a temperature file; returns the ids of the rows they show."""
    shown: set = set()
    for (ds, tk, tp), grp in _group(rows, ("dataset", "top_k", "top_p")).items():
        for law, lg in _group(grp, ("law",)).items():
            law = law[0]
            ks = sorted({r["K"] for r in lg})
            k = ks[-1]
            kg = [r for r in lg if r["K"] == k]
            names = [ALPHA] + _verifier_order(kg)
            tts = sorted({r["t_target"] for r in kg})
            tds = sorted({r["t_draft"] for r in kg})
            by = {(r["t_target"], r["t_draft"], r["verifier"]): r for r in kg}
            for sweep, fixed_name, values, fixed_values in (("draft", "target", tds, tts), ("target", "draft", tts, tds)):
                # the fixed value: the one with the most points in this sweep
                best = None
                for fv in fixed_values:
                    pts = [v for v in values if (by.get((fv, v, ALPHA)) if sweep == "draft" else by.get((v, fv, ALPHA)))]
                    if best is None or len(pts) > len(best[1]):
                        best = (fv, pts)
                if best is None or len(best[1]) < 2:
                    continue
                fv, pts = best
                get = (lambda v, n: by.get((fv, v, n))) if sweep == "draft" else (lambda v, n: by.get((v, fv, n)))
                lines.append(f"### {ds}: {sweep} temperature sweep ({fixed_name} T = {fv:g}), {law} drafts, K = {k}\n")
                lines.append("Cells: acceptance ± standard error over positions; alpha*: value ± proved lump bound.\n")

                def table(cols, cell):  # one row per swept temperature, one column per name
                    lines.append(f"| {sweep} T | " + " | ".join(cols) + " |")
                    lines.append("|---|" + "---|" * len(cols))
                    for v in pts:
                        lines.append(f"| {v:g} | " + " | ".join(cell(get(v, n), n) for n in cols) + " |")

                table(names, lambda r, n: "" if r is None else (_alpha_cell(r) if n == ALPHA else _pm(r)))
                shown_here = [get(v, n) for v in pts for n in names if get(v, n)]
                shown.update(id(r) for r in shown_here)
                lines.append("\n" + tail_note(shown_here) + "\n")
                gapped = [n for n in names[1:] if any(get(v, n) and get(v, n).get("gap_se") is not None for v in pts)]
                if gapped:
                    lines.append("Gap to alpha* in points (100 x (alpha* - acceptance)), paired over the same positions, "
                                 "± its standard error:\n")
                    table(gapped, lambda r, n: "" if r is None or r.get("gap_se") is None
                          else f"{100 * r['gap']:.2f} ± {100 * r['gap_se']:.2f}")
                    lines.append("")
                if any(r["verifier"] != ALPHA and "se_mc" not in r for r in shown_here):
                    lines.append("† row of an older run: its error is the Monte-Carlo error only.\n")
                if make_plots:
                    series = {}
                    for n in names:
                        xs = [v for v in pts if get(v, n)]
                        series[n] = (xs, [get(v, n)["acceptance"] for v in xs], None if n == ALPHA else [get(v, n)["se"] for v in xs])
                    p = plots.lines(out_dir / "plots" / f"temperature_{_slug(ds, sweep, law, k)}.png", series,
                                    title=f"{ds}: acceptance vs {sweep} temperature ({fixed_name} T={fv:g}, {law}, K={k})",
                                    xlabel=f"{sweep} temperature", ylabel="acceptance", emphasize=[ALPHA])
                    lines.append(f"![{sweep} temperature sweep](plots/{p.name})\n")
    return shown


def _blocks_section(rows, out_dir: Path, make_plots: bool, lines: list[str], reference: tuple[str, list[dict]] | None = None) -> None:
    """``reference``: (label, rows of another blocks file) whose target-only rows every row is
    also paired with, prompt by prompt (an extra speed-up column)."""
    ar = [r for r in rows if target_alone_row(r) and r["tokens_per_s"] is not None]
    ar_by = {r["prompt"]: r["tokens_per_s"] for r in ar}  # the baseline of each prompt
    ref_by = {}
    if reference is not None:
        ref_ar = [r for r in reference[1] if target_alone_row(r) and r.get("tokens_per_s") is not None]
        ref_by = {r["prompt"]: r["tokens_per_s"] for r in ref_ar}
        if not ref_by:
            raise ValueError(f"blocks baseline {reference[0]}: no target-only rows")
        m, ci = mean_ci([r["tokens_per_s"] for r in ref_ar])
        missing = sorted({r["prompt"] for r in rows} - set(ref_by))
        lines.append(f"Second baseline `{reference[0]}`: target-only {m:.2f} ± {ci:.2f} tokens/s on {len(ref_by)} prompt(s)"
                     + (f"; {len(missing)} prompt(s) of this run have none there and are left out of its column" if missing else "")
                     + ". The last column pairs every row with it, prompt by prompt.\n")
    cells = _group([r for r in rows if not target_alone_row(r)], ("verifier", "law", "k", "depth"))
    prompts = len({r["prompt"] for r in rows})
    temps = ", ".join(sorted({format(r["temperature"], "g") for r in rows}))
    ar_ci = mean_ci([r["tokens_per_s"] for r in ar]) if ar else None
    lines.append(
        f"{prompts} prompt(s), temperature {temps}. Block efficiency = tokens per target forward pass; cells are "
        "means over prompts ± the half-width of their 95% t-interval; speed-up = the mean over prompts of tokens/s "
        "over the same prompt's target-only tokens/s (paired by prompt), ± the same interval."
        + (f" Target-only autoregressive baseline: {ar_ci[0]:.2f} ± {ar_ci[1]:.2f} tokens/s." if ar_ci else "") + "\n"
    )
    extra = f" speed-up vs `{reference[0]}` |" if reference is not None else ""
    lines.append("| verifier | law | K | depth | prompts | block efficiency | acceptance rate | tokens/s | speed-up |" + extra)
    lines.append("|---|---|---|---|---|---|---|---|---|" + ("---|" if reference is not None else ""))
    for (n, law, k, d), g in sorted(cells.items(), key=lambda t: (t[0][0], t[0][1], t[0][2], t[0][3])):
        be, be_ci = mean_ci([r["block_efficiency"] for r in g])
        acc = [r["acceptance_rate"] for r in g if r.get("acceptance_rate") is not None]
        timed = [r for r in g if r["tokens_per_s"] is not None]  # a run too fast to time has none
        tps, tps_ci = mean_ci([r["tokens_per_s"] for r in timed]) if timed else (math.nan, math.nan)
        ratios = [r["tokens_per_s"] / ar_by[r["prompt"]] for r in timed if ar_by.get(r["prompt"])]
        sp = "{:.2f}x ± {:.2f}".format(*mean_ci(ratios)) if ratios else "-"  # no baseline in the run: no ratio
        if reference is not None:
            rr = [r["tokens_per_s"] / ref_by[r["prompt"]] for r in timed if ref_by.get(r["prompt"])]
            sp += " | " + ("{:.2f}x ± {:.2f}".format(*mean_ci(rr)) if rr else "-")
        lines.append(
            f"| {n} | {law} | {k} | {d} | {len(g)} | {be:.3f} ± {be_ci:.3f} | {_num(sum(acc) / len(acc)) if acc else '-'} | "
            f"{tps:.2f} ± {tps_ci:.2f} | {sp} |"
        )
    lines.append("")
    if make_plots:
        for d in sorted({k[3] for k in cells}) if len({k[3] for k in cells}) <= 3 else [None]:
            series = {}
            for n, law in sorted({(k[0], k[1]) for k in cells if d is None or k[3] == d}):
                kk = sorted(k[2] for k in cells if k[0] == n and k[1] == law and (d is None or k[3] == d))
                if d is None:  # equal-budget runs: one depth per K
                    kd = {k[2]: k[3] for k in cells if k[0] == n and k[1] == law}
                    stats = [mean_ci([r["block_efficiency"] for r in cells[(n, law, k, kd[k])]]) for k in kk]
                else:
                    stats = [mean_ci([r["block_efficiency"] for r in cells[(n, law, k, d)]]) for k in kk]
                series[f"{n} ({law})"] = (kk, [m for m, _ in stats], [ci for _, ci in stats])
            name = f"blocks_depth{d}.png" if d is not None else "blocks_equal_budget.png"
            title = f"block efficiency vs K (depth {d})" if d is not None else "block efficiency vs K (equal tree budget)"
            p = plots.lines(out_dir / "plots" / name, series, title=title, xlabel="K (drafts)", ylabel="tokens per target call")
            lines.append(f"![{title}](plots/{p.name})\n")


def summary(rows: list[dict], kind: str, *, out_dir: str | Path | None = None, make_plots: bool = False) -> str:
    """The Markdown section of one kind of results (``acceptance``, with its findings first;
    ``temperature``; ``blocks``) for rows as read by :func:`records.read_jsonl`. Plots go to
    ``out_dir/plots`` when ``make_plots``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    rows = [r for r in rows if r.get("type", "row") == "row"]
    rows, bad = valid_rows(kind, rows, range(1, len(rows) + 1), kind)  # the schema, as in the report
    if not rows:
        return f"(no {kind} rows" + (f"; {len(bad)} damaged, named by `multidraft report`)" if bad else ")")
    out = Path(out_dir) if out_dir is not None else Path(".")
    lines: list[str] = [f"({len(bad)} damaged or repeated rows left out; `multidraft report` names them)\n"] if bad else []
    if kind == "acceptance":
        findings = _acceptance_section(rows, out, make_plots, lines)
        return "\n".join(["## Findings", ""] + findings + lines)
    if kind == "temperature":
        shown = _temperature_section(rows, out, make_plots, lines)
        for why, left in _left_out_temperature(rows, shown).items():
            lines.append(f"({len(left)} row(s) in no table: {why})")
    else:
        _blocks_section(rows, out, make_plots, lines)
    return "\n".join(lines)


def _stages_section(run_dir: Path, skipped: list | None = None) -> list[str]:
    """The time of each stage from ``stages.jsonl`` (written by ``multidraft experiment paper``), if any:
    one line per invocation of a stage, with the data sets it ran on and whether it finished."""
    path = results_path(run_dir / "stages.jsonl")
    if not path.exists():
        return []
    _, rows, lines = read_jsonl(path, line_numbers=True)
    rows, bad = valid_rows(path, rows, lines, "stages")
    if skipped is not None:
        skipped += bad
    elif bad:
        raise ValueError(bad[0])
    if not rows:
        return []
    out = ["## Time of each stage\n", "Wall time on this machine of every invocation of a stage (an interrupted one "
           "records the time it ran: finished = no), from `stages.jsonl`; load = the 1-minute load average at its end.\n",
           "| stage | data sets | seconds | minutes | finished | load |", "|---|---|---|---|---|---|"]
    tot = defaultdict(float)
    for r in rows:
        secs = float(r.get("seconds") or 0.0)
        tot[r["stage"]] += secs
        load = r.get("load_average") or []
        sets = (r.get("config") or {}).get("datasets")
        sets = ", ".join(map(str, sets)) if isinstance(sets, list) else "-"
        out.append(f"| {r['stage']} | {sets or '-'} | {secs:.0f} | {secs / 60:.1f} | "
                   f"{'yes' if r.get('complete') else 'no'} | {load[0] if load else '-'} |")
    out.append("")
    out.append("Sum per stage: " + ", ".join(f"{st} {secs / 60:.1f} min" for st, secs in tot.items())
               + f"; all {sum(tot.values()) / 60:.1f} min.\n")
    return out


def _cost_section(rows: list[dict]) -> list[str]:
    """Milliseconds per position of each cell (its ``seconds`` / ``n_positions``), by law, K and
    verifier, summed over the data sets' positions: what each ceiling and verifier cost here."""
    tot = defaultdict(lambda: [0.0, 0])
    for r in rows:
        if r.get("seconds") is not None and r.get("n_positions"):
            t = tot[(r["law"], r["K"], r["verifier"])]
            t[0] += float(r["seconds"])
            t[1] += int(r["n_positions"])
    if not tot:
        return []
    laws = [law for law in LAW_ORDER if any(k[0] == law for k in tot)]
    ks = sorted({k[1] for k in tot})
    names = [ALPHA] + _verifier_order(rows)
    out = ["## Cost per position\n",
           "Milliseconds per position of each cell on this machine (one thread; the cell's wall time over its "
           "positions, all data sets together; verifier cells include their draws). `-`: not run.\n"]
    for law in laws:
        out.append(f"**{law}**\n")
        out.append("| | " + " | ".join(f"K={k}" for k in ks) + " |")
        out.append("|---|" + "---|" * len(ks))
        for n in names:
            cells = [f"{1000 * tot[(law, k, n)][0] / tot[(law, k, n)][1]:.1f}" if (law, k, n) in tot else "-" for k in ks]
            if any(c != "-" for c in cells):
                out.append(f"| {n} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def build(run_dir: str | Path, out_dir: str | Path | None = None, *, make_plots: bool = True,
          blocks_baseline: str | Path | None = None, skipped: list | None = None,
          notes: list | None = None) -> Path:
    """Write ``report.md`` (and plots) for a run; returns the report path. ``blocks_baseline``: a
    second ``blocks.jsonl`` whose target-only rows the blocks table is also paired with.

    Every row is checked against the schema the runners write (``records.SCHEMAS``): with a
    list ``skipped``, damaged and duplicated rows are left out, one ``file:line: ...; row
    skipped`` line each is added to it and listed in the report, and the good rows are
    rendered; without one, the first is a ``ValueError``. Rows of ``temperature.jsonl`` on no sweep
    table are named in one line per reason (which lines, why) in the report and in ``notes``; a
    temperature file with no sweep at all (e.g. acceptance rows, one temperature pair) is refused
    the same way as damaged rows. ``notes`` also gets lines about rows that are valid but
    incomplete (no per-position ``values``)."""
    line_of: dict = {}
    run = load_run(run_dir, skipped, line_of)
    reference = None
    if blocks_baseline is not None:
        bpath = results_path(blocks_baseline)
        if not bpath.is_file():
            raise ValueError(f"--blocks-baseline: no such file: {bpath}")
        _, brows, blines = read_jsonl(bpath, line_numbers=True)
        brows, bad = valid_rows(bpath, [r for r in brows if r.get("type", "row") == "row"],
                                [n for r, n in zip(brows, blines) if r.get("type", "row") == "row"], "blocks")
        if bad and skipped is None:
            raise ValueError(bad[0])
        if skipped is not None:
            skipped += bad
        reference = (str(blocks_baseline), brows)
    out = ensure_dir(Path(out_dir) if out_dir is not None else Path(run_dir), "output directory")
    no_mpl = make_plots and not plots.available()
    make_plots = make_plots and not no_mpl
    lines = ["# multidraft experiment report\n"]
    meta = next((m for m, _ in run.values() if m), None) or {}
    cfg = meta.get("config") or {}
    lines.append(f"Run directory `{Path(run_dir).name}`; generated from its JSONL files alone (`multidraft report`).\n")
    if cfg.get("models"):
        lines.append("Models: " + ", ".join(f"{k} `{v}`" for k, v in cfg["models"].items()) + ".")
    if meta.get("versions"):
        lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + f". Seed {meta.get('seed')}.")
    if cfg.get("eps") is not None:
        lines.append(
            f"Stored distributions: top-mass support covering 1 - {cfg['eps']:g} of p and of q, tail lumped into one "
            "token (config; the tails in force, read from the rows, and the bound on alpha* are stated per table)."
        )
    lines.append("")
    findings: list[str] = []
    claims = claims_table(run["acceptance.jsonl"][1] if "acceptance.jsonl" in run else [],
                          run["blocks.jsonl"][1] if "blocks.jsonl" in run else None)
    if claims:
        lines += ["## The papers' claims and our measurements\n",
                  "Each claim of the two source papers (Hu et al. 2025; Khisti et al. 2024) beside our measurement at "
                  "target and draft temperature 1. Differences are paired over the same positions (or prompts); a "
                  "verdict needs the difference to clear 2 standard errors.\n"] + claims + [""]
    lines += _stages_section(Path(run_dir), skipped)
    for f in ("acceptance.jsonl", "temperature.jsonl"):
        if f in run and values_note(f, run[f][1]):
            lines.append(f"_{values_note(f, run[f][1])}._\n")
            if notes is not None:
                notes.append(values_note(str(Path(run_dir) / f), run[f][1]))
    if "acceptance.jsonl" in run:
        body: list[str] = ["## Acceptance vs number of drafts\n"]
        findings = _acceptance_section(run["acceptance.jsonl"][1], out, make_plots, body)
        lines += ["## Findings by data set\n"] + findings + body
    if "acceptance.jsonl" in run:
        lines += _cost_section(run["acceptance.jsonl"][1])
    if "temperature.jsonl" in run:
        lines.append("## Temperature sweeps\n")
        trows = run["temperature.jsonl"][1]
        shown = _temperature_section(trows, out, make_plots, lines)
        tpath, where = results_path(Path(run_dir) / "temperature.jsonl"), line_of.get("temperature.jsonl", {})
        if not shown:  # not a sweep at all: refused (named with the damaged rows; exit status 2)
            pairs = sorted({(r["t_target"], r["t_draft"]) for r in trows})
            why = ("one temperature pair only (target T = {:g}, draft T = {:g}): acceptance rows, not a sweep "
                   "(`multidraft experiment acceptance` writes them to acceptance.jsonl)".format(*pairs[0])
                   if len(pairs) == 1 else "no sweep line has two temperatures with an alpha* row")
            msg = (f"{tpath}: none of its {len(trows)} rows is on a temperature sweep: {why} "
                   f"(lines {_line_ranges(where[id(r)] for r in trows)}); rows skipped")
            if skipped is None:
                raise ValueError(msg)
            skipped.append(msg)
            lines.append(f"_No temperature sweep in `{tpath.name}`: its rows are listed under Rows left out._\n")
        for why, left in _left_out_temperature(trows, shown).items() if shown else ():
            msg = f"{tpath}: {len(left)} of {len(trows)} rows in no table: {why} (lines {_line_ranges(where[id(r)] for r in left)})"
            lines.append(f"_{msg}._\n")
            if notes is not None:
                notes.append(msg)
    if "blocks.jsonl" in run:
        lines.append("## End-to-end block efficiency\n")
        _blocks_section(run["blocks.jsonl"][1], out, make_plots, lines, reference)
    if skipped:
        lines.append("## Rows left out\n")
        lines.append("Rows that do not match the schema the runners write, or repeat an earlier row's key, "
                     "are not in the tables above:\n")
        lines += [f"- `{m}`" for m in skipped] + [""]
    if no_mpl:
        lines.append(f"_(plots skipped: matplotlib is not installed; `{_optional.hint('matplotlib')}`)_\n")
    return write_file(out / "report.md", "\n".join(lines) + "\n", "write the report")  # all or nothing
