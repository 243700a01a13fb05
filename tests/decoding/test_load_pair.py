"""decoding.pair.load_pair: one loader of the (target, draft, tokenizer) pair per engine."""
from __future__ import annotations

import pytest
import torch

import tiny_models as tm
from multidraft import models
from multidraft.decoding.pair import ENGINES, load_pair
from multidraft.testing import tiny_gguf


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp("hf")
    t, dr = tm.tiny_pair(vocab_size=32, seed=4)
    tok = tm.tiny_tokenizer()
    for m, name in ((t, "t"), (dr, "d")):
        m.save_pretrained(d / name)
        tok.save_pretrained(d / name)
    return d / "t", d / "d"


def test_transformers_pair_and_target_alone(hf_dirs):
    t_dir, d_dir = hf_dirs
    target, draft, tok = load_pair("transformers", target=t_dir, draft=d_dir, dtype=torch.float32)
    assert next(target.parameters()).dtype == torch.float32 and not target.training
    assert draft.config.num_hidden_layers < target.config.num_hidden_layers
    assert tok("ab")["input_ids"] == tm.tiny_tokenizer()("ab")["input_ids"]
    alone, none, tok2 = load_pair("transformers", target=t_dir, draft=False)
    assert none is None and next(alone.parameters()).dtype == torch.bfloat16  # the default dtype
    assert len(tok2) == len(tok)


def test_transformers_goes_through_models_resolve_pair(monkeypatch):
    seen = {}

    def fake(target, draft, dtype, *, cache_dir=None, log=None):
        seen.update(target=target, draft=draft, dtype=dtype, cache_dir=cache_dir)
        return "t", "d", "tok"

    monkeypatch.setattr(models, "resolve_pair", fake)
    threads = torch.get_num_threads()
    try:
        assert load_pair("transformers", cache_dir="c", n_threads=1) == ("t", "d", "tok")
        assert torch.get_num_threads() == 1  # set before anything loads
    finally:
        torch.set_num_threads(threads)
    assert seen == {"target": None, "draft": None, "dtype": torch.bfloat16, "cache_dir": "c"}


@pytest.mark.parametrize("kw, words", [
    (dict(engine="vllm"), "engine must be one of transformers, llama.cpp, got 'vllm'"),
    (dict(engine="llama.cpp", dtype=torch.float32), "dtype applies to the transformers engine only"),
    (dict(engine="transformers", bf16_target=True), "bf16_target applies to the llama.cpp engine only"),
    (dict(engine="transformers", draft_ftype="q4_0"), "draft_ftype applies to the llama.cpp engine only"),
    (dict(engine="transformers", n_threads=0), "n_threads must be a positive integer or None, got 0"),
    (dict(engine="llama.cpp", target="x.gguf", bf16_target=True), "bf16_target applies to the default target only"),
])
def test_misuse_names_the_argument_before_any_load(monkeypatch, kw, words):
    def boom(*a, **k):
        raise AssertionError("a model load was attempted")

    monkeypatch.setattr(models, "resolve_pair", boom)
    monkeypatch.setattr(models, "ensure_default_models", boom)
    with pytest.raises(ValueError, match=words):
        load_pair(kw.pop("engine"), **kw)
    assert ENGINES == ("transformers", "llama.cpp")


def test_llama_cpp_pair_and_target_alone(tmp_path):
    pytest.importorskip("llama_cpp")
    t_path, d_path = tiny_gguf(tmp_path / "t.gguf", seed=1), tiny_gguf(tmp_path / "d.gguf", seed=2, n_layer=1)
    target, draft, tok = load_pair("llama.cpp", target=t_path, draft=d_path, n_threads=1, n_ctx=256)
    try:
        assert tok is target and target.path == t_path and draft.path == d_path
        assert target.n_threads == 1 and draft.vocab_size == target.vocab_size
    finally:
        target.close()
        draft.close()
    alone, none, tok = load_pair("llama.cpp", target=t_path, draft=False, n_threads=1, n_ctx=256)
    try:
        assert none is None and tok is alone
    finally:
        alone.close()
    with pytest.raises(FileNotFoundError, match="draft: no GGUF file at"):
        load_pair("llama.cpp", target=t_path, draft=tmp_path / "none.gguf")
