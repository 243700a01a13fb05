"""scripts/relativize_commands.py: the commands recorded in result files name repository paths
relative to the repository root; nothing but those command strings changes (issue 38)."""
from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("relativize_commands", ROOT / "scripts" / "relativize_commands.py")
rc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rc)


def test_only_repository_paths_lose_their_checkout():
    assert rc.relativize("/work/main/src/multidraft/__main__.py demo") == "src/multidraft/__main__.py demo"
    assert rc.relativize("/tmp/fresh7/.venv/bin/python -m x") == ".venv/bin/python -m x"
    assert rc.relativize("/home/u/repo/benchmarks/x.py --out /home/u/repo/docs/results/a.jsonl") == \
        "benchmarks/x.py --out docs/results/a.jsonl"
    for keep in ("/root/.cache/multidraft/models/gguf/a.gguf", "/tmp/tfrun/nodes.jsonl", "/work/wt/_runs/rt/kjv.jsonl",
                 "relative/src/multidraft/x.py", "/usr/src/multidraft/x.py"):
        assert rc.relativize(keep) == keep


def test_a_line_changes_in_its_command_strings_only_byte_for_byte():
    line = ('{"type":"meta",  "config": {"out": "/work/main/docs/x.jsonl", "note": "caf\\u00e9"},'
            ' "command": "/work/main/src/multidraft/__main__.py run --out /work/main/docs/x.jsonl",'
            ' "commands": {"ours": "/work/main/.venv/bin/python -m multidraft serve", "n": [1, 2.50]},'
            ' "argv": ["/tmp/fresh/benchmarks/b.py", "--x", "1"], "x": 1e-05}')
    new, n = rc.rewrite_document(line)
    assert n == 3
    want = (line.replace('"/work/main/src/', '"src/').replace('"/work/main/.venv', '".venv')
            .replace("--out /work/main/docs/", "--out docs/").replace('"/tmp/fresh/benchmarks', '"benchmarks'))
    assert new == want  # spacing, escapes, number spellings and the config's own path all kept
    assert json.loads(new)["config"]["out"] == "/work/main/docs/x.jsonl"
    assert rc.rewrite_document(new) == (new, 0)  # idempotent


def test_files_of_each_kind_and_the_check_mode(tmp_path):
    (tmp_path / "docs" / "r").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    meta = '{"type": "meta", "command": "/root/repo/src/multidraft/__main__.py paper", "store": "/root/repo/data/s.pt"}'
    row = '{"type": "row", "value": 0.5}'
    plain = tmp_path / "docs" / "r" / "a.jsonl"
    plain.write_text(meta + "\n" + row + "\n{\"torn")
    packed = tmp_path / "docs" / "r" / "b.jsonl.gz"
    packed.write_bytes(gzip.compress((meta + "\n" + row + "\n").encode(), mtime=0))
    doc = tmp_path / "data" / "c.json"
    doc.write_text('{\n  "command": ["/root/repo/.venv/bin/python", "-m", "x"],\n  "other": "/root/repo/src/y"\n}\n')
    untouched = tmp_path / "docs" / "r" / "d.jsonl"
    untouched.write_text(row + "\n")
    before = untouched.stat().st_mtime_ns
    assert rc.main(["--root", str(tmp_path), "--check"]) == 1
    assert plain.read_text().startswith(meta)  # --check writes nothing
    assert rc.main(["--root", str(tmp_path)]) == 0
    fixed = meta.replace('"/root/repo/src/multidraft', '"src/multidraft')
    assert plain.read_text() == fixed + "\n" + row + "\n{\"torn"  # the store path is not a command: it stays
    assert gzip.decompress(packed.read_bytes()).decode() == fixed + "\n" + row + "\n"
    assert doc.read_text() == '{\n  "command": [".venv/bin/python", "-m", "x"],\n  "other": "/root/repo/src/y"\n}\n'
    assert untouched.stat().st_mtime_ns == before
    assert rc.main(["--root", str(tmp_path), "--check"]) == 0


def test_committed_results_record_relative_commands():
    """Every committed result file is already rewritten (the script finds nothing to change)."""
    changed = {str(p.relative_to(ROOT)): rc.rewrite_file(p, write=False) for p in rc.result_files(ROOT)}
    assert {p: n for p, n in changed.items() if n} == {}
    assert len(changed) > 50  # it did look at the results
