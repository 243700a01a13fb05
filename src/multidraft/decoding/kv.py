"""KV-cache helpers for tree decoding on transformers 5 ``DynamicCache``.

A step appends the whole draft tree to the cache; ``keep`` then compacts it to the
committed prefix plus the accepted path, in place, without recomputing anything: the
accepted entries are copied down to the positions right after the prefix and the layer
tensors are cut to the new length. Only full-attention ``DynamicLayer`` layers are
supported (sliding-window layers drop entries and cannot be compacted this way).
"""
from __future__ import annotations

import copy
import time
from collections import OrderedDict

import torch

__all__ = ["new_cache", "cache_length", "keep", "tree_attention_mask", "PromptCache"]


def new_cache(model):
    """An empty ``DynamicCache`` for ``model``; ValueError for sliding-window models."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    cache = DynamicCache(config=model.config)
    for layer in cache.layers:
        if isinstance(layer, DynamicSlidingWindowLayer) or not isinstance(layer, DynamicLayer):
            raise ValueError(
                f"model: {type(model).__name__} uses {type(layer).__name__} cache layers (sliding-window or "
                "non-standard attention); the tree decoder supports full-attention models only"
            )
    return cache


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def keep(cache, start: int, extra: torch.Tensor) -> None:
    """Keep cache entries ``[0, start)`` followed by the entries at ``extra`` (sorted, all >= start)."""
    n = int(extra.numel())
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
            continue
        if n:
            idx = extra.to(layer.keys.device)
            layer.keys[..., start : start + n, :] = layer.keys.index_select(-2, idx)
            layer.values[..., start : start + n, :] = layer.values.index_select(-2, idx)
        layer.keys = layer.keys[..., : start + n, :]
        layer.values = layer.values[..., : start + n, :]


def tree_attention_mask(visible: torch.Tensor, past: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask ``[1, 1, N, past + M]`` from ``visible [N, M]`` (bool, query x key).

    Every query sees the first ``past`` cached entries; of the last M keys (later cache
    entries and the new tokens, in cache order) the ones marked in ``visible``, e.g. a
    tree's ancestor-or-self matrix. Masked entries get the dtype's minimum.
    """
    N, M = visible.shape
    allowed = torch.cat([torch.ones(N, past, dtype=torch.bool), visible], dim=1)
    mask = torch.zeros(N, past + M, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, N, past + M)


class PromptCache:
    """Prefilled prompt caches shared by several ``generate`` calls on the same models.

    ``prefill(model, ids)`` (``ids`` LongTensor ``[1, T]``) returns a private copy of the
    cache after feeding ``ids`` and the seconds the model spent on it: the forward pass runs
    the first time a (model, token sequence) pair is seen and is copied afterwards (0.0 s of
    model time), so comparing methods on one prompt pays its prefill once. The copy is
    exact (the same tensors, cloned), so decoding from it equals decoding from a fresh
    prefill. The least recently used entries beyond ``max_entries`` are dropped.
    """

    def __init__(self, max_entries: int = 4):
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive integer, got {max_entries!r}")
        self.max_entries = max_entries
        self._store: OrderedDict = OrderedDict()
        self.hits = 0
        self.misses = 0

    def prefill(self, model, ids: torch.Tensor):  # ids [1, T]
        key = (id(model), tuple(ids[0].tolist()))
        hit = self._store.get(key)
        if hit is not None and hit[0] is model:
            self._store.move_to_end(key)
            self.hits += 1
            return copy.deepcopy(hit[1]), 0.0
        self.misses += 1
        cache, secs = fresh_prefill(model, ids)
        self._store[key] = (model, copy.deepcopy(cache))
        while len(self._store) > self.max_entries:
            self._store.popitem(last=False)
        return cache, secs


def fresh_prefill(model, ids: torch.Tensor):  # ids [1, T]
    """``(cache, seconds)``: a new cache after one forward pass over ``ids`` (empty if T = 0)."""
    cache = new_cache(model)
    t0 = time.perf_counter()
    if ids.shape[1] > 0:
        model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    return cache, time.perf_counter() - t0
