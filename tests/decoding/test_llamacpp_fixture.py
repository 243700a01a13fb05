"""The tiny GGUF fixture (multidraft.testing): deterministic, non-degenerate, and read by
llama.cpp exactly as the numpy reference forward reads it.

The llama.cpp tests are skipped when llama-cpp-python is not installed (``pip install
'multidraft[llama]'``). llama.cpp runs with a float32 KV cache and flash attention off:
its default float16 KV cache (and its flash-attention path, even with a float32 cache)
moves the logits by ~3e-3, which would hide the ~1e-6 agreement checked here.
"""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from multidraft import testing as T  # noqa: E402

IDS = [10, 32, 256, 104, 101, 262, 3, 200, 7, 266, 77, 32, 116, 257]


def _llama(path, n_ctx=64):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=1,
        type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False,
    )


def _llama_logits(path, ids):
    llm = _llama(path)
    try:
        llm.eval(list(ids))
        return np.array(llm.scores[: len(ids)], dtype=np.float64)
    finally:
        llm.close()


def _entropy(logits):
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    return -(p * np.log(p)).sum(-1), p.max(-1)


# ---------------------------------------------------------------------------------------
# the file itself (no llama.cpp)
# ---------------------------------------------------------------------------------------
def test_deterministic_and_seeded(tmp_path):
    a = T.tiny_gguf(tmp_path / "a.gguf", seed=3).read_bytes()
    b = T.tiny_gguf(tmp_path / "b.gguf", seed=3).read_bytes()
    c = T.tiny_gguf(tmp_path / "c.gguf", seed=4).read_bytes()
    assert a == b
    assert len(a) == len(c) and a != c
    assert not (tmp_path / "a.gguf.partial").exists()


def test_metadata_and_vocabulary(tmp_path):
    path = T.tiny_gguf(tmp_path / "m.gguf", seed=0, vocab=300, n_ctx=256)
    r = gguf.GGUFReader(str(path))
    f = lambda k: r.get_field(k).contents()  # noqa: E731
    assert f("general.architecture") == "qwen2"
    assert f("qwen2.context_length") == 256
    assert f("tokenizer.ggml.model") == "gpt2"
    tokens = f("tokenizer.ggml.tokens")
    assert len(tokens) == 300 and tokens == T.tiny_tokens(300)
    assert tokens[32] == "Ġ" and tokens[10] == "Ċ" and tokens[ord("a")] == "a"
    assert len(set(tokens)) == 300
    assert f("tokenizer.ggml.eos_token_id") == tokens.index("<|endoftext|>")
    assert f("tokenizer.ggml.eot_token_id") == tokens.index("<|im_end|>")
    types = f("tokenizer.ggml.token_type")
    assert types[: 256 + len(T.MERGES)] == [1] * (256 + len(T.MERGES))
    assert types[T.tiny_vocab_size():] == [5] * (300 - T.tiny_vocab_size())
    for t in r.tensors:
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
    assert r.get_tensor(0).name == "token_embd.weight"
    assert {t.name for t in r.tensors} >= {"output.weight", "blk.1.attn_q.bias", "blk.1.ffn_down.weight"}


def test_distributions_are_neither_flat_nor_one_hot(tmp_path):
    V = T.tiny_vocab_size()
    rng = np.random.default_rng(0)
    for seed, kw in ((0, {}), (1, {}), (2, {"tie_embeddings": True})):
        path = T.tiny_gguf(tmp_path / f"e{seed}.gguf", seed=seed, **kw)
        H, pmax = _entropy(T.gguf_reference_logits(path, rng.integers(0, V, 48)))
        assert 3.0 < H.mean() < 4.8, (seed, H.mean())
        assert H.min() > 1.0 and H.max() < np.log(V) - 0.5
        assert pmax.max() < 0.95


