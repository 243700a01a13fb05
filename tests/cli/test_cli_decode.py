"""``multidraft decode`` argument checks: every misuse is one line, exit 2, and no model is loaded."""
from __future__ import annotations

import json

import numpy as np
import pytest

from multidraft import models
from multidraft.cli import main




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
    (["--bf16-target"], "--engine llama.cpp only"),
    (["--draft-ftype", "q4_0"], "--draft-ftype applies to --engine llama.cpp only"),
    (["--threads", "2"], "--engine llama.cpp only"),
    (["--ctx-size", "512"], "--ctx-size applies to --engine llama.cpp only"),
    (["--engine", "llama.cpp", "--ctx-size", "8"], "--ctx-size must be in [256, 131072]"),
    (["--engine", "llama.cpp", "--ctx-size", "100"], "--ctx-size must be in [256, 131072]"),
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
    assert obj["settings"]["law"] == "wor" and obj["settings"]["k"] == 3 and obj["settings"]["verifier"] == "rrs_wor"
    # the result fields come from GenerationResult.to_dict
    for key in ("tokens", "new_tokens", "target_calls", "draft_calls", "block_efficiency", "acceptance_rate",
                "accepted_lengths", "draft_depths", "stop_reason", "seconds", "tokens_per_s"):
        assert key in obj
    assert obj["new_tokens"] == 6 == len(obj["tokens"])
    ids = tok("hellothere", return_tensors="pt")["input_ids"]
    assert obj["tokens"] == tm.greedy_reference(t, ids, 6).tolist()


# --tree auto -----------------------------------------------------------------------------------
def _profile_file(tmp_path, target_seconds, name="prof.json"):
    from multidraft.decoding.treeopt import CostProfile

    pr = CostProfile(list(range(1, 65)), [target_seconds(n) for n in range(1, 65)], [1, 8], [1e-3, 2e-3],
                     meta={"dtype": "float32"})
    path = tmp_path / name
    path.write_text(pr.to_json())
    return path


@pytest.mark.parametrize("extra,words", [
    ([], "--profile"),
    (["--profile", "/no/such/file.json"], "--profile"),
    (["--verifier", "none", "--profile", "x.json"], "--tree auto needs a --verifier"),
    (["--profile", "PROF", "--max-nodes", "65"], "--max-nodes"),
    (["--profile", "PROF", "--max-depth", "9"], "--max-depth"),
    (["--profile", "PROF", "--accept-stats", "PROF"], "--accept-stats"),
])
def test_tree_auto_misuse_before_any_model(no_models, capsys, tmp_path, extra, words):
    prof = _profile_file(tmp_path, lambda n: 0.1 * n)
    extra = [str(prof) if x == "PROF" else x for x in extra]
    assert main(BASE + ["--tree", "auto"] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert no_models == []


def _auto_run(monkeypatch, capsys, tmp_path, prof, extra=()):
    pytest.importorskip("transformers")
    import tiny_models as tm

    t, d = tm.tiny_pair(vocab_size=32, seed=4)
    tok = tm.tiny_tokenizer()
    monkeypatch.setattr(models, "resolve_pair", lambda *a, **kw: (t, d, tok))
    argv = ["decode", "--prompt", "hellothere", "--ignore-eos", "--max-new-tokens", "8", "--verifier", "specinfer",
            "--k", "3", "--tree", "auto", "--profile", str(prof), "--warmup-tokens", "12", "--max-nodes", "16",
            "--max-depth", "4", "--temperature", "0", "--json", *extra]
    assert main(argv) == 0
    cap = capsys.readouterr()
    obj = json.loads(cap.out.strip().splitlines()[-1])
    ids = tok("hellothere", return_tensors="pt")["input_ids"]
    assert obj["tokens"] == tm.greedy_reference(t, ids, 8).tolist()
    return obj, cap.err


def test_tree_auto_decodes_with_a_tree_when_verify_is_cheap(monkeypatch, capsys, tmp_path):
    prof = _profile_file(tmp_path, lambda n: 0.1 + 1e-4 * n)
    obj, err = _auto_run(monkeypatch, capsys, tmp_path, prof)
    auto = obj["auto"]
    assert auto["pays"] and auto["decoded_with"] == "tree" and not auto["forced"]
    paths = auto["tree"]["paths"]
    assert 1 <= len(paths) <= 15 and max(len(p) for p in paths) <= 4
    assert obj["settings"]["depth"] == max(len(p) for p in paths) and obj["settings"]["k"] <= 3
    assert obj["settings"]["tree"] is None or sorted(obj["settings"]["tree"]) == sorted(paths)
    assert obj["settings"]["rule"] == "token_walk"
    assert auto["accept_stats"]["source"].startswith("warm-up decode")
    assert "tree auto: best tree" in err
    assert max(obj["draft_depths"]) >= 1


def test_tree_auto_falls_back_to_target_only_and_force_tree(monkeypatch, capsys, tmp_path):
    prof = _profile_file(tmp_path, lambda n: 0.1 * n)      # every node costs a full forward
    obj, err = _auto_run(monkeypatch, capsys, tmp_path, prof)
    auto = obj["auto"]
    assert not auto["pays"] and auto["decoded_with"] == "target-only"
    assert obj["settings"]["verifier"] is None and obj["settings"]["rule"] is None and obj["target_calls"] == obj["new_tokens"]
    assert "no tree beats the target alone" in err
    # the same statistics from a file (no warm-up), forced onto the best tree
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(auto["accept_stats"]))
    obj, err = _auto_run(monkeypatch, capsys, tmp_path, prof, ["--accept-stats", str(stats), "--force-tree"])
    auto2 = obj["auto"]
    assert auto2["decoded_with"] == "tree" and auto2["forced"]
    assert auto2["accept_stats"]["accept"] == auto["accept_stats"]["accept"]
    assert auto2["tree"]["paths"] == auto["tree"]["paths"]
    assert "decoding with the best tree anyway" in err


