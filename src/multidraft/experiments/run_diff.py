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

For two ``blocks.jsonl`` (``multidraft experiment blocks`` / ``paper``), the runs are keyed by
(prompt, verifier, law, K, depth, temperature) instead: in how many the decode made the same
tokens with the same calls (new tokens, target and draft calls, block efficiency), every run
that differs, and the seconds of the common runs by verifier with their ratio.

    multidraft compare-runs docs/results/paper/acceptance.jsonl runs/rerun/acceptance.jsonl
    multidraft compare-runs docs/results/paper/blocks.jsonl runs/rerun/blocks.jsonl

No timing is done here: the seconds are the ones each run recorded in its rows. For blocks
rows that carry their ``tokens`` (the decode runner's schema, :mod:`.decode_runs`), "same" also
means the same token ids.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

from .records import SCHEMAS, read_jsonl, valid_rows

__all__ = ["compare_files", "compare_blocks", "KEY", "BLOCKS_KEY", "BLOCKS_SAME"]

KEY = ("dataset", "t_target", "t_draft", "law", "K", "verifier")
BLOCKS_KEY = ("prompt", "verifier", "law", "k", "depth", "temperature")
assert set(KEY) <= set(SCHEMAS["acceptance"].key) and set(BLOCKS_KEY) <= set(SCHEMAS["blocks"].key)
BLOCKS_SAME = ("new_tokens", "target_calls", "draft_calls", "block_efficiency")


def _rows(path: str) -> tuple[list, list]:
    """``(rows, lines)``: the measurement rows of a results file (not summaries) and their line numbers."""
    _, rows, lines = read_jsonl(path, line_numbers=True)
    keep = [i for i, r in enumerate(rows) if r.get("type", "row") == "row" and r.get("kind", "run") == "run"]
    return [rows[i] for i in keep], [lines[i] for i in keep]


def _checked(path: str, rows: list, lines: list, kind: str, skipped: list | None) -> list:
    """The rows that satisfy the schema the runners write (``records.SCHEMAS[kind]``), duplicates
    left out; one ``file:line`` line per other row into ``skipped`` (ValueError without a list)."""
    # what this comparison reads: the cell's key and mean (blocks: the run's key)
    needed = KEY + ("acceptance",) if kind == "acceptance" else BLOCKS_KEY
    good, bad = valid_rows(path, rows, lines, kind, needed)
    if bad and skipped is None:
        raise ValueError(bad[0])
    if skipped is not None:
        skipped += bad
    return good


def _field(r: dict, f: str):
    """A key field of a row; a decode row of a sequence-level tree rule (verifier ``-``) is keyed
    and grouped by its rule's name in the verifier's place (no rule shares a verifier's name)."""
    if f == "verifier" and r.get("verifier") == "-" and r.get("rule"):
        return r["rule"]
    return r.get(f)


def _cells(rows: list, key=KEY) -> dict:
    return {tuple(_field(r, f) for f in key): r for r in rows}


def _same_run(ra: dict, rb: dict) -> bool:
    if not all(ra.get(f) == rb.get(f) for f in BLOCKS_SAME):
        return False
    return ra.get("tokens") is None or rb.get("tokens") is None or ra["tokens"] == rb["tokens"]


def compare_blocks(first: str, second: str, rows_a: list, rows_b: list, print: Callable[..., None] = print) -> None:
    """Print how two blocks files' common runs compare (tokens made, calls, seconds)."""
    a, b = _cells(rows_a, BLOCKS_KEY), _cells(rows_b, BLOCKS_KEY)
    common = sorted(set(a) & set(b), key=str)
    print(f"{first}: {len(a)} runs; {second}: {len(b)} runs; {len(common)} in both")
    same = {k for k in common if _same_run(a[k], b[k])}
    both = sum(a[k].get("tokens") is not None and b[k].get("tokens") is not None for k in common)
    print(f"same new tokens, target calls, draft calls and block efficiency in {len(same)} of {len(common)} runs"
          + (f" (token ids compared in the {both} runs both files record)" if both else ""))
    for k in common:
        if k not in same:
            diff = ", ".join(f"{f} {a[k].get(f)} -> {b[k].get(f)}" for f in BLOCKS_SAME if a[k].get(f) != b[k].get(f))
            diff = diff or "other token ids"
            print(f"  differs: {'/'.join(map(str, k))}: {diff}")
    ta, tb = defaultdict(float), defaultdict(float)
    for k in common:
        ta[k[1]] += a[k].get("seconds") or 0.0
        tb[k[1]] += b[k].get("seconds") or 0.0
    print("\nseconds of the common runs by verifier: first -> second (second / first)")
    for name in sorted(ta, key=lambda x: -tb[x]):
        print(f"  {name:>16}: {ta[name]:8.0f} -> {tb[name]:7.0f} ({tb[name] / ta[name]:.2f}x)" if ta[name] else f"  {name:>16}: -")
    sa, sb = sum(ta.values()), sum(tb.values())
    print(f"  {'all':>16}: {sa:8.0f} -> {sb:7.0f}" + (f" ({sb / sa:.2f}x)" if sa else ""))


def compare_files(first: str, second: str, print: Callable[..., None] = print, skipped: list | None = None) -> None:
    """Print the comparison of two results files: blocks runs when the rows have prompts, else
    acceptance / temperature cells. Every row is checked against the schema of its kind
    (``records.SCHEMAS``): with a list ``skipped`` a damaged or duplicated row is left out with
    one ``file:line`` line in it, without one it is a ``ValueError``."""
    (rows_a, lines_a), (rows_b, lines_b) = _rows(first), _rows(second)
    kind = "blocks" if any("prompt" in r for r in rows_a[:1] + rows_b[:1]) else "acceptance"
    rows_a = _checked(first, rows_a, lines_a, kind, skipped)
    rows_b = _checked(second, rows_b, lines_b, kind, skipped)
    if kind == "blocks":
        compare_blocks(first, second, rows_a, rows_b, print)
        return
    a, b = _cells(rows_a), _cells(rows_b)
    common = sorted(set(a) & set(b), key=str)
    print(f"{first}: {len(a)} cells; {second}: {len(b)} cells; {len(common)} in both")
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
