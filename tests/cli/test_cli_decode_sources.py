"""``multidraft decode --sources model,lookup``: mixed trees end to end on the tiny pair (the
target's greedy text at T = 0, acceptance reported), and the one-line refusals."""
from __future__ import annotations

import json

import pytest

from multidraft import models
from multidraft.cli import main

PROMPT = "abcdabcdabcdabc"  # prompt lookup has matches


def _tiny(monkeypatch):
    pytest.importorskip("transformers")
    import tiny_models as tm

    t, d = tm.tiny_pair(vocab_size=32, seed=4)
    tok = tm.tiny_tokenizer()
    monkeypatch.setattr(models, "resolve_pair", lambda *a, **kw: (t, d, tok))
    return tm, t, tok


@pytest.mark.parametrize("sources", ["model,lookup"])
def test_decode_with_free_sources_is_the_greedy_text_and_reports_acceptance(monkeypatch, capsys, sources):
    tm, t, tok = _tiny(monkeypatch)
    argv = ["decode", "--prompt", PROMPT, "--ignore-eos", "--max-new-tokens", "16", "--verifier", "specinfer",
            "--k", "2", "--depth", "2", "--temperature", "0", "--sources", sources, "--json"]
    assert main(argv) == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    assert obj["tokens"] == tm.greedy_reference(t, ids, 16).tolist()
    assert obj["settings"]["sources"] == sources.split(",")
    assert 0 <= obj["acceptance_rate"] <= 1 and obj["block_efficiency"] >= 1
    assert max(obj["draft_depths"]) > 2  # the copied chain went past the model's depth
    assert main(argv[:-1]) == 0
    err = capsys.readouterr().err
    assert "acceptance" in err and "block efficiency" in err


@pytest.mark.parametrize("extra,flag", [(["--rule", "traversal"], "--rule"), (["--rule", "gbv"], "--rule"),
                                        (["--verifier", "specinfer", "--draft-law", "wor"], "--draft-law")])
