#!/usr/bin/env python3
"""Make the commands recorded in result files relative to the repository root (issue 38).

Result files recorded the command that made them with the absolute path of the checkout that ran
it (``/work/main/src/multidraft/__main__.py experiment ...``, ``/work/wt/claims/src/...``,
``/work/main/.venv/bin/python -m multidraft serve ...``). This script rewrites, in every
``.jsonl``, ``.jsonl.gz`` and ``.json`` file under ``docs/`` and ``data/``, the string values
of the ``command`` fields (and of ``commands`` / ``argv``, which hold commands too), at any
depth, strings inside lists and objects under such a field included: an absolute path whose
tail is a repository path (``src/multidraft/...``, ``.venv/...``, ``benchmarks/...``,
``scripts/...``, ``tests/...``, ``docs/...``, ``data/...``) loses the checkout prefix.

Nothing else changes: every other field, and every byte of the file outside the rewritten string
tokens, stays as it was (each file is scanned token by token; the rewritten file must parse to
the old one with only those strings changed, or the script stops). Absolute paths that are not
in the repository (``/root/.cache/...`` models, ``/tmp/...`` outputs) stay, as do absolute paths
in any other field. A ``.gz`` file is written back with ``gzip -n -9`` (or Python's gzip at
level 9 with mtime 0 where there is no ``gzip``).

    python scripts/relativize_commands.py            # rewrite, print one line per changed file
    python scripts/relativize_commands.py --check    # change nothing; exit 1 if a file would change
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import subprocess
import sys
from json.decoder import scanstring
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = frozenset({"command", "commands", "argv"})
TOP = ("src/multidraft", ".venv", "benchmarks", "scripts", "tests", "docs", "data")
# an absolute path under one of the machines' homes and scratch folders, up to the first segment
# that starts a repository path; not preceded by a path character (so not the tail of another path)
_CHECKOUT = re.compile(r"(?<![\w.~/-])/(?:root|work|home|tmp)(?:/[\w.+-]+)*?/(?=(?:"
                       + "|".join(re.escape(t) for t in TOP) + r")/)")


_MAYBE = re.compile('"(?:' + "|".join(sorted(FIELDS)) + ')"')


def relativize(text: str) -> str:
    """``text`` with the checkout prefix of each absolute repository path removed."""
    return _CHECKOUT.sub("", text)


def _fix_value(obj, under: bool):
    """``obj`` with :func:`relativize` applied to every string under a command field."""
    if isinstance(obj, dict):
        return {k: _fix_value(v, under or k in FIELDS) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fix_value(v, under) for v in obj]
    if isinstance(obj, str) and under:
        return relativize(obj)
    return obj


def rewrite_document(text: str) -> tuple[str, int]:
    """``(new text, strings changed)`` of one JSON document, every byte outside the changed
    string tokens kept. A string is rewritten when some enclosing object key is a command field."""
    out: list[str] = []
    stack: list[list] = []  # ["obj", current key, expecting a key] or ["arr", None, False]
    changed = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            value, end = scanstring(text, i + 1)
            token = text[i:end]
            top = stack[-1] if stack else None
            if top is not None and top[0] == "obj" and top[2]:
                top[1], top[2] = value, False  # an object key
            elif any(e[0] == "obj" and e[1] in FIELDS for e in stack):
                new = relativize(value)
                if new != value:
                    ascii_only = token == json.dumps(value, ensure_ascii=True)
                    token = json.dumps(new, ensure_ascii=ascii_only)
                    changed += 1
            out.append(token)
            i = end
            continue
        if ch == "{":
            stack.append(["obj", None, True])
        elif ch == "[":
            stack.append(["arr", None, False])
        elif ch in "}]":
            stack.pop()
        elif ch == "," and stack and stack[-1][0] == "obj":
            stack[-1][2] = True
        out.append(ch)
        i += 1
    new_text = "".join(out)
    if changed:  # the rewrite changed exactly the command strings, nothing else
        if json.loads(new_text) != _fix_value(json.loads(text), False):
            raise ValueError("rewrite changed more than the command fields")
    return new_text, changed


def rewrite_text(text: str, lines: bool) -> tuple[str, int]:
    """A JSONL text line by line (blank and unparsable lines kept as they are), or one JSON document."""
    if not lines:
        return rewrite_document(text)
    parts, total = [], 0
    for line in text.split("\n"):
        if line.strip() and _MAYBE.search(line) and _CHECKOUT.search(line):  # most rows name no command
            try:
                json.loads(line)
            except json.JSONDecodeError:
                parts.append(line)  # a torn line: not ours to touch
                continue
            line, n = rewrite_document(line)
            total += n
        parts.append(line)
    return "\n".join(parts), total


def _gzip(data: bytes) -> bytes:
    if shutil.which("gzip"):
        return subprocess.run(["gzip", "-n", "-9", "-c"], input=data, capture_output=True, check=True).stdout
    return gzip.compress(data, compresslevel=9, mtime=0)


def rewrite_file(path: Path, *, write: bool) -> int:
    """Command strings changed in ``path`` (written back when ``write``)."""
    raw = path.read_bytes()
    packed = path.name.endswith(".gz")
    text = (gzip.decompress(raw) if packed else raw).decode("utf-8")
    new, n = rewrite_text(text, lines=not path.name.endswith(".json"))
    if n and write:
        data = new.encode("utf-8")
        path.write_bytes(_gzip(data) if packed else data)
    return n


def result_files(root: Path) -> list[Path]:
    return sorted(p for d in ("docs", "data") if (root / d).is_dir() for p in (root / d).rglob("*")
                  if p.is_file() and p.name.endswith((".jsonl", ".jsonl.gz", ".json")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if some file would change")
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this script's)")
    a = ap.parse_args(argv)
    files = fields = 0
    for path in result_files(a.root):
        n = rewrite_file(path, write=not a.check)
        if n:
            files += 1
            fields += n
            print(f"{path.relative_to(a.root)}: {n} command string(s){' to rewrite' if a.check else ''}")
    print(f"{files} file(s), {fields} command string(s) {'to rewrite' if a.check else 'rewritten'}", file=sys.stderr)
    return 1 if a.check and files else 0


if __name__ == "__main__":
    sys.exit(main())