def _study_file(tmp_path, datasets=("toy",)):
    """A study acceptance JSONL: alpha*(iid, K = 1) and specinfer at K = 2, 3 along 60 positions that
    alternate 20 easy (acceptance 0.98) and 10 hard (0.2) ones."""
    a1 = np.array(([0.98] * 20 + [0.2] * 10) * 2)
    rows = [{"type": "meta", "run_id": "r", "config": {}}]
    for ds in datasets:
        for ver, k, vals in [("alpha*", 1, a1), ("specinfer", 2, np.minimum(1, a1 + 0.01)),
                             ("specinfer", 3, np.minimum(1, a1 + 0.015))]:
            rows.append({"type": "row", "run_id": "r", "dataset": ds, "t_target": 0.0, "t_draft": 0.0,
                         "top_k": None, "top_p": None, "law": "iid", "verifier": ver, "K": k,
                         "values": [float(x) for x in vals]})
    path = tmp_path / "acceptance.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_tree_auto_from_the_study_rates_trees_along_the_text(monkeypatch, capsys, tmp_path):
    # drafting is cheap and verify width free: the along model sees runs of 20 easy tokens and
    # picks a deep chain-like tree; no warm-up decode is run
    prof = _profile_file(tmp_path, lambda n: 0.1 + 1e-4 * n)
    study = _study_file(tmp_path)
    obj, err = _auto_run(monkeypatch, capsys, tmp_path, prof, ["--accept-stats", str(study)])
    auto = obj["auto"]
    assert auto["acceptance_model"] == "along" and auto["decoded_with"] == "tree"
    assert auto["accept_stats"]["source"].startswith("study acceptance.jsonl: toy, specinfer (iid), K = 1,2,3")
    assert auto["accept_stats"]["alpha"]["1"] == pytest.approx(0.72)
    assert auto["tree"]["depth"] == 4
    assert auto["profile_statistic"] is None         # a profile without samples: its points as stored
    assert "(along model)" in err and "warm-up" not in err


