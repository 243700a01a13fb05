"""The committed results of the decode runner (``docs/results/decode_speed``, ``docs/results/demo``)
read and validate against the row schema; a damaged row is refused naming ``file:line``
(issue 41, item 8)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from multidraft import verifiers
from multidraft.experiments import decode_runs as dr
from multidraft.experiments import records
from multidraft.experiments.records import IMPLIED_LAWS, decode_row_spelling, read_decode_rows, row_problem

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted((ROOT / "docs/results/decode_speed").glob("*.jsonl")) + sorted((ROOT / "docs/results/demo").glob("*.jsonl"))
DESCRIBED = ("rule", "verifier", "law", "k", "depth", "temperature")


def test_the_committed_files_are_there():
    assert len(COMMITTED) == 15  # 13 decode_speed runs (11 written before the verifier field) and 2 demos


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_committed_decode_file_reads_and_validates(path):
    meta, rows, lines = read_decode_rows(path)
    assert rows and len(rows) == len(lines)
    for row in rows:
        assert set(DESCRIBED) <= set(row), row["method"]
        assert row_problem(row, "blocks") is None
        assert row["temperature"] == meta["config"]["temperature"]
        assert (row["verifier"] is None) == (row["method_kind"] != "tree" and row["method_kind"] != "auto"
                                             or row["rule"] not in (None, "token_walk"))


SPECS = ["target", "sd:4", "specinfer:2x3", "rrs_wor:2x3", "greedy_optimal:2x3", "spectr:2x2", "specinfer:seq2x4",
         "rrs_wor:dyn:4:12:4", "specinfer:dyn:4:16:6:0.05", "naive:1x5"]


@pytest.mark.parametrize("spec", SPECS)
def test_a_legacy_row_is_completed_as_settings_describe_would_write_it(spec):
    described = dr.parse_method(spec, temperature=0.7).describe()
    legacy = {"kind": "run", "method": described["method"], "method_kind": described["method_kind"], "prompt": "p",
              "block_efficiency": 2.0, "tokens_per_s": 1.0}
    row = decode_row_spelling(dict(legacy), {"config": {"temperature": 0.7}})
    for f in DESCRIBED + ("tree", "max_nodes", "min_gain"):
        if f in row or described[f] is not None:
            assert row.get(f) == described[f], (spec, f)


def test_a_legacy_auto_row_takes_k_and_depth_from_its_chosen_tree():
    paths = [[0], [1], [0, 0], [0, 0, 0]]
    described = dr.parse_method("greedy_optimal:auto:4").chosen(paths, {}).describe()
    row = decode_row_spelling({"method": "greedy_optimal auto K<=4", "method_kind": "auto", "block_efficiency": 2.0,
                               "tree": {"nodes": 4, "paths": paths}}, {"config": {"temperature": 1.0}})
    assert [row[f] for f in DESCRIBED] == [described[f] for f in DESCRIBED] and row["tree"] == paths
    # without its tree the size is unknown: the row is refused by the schema, not guessed
    bare = decode_row_spelling({"method": "specinfer auto K<=4", "method_kind": "auto", "block_efficiency": 2.0,
                                "prompt": "p", "tokens_per_s": 1.0}, {"config": {"temperature": 1.0}})
    assert "depth" not in bare and row_problem(bare, "blocks").startswith("missing field")


def test_legacy_peer_rows():
    meta = {"config": {"temperature": 1.0}}
    spec = decode_row_spelling({"method": "llama-speculative D=6 NP=2", "method_kind": "llama-spec",
                                "block_efficiency": 3.0, "draft_calls": -1}, meta)
    assert (spec["verifier"], spec["law"], spec["k"], spec["depth"], spec["draft_calls"]) == (None, None, 2, 6, None)
    hf = decode_row_spelling({"method": "hf-assisted", "method_kind": "hf", "block_efficiency": 3.0}, meta)
    assert (hf["verifier"], hf["k"], hf["depth"]) == (None, 0, 0)


def test_the_names_are_the_library_s():
    from multidraft.decoding.settings import decoder_rules
    from multidraft.drafts import LAW_KINDS

    assert records.VERIFIER_NAMES == tuple(verifiers.names()) and records.TREE_RULE_NAMES == tuple(decoder_rules())
    assert records.LAW_NAMES == tuple(LAW_KINDS)


def test_implied_laws_are_the_verifiers():
    for name in verifiers.names():
        v = verifiers.get(name)
        for k in (2, 3, 4):
            if v.laws_for(k):
                assert IMPLIED_LAWS.get(name, "iid") == v.implied_law(k), (name, k)


def _damaged(tmp_path, line: int, edit) -> Path:
    src = ROOT / "docs/results/decode_speed/llama-bf16-q4.jsonl"  # a legacy file: no verifier field
    lines = src.read_text().splitlines()
    row = json.loads(lines[line - 1])
    edit(row)
    lines[line - 1] = json.dumps(row)
    out = tmp_path / "run.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize("edit,needle", [
    (lambda r: r.update(block_efficiency="x"), "field 'block_efficiency' must be a number >= 0, got \"x\""),
    (lambda r: r.pop("prompt"), "missing field 'prompt' (a string)"),
    (lambda r: r.update(method="beam K=2 depth 3", method_kind="tree"), "missing field 'verifier'"),
    (lambda r: r.update(kind="cell"), "a row of kind \"cell\", not a decode row"),
    (lambda r: r.update(verifier="beam"), "field 'verifier' must be one of 'naive', "),
    (lambda r: r.update(rule="walk"), "field 'rule' must be one of 'token_walk', "),
])
def test_a_damaged_row_is_refused_naming_file_and_line(edit, needle, tmp_path):
    path = _damaged(tmp_path, 7, edit)
    with pytest.raises(ValueError) as e:
        read_decode_rows(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:7: ") and needle in msg and "\n" not in msg


def test_summarize_file_refuses_a_damaged_row_in_one_line(tmp_path):
    from bench_loader import benchmark_module

    path = _damaged(tmp_path, 9, lambda r: r.update(new_tokens=-5))
    with benchmark_module("decode_speed") as ds, pytest.raises(SystemExit) as e:
        ds.summarize_file(path, None)
    assert str(e.value) == f"{path}:9: field 'new_tokens' must be an integer >= 0, got -5"


def test_a_file_of_other_rows_is_not_a_decode_file(tmp_path):
    path = tmp_path / "acc.jsonl"
    with records.JsonlWriter(path, {}, 0) as w:
        w.write(dataset="d", t_target=1.0, t_draft=1.0, law="iid", K=2, verifier="naive", acceptance=0.5, se=0.1)
    with pytest.raises(ValueError, match=f"{path}:2: a row without a kind or block_efficiency, not a decode row"):
        read_decode_rows(path)
