"""KV-cache helpers for tree decoding on transformers 5 ``DynamicCache``.

A step appends the whole draft tree to the cache; ``keep`` then compacts it to the
committed prefix plus the accepted path, in place, without recomputing anything: the
accepted entries are copied down to the positions right after the prefix and the layer
tensors are cut to the new length. Only full-attention ``DynamicLayer`` layers are
supported (sliding-window layers drop entries and cannot be compacted this way).
"""
from __future__ import annotations

import torch

__all__ = ["new_cache", "cache_length", "keep", "tree_attention_mask"]


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
