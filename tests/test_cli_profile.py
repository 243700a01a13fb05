"""``multidraft profile`` on tiny models: JSON fields and sanity (never timings)."""
from __future__ import annotations

import json

import pytest

from multidraft import models
from multidraft.cli import main


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
                "load_average", "samples"):
        assert key in obj["meta"], key
    assert obj["meta"]["dtype"] == "float32" and obj["meta"]["prefix_tokens"] == 16
    secs = obj["target"]["seconds"] + obj["draft"]["seconds"]
    assert all(s > 0 for s in secs)
    prof = CostProfile.from_dict(obj)
    assert prof.target_seconds(3) > 0 and prof.draft_seconds(2) > 0


@pytest.mark.parametrize("bad,words", [
    (["--nodes", "2,4"], "--nodes must include 1"),
    (["--nodes", "1,128"], "<= 64"),
    (["--repeats", "0"], "--repeats"),
    (["--prefix", "0"], "--prefix"),
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
    with pytest.raises(ValueError, match="prefix"):
        measure_profile(t, d, nodes=[1, 64], draft_nodes=[1], prefix=250, repeats=1)
