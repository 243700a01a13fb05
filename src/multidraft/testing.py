"""Test fixtures that ship with the package: tiny random-weight GGUF models for llama.cpp.

:func:`tiny_gguf` writes a small ``qwen2`` GGUF (float32 weights, a self-contained
byte-level BPE vocabulary of :func:`tiny_vocab_size` tokens) that llama.cpp loads in
milliseconds; two files with different seeds are a target/draft pair that share one
vocabulary::

    from multidraft.testing import tiny_gguf, gguf_reference_logits

    target = tiny_gguf(tmp / "target.gguf", seed=0)
    draft = tiny_gguf(tmp / "draft.gguf", seed=1, n_layer=1)
    logits = gguf_reference_logits(target, [3, 80, 81])   # float64 [3, V], no llama.cpp needed

:func:`gguf_reference_logits` is a plain numpy re-implementation of llama.cpp's ``qwen2``
forward pass (RMSNorm, q/k/v biases, NEOX-style RoPE with the file's ``rope.freq_base``,
grouped-query causal attention, SwiGLU, tied or untied output) that reads every weight
back from the file, so it also serves as the exact reference a llama.cpp engine is tested
against. Writing needs the ``gguf`` package (``pip install gguf``, part of the ``models``
extra); nothing here imports llama.cpp.

The vocabulary (ids are stable; tests may rely on them):

* ids ``0..255``: the 256 GPT-2 byte-level symbols, id ``b`` is byte ``b``
  (``"Ġ"`` is id 32, the space; ``"Ċ"`` is id 10, the newline);
* ids ``256..256+len(MERGES)-1``: the merged tokens of :data:`MERGES`, in rank order;
* then the special (control) tokens :data:`SPECIAL_TOKENS`: ``<|endoftext|>`` (end of
  sequence and padding), ``<|im_start|>``, ``<|im_end|>`` (end of turn);
* then, when ``vocab`` asks for more, unused padding tokens ``<|extra_i|>`` (control
  tokens no text maps to, like the padding rows of real Qwen checkpoints).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = [
    "MERGES",
    "SPECIAL_TOKENS",
    "tiny_vocab_size",
    "tiny_tokens",
    "tiny_gguf",
    "gguf_reference_logits",
]

# merge rules "left right" in rank order; each result is a token right after the bytes
MERGES: tuple[str, ...] = (
    "Ġ t", "h e", "i n", "Ġ a", "e r", "o n", "Ġt he", "Ġ s", "r e", "Ċ Ċ",
)
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# ChatML, as Qwen2.5 uses it (no default system prompt), so chat formatting works too
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_TOKEN_NORMAL = 1   # gguf.TokenType.NORMAL
_TOKEN_CONTROL = 3  # gguf.TokenType.CONTROL
_TOKEN_UNUSED = 5   # gguf.TokenType.UNUSED


def _byte_symbols() -> list[str]:
    """GPT-2's ``bytes_to_unicode``: the printable symbol of each byte 0..255, by byte value."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    sym = {}
    n = 0
    for b in range(256):
        if b in printable:
            sym[b] = chr(b)
        else:
            sym[b] = chr(256 + n)
            n += 1
    return [sym[b] for b in range(256)]


def _base_tokens() -> list[str]:
    tokens = _byte_symbols()
    for rule in MERGES:
        left, right = rule.split(" ")
        if left not in tokens or right not in tokens:
            raise AssertionError(f"merge {rule!r} uses a token that is not in the vocabulary")  # a bug in MERGES
        tokens.append(left + right)
    tokens.extend(SPECIAL_TOKENS)
    return tokens


def tiny_vocab_size() -> int:
    """Smallest vocabulary :func:`tiny_gguf` writes: 256 bytes + merges + special tokens (269)."""
    return len(_base_tokens())


def tiny_tokens(vocab: int | None = None) -> list[str]:
    """Token strings by id (the GGUF ``tokenizer.ggml.tokens``) for a vocabulary of ``vocab`` tokens."""
    tokens = _base_tokens()
    if vocab is None:
        return tokens
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)):
        raise ValueError(f"vocab must be an int or None, got {vocab!r}")
    if vocab < len(tokens):
        raise ValueError(
            f"vocab must be at least {len(tokens)} (256 byte symbols, {len(MERGES)} merges, "
            f"{len(SPECIAL_TOKENS)} special tokens), got {vocab}"
        )
    return tokens + [f"<|extra_{i}|>" for i in range(int(vocab) - len(tokens))]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _gguf():
    from . import _optional

    return _optional.require("gguf", "multidraft.testing")


