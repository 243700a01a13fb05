"""Tiny random-initialised causal LMs and a character tokenizer for fast tests.

Importable helper (not a test module) shared by the decoding and experiments tests::

    from tiny_models import tiny_pair, tiny_model, tiny_tokenizer

    target, draft = tiny_pair(vocab_size=24, seed=0)             # Qwen2 target + related draft
    target, draft = tiny_pair(arch="llama", related=False)        # unrelated Llama pair
    tok = tiny_tokenizer()                                        # 32 tokens: id 0 is "<eos>"

Models are in eval mode, float32 by default (``dtype=torch.float64`` for exact checks),
``attn_implementation="sdpa"``. ``init_scale`` widens the weight initialisation so the
next-token distributions are far from uniform (distinct argmaxes, meaningful drafts).
A ``related`` draft is the target with fewer layers dropped and its weights perturbed,
so acceptance rates are neither 0 nor 1. Everything is seeded; no global RNG is touched
(the initialisation runs under ``torch.random.fork_rng``).
"""
from __future__ import annotations

import contextlib
import copy

import torch

ALPHABET = list("abcdefghijklmnopqrstuvwxyz .,\n?!")  # 32 symbols with <eos> replacing '!'
_ARCHS = ("qwen2", "llama")


def _config(arch: str, vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int, max_pos: int, init_scale: float):
    if arch not in _ARCHS:
        raise ValueError(f"arch must be one of {_ARCHS}, got {arch!r}")
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_pos,
        initializer_range=0.02 * init_scale,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=0,
        pad_token_id=None,
    )
    if arch == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(use_sliding_window=False, **common)
    from transformers import LlamaConfig

    return LlamaConfig(**common)


def tiny_model(
    *,
    arch: str = "qwen2",
    vocab_size: int = 32,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_pos: int = 256,
    seed: int = 0,
    init_scale: float = 10.0,
    dtype: torch.dtype = torch.float32,
):
    """One random causal LM (``Qwen2ForCausalLM`` or ``LlamaForCausalLM``), eval mode."""
    from transformers import AutoModelForCausalLM

    cfg = _config(arch, vocab_size, hidden, layers, heads, kv_heads, max_pos, init_scale)
    cfg._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    return model.to(dtype).eval()


def tiny_pair(
    *,
    arch: str = "qwen2",
    vocab_size: int = 32,
    seed: int = 0,
    related: bool = True,
    noise: float = 0.1,
    dtype: torch.dtype = torch.float32,
    **kw,
):
    """``(target, draft)`` sharing a vocabulary.

    ``related=True``: the draft is the target's first layer(s) (one fewer layer when there
    are two or more) with Gaussian noise of relative size ``noise`` added to every weight.
    ``related=False``: an independently initialised model of the same shape.
    """
    target = tiny_model(arch=arch, vocab_size=vocab_size, seed=seed, dtype=dtype, **kw)
    if not related:
        draft = tiny_model(arch=arch, vocab_size=vocab_size, seed=seed + 1000, dtype=dtype, **kw)
        return target, draft
    draft = copy.deepcopy(target)
    n = draft.config.num_hidden_layers
    if n >= 2:
        draft.model.layers = draft.model.layers[: n - 1]
        draft.config.num_hidden_layers = n - 1
        if getattr(draft.config, "layer_types", None) is not None:
            draft.config.layer_types = draft.config.layer_types[: n - 1]
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for prm in draft.parameters():
            scale = prm.detach().float().std() if prm.numel() > 1 else prm.detach().abs().float()
            prm.add_((torch.randn(prm.shape, generator=g, dtype=torch.float32) * noise * scale).to(prm.dtype))
    return target, draft.eval()


def tiny_tokenizer():
    """A character-level fast tokenizer over 32 symbols; id 0 is ``<eos>`` (also pad)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = ["<eos>"] + ALPHABET[:-1]
    vocab = {s: i for i, s in enumerate(symbols)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<eos>", unk_token="?")
    return tok


def greedy_reference(model, input_ids: torch.Tensor, n: int, eos_token_id=None) -> torch.Tensor:
    """The model's own greedy continuation (plain full forwards, no cache): LongTensor [n'] (n' <= n)."""
    ids = input_ids.clone()
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1]
            t = int(torch.argmax(logits))
            out.append(t)
            ids = torch.cat([ids, torch.tensor([[t]], dtype=ids.dtype)], 1)
            if eos_token_id is not None and t == eos_token_id:
                break
    return torch.tensor(out, dtype=torch.long)


@contextlib.contextmanager
def tiny_llama_pair(directory, n_ctx: int):
    """Two tiny GGUF models (``multidraft.testing.tiny_gguf``, seeds 1 and 2) in llama.cpp contexts
    of ``n_ctx`` cells, float32 KV cells and no flash attention (tree passes then agree with plain
    decodes to float32 rounding), one thread (two spinning threads on a loaded 2-core machine
    stall); closed on exit. Skips the test where llama-cpp-python is not installed."""
    import pytest

    pytest.importorskip("llama_cpp")
    from multidraft.decoding.llamacpp import LlamaCppModel
    from multidraft.testing import tiny_gguf

    kw = dict(n_ctx=n_ctx, cache_type="f32", flash_attn=False, n_threads=1)
    ms = [LlamaCppModel(tiny_gguf(directory / "t.gguf", seed=1), **kw),
          LlamaCppModel(tiny_gguf(directory / "d.gguf", seed=2), **kw)]
    try:
        yield ms
    finally:
        for m in ms:
            m.close()


def tiny_bpe_tokenizer():
    """The tiny GGUFs' byte-level BPE vocabulary (``multidraft.testing``: 256 byte symbols, its
    merges and special tokens, 269 ids) as a transformers fast tokenizer, as Qwen's is built
    (NFC normalizer, ByteLevel pre-tokenizer and decoder), with the GGUFs' ChatML template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from multidraft import testing

    tokens = testing.tiny_tokens()
    vocab = {t: i for i, t in enumerate(tokens[: len(tokens) - len(testing.SPECIAL_TOKENS)])}
    merges = [tuple(rule.split(" ")) for rule in testing.MERGES]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in testing.SPECIAL_TOKENS])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.chat_template = testing.CHAT_TEMPLATE
    return tok
