"""Tracked ``docs/`` stays small (issue 38): at most 20 MB, the sum of the sizes of the files
``git ls-files docs`` lists. Bulk per-tree and per-position rows go in as ``.jsonl.gz``
(``records.read_jsonl`` reads both) or out of the tree with the command that regenerates them."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 20_000_000  # bytes


def tracked_docs() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "docs"], capture_output=True, check=False)
    if out.returncode != 0:
        pytest.skip("git ls-files failed: " + out.stderr.decode(errors="replace").strip())
    return [ROOT / p for p in out.stdout.decode().split("\0") if p]


def test_tracked_docs_stay_under_20_mb():
    files = tracked_docs()
    assert files, "git ls-files docs listed nothing"
    sizes = {p: p.stat().st_size for p in files if p.is_file()}
    total = sum(sizes.values())
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total <= LIMIT, (f"tracked docs/ holds {total / 1e6:.1f} MB > {LIMIT / 1e6:.0f} MB; largest: "
                            + ", ".join(f"{p.relative_to(ROOT)} {s / 1e6:.1f} MB" for p, s in biggest)
                            + " (compress bulk rows: gzip -n -9, read by records.read_jsonl)")
