"""The source papers' claims beside our measurements, from the JSONL rows alone.

:func:`claims_table` reads the acceptance rows (one dataset at target and draft temperature 1)
and the blocks rows and returns Markdown lines: one table row per claim and dataset with the
measurement and its error bar and a verdict (``holds``, ``does not hold``, ``not resolved``
when the error bar covers zero). Differences between two cells are *paired*: the same
positions and the same per-position values (``values`` in the rows), so their standard
error is the one of the per-position differences. A verdict needs the difference to clear
two standard errors.
"""
from __future__ import annotations

import math
from collections import defaultdict

from .records import target_alone_row

__all__ = ["claims_table", "paired", "t95", "mean_ci"]

ALPHA = "alpha*"
KS = (2, 4, 8)  # the Ks a claim is shown at (those present)


def paired(a: dict | None, b: dict | None):
    """``(mean, se, n)`` of the per-position differences ``a - b`` (same positions), or None."""
    if not a or not b:
        return None
    va, vb = a.get("values"), b.get("values")
    if not va or not vb or len(va) != len(vb):
        return None
    d = [x - y for x, y in zip(va, vb)]
    n = len(d)
    m = sum(d) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    return m, sd / math.sqrt(n), n


def t95(n: int) -> float:
    """The two-sided 95% Student-t quantile with n - 1 degrees of freedom (normal for large n)."""
    if n < 2:
        return float("nan")
    try:
        from scipy import stats

        return float(stats.t.ppf(0.975, n - 1))
    except ImportError:  # pragma: no cover (scipy is a dependency)
        return 1.96


