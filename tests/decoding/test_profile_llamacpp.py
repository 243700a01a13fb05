"""``decoding.profiling`` and ``multidraft profile --engine llama.cpp`` on tiny random GGUFs.

Structure only (sizes, meta fields, the cache state afterwards), never timings.
"""
from __future__ import annotations

import json

import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp")

from multidraft import models  # noqa: E402
from multidraft.cli import main  # noqa: E402
from multidraft.decoding import pair as pair_module  # noqa: E402
from multidraft.decoding import profiling  # noqa: E402
from multidraft.decoding.llamacpp import LlamaCppModel  # noqa: E402
from multidraft.decoding.treeopt import AcceptStats, CostProfile, choose_tree, fit_overhead  # noqa: E402
from multidraft.testing import tiny_gguf  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    return tiny_gguf(d / "target.gguf", seed=1), tiny_gguf(d / "draft.gguf", seed=2, n_layer=1)


@pytest.fixture(scope="module")
def pair(files):
    ms = [LlamaCppModel(f, n_ctx=256, n_threads=1) for f in files]
    yield ms
    for m in ms:
        m.close()


def _pos_max(model, seq: int) -> int:
    return int(llama_cpp.llama_memory_seq_pos_max(model._mem, seq))


def test_measure_forward_leaves_the_prefix_in_the_cache(pair):
    t, _ = pair
    run = t.runner()
    run.prefill(torch.arange(12).view(1, 12) * 5 % t.vocab_size)
    times = profiling.measure_forward(run, [1, 3, 8], repeats=2, warmup=1)
    assert sorted(times) == [1, 3, 8] and all(len(v) == 2 and min(v) > 0 for v in times.values())
    assert run.base == 12 and _pos_max(t, 0) == 11
    assert all(_pos_max(t, s) == -1 for s in range(1, 10))  # no tree sequence survives
    # the cache still continues the prefix: one more step extends and commits as usual
    run.extend([4], [-1])
    run.commit([0])
    assert run.base == 13 and _pos_max(t, 0) == 12


def test_profile_structure_meta_and_cache(pair, files):
    t, d = pair
    prof = profiling.measure_profile(t, d, nodes=[1, 2, 4, 16], draft_nodes=[1, 2, 3], prefix=20, repeats=2,
                                     warmup=1, statistic="min", meta={"target": "tiny"})
    assert prof.target_nodes == (1, 2, 4, 16) and prof.draft_nodes == (1, 2, 3)
    assert all(s > 0 for s in prof.target_times + prof.draft_times)
    m = prof.meta
    assert m["engine"] == "llama.cpp" and m["target"] == "tiny"
    assert m["target_file"] == files[0].name and m["draft_file"] == files[1].name
    assert m["dtype"] == m["draft_dtype"] == "F32"
    assert m["llama_cpp_python"] == llama_cpp.__version__ and m["threads"] == m["draft_threads"] == 1
    assert m["prefix_tokens"] == 20 and m["statistic"] == "min" and m["repeats"] == 2
    for name, ns, ts in (("target", prof.target_nodes, prof.target_times), ("draft", prof.draft_nodes, prof.draft_times)):
        for n, s in zip(ns, ts):
            assert len(m["samples"][name][str(n)]) == 2 and s == pytest.approx(min(m["samples"][name][str(n)]), abs=1e-6)
    for model in (t, d):  # both caches hold the prefix and nothing else
        assert _pos_max(model, 0) == 19 and _pos_max(model, 1) == -1
    # the profile feeds the tree chooser unchanged, through JSON too
    again = CostProfile.from_json(prof.to_json())
    assert again.meta["engine"] == "llama.cpp" and again.target_times == prof.target_times
    choice = choose_tree(again, AcceptStats({1: [0.8], 2: [0.8, 0.1]}), max_nodes=8, max_depth=3)
    assert choice.target_only_tokens_per_s == pytest.approx(1 / (prof.target_times[0] + prof.per_step_seconds))
    # the decoder's own time from decodes on this engine, fitted against the points
    runs = m["overhead"]["runs"]
    assert [r["depth"] for r in runs] == [0, 2, 4] and all(r["new_tokens"] == 64 for r in runs)
    assert (prof.per_step_seconds, prof.per_node_seconds) == pytest.approx(fit_overhead(prof, runs))
    with pytest.raises(ValueError, match="context"):
        profiling.measure_profile(t, d, nodes=[1, 64], draft_nodes=[1], prefix=200, repeats=1)
    with pytest.raises(ValueError, match="overhead_tokens: 150 prompt tokens \\+ 128 decoded"):
        profiling.measure_profile(t, d, nodes=[1, 8], draft_nodes=[1], prefix=150, repeats=1, overhead_tokens=128)


def test_cli_profile_on_llama_cpp(monkeypatch, capsys, tmp_path, files):
    seen = {}

    def fake_pair(engine, *, target=None, draft=None, bf16_target=False, n_threads=None, n_ctx=4096, **kw):
        seen.update(engine=engine, target=target, draft=draft, bf16_target=bf16_target, n_threads=n_threads, n_ctx=n_ctx)
        t = LlamaCppModel(target, n_ctx=256, n_threads=n_threads)
        return t, LlamaCppModel(draft, n_ctx=256, n_threads=n_threads), t

    def boom(*a, **kw):
        raise AssertionError("the transformers loader was used")

    monkeypatch.setattr(pair_module, "load_pair", fake_pair)
    monkeypatch.setattr(models, "resolve_pair", boom)
    out = tmp_path / "prof.json"
    argv = ["profile", "--quiet", "--engine", "llama.cpp", "--target", str(files[0]), "--draft", str(files[1]),
            "--threads", "2", "--nodes", "1,2,4", "--draft-nodes", "1-2", "--repeats", "1", "--prefix", "16",
            "--statistic", "min", "--out", str(out)]
    assert main(argv) == 0
    assert seen["engine"] == "llama.cpp" and seen["n_threads"] == 2 and seen["bf16_target"] is False and seen["n_ctx"] >= 16 + 1 + 4
    text = capsys.readouterr().out
    assert "2 llama.cpp threads" in text and files[0].name in text and "target n" in text and "draft m" in text
    obj = json.loads(out.read_text())
    assert obj["target"]["nodes"] == [1, 2, 4] and obj["draft"]["nodes"] == [1, 2]
    meta = obj["meta"]
    assert meta["engine"] == "llama.cpp" and meta["threads"] == 2 and meta["target"] == str(files[0])
    assert meta["target_file"] == files[0].name and meta["llama_cpp_python"] == llama_cpp.__version__
    assert CostProfile.from_dict(obj).meta["engine"] == "llama.cpp"
    # the decodes ran on a real prompt, cut to the tiny model's context: 256 - 64 tokens - (a chain of 4 + 1)
    assert meta["overhead"]["prompt"].startswith("HumanEval/163 through the chat template")
    assert meta["overhead"]["prompt"].endswith("cut to its last 187 to fit the context") and "overhead_prompt" not in meta
