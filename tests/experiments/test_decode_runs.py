"""The one decode runner (``experiments.decode_runs``): methods, interleaving, the seed rule, the row
schema and the summary, on the tiny pair."""
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

PROMPTS = [("p0", torch.tensor([[3, 1, 4, 1, 5]])), ("p1", torch.tensor([[2, 7, 1, 8, 2, 8, 1]]))]


@pytest.fixture(scope="module")
def pair():
    return tm.tiny_pair(vocab_size=32, max_pos=512)


def _methods():
    return [dr.target_alone(), dr.tree_method("SD", "naive", 1, 3), dr.tree_method("specinfer 2x2", "specinfer", 2, 2),
            dr.tree_method("specinfer seq 2x2", "specinfer", 2, 2, tree="sequences"),
            dr.tree_method("rrs_wor 2x2", "rrs_wor", 2, 2)]


def test_seed_rule_is_the_blocks_rule_and_rows_carry_the_schema(pair):
    t, d = pair
    methods = _methods()
    out = dr.run(t, d, PROMPTS, methods, seed=5, max_new_tokens=7)
    assert out.stopped is None and len(out.rows) == len(PROMPTS) * len(methods)
    assert [(r["prompt"], r["method"]) for r in out.rows] == [(p, m.label) for p, _ in PROMPTS for m in methods]
    for r in out.rows:
        key = f"{r['verifier']}|{r['law']}|{r['k']}|{r['depth']}" if r["rule"] else "autoregressive|-|0|0"
        assert r["seed"] == derive_seed(5, f"{r['prompt']}|{key}", rule="unit")  # the blocks stage's seeds, unchanged
        assert {"kind", "method", "method_kind", "rule", "verifier", "law", "k", "depth", "tree", "temperature",
                "draft_temperature", "sources", "prompt", "prompt_tokens", "round", "seed", "new_tokens", "target_calls",
                "draft_calls", "tree_tokens", "block_efficiency", "acceptance_rate", "seconds", "tokens_per_s",
                "prefill_seconds", "stop_reason", "tokens"} <= set(r)
        m = next(m for m in methods if m.label == r["method"])
        assert {f: r[f] for f in m.settings.describe()} == m.settings.derive(max_new_tokens=7).describe()
        assert len(r["tokens"]) == r["new_tokens"] == 7
    base = out.rows[0]
    assert (base["rule"], base["verifier"], base["law"], base["k"], base["depth"], base["acceptance_rate"]) == \
        (None, None, None, 0, 0, None)
    assert [r["law"] for r in out.rows[:5]] == [None, "iid", "iid", "iid", "wor"]
    assert out.rows[3]["tree"] == "sequences" and out.rows[2]["tree"] is None
    # each run is generate() with its own seed: the same tokens alone, in another order or with others skipped
    g = md.generate(t, d, PROMPTS[1][1], verifier="specinfer", k=2, depth=2, draft_law="iid", max_new_tokens=7,
                    generator=torch.Generator().manual_seed(out.rows[7]["seed"]))
    assert g.tokens.tolist() == out.rows[7]["tokens"]
    again = dr.run(t, d, PROMPTS[::-1], methods[::-1], seed=5, max_new_tokens=7,
                   skip=lambda pid, m: m.label == "SD")
    key = lambda rs: {(r["prompt"], r["method"]): r["tokens"] for r in rs}  # noqa: E731
    assert key(again.rows) == {k: v for k, v in key(out.rows).items() if k[1] != "SD"}
    other = dr.run(t, d, PROMPTS, methods[:1], seed=6, max_new_tokens=7)
    assert other.rows[0]["tokens"] != out.rows[0]["tokens"] or other.rows[1]["tokens"] != out.rows[5]["tokens"]


def test_rounds_repeat_the_tokens_in_alternating_order_and_the_budget_stops_between_prompts(pair):
    t, d = pair
    methods = _methods()[:3]
    seen = []
    out = dr.run(t, d, PROMPTS, methods, seed=0, max_new_tokens=5, rounds=2, write=seen.append)
    assert seen == out.rows and len(out.rows) == 12
    p0 = [(r["round"], r["method"]) for r in out.rows[:6]]
    labels = [m.label for m in methods]
    assert p0 == [(0, x) for x in labels] + [(1, x) for x in labels[::-1]]
    by = {}
    for r in out.rows:
        by.setdefault((r["prompt"], r["method"]), []).append(r["tokens"])
    assert all(a == b for a, b in by.values())
    stopped = dr.run(t, d, PROMPTS, methods, seed=0, max_new_tokens=5, time_budget_s=1e-9)
    assert {r["prompt"] for r in stopped.rows} == {"p0"} and "time budget" in stopped.stopped
    with pytest.raises(ValueError, match="rounds"):
        dr.run(t, d, PROMPTS, methods, seed=0, max_new_tokens=5, rounds=0)