def test_tree_auto_profile_statistic_recomputes_points_from_samples(monkeypatch, capsys, tmp_path):
    from multidraft.decoding.treeopt import CostProfile

    nodes = list(range(1, 65))
    samples = {"target": {str(n): [0.1 + 1e-4 * n, 0.3, 0.31] for n in nodes},
               "draft": {"1": [1e-3, 2e-3, 9e-3], "8": [2e-3, 3e-3, 4e-3]}}
    pr = CostProfile(nodes, [0.1 + 1e-4 * n for n in nodes], [1, 8], [1e-3, 2e-3],
                     meta={"statistic": "min", "samples": samples})
    path = tmp_path / "prof.json"
    path.write_text(pr.to_json())
    study = _study_file(tmp_path)
    obj, err = _auto_run(monkeypatch, capsys, tmp_path, path, ["--accept-stats", str(study)])
    auto = obj["auto"]
    assert auto["profile_statistic"] == "median" and auto["target_seconds_1"] == pytest.approx(0.3)
    obj, err = _auto_run(monkeypatch, capsys, tmp_path, path, ["--accept-stats", str(study),
                                                               "--profile-statistic", "stored"])
    assert obj["auto"]["target_seconds_1"] == pytest.approx(0.1001)
    obj, err = _auto_run(monkeypatch, capsys, tmp_path, path, ["--accept-stats", str(study),
                                                               "--profile-statistic", "mean"])
    assert obj["auto"]["target_seconds_1"] == pytest.approx((0.1001 + 0.61) / 3)


@pytest.mark.parametrize("extra,words", [
    (["--accept-dataset", "toy"], "--accept-dataset needs --accept-stats"),
    (["--accept-stats", "STUDY2"], "choose one"),
    (["--accept-stats", "STUDY2", "--accept-dataset", "nope"], "no rows for data set 'nope'"),
    (["--accept-stats", "STUDY", "--temperature", "1"], "no rows with per-position values at temperatures 1"),
    (["--accept-stats", "STUDY", "--verifier", "spectr"], "no rows for spectr under the iid law"),
    (["--profile-statistic", "min"], "no timed samples"),
])
def test_tree_auto_study_misuse_before_any_model(no_models, capsys, tmp_path, extra, words):
    prof = _profile_file(tmp_path, lambda n: 0.1 * n)
    (tmp_path / "two").mkdir()
    names = {"STUDY": str(_study_file(tmp_path)), "STUDY2": str(_study_file(tmp_path / "two", ("a", "b")))}
    extra = [names.get(x, x) for x in extra]
    assert main(BASE + ["--tree", "auto", "--profile", str(prof), "--temperature", "0", "--k", "3"] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert no_models == []


def test_llama_engine_without_the_extra_names_it(no_models, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    assert main(BASE + ["--engine", "llama.cpp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scripts/install_llama_cpp.sh .venv/bin/python" in err[0]


def test_decode_chat_encodes_a_message_as_the_chat_endpoint(monkeypatch, capsys):
    """One prompt encoder (datasets.encode): ``decode --chat`` and the server's chat endpoint
    (``TextCodec.chat``) give the same ids for one message, the chat template applied once and no
    special token added on top of those the template writes (here a BOS the tokenizer would add too)."""
    pytest.importorskip("transformers")
    import tiny_models as tm
    from tokenizers import processors

    from multidraft import decoding
    from multidraft.datasets import encode
    from multidraft.serve import TextCodec

    t, d = tm.tiny_pair(vocab_size=32, seed=4)
    tok = tm.tiny_tokenizer()
    tok.bos_token = "<eos>"  # id 0 doubles as a BOS that plain text gets and the template writes
    tok._tokenizer.post_processor = processors.TemplateProcessing(single="<eos> $A", special_tokens=[("<eos>", 0)])
    tok.chat_template = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant {% endif %}")
    monkeypatch.setattr(models, "resolve_pair", lambda *a, **kw: (t, d, tok))
    seen = []

    def fake_generate(target, draft, input_ids, settings, **kw):  # input_ids [1, T]
        seen.append(input_ids[0].tolist())
        raise SystemExit(0)

    monkeypatch.setattr(decoding, "generate", fake_generate)
    with pytest.raises(SystemExit):
        main(["decode", "--prompt", "hello", "--chat", "--quiet", "--max-new-tokens", "2"])
    served = TextCodec("transformers", t, tok).chat([{"role": "user", "content": "hello"}])
    assert seen == [served] and served == encode(tok, "hello", chat=True)
    assert served[0] == 0 and served[1] != 0  # the template's BOS, once
    assert encode(tok, "hello")[0] == 0 and len(encode(tok, "hello")) == 6  # plain text: the tokenizer's BOS
    assert TextCodec("transformers", t, tok).encode("hello") == encode(tok, "hello")
