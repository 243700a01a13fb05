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

import json
from collections import defaultdict
from typing import Callable

from .records import SCHEMAS, read_jsonl, valid_rows

__all__ = ["compare_files", "compare_blocks", "KEY", "BLOCKS_KEY", "BLOCKS_SAME"]

KEY = ("dataset", "t_target", "t_draft", "law", "K", "verifier")
BLOCKS_KEY = ("prompt", "verifier", "law", "k", "depth", "temperature")
assert set(KEY) <= set(SCHEMAS["acceptance"].key) and set(BLOCKS_KEY) <= set(SCHEMAS["blocks"].key)
BLOCKS_SAME = ("new_tokens", "target_calls", "draft_calls", "block_efficiency")
# a decode run is compared with the run of the same key, tree shape and round in the other file
BLOCKS_CELL = BLOCKS_KEY + ("tree", "round")


SUMMARY_KINDS = {"summary": "the summary of each method, made from its run rows", "end": "the run's end: wall time, load"}


def _rows(path: str, print: Callable[..., None] = print, skipped: list | None = None) -> tuple[dict | None, list, list]:
    """``(meta, rows, lines)``: the measurement rows of a results file and their line numbers. A
    decode file's summary rows (:data:`SUMMARY_KINDS`) are named in one line printed with
    ``print``; a row of any other ``type`` or ``kind`` is not one this comparison reads: one
    ``file:line`` line each into ``skipped`` (ValueError without a list)."""
    other: list = []
    meta, rows, lines = read_jsonl(path, line_numbers=True, torn=other)
    keep, summaries = [], defaultdict(list)
    for i, (r, n) in enumerate(zip(rows, lines)):
        kind = r.get("kind", "run")
        if r.get("type", "row") != "row":
            other.append(f"{path}:{n}: a row of type {r.get('type')!r}, not a measurement row; row skipped")
        elif kind in SUMMARY_KINDS:
            summaries[kind].append(n)
        elif kind != "run":
            other.append(f"{path}:{n}: a row of kind {kind!r}, not a run or cell row; row skipped")
        else:
            keep.append(i)
    if other and skipped is None:
        raise ValueError(other[0])
    if other:
        skipped += other
    if summaries:
        print(f"{path}: {sum(map(len, summaries.values()))} rows not compared: "
              + "; ".join(f"{len(ns)} of kind {k!r} ({SUMMARY_KINDS[k]}; line{'s' * (len(ns) > 1)} "
                          f"{', '.join(map(str, ns[:8]))}{', ...' if len(ns) > 8 else ''})" for k, ns in summaries.items()))
    return meta, [rows[i] for i in keep], [lines[i] for i in keep]


def _file_kind(path: str, meta: dict | None, rows: list) -> str | None:
    """``blocks`` (decode runs, rows with prompts) or ``acceptance`` (cells), by the file's rows
    (None: no rows); ``ValueError`` naming the file when its rows are of both kinds."""
    kinds = {"blocks" if "prompt" in r or "block_efficiency" in r else "acceptance" for r in rows}
    if len(kinds) > 1:
        raise ValueError(f"{path}: holds both decode runs (rows with a prompt) and acceptance cells: "
                         "one kind of rows per results file")
    return kinds.pop() if kinds else None


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


_DECODER_KINDS = (None, "target", "tree", "auto")  # method_kind of this library's decoder; others are peers


def _field(r: dict, f: str):
    """A key field of a row; a decode row without a verifier is keyed and grouped by its
    sequence-level tree rule's name in the verifier's place (no rule shares a verifier's name),
    or a peer's by its kind (``llama-spec``), so that neither collides with the target alone."""
    if f == "verifier" and r.get("verifier") in (None, "-"):
        if r.get("rule") not in (None, "-", "token_walk"):
            return r["rule"]
        if r.get("method_kind") not in _DECODER_KINDS:
            return r["method_kind"]
    if f == "round":
        return r.get("round", 0)
    v = r.get(f)
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v  # an explicit tree: its paths


def _cells(rows: list, key=KEY, path: str | None = None, print: Callable[..., None] | None = None) -> dict:
    """``{key: row}``; rows whose key repeats an earlier row's (same cell or run, e.g. two tree
    shapes the key does not tell apart) are named in one line with ``print`` and left out."""
    out, repeated = {}, []
    for r in rows:
        k = tuple(_field(r, f) for f in key)
        if k in out:
            repeated.append(k)
        else:
            out[k] = r
    if repeated and print is not None:
        print(f"{path}: {len(repeated)} rows not compared: the same {', '.join(key)} as an earlier row "
              f"(e.g. {_show(repeated[0])})")
    return out


