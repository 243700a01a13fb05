"""Every repository path the docs cite exists (issue 38).

The Markdown files under ``docs/`` (and ``data/``) and the top-level ``README.md`` cite repository paths in two
ways: in code (inline `` `...` `` spans and fenced blocks: a token starting with ``src/``,
``docs/``, ``benchmarks/``, ``tests/``, ``scripts/`` or ``data/``, read from the repository root)
and in links (``[text](target)``, read from the citing file's folder, as a Markdown viewer does).
Each must name a file or folder of the checkout; a glob must match something. Templates
(``<law>_k<K>.jsonl``, ``{name}``) and web links are not paths; a token after ``--out`` /
``--markdown`` / ``>`` names a file a command WRITES (it need not exist) and is left out.
"""
from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("src", "docs", "benchmarks", "tests", "scripts", "data")
_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)
_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_TOKEN = re.compile(r"(?<![\w./~$:-])(?:\./)?((?:" + "|".join(TOPS) + r")/[\w./*?+@-]*)")
_WRITES = re.compile(r"(?:--out(?:-dir)?|--markdown|--json|--logs|>)[ =]+$")
_TAIL = re.compile(r"(?::\d+(?:-\d+)?|::[\w\[\]-]+)$")


def _clean(p: str) -> str:
    p = _TAIL.sub("", p)
    return p.rstrip(".,:;")


def cited_paths(text: str) -> list[tuple[str, int, str]]:
    """``(kind, line, path)`` for each repository path a Markdown text cites: kind ``code`` (from
    the repository root) or ``link`` (from the file's folder). Paths an inline or fenced command
    writes (after ``--out`` and the like) are left out, so are templates and web links."""
    out: list[tuple[str, int, str]] = []

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def code(body: str, start: int) -> None:
        for m in _TOKEN.finditer(body):
            path = _clean(m.group(1))
            before = body[max(0, m.start() - 16):m.start()]
            if _WRITES.search(before) or re.search(r"[<>{}]", body[m.start():m.end() + 1]) or "/" not in path:
                continue
            out.append(("code", line_of(start + m.start()), path))

    rest = list(text)
    for m in _FENCE.finditer(text):  # fenced blocks first; blanked so their backticks are not spans
        code(m.group(2), m.start(2))
        rest[m.start():m.end()] = " " * (m.end() - m.start())
    prose = "".join(rest)
    spans = list(rest)
    for m in _SPAN.finditer(prose):
        code(m.group(2), m.start(2))
        spans[m.start():m.end()] = " " * (m.end() - m.start())
    for m in _LINK.finditer("".join(spans)):  # links outside code
        target = m.group(1).split("#", 1)[0]
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or re.search(r"[<>{}]", target):
            continue
        out.append(("link", line_of(m.start()), target))
    return out


def missing_paths(md: Path, root: Path = ROOT) -> list[str]:
    """``file:line: path`` for each path ``md`` cites that is not in the checkout at ``root``."""
    bad = []
    for kind, line, path in cited_paths(md.read_text(encoding="utf-8")):
        base = root if kind == "code" else md.parent
        target = (base / path).resolve()
        if kind == "link" and root.resolve() not in (target, *target.parents):
            bad.append(f"{md.relative_to(root)}:{line}: {path} (outside the repository)")
            continue
        found = glob.glob(str(target)) if any(c in path for c in "*?") else target.exists()
        if not found:
            bad.append(f"{md.relative_to(root)}:{line}: {path}")
    return bad


def doc_files(root: Path = ROOT) -> list[Path]:
    """The Markdown under ``docs/`` and ``data/`` (the inputs' READMEs cite paths too) and ``README.md``."""
    files = sorted((root / "docs").rglob("*.md")) + sorted((root / "data").rglob("*.md"))
    return files + [root / "README.md"] if (root / "README.md").exists() else files


SAMPLE = """\
# A page
See `src/multidraft/trees/block.py:12` and `tests/test_docs_paths.py::test_x`, the folder `docs/`,
and [the guide](guide/usage.md#setup), [a site](https://example.com/docs/x.md), [up](../README.md).
Templates are not paths: `docs/results/seq_rules/<law>_k<K>.jsonl`; `PYTHONPATH=src python -m x`;
nor a file at a commit, `git show fbe1cd4:docs/paper/x.jsonl`, nor `llama.cpp/src/llama-sampler.cpp`.

```
python benchmarks/serve_load.py --out docs/results/new.jsonl --markdown=docs/new.md > data/out.txt
ls docs/results/real_trees/*.jsonl.gz
```
A `` `docs/inline` `` span, and `benchmarks/missing.py`.
"""


def test_the_extractor_on_a_sample():
    got = cited_paths(SAMPLE)
    assert got == [
        ("code", 8, "benchmarks/serve_load.py"),
        ("code", 9, "docs/results/real_trees/*.jsonl.gz"),
        ("code", 2, "src/multidraft/trees/block.py"),
        ("code", 2, "tests/test_docs_paths.py"),
        ("code", 2, "docs/"),
        ("code", 11, "docs/inline"),
        ("code", 11, "benchmarks/missing.py"),
        ("link", 3, "guide/usage.md"),
        ("link", 3, "../README.md"),
    ]


def test_a_missing_path_is_named(tmp_path):
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    (tmp_path / "src" / "multidraft" / "trees").mkdir(parents=True)
    (tmp_path / "src" / "multidraft" / "trees" / "block.py").write_text("")
    (tmp_path / "docs" / "guide" / "usage.md").write_text("")
    page = tmp_path / "docs" / "page.md"
    page.write_text(SAMPLE)
    assert missing_paths(page, tmp_path) == [
        "docs/page.md:8: benchmarks/serve_load.py",
        "docs/page.md:9: docs/results/real_trees/*.jsonl.gz",
        "docs/page.md:2: tests/test_docs_paths.py",
        "docs/page.md:11: docs/inline",
        "docs/page.md:11: benchmarks/missing.py",
        "docs/page.md:3: ../README.md",
    ]
    (tmp_path / "README.md").write_text("")
    assert "docs/page.md:3: ../README.md" not in missing_paths(page, tmp_path)


def test_every_path_the_docs_cite_exists():
    files = doc_files()
    assert len(files) > 20
    cited = sum(len(cited_paths(f.read_text(encoding="utf-8"))) for f in files)
    assert cited > 200  # the extractor sees the docs' paths (not trivially passing)
    bad = [b for f in files for b in missing_paths(f)]
    assert not bad, "paths cited in the docs that do not exist:\n" + "\n".join(bad)
