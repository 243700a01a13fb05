"""The target-alone continuation (``decoding.continuation``) runs through the decoder's runners:
on transformers and on llama.cpp models it samples the tokens ``generate(verifier=None)`` samples
from the same generator, with the logits of a plain forward at every position, and the collector
stores llama.cpp positions like transformers ones."""
from __future__ import annotations

import os
import sys

import pytest
import torch
from tiny_models import tiny_llama_pair

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import tiny_models as tm  # noqa: E402

import multidraft as md  # noqa: E402
from multidraft.decoding.continuation import continuation_logits  # noqa: E402

PROMPT = [3, 1, 4, 1, 5]


def _same_as_generate(target, draft, V, temperature, seed, n=24):
    ids = torch.tensor([PROMPT])
    c = continuation_logits(target, draft, ids, max_new_tokens=n, temperature=temperature,
                            generator=torch.Generator().manual_seed(seed))
    g = md.generate(target, None, ids, verifier=None, temperature=temperature, max_new_tokens=n,
                    generator=torch.Generator().manual_seed(seed))
    assert c.tokens.tolist() == g.tokens.tolist()
    assert c.target_logits.shape == (n, V) and c.target_logits.dtype == torch.float32
    assert (c.draft_logits is None) == (draft is None)
    return c


def test_transformers_continuation_is_the_target_alone_decode():
    t, d = tm.tiny_pair(vocab_size=32, max_pos=256)
    c = _same_as_generate(t, d, 32, 1.0, 0)
    assert len(set(c.tokens.tolist())) > 3  # sampled, not stuck on one token
    _same_as_generate(t, None, 32, 0.0, 1)
    # the logits at position i are those of a plain forward over the prompt and tokens[:i]
    seq = torch.tensor([PROMPT + c.tokens.tolist()])
    with torch.no_grad():
        ref_t, ref_d = t(input_ids=seq).logits[0].float(), d(input_ids=seq).logits[0].float()
    at = slice(len(PROMPT) - 1, len(PROMPT) - 1 + len(c))
    torch.testing.assert_close(c.target_logits, ref_t[at], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(c.draft_logits, ref_d[at], atol=1e-4, rtol=1e-4)


def test_continuation_stops_after_eos_and_checks_its_arguments():
    t, d = tm.tiny_pair(vocab_size=32, max_pos=256)
    ids = torch.tensor([PROMPT])
    full = continuation_logits(t, d, ids, max_new_tokens=30, generator=3)
    eos = full.tokens[5].item()
    first = full.tokens.tolist().index(eos)
    cut = continuation_logits(t, d, ids, max_new_tokens=30, generator=3, eos_token_id=[eos])
    assert cut.tokens.tolist() == full.tokens.tolist()[: first + 1]
    for bad, words in (({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": -1.0}, "temperature")):
        with pytest.raises(ValueError, match=words):
            continuation_logits(t, d, ids, **{"max_new_tokens": 4, **bad}, generator=0)
    with pytest.raises(ValueError, match="input_ids"):
        continuation_logits(t, d, torch.tensor(PROMPT), max_new_tokens=4, generator=0)
    with pytest.raises(ValueError, match="target"):
        continuation_logits(None, d, ids, max_new_tokens=4, generator=0)


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory):
    with tiny_llama_pair(tmp_path_factory.mktemp("gguf"), 256) as ms:
        yield ms


def _plain(model, seq):
    model.clear()
    return model.decode(seq, list(range(len(seq))), [[0]] * len(seq), [True] * len(seq)).float().clone()


def test_llama_cpp_continuation_is_the_target_alone_decode(gguf_models):
    t, d = gguf_models
    c = _same_as_generate(t, d, t.vocab_size, 1.0, 0)
    _same_as_generate(t, d, t.vocab_size, 0.0, 2)
    seq = PROMPT + c.tokens.tolist()
    at = slice(len(PROMPT) - 1, len(PROMPT) - 1 + len(c))
    torch.testing.assert_close(c.target_logits, _plain(t, seq)[at], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(c.draft_logits, _plain(d, seq)[at], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="two LlamaCppModel"):
        continuation_logits(t, t, torch.tensor([PROMPT]), max_new_tokens=2, generator=0)


def test_collect_on_llama_cpp_models(gguf_models, prompt_file, tmp_path):
    from multidraft.experiments import collect, store

    t, d = gguf_models
    kw = dict(models=lambda: (t, d, t), model_names={"target": "t", "draft": "d"},
              datasets=[f"file:{prompt_file}"], configs=[(1.0, 1.0)], n_texts=2, positions_per_text=None,
              positions_from="continuation", new_tokens=6, seed=0)
    path = collect.collect(tmp_path / "a", **kw)[(f"file:{prompt_file}", 1.0, 1.0)]
    ps = store.load(path)
    srcs = ps.info["sources"]
    assert 1 <= len(ps) <= 12 and len(srcs) == len(ps) and ps.info["V"] == t.vocab_size
    # the stored tokens are the continuation's: the same seed gives the same positions
    again = store.load(collect.collect(tmp_path / "b", **kw)[(f"file:{prompt_file}", 1.0, 1.0)])
    assert again.info["sources"] == srcs
    with pytest.raises(ValueError, match="teacher-forcing"):
        collect.collect(tmp_path / "c", **{**kw, "positions_from": "teacher-forcing"})


def test_experiment_cli_collects_on_llama_cpp(gguf_models, prompt_file, tmp_path, monkeypatch, capsys):
    """``multidraft experiment acceptance --engine llama.cpp``: the GGUF pair collects continuation
    positions, bound to model names that say llama.cpp; teacher forcing is refused before any load."""
    from multidraft.cli import main
    from multidraft.decoding import pair
    from multidraft.experiments import store
    from multidraft.experiments.records import read_jsonl

    t, d = gguf_models
    loads = []
    monkeypatch.setattr(pair, "load_pair", lambda engine, **kw: loads.append(engine) or (t, d, t))
    base = ["experiment", "acceptance", str(tmp_path / "run"), "--engine", "llama.cpp", "--datasets", f"file:{prompt_file}",
            "--texts", "2", "--new-tokens", "4", "--k", "1,2", "--laws", "iid", "--verifiers", "specinfer",
            "--draws", "4", "--no-progress"]
    assert main(base + ["--positions-from", "teacher-forcing"]) == 2
    err = capsys.readouterr().err
    assert "--engine llama.cpp collects --positions-from continuation only" in err and len(err.strip().splitlines()) == 1
    assert loads == []
    assert main(base) == 0 and loads == ["llama.cpp"]
    meta, rows = read_jsonl(tmp_path / "run" / "acceptance.jsonl")
    assert meta["config"]["models"]["target"].endswith("via llama.cpp") and {r["verifier"] for r in rows} >= {"specinfer"}
    (path,) = (tmp_path / "run" / "positions").glob("*.pt")
    assert store.load(path).info["V"] == t.vocab_size