def _show(k: tuple) -> str:
    """A key as printed: its fields joined by ``/``; a decode run's tree shape and round only when
    not the default (``p0/specinfer/iid/2/3/1.0``, ``.../1.0 (tree "sequences", round 1)``)."""
    if len(k) != len(BLOCKS_CELL):
        return "/".join(map(str, k))
    extra = ([f"tree {k[-2]}"] if k[-2] is not None else []) + ([f"round {k[-1]}"] if k[-1] else [])
    return "/".join(map(str, k[:len(BLOCKS_KEY)])) + (f" ({', '.join(extra)})" if extra else "")


def _one_side(first: str, second: str, a: dict, b: dict, what: str, print: Callable[..., None]) -> None:
    """One line naming the keys found in one file only (not compared), with the first of each."""
    for path, mine, other in ((first, a, b), (second, b, a)):
        only = sorted(set(mine) - set(other), key=str)
        if only:
            print(f"  {len(only)} {what} only in {path}, not compared (e.g. {_show(only[0])})")


def _same_run(ra: dict, rb: dict) -> bool:
    if not all(ra.get(f) == rb.get(f) for f in BLOCKS_SAME):
        return False
    return ra.get("tokens") is None or rb.get("tokens") is None or ra["tokens"] == rb["tokens"]


def compare_blocks(first: str, second: str, rows_a: list, rows_b: list, print: Callable[..., None] = print) -> None:
    """Print how two blocks files' common runs compare (tokens made, calls, seconds)."""
    a, b = _cells(rows_a, BLOCKS_CELL, first, print), _cells(rows_b, BLOCKS_CELL, second, print)
    common = sorted(set(a) & set(b), key=str)
    print(f"{first}: {len(a)} runs; {second}: {len(b)} runs; {len(common)} in both")
    _one_side(first, second, a, b, "runs", print)
    same = {k for k in common if _same_run(a[k], b[k])}
    both = sum(a[k].get("tokens") is not None and b[k].get("tokens") is not None for k in common)
    print(f"same new tokens, target calls, draft calls and block efficiency in {len(same)} of {len(common)} runs"
          + (f" (token ids compared in the {both} runs both files record)" if both else ""))
    for k in common:
        if k not in same:
            diff = ", ".join(f"{f} {a[k].get(f)} -> {b[k].get(f)}" for f in BLOCKS_SAME if a[k].get(f) != b[k].get(f))
            diff = diff or "other token ids"
            print(f"  differs: {_show(k)}: {diff}")
    ta, tb = defaultdict(float), defaultdict(float)
    for k in common:
        ta[k[1]] += a[k].get("seconds") or 0.0
        tb[k[1]] += b[k].get("seconds") or 0.0
    print("\nseconds of the common runs by verifier: first -> second (second / first)")
    for name in sorted(ta, key=lambda x: -tb[x]):
        label = "target alone" if name is None else str(name)
        print(f"  {label:>16}: {ta[name]:8.0f} -> {tb[name]:7.0f} ({tb[name] / ta[name]:.2f}x)" if ta[name] else f"  {label:>16}: -")
    sa, sb = sum(ta.values()), sum(tb.values())
    print(f"  {'all':>16}: {sa:8.0f} -> {sb:7.0f}" + (f" ({sb / sa:.2f}x)" if sa else ""))


def compare_files(first: str, second: str, print: Callable[..., None] = print, skipped: list | None = None) -> None:
    """Print the comparison of two results files: blocks runs when the rows have prompts, else
    acceptance / temperature cells. Every row is checked against the schema of its kind
    (``records.SCHEMAS``): with a list ``skipped`` a damaged or duplicated row is left out with
    one ``file:line`` line in it, without one it is a ``ValueError``."""
    (meta_a, rows_a, lines_a), (meta_b, rows_b, lines_b) = _rows(first, print, skipped), _rows(second, print, skipped)
    ka, kb = _file_kind(first, meta_a, rows_a), _file_kind(second, meta_b, rows_b)
    if ka and kb and ka != kb:
        what = {"blocks": "decode runs (blocks rows)", "acceptance": "acceptance cells"}
        raise ValueError(f"{first} holds {what[ka]}, {second} {what[kb]}: compare two files of one evaluation")
    kind = ka or kb or "acceptance"
    exp_a, exp_b = (((m or {}).get("config") or {}).get("experiment") for m in (meta_a, meta_b))
    if isinstance(exp_a, str) and isinstance(exp_b, str) and exp_a != exp_b:
        print(f"{first} was written by `experiment {exp_a}`, {second} by `experiment {exp_b}`: "
              "only the cells of both are compared")
    rows_a = _checked(first, rows_a, lines_a, kind, skipped)
    rows_b = _checked(second, rows_b, lines_b, kind, skipped)
    if kind == "blocks":
        compare_blocks(first, second, rows_a, rows_b, print)
        return
    a, b = _cells(rows_a, KEY, first, print), _cells(rows_b, KEY, second, print)
    common = sorted(set(a) & set(b), key=str)
    print(f"{first}: {len(a)} cells; {second}: {len(b)} cells; {len(common)} in both")
    _one_side(first, second, a, b, "cells", print)
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