def test_decode_refuses_what_cannot_verify_mixed_trees(no_models, capsys, extra, flag):
    assert main(["decode", "--prompt", PROMPT, "--quiet", "--sources", "model,lookup", *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and lines[0].startswith("multidraft decode: error:")
    assert no_models == []


@pytest.mark.parametrize("sources", ["lookup", "lookup,suffix"])
def test_decode_free_only_loads_no_draft_and_is_the_greedy_text(monkeypatch, capsys, tmp_path, sources):
    """``--sources lookup`` (no model): the target alone is loaded (load_pair's draft=False, so no
    draft model), the text is the target's greedy text and the settings name the sources alone."""
    tm, t, tok = _tiny(monkeypatch)
    loaded = []
    monkeypatch.setattr(models, "resolve_pair", lambda *a, **kw: loaded.append("pair") or (t, None, tok))
    monkeypatch.setattr(models, "ensure_model", lambda *a, **kw: "tiny-target")
    monkeypatch.setattr(models, "load_model", lambda *a, **kw: loaded.append("target") or (t, tok))
    argv = ["decode", "--prompt", PROMPT, "--ignore-eos", "--max-new-tokens", "16", "--temperature", "0",
            "--sources", sources, "--json"]
    assert main(argv) == 0
    out = capsys.readouterr()
    obj = json.loads(out.out.strip().splitlines()[-1])
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    assert obj["tokens"] == tm.greedy_reference(t, ids, 16).tolist()
    assert loaded == ["target"] and obj["run"]["draft"] is None and obj["draft_calls"] == 0
    assert obj["settings"]["sources"] == sources.split(",") and obj["settings"]["verifier"] is None
    assert obj["settings"]["k"] == 0 and max(obj["draft_depths"]) >= 2 and obj["target_calls"] < 16
    assert "warning" not in out.err
    (tmp_path / "config.json").write_text("{}")
    assert main(argv + ["--draft", str(tmp_path)]) == 0  # --draft: named in a warning, not loaded
    assert "--draft is not loaded" in capsys.readouterr().err and loaded == ["target", "target"]


@pytest.mark.parametrize("extra,flag", [(["--verifier", "specinfer"], "--verifier"), (["--k", "2"], "--k"),
                                        (["--depth", "3"], "--depth"), (["--rule", "block"], "--rule"),
                                        (["--draft-law", "iid"], "--draft-law"),
                                        (["--draft-temperature", "0.5"], "--draft-temperature"),
                                        (["--tree", "sequences"], "--tree"), (["--tree", "dynamic"], "--tree")])
def test_decode_free_only_refuses_the_draft_models_flags(no_models, capsys, extra, flag):
    assert main(["decode", "--prompt", PROMPT, "--quiet", "--sources", "lookup", *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and lines[0].startswith("multidraft decode: error:"), lines
    assert no_models == []


def _profile(tmp_path, seconds, name):
    """A cost profile file whose target pass over n tree tokens takes ``seconds(n)``."""
    from multidraft.decoding.treeopt import CostProfile

    path = tmp_path / name
    path.write_text(CostProfile(list(range(1, 65)), [seconds(n) for n in range(1, 65)], [1, 8], [1e-3, 2e-3]).to_json())
    return path


def test_decode_free_only_tree_auto_cuts_the_free_chains_by_the_profile(monkeypatch, capsys, tmp_path):
    """``--sources lookup,suffix --tree auto --profile FILE``: no tree to choose and no draft model
    (the target alone loaded, no warm-up), the settings stay free-only, the text is the target's
    greedy text, and the profile cuts the copied chains: where every tree token costs a whole pass
    the sources propose fewer tokens than where width is free (then every chain at its cap, as
    without a profile)."""
    tm, t, tok = _tiny(monkeypatch)
    loaded = []
    monkeypatch.setattr(models, "ensure_model", lambda *a, **kw: "tiny-target")
    monkeypatch.setattr(models, "load_model", lambda *a, **kw: loaded.append("target") or (t, tok))
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    ref = tm.greedy_reference(t, ids, 24).tolist()
    base = ["decode", "--prompt", PROMPT, "--ignore-eos", "--max-new-tokens", "24", "--temperature", "0",
            "--sources", "lookup,suffix", "--json"]
    proposed = {}
    for name, seconds in (("flat", lambda n: 1.0), ("steep", lambda n: float(n)), (None, None)):
        argv = base + (["--tree", "auto", "--profile", str(_profile(tmp_path, seconds, f"{name}.json"))] if name else [])
        assert main(argv) == 0
        out = capsys.readouterr()
        obj = json.loads(out.out.strip().splitlines()[-1])
        assert obj["tokens"] == ref and obj["draft_calls"] == 0 and obj["run"]["draft"] is None
        assert obj["settings"]["sources"] == ["lookup", "suffix"] and obj["settings"]["tree"] is None
        if name:
            assert obj["auto"]["decoded_with"] == "free-chains-by-cost" and "free chains are cut by cost" in out.err
        proposed[name] = sum(s["proposed"] for s in obj["source_stats"].values())
    assert loaded == ["target"] * 3
    assert proposed["flat"] == proposed[None] > proposed["steep"] > 0


@pytest.mark.parametrize("extra,flag", [([], "--profile"), (["--accept-stats", "PROF"], "--accept-stats"),
                                        (["--warmup-tokens", "8"], "--warmup-tokens"),
                                        (["--force-tree"], "--force-tree"), (["--max-nodes", "16"], "--max-nodes"),
                                        (["--max-depth", "4"], "--max-depth")])
def test_decode_free_only_tree_auto_refuses_what_rates_a_model_tree(no_models, capsys, tmp_path, extra, flag):
    prof = _profile(tmp_path, lambda n: 1.0, "p.json")
    extra = [str(prof) if x == "PROF" else x for x in extra]
    argv = ["decode", "--prompt", PROMPT, "--quiet", "--sources", "lookup", "--tree", "auto"]
    assert main(argv + ([] if flag == "--profile" else ["--profile", str(prof)]) + extra) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and lines[0].startswith("multidraft decode: error:"), lines
    assert no_models == []
