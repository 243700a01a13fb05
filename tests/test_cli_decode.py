"""``multidraft decode`` argument checks: every misuse is one line, exit 2, and no model is loaded."""
from __future__ import annotations

import json

import pytest

from multidraft import models
from multidraft.cli import main


@pytest.fixture
def no_models(monkeypatch):
    """Any model load fails the test: the checks must come first."""
    calls = []

    def boom(*a, **kw):
        calls.append((a, kw))
        raise AssertionError("resolve_pair was called: a model would have been loaded")

    monkeypatch.setattr(models, "resolve_pair", boom)
    monkeypatch.setattr(models, "ensure_default_models", boom)
    return calls


BASE = ["decode", "--prompt", "def f(x):", "--quiet"]


@pytest.mark.parametrize("bad,words", [
    (["--top-p", "2"], "--top-p"),
    (["--top-p", "0"], "--top-p"),
    (["--top-k", "0"], "--top-k"),
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--k", "0"], "--k"),
    (["--k", "abc"], "--k"),
    (["--k", "2,4"], "--k"),
    (["--depth", "0"], "--depth"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--tree", "[[1]]"], "--tree"),
    (["--tree", "{bad"], "--tree"),
    (["--tree", "3"], "--tree"),
    (["--verifier", "bogus"], "unknown verifier"),
    (["--draft-law", "bogus"], "--draft-law"),
    (["--verifier", "rrs_wor", "--draft-law", "iid"], "laws that work with 2 drafts: wor"),
    (["--verifier", "spechub", "--k", "4"], "--k"),
    (["--verifier", "naive", "--k", "2"], "--k"),
    (["--draft-temperature", "1,x"], "--draft-temperature"),
    (["--draft-temperature", "1,2,3"], "--draft-temperature"),
    (["--draft-temperature", "-1"], "--draft-temperature"),
])
def test_misuse_is_one_line_before_any_model(no_models, capsys, bad, words):
    assert main(BASE + bad) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert words in lines[0] and "Traceback" not in err
    assert lines[0].startswith("multidraft decode: error:")
    assert no_models == []


def test_out_directory_and_missing_parent(no_models, capsys, tmp_path):
    assert main(BASE + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "is a directory" in err and len(err.strip().splitlines()) == 1
    assert main(BASE + ["--out", str(tmp_path / "no" / "such" / "x.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert no_models == []


def test_verifier_implies_its_law_in_the_cli(monkeypatch, capsys, tmp_path):
    """``--verifier rrs_wor`` without ``--draft-law`` reaches the loader (the law is implied) and decodes."""
    pytest.importorskip("transformers")
    import tiny_models as tm

    t, d = tm.tiny_pair(vocab_size=32, seed=4)
    tok = tm.tiny_tokenizer()
    monkeypatch.setattr(models, "resolve_pair", lambda *a, **kw: (t, d, tok))
    out = tmp_path / "res.json"
    argv = ["decode", "--prompt", "hellothere", "--quiet", "--ignore-eos", "--max-new-tokens", "6",
            "--verifier", "rrs_wor", "--k", "3", "--depth", "2", "--temperature", "0", "--json", "--out", str(out)]
    assert main(argv) == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert obj == json.loads(out.read_text())
    assert obj["settings"]["law"] == "wor" and obj["settings"]["K"] == 3 and obj["settings"]["verifier"] == "rrs_wor"
    # the result fields come from GenerationResult.to_dict
    for key in ("tokens", "new_tokens", "target_calls", "draft_calls", "block_efficiency", "acceptance_rate",
                "accepted_lengths", "draft_depths", "stop_reason", "seconds", "tokens_per_s"):
        assert key in obj
    assert obj["new_tokens"] == 6 == len(obj["tokens"])
    ids = tok("hellothere", return_tensors="pt")["input_ids"]
    assert obj["tokens"] == tm.greedy_reference(t, ids, 6).tolist()
