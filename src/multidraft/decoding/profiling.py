"""Measure a :class:`~multidraft.decoding.treeopt.CostProfile` for a model pair on this machine.

The target is timed the way the engine scores a tree (``engine.score_tree``): n tokens over
a cached prompt prefix, positions ``prefix + depth``, a 4D tree attention mask (a plain
forward for n = 1), logits for every token; the draft the way one tree level is drafted
(m nodes with a tree mask over its cache, logits for every node). Each point is the median
(or minimum) of ``repeats`` timed forwards after ``warmup`` untimed rounds, interleaved over
the sizes; the cache is cut back to the prefix after every forward (``kv.keep``), so every
forward sees the same prefix length.
"""
from __future__ import annotations

import os
import platform
import statistics
import time

import torch

from .kv import fresh_prefill, keep, tree_attention_mask
from .treeopt import CostProfile

__all__ = ["measure_forward", "measure_profile", "machine_info"]

TARGET_NODES = (1, 2, 4, 8, 16, 32, 64)
DRAFT_NODES = tuple(range(1, 9))


def _context(model) -> int:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(getattr(cfg, "max_position_embeddings", 0) or 1 << 62)


def _vocab(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def _inputs(model, prefix: int, n: int) -> dict:
    """Forward kwargs for n tree tokens over a cache of ``prefix`` entries (the engine's score_tree path).

    The tokens form a star (the root and n - 1 children at depth 1), the shape of the first
    level; the attention cost does not depend on the mask pattern.
    """
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    kw = {"input_ids": (torch.arange(n, device=device) * 7919 % _vocab(model)).view(1, n)}
    if n > 1:
        vis = torch.zeros(n, n, dtype=torch.bool)
        vis[:, 0] = True
        vis[torch.arange(n), torch.arange(n)] = True
        depth = torch.ones(n, dtype=torch.long)
        depth[0] = 0
        kw.update(position_ids=(prefix + depth).to(device).view(1, n),
                  attention_mask=tree_attention_mask(vis, prefix, dtype).to(device))
    return kw


def _timed(model, cache, prefix: int, kw: dict) -> float:
    t0 = time.perf_counter()
    model(cache=cache, use_cache=True, **kw)
    dt = time.perf_counter() - t0
    keep(cache, prefix, torch.zeros(0, dtype=torch.long))
    return dt


def measure_forward(model, cache, prefix: int, ns, *, repeats: int = 5, warmup: int = 1) -> dict:
    """``{n: [seconds of each timed forward]}`` for n tree tokens over ``cache`` (``prefix`` entries).

    Repetitions are interleaved over ``ns`` (round robin after ``warmup`` untimed rounds), so
    a burst of load from other processes spreads over all sizes instead of one.
    """
    kws = {n: _inputs(model, prefix, n) for n in ns}
    times: dict = {n: [] for n in ns}
    with torch.inference_mode():
        for r in range(warmup + repeats):
            for n in ns:
                dt = _timed(model, cache, prefix, kws[n])
                if r >= warmup:
                    times[n].append(dt)
    return times


def _load():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return None


def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import transformers

        tv = transformers.__version__
    except ImportError:  # pragma: no cover
        tv = None
    load = _load()
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "load_average": load,
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": tv}


def measure_profile(target, draft, *, nodes=TARGET_NODES, draft_nodes=DRAFT_NODES, prefix: int = 128,
                    repeats: int = 5, warmup: int = 1, statistic: str = "median",
                    meta: dict | None = None) -> CostProfile:
    """Seconds (``statistic`` 'median' or 'min' of the repeats) of one target forward per n in ``nodes``
    and one draft level per m in ``draft_nodes``; every sample is kept in ``meta['samples']``.

    On a shared machine 'min' estimates the uncontended cost; the median what a decode under
    the current load sees (``meta['load_average']`` records the load).
    """
    nodes = sorted({int(n) for n in nodes})
    draft_nodes = sorted({int(m) for m in draft_nodes})
    if not nodes or nodes[0] < 1 or not draft_nodes or draft_nodes[0] < 1:
        raise ValueError("nodes and draft_nodes must be non-empty lists of integers >= 1")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    if prefix < 1:
        raise ValueError(f"prefix must be >= 1 token, got {prefix}")
    pick = {"median": statistics.median, "min": min}.get(statistic)
    if pick is None:
        raise ValueError(f"statistic must be 'median' or 'min', got {statistic!r}")
    out, raw = {}, {}
    load0 = _load()
    for name, model, ns in (("target", target, nodes), ("draft", draft, draft_nodes)):
        ctx = _context(model)
        if prefix + 1 + ns[-1] > ctx:
            raise ValueError(f"prefix: {prefix} prompt tokens + {ns[-1]} tree tokens exceed the {name}'s "
                             f"context of {ctx}")
        V = _vocab(model)
        ids = (torch.arange(prefix, device=next(model.parameters()).device) * 31 % V).view(1, prefix)
        with torch.inference_mode():
            cache, _ = fresh_prefill(model, ids)
        samples = measure_forward(model, cache, prefix, ns, repeats=repeats, warmup=warmup)
        out[name] = [pick(samples[n]) for n in ns]
        raw[name] = {str(n): [round(x, 6) for x in samples[n]] for n in ns}
    info = machine_info()
    info.update({"dtype": str(next(target.parameters()).dtype).replace("torch.", ""),
                 "draft_dtype": str(next(draft.parameters()).dtype).replace("torch.", ""),
                 "prefix_tokens": prefix, "repeats": repeats, "warmup": warmup, "statistic": statistic,
                 "load_average_before": load0, "samples": raw,
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    info.update(meta or {})
    return CostProfile(nodes, out["target"], draft_nodes, out["draft"], 0.0, info)