def mean_ci(xs) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval, the one summary of a column of rows (decode
    runs, the report's blocks tables); None, NaN and infinite values are dropped first. The
    half-width is NaN where it is undefined: at n = 1 (no spread to estimate, ``t95(1)`` is NaN),
    printed as ``nan``, never as a zero-width interval; both are NaN at n = 0."""
    xs = [x for x in xs if x is not None and isinstance(x, (int, float)) and math.isfinite(x)]
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(xs) / n
    if n < 2:
        return m, float("nan")
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, t95(n) * sd / math.sqrt(n)


def _verdict(diffs, sign: int = 1) -> str:
    """``holds`` when every difference (times sign) exceeds 2 se, ``does not hold`` when one is
    below -2 se, else ``not resolved``."""
    if not diffs:
        return "-"
    if all(sign * m > 2 * se for m, se, _ in diffs):
        return "holds"
    if any(sign * m < -2 * se for m, se, _ in diffs):
        return "does not hold"
    return "not resolved (within 2 se)"


def _fmt(k, d, nd=4) -> str:
    return f"K={k}: {d[0]:+.{nd}f} ± {d[1]:.{nd}f}"


def claims_table(acc_rows: list[dict], block_rows: list[dict] | None = None) -> list[str]:
    """Markdown lines of the findings table (empty when there are no acceptance rows at T = 1)."""
    cells = defaultdict(dict)
    for r in acc_rows:
        if r.get("t_target") == 1.0 and r.get("t_draft") == 1.0 and not r.get("top_k") and r.get("top_p") in (None, 1, 1.0):
            cells[r["dataset"]][(r["law"], r["K"], r["verifier"])] = r
    out = ["| claim (source) | data set | our measurement (paired mean ± SE over positions) | verdict |", "|---|---|---|---|"]
    for ds, by in cells.items():
        ks = [k for k in KS if any(key[1] == k for key in by)]

        def row(claim, parts, verdict):
            out.append(f"| {claim} | {ds} | {'; '.join(parts) if parts else '-'} | {verdict} |")

        # 1. without replacement raises the ceiling (Hu et al.)
        d = [(k, paired(by.get(("wor", k, ALPHA)), by.get(("iid", k, ALPHA)))) for k in ks]
        d = [(k, x) for k, x in d if x]
        if d:
            row("alpha*(wor) > alpha*(iid) (Hu et al. 2025)", [_fmt(k, x) for k, x in d], _verdict([x for _, x in d]))
        # 2. existing verifiers stay below alpha*
        for law, names in (("iid", ("specinfer", "spectr", "khisti_is")), ("wor", ("rrs_wor",))):
            for n in names:
                d = [(k, paired(by.get((law, k, ALPHA)), by.get((law, k, n)))) for k in ks]
                d = [(k, x) for k, x in d if x]
                if d:
                    row(f"`{n}` stays below alpha*({law}) (Hu et al. 2025)",
                        [f"gap {_fmt(k, x)}" for k, x in d], _verdict([x for _, x in d]))
        # 3. the greedy law: its ceiling vs iid's, and greedy_optimal reaches it
        d = [(k, paired(by.get(("greedy", k, ALPHA)), by.get(("iid", k, ALPHA)))) for k in ks]
        d = [(k, x) for k, x in d if x]
        if d:
            row("greedy drafts: alpha*(greedy) - alpha*(iid) (Hu et al. 2025)", [_fmt(k, x) for k, x in d],
                "greedy higher" if _verdict([x for _, x in d]) == "holds" else
                ("iid higher" if _verdict([x for _, x in d], -1) == "holds" else "mixed / within 2 se"))
        d = [(k, paired(by.get(("greedy", k, ALPHA)), by.get(("greedy", k, "greedy_optimal")))) for k in ks]
        d = [(k, x) for k, x in d if x]
        if d:
            worst = max(abs(x[0]) for _, x in d)
            row("`greedy_optimal` reaches alpha*(greedy) (Hu et al. 2025)", [f"gap {_fmt(k, x)}" for k, x in d],
                "holds" if all(abs(x[0]) <= 2 * x[1] + 1e-6 for _, x in d) else f"gap up to {worst:.4f}")
        # 4. the order optimal >= IS >= SpecTr >= SpecInfer in token acceptance (Khisti et al. Tables 1, 3)
        for hi, lo in (("optimal", "khisti_is"), ("khisti_is", "spectr"), ("spectr", "specinfer")):
            d = [(k, paired(by.get(("iid", k, hi)), by.get(("iid", k, lo)))) for k in ks]
            d = [(k, x) for k, x in d if x]
            if d:
                v = _verdict([x for _, x in d])
                row(f"token acceptance `{hi}` >= `{lo}`, iid (Khisti et al. 2024)", [_fmt(k, x) for k, x in d],
                    "holds (strictly)" if v == "holds" else v)
        # 5. how often acceptance 1 is possible at K = 2 (Khisti et al.'s condition p(S) >= q(S)^2 for all S)
        for law in ("iid", "wor"):
            a = by.get((law, 2, ALPHA))
            if a and a.get("values"):
                n = len(a["values"])
                f = sum(v >= 1 - 1e-6 for v in a["values"]) / n
                se = math.sqrt(f * (1 - f) / n)
                cond = "p(S) >= q(S)^2 for every S" if law == "iid" else "alpha*(wor) = 1"
                row(f"K = 2 unit acceptance possible ({cond}; Khisti et al. 2024)", [f"{100 * f:.1f}% ± {100 * se:.1f}% of {n} positions"],
                    "measured")
        # 6. drafts at different temperatures (independent law)
        d = [(k, by.get(("independent", k, ALPHA)), by.get(("independent", k, "specinfer")), by.get(("independent", k, "khisti_is")))
             for k in (2, 3, 4)]
        parts = []
        for k, a, s_, i_ in d:
            if a:
                w = a.get("bound_width_max")
                gs = paired(a, s_)
                gi = paired(a, i_)
                parts.append(f"K={k}: alpha* {a['acceptance']:.4f} (width <= {w:.1e})" if w is not None else f"K={k}: alpha* {a['acceptance']:.4f}")
                if gs:
                    parts[-1] += f", gap specinfer {gs[0]:+.4f} ± {gs[1]:.4f}"
                if gi:
                    parts[-1] += f", gap khisti_is {gi[0]:+.4f} ± {gi[1]:.4f}"
        if parts:
            row("independent drafts (different temperatures) stay below alpha* (Khisti et al. 2024)", parts, "measured")
    if block_rows:
        out += _block_claims(block_rows)
    return out if len(out) > 2 else []


def _block_claims(rows: list[dict]) -> list[str]:
    """The order optimal >= IS >= SpecTr >= SpecInfer in block efficiency, paired over prompts."""
    by = defaultdict(dict)
    for r in rows:
        if not target_alone_row(r):
            by[(r["verifier"], r["k"])][r["prompt"]] = r["block_efficiency"]
    out = []
    for k in sorted({k for _, k in by}):
        if k < 2:
            continue
        for hi, lo in (("optimal", "khisti_is"), ("khisti_is", "spectr"), ("spectr", "specinfer")):
            a, b = by.get((hi, k)), by.get((lo, k))
            if not a or not b:
                continue
            common = sorted(set(a) & set(b))
            if len(common) < 2:
                continue
            m, se, n = paired({"values": [a[p] for p in common]}, {"values": [b[p] for p in common]})
            v = _verdict([(m, se, n)])
            out.append(f"| block efficiency `{hi}` >= `{lo}` (Khisti et al. 2024, Table 1) | blocks, K={k} | "
                       f"{m:+.3f} ± {se:.3f} tokens/call over {n} prompts (paired) | {v} |")
    return out
