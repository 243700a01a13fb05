"""``datasets.token_byte_bound``: a lower bound on a text's token count read from the vocabulary
once (``len(encode(x)) >= ceil(bytes(N(x)) / B)``), so the server refuses a prompt that cannot
fit its context before tokenizing it (issue 41, item 4). Checked on the tiny GGUFs' byte-level
BPE vocabulary through transformers and through llama.cpp, on Qwen2.5's tokenizer where it is
cached, and refused (None) for a word-level tokenizer, where no such bound holds."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

import tiny_models as tm
from multidraft.datasets import ByteBound, encode, token_byte_bound

QWEN = Path.home() / ".cache/multidraft/models/qwen2.5-coder-0.5b-instruct"
# pieces that stress the bound: specials (the longest tokens), merges, NFC pairs that compose
# (e + combining acute, Hangul jamo L V T: 9 bytes -> 3), multi-byte characters, newline runs
PIECES = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "the", " the", " a", "in", "er", "\n\n", "\n", " ", "x",
          "e\u0301", "\u1100\u1161\u11a8", "\u00e9", "\ud55c", "\U0001f600", "\u212b", "\u0958", "==", "\t"]


def texts(seed: int, n: int = 60):
    rng = random.Random(seed)
    out = ["", "a", "<|endoftext|>" * 7, "\u1100\u1161\u11a8" * 50]
    for _ in range(n):
        out.append("".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 120))))
    return out


def check_bound(count, bound: ByteBound, seed: int) -> None:
    for x in texts(seed):
        n, low = count(x), bound.min_tokens(x)
        assert n >= low, (x, n, low)


def test_tiny_bpe_through_transformers():
    tok = tm.tiny_bpe_tokenizer()
    bound = token_byte_bound(tok)
    assert bound is not None and bound.bytes_per_token == len("<|endoftext|>") and bound.nfc
    check_bound(lambda x: len(encode(tok, x)), bound, 0)
    x = "<|endoftext|>" * 9  # the bound is attained: nine tokens of B bytes each
    assert len(encode(tok, x)) == bound.min_tokens(x) == 9
    x = "\u1100\u1161\u11a8" * 4  # NFC makes 4 syllables of 3 bytes of the 36 bytes of jamo
    assert bound.text_bytes(x) == 12


def test_tiny_bpe_through_llama_cpp(tmp_path):
    with tm.tiny_llama_pair(tmp_path, n_ctx=256) as (target, _):
        bound = token_byte_bound(target)
        assert bound is not None and bound.bytes_per_token == len("<|endoftext|>") and not bound.nfc
        check_bound(lambda x: len(target.tokenize(x)), bound, 1)
        assert target.token_byte_bound() is target.token_byte_bound()  # read once


@pytest.mark.slow
@pytest.mark.skipif(not (QWEN / "tokenizer.json").is_file(), reason="Qwen2.5-Coder-0.5B is not cached")
def test_qwen_tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(QWEN)
    bound = token_byte_bound(tok)
    assert bound is not None and bound.bytes_per_token == 128 and bound.nfc  # 128 spaces is its longest token
    check_bound(lambda x: len(encode(tok, x)), bound, 2)
    x = " " * 128 * 5
    assert len(encode(tok, x)) >= bound.min_tokens(x) == 5


def test_no_bound_for_a_word_level_tokenizer():
    """The tiny transformers pair's tokenizer maps a run of newlines to one unknown token: no B."""
    tok = tm.tiny_tokenizer()
    assert len(encode(tok, "\n" * 1000)) == 1
    assert token_byte_bound(tok) is None


def test_byte_bound_is_checked():
    with pytest.raises(ValueError, match="bytes_per_token"):
        ByteBound(0)
    assert ByteBound(4).min_tokens("abcde") == 2 and ByteBound(4).min_tokens("") == 0


QWEN_GGUF = Path.home() / ".cache/multidraft/models/gguf/qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf"


@pytest.mark.slow
@pytest.mark.skipif(not QWEN_GGUF.is_file(), reason="the Qwen2.5-Coder-0.5B GGUF is not cached")
def test_qwen_gguf_through_llama_cpp():
    """llama.cpp's tokenizer of the same vocabulary: B = 128 too, and no normalization (a
    decomposed text round-trips byte for byte, so the bound counts the raw bytes)."""
    pytest.importorskip("llama_cpp")
    from multidraft.decoding.llamacpp import LlamaCppModel

    m = LlamaCppModel(QWEN_GGUF, n_ctx=256, n_threads=1)
    try:
        bound = token_byte_bound(m)
        assert bound is not None and bound.bytes_per_token == 128 and not bound.nfc
        for x in ("e\u0301", "\u1100\u1161\u11a8" * 3):
            assert m.detokenize_special(m.tokenize(x)) == x
        check_bound(lambda x: len(m.tokenize(x)), bound, 3)
    finally:
        m.close()