def test_pair_shares_the_vocabulary_but_not_the_weights(tmp_path):
    t = T.tiny_gguf(tmp_path / "t.gguf", seed=0)
    d = T.tiny_gguf(tmp_path / "d.gguf", seed=1, n_layer=1)
    tr, dr = gguf.GGUFReader(str(t)), gguf.GGUFReader(str(d))
    key = "tokenizer.ggml.tokens"
    assert tr.get_field(key).contents() == dr.get_field(key).contents()
    lt, ld = T.gguf_reference_logits(t, IDS), T.gguf_reference_logits(d, IDS)
    assert lt.shape == ld.shape == (len(IDS), T.tiny_vocab_size())
    assert np.abs(lt - ld).max() > 1.0


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"vocab": 100}, "vocab must be at least 269"),
        ({"vocab": 270.0}, "vocab must be an int"),
        ({"n_embd": 60}, "n_embd"),
        ({"n_embd": 12, "n_head": 4}, "even head size"),
        ({"n_head_kv": 3}, "multiple of n_head_kv"),
        ({"n_layer": 0}, "n_layer must be a positive int"),
        ({"rope_theta": float("nan")}, "rope_theta"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments(tmp_path, kw, match):
    args = {"seed": 0, **kw}
    with pytest.raises(ValueError, match=match):
        T.tiny_gguf(tmp_path / "x.gguf", **args)
    assert not list(tmp_path.iterdir())


def test_reference_rejects_bad_ids(tmp_path):
    path = T.tiny_gguf(tmp_path / "r.gguf", seed=0)
    with pytest.raises(ValueError, match=r"token_ids must lie in \[0, 269\)"):
        T.gguf_reference_logits(path, [0, 269])
    with pytest.raises(ValueError, match="non-empty"):
        T.gguf_reference_logits(path, [])
    with pytest.raises(FileNotFoundError):
        T.gguf_reference_logits(tmp_path / "none.gguf", [1])


# ---------------------------------------------------------------------------------------
# llama.cpp reads it as the reference does
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw",
    [
        {},                                                    # untied output, GQA 4/2
        {"tie_embeddings": True},                              # output = token_embd
        {"n_layer": 1, "n_head_kv": 4, "rope_theta": 1e6},     # plain MHA, Qwen2.5's theta
        {"n_embd": 32, "n_head": 2, "n_head_kv": 1, "n_ff": 96, "vocab": 300, "rms_eps": 1e-2},
    ],
)
def test_llamacpp_logits_equal_reference(tmp_path, kw):
    path = T.tiny_gguf(tmp_path / "m.gguf", seed=5, **kw)
    got = _llama_logits(path, IDS)
    want = T.gguf_reference_logits(path, IDS)
    assert got.shape == want.shape == (len(IDS), kw.get("vocab", T.tiny_vocab_size()))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_the_comparison_sees_rope_theta_and_eps(tmp_path):
    """Same seed, other hyperparameters: the weights are identical, the logits must not be
    (so the agreement above pins down the file's rope.freq_base and RMSNorm epsilon)."""
    base = T.tiny_gguf(tmp_path / "a.gguf", seed=5)
    got = _llama_logits(base, IDS)
    for kw in ({"rope_theta": 1e6}, {"rms_eps": 1e-1}):
        other = T.tiny_gguf(tmp_path / "b.gguf", seed=5, **kw)
        assert np.abs(got - T.gguf_reference_logits(other, IDS)).max() > 1e-2, kw


def test_llamacpp_tokenizer(tmp_path):
    path = T.tiny_gguf(tmp_path / "tok.gguf", seed=0)
    llm = _llama(path)
    try:
        tokens = T.tiny_tokens()
        assert llm.n_vocab() == len(tokens)
        assert llm.token_eos() == tokens.index("<|endoftext|>")
        ids = llm.tokenize(b"the cat\n\nsat", add_bos=False)
        assert [tokens[i] for i in ids] == ["t", "he", "Ġ", "c", "a", "t", "ĊĊ", "s", "a", "t"]
        text = "héllo wörld\n"
        assert llm.detokenize(llm.tokenize(text.encode(), add_bos=False)) == text.encode()
        chat = llm.tokenize(b"<|im_start|>hi<|im_end|>", add_bos=False, special=True)
        assert chat == [tokens.index("<|im_start|>"), ord("h"), ord("i"), tokens.index("<|im_end|>")]
    finally:
        llm.close()
