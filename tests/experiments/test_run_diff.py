"""``multidraft compare-runs`` (experiments.run_diff): two results files side by side."""
from __future__ import annotations

from multidraft.cli import main
from multidraft.experiments.records import JsonlWriter


def _blocks(path, rows):
    with JsonlWriter(path, {"experiment": "blocks"}, 0) as w:
        for r in rows:
            w.write(**r)
    return path


def _run(prompt, verifier, calls, tokens=None, seconds=1.0):
    r = {"kind": "run", "prompt": prompt, "verifier": verifier, "law": "iid", "K": 2, "depth": 3, "temperature": 1.0,
         "new_tokens": 8, "target_calls": calls, "draft_calls": 3 * calls, "block_efficiency": 8 / calls,
         "seconds": seconds}
    if tokens is not None:
        r["tokens"] = tokens
    return r


def test_blocks_files_compare_calls_and_token_ids(tmp_path, capsys):
    a = _blocks(tmp_path / "a.jsonl", [_run("p0", "specinfer", 4, [1, 2]), _run("p1", "specinfer", 4, [3, 4]),
                                       _run("p2", "optimal", 3), _run("p3", "optimal", 2, [5])])
    b = _blocks(tmp_path / "b.jsonl", [_run("p0", "specinfer", 4, [1, 2], 2.0), _run("p1", "specinfer", 4, [3, 5]),
                                       _run("p2", "optimal", 5, [7]), _run("p9", "optimal", 2, [5])])
    with JsonlWriter(tmp_path / "b.jsonl", {"experiment": "blocks"}, 0) as w:
        w.write(kind="summary", method="x", prompts=2)  # summary rows are not runs
    assert main(["compare-runs", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "4 runs; " in out and "3 in both" in out
    assert "same new tokens, target calls, draft calls and block efficiency in 1 of 3 runs" in out
    assert "p1/specinfer/iid/2/3/1.0: other token ids" in out
    assert "p2/optimal/iid/2/3/1.0: target_calls 3 -> 5" in out
    assert "specinfer:        2 ->       3 (1.50x)" in out


def test_acceptance_files_compare_values(tmp_path, capsys):
    def cell(law, values):
        return {"dataset": "d", "t_target": 1.0, "t_draft": 1.0, "law": law, "K": 2, "verifier": "optimal",
                "values": values, "acceptance": sum(values) / len(values), "se": 0.1, "seconds": 2.0}
    a = _blocks(tmp_path / "a.jsonl", [cell("iid", [0.5, 0.5]), cell("wor", [0.6, 0.7])])
    b = _blocks(tmp_path / "b.jsonl", [cell("iid", [0.5, 0.5]), cell("wor", [0.6, 0.9])])
    assert main(["compare-runs", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "identical per-position values in 1 of 2 cells" in out and "d/1.0/1.0/wor/2/optimal: 1 of 2 positions" in out