def tiny_gguf(
    path: str | os.PathLike,
    *,
    seed: int,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    vocab: int | None = None,
    n_ctx: int = 512,
    rope_theta: float = 10000.0,
    rms_eps: float = 1e-6,
    tie_embeddings: bool = False,
    logit_std: float = 2.0,
) -> Path:
    """Write a tiny random ``qwen2`` GGUF with float32 weights to ``path``; returns the path.

    Deterministic: the same arguments give the same bytes (weights from
    ``numpy.random.default_rng(seed)``). ``n_embd`` must be a multiple of ``n_head`` with an
    even head size ``n_embd / n_head``, and ``n_head`` a multiple of ``n_head_kv``
    (grouped-query attention, as Qwen2.5). ``vocab`` is the vocabulary size ``V`` (default
    :func:`tiny_vocab_size`, 269; larger values append unused tokens). ``n_ctx`` is the
    training context written to ``qwen2.context_length``.

    Weight scales: embeddings and hidden projections have unit-variance activations
    (entries ``N(0, 1/fan_in)``; embeddings ``N(0, 1)``), norm weights ``1 + N(0, 0.1^2)``
    and biases ``N(0, 0.1^2)``, so attention is neither uniform nor one-hot. The output
    projection (or, with ``tie_embeddings``, the shared embedding table, which RMSNorm makes
    scale-free on the input side) has entries ``N(0, logit_std^2 / n_embd)``: logits have
    standard deviation about ``logit_std`` (in nats), which at temperature 1 gives
    next-token entropies of 3.5-3.9 nats on average over random contexts (single positions
    1.5-4.5; ``log V = 5.6``) for the default 2.0, largest probabilities up to ~0.75
    (``test_llamacpp_fixture`` checks the range). The file is written to a temporary
    sibling and renamed, so ``path`` is never a partial file.
    """
    gguf = _gguf()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    n_layer = _positive_int("n_layer", n_layer)
    n_embd = _positive_int("n_embd", n_embd)
    n_head = _positive_int("n_head", n_head)
    n_head_kv = _positive_int("n_head_kv", n_head_kv)
    n_ff = _positive_int("n_ff", n_ff)
    n_ctx = _positive_int("n_ctx", n_ctx)
    if n_embd % n_head or (n_embd // n_head) % 2:
        raise ValueError(f"n_embd ({n_embd}) must be n_head ({n_head}) times an even head size")
    if n_head % n_head_kv:
        raise ValueError(f"n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv})")
    for name, value in (("rope_theta", rope_theta), ("rms_eps", rms_eps), ("logit_std", logit_std)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    tokens = tiny_tokens(vocab)
    V = len(tokens)
    n_base = tiny_vocab_size()
    types = [_TOKEN_NORMAL] * (256 + len(MERGES)) + [_TOKEN_CONTROL] * len(SPECIAL_TOKENS) + [_TOKEN_UNUSED] * (V - n_base)
    head_dim = n_embd // n_head
    n_kv = n_head_kv * head_dim

    rng = np.random.default_rng(int(seed))

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_weight():
        return (1.0 + normal((n_embd,), 0.1)).astype(np.float32)

    out_std = logit_std / math.sqrt(n_embd)
    tensors: list[tuple[str, np.ndarray]] = [
        ("token_embd.weight", normal((V, n_embd), out_std if tie_embeddings else 1.0)),
    ]
    for i in range(n_layer):
        b = f"blk.{i}."
        tensors += [
            (b + "attn_norm.weight", norm_weight()),
            (b + "attn_q.weight", normal((n_embd, n_embd), 1 / math.sqrt(n_embd))),
            (b + "attn_q.bias", normal((n_embd,), 0.1)),
            (b + "attn_k.weight", normal((n_kv, n_embd), 1 / math.sqrt(n_embd))),
            (b + "attn_k.bias", normal((n_kv,), 0.1)),
            (b + "attn_v.weight", normal((n_kv, n_embd), 1 / math.sqrt(n_embd))),
            (b + "attn_v.bias", normal((n_kv,), 0.1)),
            (b + "attn_output.weight", normal((n_embd, n_embd), 1 / math.sqrt(n_embd))),
            (b + "ffn_norm.weight", norm_weight()),
            (b + "ffn_gate.weight", normal((n_ff, n_embd), 1 / math.sqrt(n_embd))),
            (b + "ffn_up.weight", normal((n_ff, n_embd), 1 / math.sqrt(n_embd))),
            (b + "ffn_down.weight", normal((n_embd, n_ff), 1 / math.sqrt(n_ff))),
        ]
    tensors.append(("output_norm.weight", norm_weight()))
    if not tie_embeddings:
        tensors.append(("output.weight", normal((V, n_embd), out_std)))

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    w = gguf.GGUFWriter(str(tmp), "qwen2")
    try:
        w.add_name(f"multidraft tiny qwen2 (seed {int(seed)})")
        w.add_file_type(0)  # LLAMA_FTYPE_ALL_F32
        w.add_context_length(n_ctx)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_rope_freq_base(float(rope_theta))
        w.add_layer_norm_rms_eps(float(rms_eps))
        w.add_vocab_size(V)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(list(MERGES))
        eos = tokens.index("<|endoftext|>")
        w.add_eos_token_id(eos)
        w.add_pad_token_id(eos)
        w.add_bos_token_id(eos)  # Qwen2.5's convention: never added (add_bos_token false)
        w.add_eot_token_id(tokens.index("<|im_end|>"))
        w.add_add_bos_token(False)
        w.add_chat_template(CHAT_TEMPLATE)
        for name, arr in tensors:
            w.add_tensor(name, arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------
# the reference forward pass
# ---------------------------------------------------------------------------------------
def _field(reader, path: Path, key: str):
    f = reader.get_field(key)
    if f is None:
        raise ValueError(f"{path}: no metadata key {key!r}")
    return f.contents()


def _read_weights(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    gguf = _gguf()
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))
    arch = _field(reader, path, "general.architecture")
    if arch != "qwen2":
        raise ValueError(f"{path}: architecture {arch!r}; the reference forward implements qwen2 only")
    def optional(key, default):  # llama.cpp's defaults for keys a file may leave out
        return _field(reader, path, key) if reader.get_field(key) is not None else default

    n_head = int(_field(reader, path, "qwen2.attention.head_count"))
    hp = {
        "n_layer": int(_field(reader, path, "qwen2.block_count")),
        "n_embd": int(_field(reader, path, "qwen2.embedding_length")),
        "n_head": n_head,
        "n_head_kv": int(optional("qwen2.attention.head_count_kv", n_head)),
        "eps": float(_field(reader, path, "qwen2.attention.layer_norm_rms_epsilon")),
        "theta": float(optional("qwen2.rope.freq_base", 10000.0)),
    }
    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # numpy order: [out, in]
        weights[t.name] = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(shape)
    return hp, weights


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope_neox(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """NEOX-style rotary embedding (pairs ``i`` and ``i + d/2``) of ``x`` [T, H, d]."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)   # [d/2]
    ang = pos[:, None].astype(np.float64) * inv[None, :]          # [T, d/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def gguf_reference_logits(path: str | os.PathLike, token_ids: Sequence[int]) -> np.ndarray:
    """Logits ``float64 [T, V]`` of the ``qwen2`` GGUF at ``path`` for the sequence ``token_ids``.

    Row ``t`` is the next-token logits after ``token_ids[: t + 1]`` (positions ``0..T-1``,
    causal attention), computed in float64 numpy from the file's weights (F32, F16, BF16 or
    any type ``gguf.quants`` dequantises) and hyperparameters. Meant for tiny models: the
    whole model is dequantised into memory.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    hp, W = _read_weights(path)
    ids = np.asarray(list(token_ids), dtype=np.int64)
    emb = W["token_embd.weight"]
    V = emb.shape[0]
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"token_ids must be a non-empty 1-D sequence of ints, got shape {ids.shape}")
    if ids.min() < 0 or ids.max() >= V:
        raise ValueError(f"token_ids must lie in [0, {V}), got values in [{ids.min()}, {ids.max()}]")
    T = ids.size
    H, Hkv = hp["n_head"], hp["n_head_kv"]
    d = hp["n_embd"] // H
    eps, theta = hp["eps"], hp["theta"]
    pos = np.arange(T)
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    x = emb[ids]                                                   # [T, n_embd]
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        h = _rms_norm(x, W[b + "attn_norm.weight"], eps)
        q = (h @ W[b + "attn_q.weight"].T + W.get(b + "attn_q.bias", 0.0)).reshape(T, H, d)
        k = (h @ W[b + "attn_k.weight"].T + W.get(b + "attn_k.bias", 0.0)).reshape(T, Hkv, d)
        v = (h @ W[b + "attn_v.weight"].T + W.get(b + "attn_v.bias", 0.0)).reshape(T, Hkv, d)
        q, k = _rope_neox(q, pos, theta), _rope_neox(k, pos, theta)
        group = H // Hkv
        k = np.repeat(k, group, axis=1)                            # head j uses kv head j // group
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(d) + mask
        scores -= scores.max(axis=-1, keepdims=True)
        att = np.exp(scores)
        att /= att.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", att, v).reshape(T, H * d)
        x = x + o @ W[b + "attn_output.weight"].T
        h = _rms_norm(x, W[b + "ffn_norm.weight"], eps)
        gate = h @ W[b + "ffn_gate.weight"].T
        up = h @ W[b + "ffn_up.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ W[b + "ffn_down.weight"].T
    x = _rms_norm(x, W["output_norm.weight"], eps)
    out = W.get("output.weight", emb)
    return x @ out.T
