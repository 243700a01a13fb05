"""Two runs of the same evaluation side by side: are the rows the same, and what did each cost?

For two results files written by ``multidraft experiment acceptance`` / ``paper`` (an
``acceptance.jsonl`` or ``temperature.jsonl`` each, e.g. the published study and a rerun of
its evaluation stages on the same position stores with newer code), prints:

* how many cells (dataset, temperatures, law, K, verifier) the two have in common, and in how
  many the per-position values and the cell mean are identical;
* every cell that differs: on how many positions, the largest per-position difference, the
  difference of the means in standard errors, and the code each row was written by (rows
  carry ``code`` since 2026-12-05; older rows show ``-``);
* the seconds of the common cells in each run, by data set and by verifier.

    .venv/bin/python benchmarks/compare_runs.py docs/paper/acceptance.jsonl runs/rerun/acceptance.jsonl

No timing is done here: the seconds are the ones each run recorded in its rows.
"""
from __future__ import annotations

import argparse
from collections import defaultdict

from multidraft.experiments.records import read_jsonl

KEY = ("dataset", "t_target", "t_draft", "law", "K", "verifier")


def _cells(path: str) -> dict:
    _, rows = read_jsonl(path)
    return {tuple(r.get(f) for f in KEY): r for r in rows if r.get("type", "row") == "row"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first")
    ap.add_argument("second")
    args = ap.parse_args(argv)
    a, b = _cells(args.first), _cells(args.second)
    common = sorted(set(a) & set(b), key=str)
    print(f"{args.first}: {len(a)} cells; {args.second}: {len(b)} cells; {len(common)} in both")
    same_values = sum(a[k].get("values") == b[k].get("values") for k in common)
    same_mean = sum(a[k]["acceptance"] == b[k]["acceptance"] for k in common)
    print(f"identical per-position values in {same_values} of {len(common)} cells, identical means in {same_mean}")
    for k in common:
        ra, rb = a[k], b[k]
        va, vb = ra.get("values") or [], rb.get("values") or []
        if va == vb:
            continue
        n = sum(x != y for x, y in zip(va, vb))
        big = max((abs(x - y) for x, y in zip(va, vb)), default=float("nan"))
        se = max(ra.get("se") or 0.0, rb.get("se") or 0.0)
        d = rb["acceptance"] - ra["acceptance"]
        print(f"  differs: {'/'.join(map(str, k))}: {n} of {len(va)} positions, largest {big:.1e}; "
              f"mean {d:+.2e} ({d / se:+.2f} se); code {ra.get('code', '-')} -> {rb.get('code', '-')}"
              if se > 0 else f"  differs: {'/'.join(map(str, k))}: {n} positions, mean {d:+.2e}")
    for field in ("dataset", "verifier"):
        ta, tb = defaultdict(float), defaultdict(float)
        for k in common:
            name = k[KEY.index(field)]
            ta[name] += a[k].get("seconds") or 0.0
            tb[name] += b[k].get("seconds") or 0.0
        print(f"\nseconds of the common cells by {field}: first -> second")
        for name in sorted(ta, key=lambda x: -tb[x]):
            print(f"  {name:>16}: {ta[name]:9.0f} -> {tb[name]:7.0f}")
        print(f"  {'all':>16}: {sum(ta.values()):9.0f} -> {sum(tb.values()):7.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
