"""``multidraft experiment paper``: the whole study on tiny models, resumable, and its report."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from multidraft.experiments import findings, paper, report
from multidraft.experiments.records import read_jsonl

TIMING = ("seconds", "tokens_per_s", "prefill_seconds", "time", "started")


@pytest.fixture
def tiny(tiny_sharp):
    return tiny_sharp


@pytest.fixture
def cfg(prompt_file):
    f = prompt_file
    return replace(paper.QUICK, datasets=(f"file:{f}",), min_positions=30, block_dataset=f"file:{f}")


def _rows(run_dir):
    out = {}
    for name in ("acceptance.jsonl", "temperature.jsonl", "blocks.jsonl"):
        _, rows = read_jsonl(run_dir / name)
        out[name] = [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
    return out


def _run(run_dir, tiny, cfg, **kw):
    return paper.run(run_dir, models=lambda: tiny, model_names={"target": "t", "draft": "d"}, config=cfg, **kw)


def test_paper_runs_every_stage_and_a_rerun_writes_nothing(tiny, cfg, tmp_path):
    spent = _run(tmp_path / "a", tiny, cfg)
    assert list(spent) == list(paper.STAGES)
    rows = _rows(tmp_path / "a")
    acc = rows["acceptance.jsonl"]
    assert {r["law"] for r in acc} == {"iid", "wor", "greedy", "independent"}
    assert {r["K"] for r in acc} == set(cfg.ks)
    assert min(r["n_positions"] for r in acc) >= cfg.min_positions
    assert {(r["t_target"], r["t_draft"]) for r in rows["temperature.jsonl"]} >= {(0.5, 1.0), (1.0, 0.5)}
    blocks = rows["blocks.jsonl"]
    assert {r["k"] for r in blocks if r["rule"] is not None} == set(cfg.block_ks)
    assert {r["verifier"] for r in blocks if r["k"] == 1} == {"naive"}  # K = 1 is SD, run once
    assert all(r["depth"] == cfg.block_budget // r["k"] for r in blocks if r["rule"] is not None)

    def boom():
        raise AssertionError("a finished run must not load the models again")

    again = paper.run(tmp_path / "a", models=boom, model_names={"target": "t", "draft": "d"}, config=cfg)
    assert list(again) == list(paper.STAGES)
    assert _rows(tmp_path / "a") == rows
    stages = read_jsonl(tmp_path / "a" / "stages.jsonl")[1]
    assert [r["stage"] for r in stages] == list(paper.STAGES) * 2 and all(r["complete"] for r in stages)
    assert [r["rows_written"] for r in stages[4:]] == [0, 0, 0, 0]
    md = report.build(tmp_path / "a").read_text()
    assert "The papers' claims" in md and "Time of each stage" in md and "independent drafts" in md
    assert "Cost per position" in md and "| alpha* |" in md


def test_killed_and_resumed_run_loses_and_duplicates_nothing(tiny, cfg, tmp_path):
    _run(tmp_path / "ref", tiny, cfg)
    calls = {"n": 0}

    def killer(it, total=None, desc=""):  # a progress wrapper that is interrupted mid-stage
        for x in it:
            calls["n"] += 1
            if calls["n"] == 9:
                raise KeyboardInterrupt
            yield x

    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "b", tiny, cfg, progress=killer)
    stages = read_jsonl(tmp_path / "b" / "stages.jsonl")[1]
    assert stages[-1]["complete"] is False  # the interrupted stage's time is recorded
    _run(tmp_path / "b", tiny, cfg)
    ref, got = _rows(tmp_path / "ref"), _rows(tmp_path / "b")
    for name in ref:
        key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
        assert sorted(map(key, got[name])) == sorted(map(key, ref[name])), name  # same rows, none twice


def test_unknown_stage_is_refused(tiny, cfg, tmp_path):
    with pytest.raises(ValueError, match="unknown"):
        _run(tmp_path, tiny, cfg, stages=["collect", "nope"])


def test_claims_table_verdicts_from_paired_values():
    base = dict(dataset="d", t_target=1.0, t_draft=1.0, top_k=None, top_p=None)
    n = 50
    rows = [
        {**base, "law": "iid", "K": 2, "verifier": "alpha*", "acceptance": 0.9, "values": [0.9] * (n - 10) + [1.0] * 10},
        {**base, "law": "wor", "K": 2, "verifier": "alpha*", "acceptance": 0.95, "values": [0.95] * (n - 10) + [1.0] * 10},
        {**base, "law": "iid", "K": 2, "verifier": "specinfer", "acceptance": 0.85,
         "values": [0.85 + 0.01 * ((-1) ** i) for i in range(n - 10)] + [1.0] * 10},
        {**base, "law": "iid", "K": 2, "verifier": "spectr", "acceptance": 0.85,
         "values": [0.85 - 0.01 * ((-1) ** i) for i in range(n - 10)] + [1.0] * 10},
    ]
    lines = findings.claims_table(rows)
    text = "\n".join(lines)
    assert "| alpha*(wor) > alpha*(iid) (Hu et al. 2025) | d | K=2: +0.0400 ± 0.0029 | holds |" in text
    assert "`specinfer` stays below alpha*(iid)" in text and "holds" in text
    # spectr - specinfer alternates +-0.02: mean 0, within 2 se
    assert "token acceptance `spectr` >= `specinfer`, iid (Khisti et al. 2024) | d | K=2: +0.0000" in text
    assert "not resolved" in [ln for ln in lines if "`spectr` >= `specinfer`" in ln][0]
    assert "20.0% ± 5.7% of 50 positions" in text  # alpha*(iid, K=2) = 1 at 10 of 50 positions
    assert findings.paired(rows[0], {"values": [1.0]}) is None  # different positions: no paired difference


def test_blocks_configs_bind_the_committed_paper_results(tmp_path):
    """The study's blocks configs (made once, up front) bind exactly what the committed
    docs/results/paper/blocks.jsonl was bound to: the same meta config, byte for byte, and the
    same run id, so that file resumes with nothing left to run for either config."""
    import shutil
    from pathlib import Path

    from multidraft.experiments import blocks
    from multidraft.experiments.records import check_binding, resume, row_key, run_id

    committed = Path(__file__).resolve().parents[2] / "docs" / "results" / "paper" / "blocks.jsonl"
    meta, rows = read_jsonl(committed)
    cfgs = paper.blocks_configs(paper.PAPER)
    assert [c.verifiers for c in cfgs] == [("naive",), paper.BLOCK_VERIFIERS]
    models = meta["config"]["models"]
    first = cfgs[0].binding(models)
    assert json.dumps(first) == json.dumps(meta["config"])  # the meta row the study writes, key order included
    for c in cfgs:
        b = c.binding(models)
        assert run_id(b, meta["seed"], blocks.KEYED) == meta["run_id"]
        assert check_binding(committed, b, meta["seed"], blocks.KEYED) == rows
        # every run of every prompt is in the file: a rerun of the stage has nothing left to do
        shutil.copy(committed, tmp_path / "blocks.jsonl")
        done = resume(tmp_path / "blocks.jsonl", b, meta["seed"], key_fields=blocks.KEY, keyed=blocks.KEYED)
        pids = {r["prompt"] for r in rows}
        assert len(pids) == paper.PAPER.block_prompts
        assert all(row_key(blocks._key(p, m), blocks.KEY) in done for p in pids for m in c.methods)
    # another size of the study is another binding, refused on that file
    other = replace(paper.PAPER, block_new_tokens=32)
    with pytest.raises(ValueError, match="another config"):
        check_binding(committed, paper.blocks_configs(other)[0].binding(models), meta["seed"], blocks.KEYED)


def test_paper_refuses_a_bad_blocks_size_before_any_stage(tmp_path):
    """The blocks configs are validated once, up front: a bad size stops the study before the
    collect stage runs (no model loaded, nothing written)."""
    from multidraft._errors import ArgumentError

    loads = []
    bad = replace(paper.QUICK, block_budget=1)  # < K = 2
    with pytest.raises(ArgumentError) as ei:
        paper.run(tmp_path / "run", models=lambda: loads.append(1), model_names={"target": "t", "draft": "d"}, config=bad)
    assert ei.value.arg == "budget" and loads == []
    assert not (tmp_path / "run" / "stages.jsonl").exists()
