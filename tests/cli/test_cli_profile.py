"""``multidraft profile`` on tiny transformers models: JSON fields and structure (never timings).

The llama.cpp side (tiny GGUFs) is in ``test_profile_llamacpp.py``; the missing-extra error is here
because it must work where llama-cpp-python is not installed.
"""
from __future__ import annotations

import json
import sys

import pytest

from multidraft import models
from multidraft.cli import main
from multidraft.decoding import pair, quantize


def test_profile_on_tiny_models(monkeypatch, capsys, tmp_path):
    pytest.importorskip("transformers")
    import tiny_models as tm

    from multidraft.decoding.treeopt import CostProfile

    t, d = tm.tiny_pair(vocab_size=32, seed=1)
    monkeypatch.setattr(models, "resolve_pair", lambda *a, **kw: (t, d, tm.tiny_tokenizer()))
    out = tmp_path / "prof.json"
    argv = ["profile", "--quiet", "--nodes", "1,2,4,8", "--draft-nodes", "1-3", "--repeats", "2",
            "--prefix", "16", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "target n" in text and "draft m" in text and str(out) in text
    obj = json.loads(out.read_text())
    assert obj["target"]["nodes"] == [1, 2, 4, 8] and obj["draft"]["nodes"] == [1, 2, 3]
    for key in ("cpu", "cores", "torch", "transformers", "dtype", "prefix_tokens", "repeats", "target", "draft",
                "load_average", "samples", "engine", "threads"):
        assert key in obj["meta"], key
    assert obj["meta"]["dtype"] == "float32" and obj["meta"]["prefix_tokens"] == 16
    assert obj["meta"]["engine"] == "transformers" and "llama_cpp_python" not in obj["meta"]
    assert "torch threads" in text
    secs = obj["target"]["seconds"] + obj["draft"]["seconds"]
    assert all(s > 0 for s in secs)
    prof = CostProfile.from_dict(obj)
    assert prof.target_seconds(3) > 0 and prof.draft_seconds(2) > 0
    # the decoder's own time, fitted to real decodes of 64 tokens: the target alone, chains of 2 and 4
    from multidraft.decoding.treeopt import fit_overhead

    runs = obj["meta"]["overhead"]["runs"]
    assert [r["depth"] for r in runs] == [0, 2, 4] and obj["meta"]["overhead"]["tokens"] == 64
    assert runs[0]["steps"] == 64 and all(0 < r["steps"] <= 64 and r["new_tokens"] == 64 for r in runs)
    assert (prof.per_step_seconds, prof.per_node_seconds) == pytest.approx(fit_overhead(prof, runs))
    assert prof.per_step_seconds >= 0 and prof.per_node_seconds >= 0
    assert "decoder's own time" in text and "chain 4" in text
    assert obj["meta"]["overhead"]["prompt"].startswith("HumanEval/163 through the chat template")
    # and none with --overhead-tokens 0
    assert main(argv + ["--overhead-tokens", "0"]) == 0
    obj = json.loads(out.read_text())
    assert "overhead" not in obj["meta"] and obj["per_step_seconds"] == 0.0 and obj["per_node_seconds"] == 0.0
    assert "decoder's own time" not in capsys.readouterr().out


@pytest.mark.parametrize("bad,words", [
    (["--nodes", "2,4"], "--nodes must include 1"),
    (["--nodes", "1,128"], "<= 64"),
    (["--repeats", "0"], "--repeats"),
    (["--prefix", "0"], "--prefix"),
    (["--bf16-target"], "--bf16-target applies to --engine llama.cpp only"),
    (["--draft-ftype", "q4_0"], "--draft-ftype applies to --engine llama.cpp only"),
    (["--threads", "0"], "--threads"),
    (["--overhead-tokens", "-1"], "--overhead-tokens must be >= 0"),
])
def test_profile_misuse_is_one_line_before_any_model(monkeypatch, capsys, bad, words):
    def boom(*a, **kw):
        raise AssertionError("a model would have been loaded")

    monkeypatch.setattr(models, "resolve_pair", boom)
    assert main(["profile", "--quiet"] + bad) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and err[0].startswith("multidraft profile: error:")


def test_min_statistic_is_the_smallest_sample(monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    import tiny_models as tm

    from multidraft.decoding.profiling import measure_profile

    t, d = tm.tiny_pair(vocab_size=32, seed=1)
    prof = measure_profile(t, d, nodes=[1, 3], draft_nodes=[1, 2], prefix=8, repeats=3, warmup=0, statistic="min")
    for name, ns, ts in (("target", prof.target_nodes, prof.target_times), ("draft", prof.draft_nodes, prof.draft_times)):
        for n, s in zip(ns, ts):
            samples = prof.meta["samples"][name][str(n)]
            assert len(samples) == 3 and s == pytest.approx(min(samples), abs=1e-6)
    with pytest.raises(ValueError, match="statistic"):
        measure_profile(t, d, nodes=[1], draft_nodes=[1], prefix=8, repeats=1, statistic="mean")
    with pytest.raises(ValueError, match="overhead_tokens"):
        measure_profile(t, d, nodes=[1], draft_nodes=[1], prefix=8, repeats=1, overhead_tokens=-2)
    with pytest.raises(ValueError, match="prefix"):
        measure_profile(t, d, nodes=[1, 64], draft_nodes=[1], prefix=250, repeats=1)


def test_measure_forward_through_a_runner_leaves_the_prefix(monkeypatch):
    """One timed ``extend`` per size of the star shape (root + n - 1 children, every logit), the
    cache rolled back to the prefix after each; nothing else is left in the cache."""
    pytest.importorskip("transformers")
    import tiny_models as tm
    import torch

    from multidraft.decoding import profiling
    from multidraft.decoding.runners import HFRunner

    t, _ = tm.tiny_pair(vocab_size=32, seed=1)
    run = HFRunner(t)
    run.prefill(torch.arange(10).view(1, 10) % 32)
    calls = []
    extend = run.extend

    def spy(tokens, parents, last_only=False):
        calls.append((list(tokens), list(parents), last_only, run.base))
        out = extend(tokens, parents, last_only)
        assert out.shape == (len(tokens), 32)
        return out

    monkeypatch.setattr(run, "extend", spy)
    times = profiling.measure_forward(run, [1, 2, 5], repeats=3, warmup=2)
    assert sorted(times) == [1, 2, 5] and all(len(v) == 3 and min(v) > 0 for v in times.values())
    assert [len(c[0]) for c in calls] == [1, 2, 5] * 5  # interleaved: warmup rounds, then repeats
    for toks, parents, last_only, base in calls:
        assert parents == [-1] + [0] * (len(toks) - 1) and not last_only and base == 10
    assert run.base == 10 and run.cache.get_seq_length() == 10


def test_profile_meta_and_engine_mixing(monkeypatch):
    pytest.importorskip("transformers")
    import tiny_models as tm

    from multidraft.decoding.profiling import measure_profile
    from multidraft.decoding.treeopt import AcceptStats, CostProfile, choose_tree

    t, d = tm.tiny_pair(vocab_size=32, seed=1)
    prof = measure_profile(t, d, nodes=[1, 2, 4], draft_nodes=[1, 2], prefix=8, repeats=1, warmup=0,
                           meta={"target": "tiny"})
    m = prof.meta
    assert m["engine"] == "transformers" and m["dtype"] == m["draft_dtype"] == "float32" and m["target"] == "tiny"
    assert sorted(m["samples"]) == ["draft", "target"] and sorted(m["samples"]["target"], key=int) == ["1", "2", "4"]
    again = CostProfile.from_json(prof.to_json())
    assert again.meta["engine"] == "transformers" and again.target_nodes == (1, 2, 4)
    choice = choose_tree(again, AcceptStats({1: [0.8], 2: [0.8, 0.1]}), max_nodes=4, max_depth=2)
    assert choice.target_only_tokens_per_s > 0

    class FakeGGUF:  # a llama.cpp model as far as the engine checks go
        engine = "llama.cpp"

    with pytest.raises(ValueError, match="one engine"):
        measure_profile(t, FakeGGUF(), nodes=[1], draft_nodes=[1], prefix=8, repeats=1)


@pytest.mark.parametrize("extra", [[], ["--bf16-target"], ["--threads", "2"]])
def test_llama_engine_without_the_extra_is_one_line_before_any_model(monkeypatch, capsys, extra):
    def boom(*a, **kw):
        raise AssertionError("a model would have been loaded")

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    monkeypatch.setattr(models, "resolve_pair", boom)
    monkeypatch.setattr(pair, "load_pair", boom)
    monkeypatch.setattr(quantize, "ensure_gguf", boom)
    assert main(["profile", "--quiet", "--engine", "llama.cpp"] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("multidraft profile: error:")
    assert "scripts/install_llama_cpp.sh .venv/bin/python" in err[0]


@pytest.mark.parametrize("bad,words", [
    (["--dtype", "float32"], "--dtype applies to --engine transformers only"),
    (["--bf16-target", "--target", "x.gguf"], "--bf16-target picks the default target"),
    (["--draft-ftype", "q4_0", "--draft", "x.gguf"], "--draft-ftype picks the default draft"),
    (["--draft-ftype", "q3_k"], "--draft-ftype must be one of bf16, f16, f32, q4_0, got 'q3_k'"),
])
def test_llama_engine_misuse(monkeypatch, capsys, bad, words):
    pytest.importorskip("llama_cpp")

    def boom(*a, **kw):
        raise AssertionError("a model would have been loaded")

    monkeypatch.setattr(pair, "load_pair", boom)
    assert main(["profile", "--quiet", "--engine", "llama.cpp"] + bad) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