def test_summary_and_table(pair):
    t, d = pair
    methods = _methods()[:3]
    rows = dr.run(t, d, PROMPTS, methods, seed=1, max_new_tokens=6).rows
    summary = dr.summarize(rows, methods)
    assert [s["method"] for s in summary] == [m.label for m in methods]
    base, sd, multi = summary
    assert base["speedup"] == pytest.approx(1.0) and base["speedup_mean"] == pytest.approx(1.0)
    assert base["block_efficiency"] == 1.0 and base["acceptance_rate"] != base["acceptance_rate"]  # NaN: no drafts
    for s in (sd, multi):
        assert s["new_tokens"] == 12 and s["prompts"] == 2
        assert s["block_efficiency"] == pytest.approx(12 / s["target_calls"])
        mine = [r for r in rows if r["method"] == s["method"]]
        assert s["acceptance_rate"] == pytest.approx(sum(r["acceptance_rate"] for r in mine) / 2)
    table = dr.format_table(summary)
    assert table.splitlines()[0].startswith("| method | law | K | block eff. ± 95% |")
    assert len(table.splitlines()) == 2 + len(methods) and "| specinfer 2x2 | iid | 2 |" in table
    # the summary reads rows alone as well (a file written earlier)
    assert [s["method"] for s in dr.summarize(rows)] == [m.label for m in methods]


def test_methods_are_checked_before_any_model(pair):
    with pytest.raises(ValueError, match="depth"):
        dr.check_methods([dr.tree_method("x", "specinfer", 2, 0)], max_new_tokens=4)
    with pytest.raises(ValueError, match="twice"):
        dr.check_methods([dr.target_alone(), dr.target_alone()], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        dr.check_methods([dr.target_alone()], max_new_tokens=0)
    with pytest.raises(ValueError, match="unknown verifier"):
        dr.parse_method("nosuch:2x2")
    d = dr.parse_method("specinfer:dyn:4:12:6:0.1").settings.describe()
    assert (d["verifier"], d["k"], d["depth"], d["tree"], d["max_nodes"], d["min_gain"], d["law"]) == \
        ("specinfer", 4, 6, "dynamic", 12, 0.1, "iid")
    assert dr.parse_method("rrs_wor:seq2x3").settings.law == "wor" and dr.parse_method("sd:4").settings.chain
    assert dr.parse_method("spectr:auto:2").method_kind == "auto"
    with pytest.raises(ValueError, match="cannot read"):
        dr.parse_method("what")


def test_a_peer_runs_in_the_interleaving_with_its_own_seed(pair):
    t, d = pair
    calls = []

    def peer(pid, ids, seed):
        calls.append((pid, int(ids.shape[1]), seed))
        return {"new_tokens": 6, "target_calls": 3, "draft_calls": None, "seconds": 0.5, "block_efficiency": 2.0,
                "acceptance_rate": float("nan")}

    methods = [dr.target_alone(), dr.peer_method("peer D=4 NP=2", "llama-spec", peer, k=2, depth=4)]
    out = dr.run(t, d, PROMPTS, methods, seed=2, max_new_tokens=6)
    assert calls == [(pid, int(ids.shape[1]), derive_seed(2, f"{pid}|llama-spec|-|0|0", rule="unit")) for pid, ids in PROMPTS]
    row = out.rows[1]
    assert (row["method_kind"], row["verifier"], row["rule"], row["law"], row["k"], row["depth"], row["tokens"]) == \
        ("llama-spec", None, None, None, 2, 4, None)
    assert row["tokens_per_s"] == 12.0 and row["block_efficiency"] == 2.0
    s = dr.summarize(out.rows)[1]
    assert s["method_kind"] == "llama-spec" and s["tokens_per_s"] == 12.0 and s["acceptance_rate"] != s["acceptance_rate"]
    assert s["draft_calls"] is None and dr.summarize(out.rows)[0]["draft_calls"] == 0  # not counted, not 0 (or -2)
