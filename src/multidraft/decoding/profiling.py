"""Measure a :class:`~multidraft.decoding.treeopt.CostProfile` for a model pair on this machine.

Engine-agnostic: both models are timed through their *runner* (``runners.runner_for``:
``HFRunner`` for transformers, ``llamacpp.LlamaRunner`` for llama.cpp), i.e. through the very
calls the decoder makes. Each model's runner prefills a ``prefix``-token prompt once
(``runner.prefill``); then every timed forward is one ``runner.extend`` of n tokens shaped as a
star (the root at position ``prefix`` and n - 1 children at ``prefix + 1``, parents
``[-1, 0, 0, ...]``: the first level of a tree; the cost does not depend on the mask pattern)
with logits for every token, followed by an untimed ``runner.commit([])`` that rolls the cache
back to the prefix, so every forward sees the same prefix length.

The target point n is one target forward over n tree tokens (what ``engine.score_tree``
costs, n = 1 being the target alone); the draft point m is one draft level of m nodes. Each
point is the median (or minimum) of ``repeats`` timed forwards after ``warmup`` untimed
rounds, interleaved over the sizes.
"""
from __future__ import annotations

import ctypes
import os
import platform
import statistics
import time

import torch

from .runners import runner_for
from .treeopt import CostProfile

__all__ = ["measure_forward", "measure_profile", "machine_info", "engine_info"]

TARGET_NODES = (1, 2, 4, 8, 16, 32, 64)
DRAFT_NODES = tuple(range(1, 9))


def star(n: int, vocab: int) -> tuple[list[int], list[int]]:
    """``(tokens, parents)`` of a star of n tree tokens: the root (parent -1, the end of the
    prefix) and n - 1 children of it; token ids spread over the vocabulary."""
    return [i * 7919 % vocab for i in range(n)], [-1] + [0] * (n - 1)


def measure_forward(runner, ns, *, repeats: int = 5, warmup: int = 1) -> dict:
    """``{n: [seconds of each timed forward]}`` for n star-shaped tree tokens (:func:`star`)
    over the prefix already in ``runner`` (``runner.prefill`` done, nothing uncommitted).

    Each forward is ``runner.extend`` (logits for every token), timed alone; the cache goes
    back to the prefix after it (``runner.commit([])``). Repetitions are interleaved over
    ``ns`` (round robin after ``warmup`` untimed rounds), so a burst of load from other
    processes spreads over all sizes instead of one.
    """
    V = runner.vocab_size
    shapes = {n: star(n, V) for n in ns}
    times: dict = {n: [] for n in ns}
    with torch.inference_mode():
        for r in range(warmup + repeats):
            for n in ns:
                toks, parents = shapes[n]
                t0 = time.perf_counter()
                runner.extend(toks, parents)
                dt = time.perf_counter() - t0
                runner.commit([])
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


def _gguf_type(model) -> str:
    """The GGUF's file type as llama.cpp names it (``Q4_K_M``, ``BF16``, ``F32``, ...)."""
    L, buf = model._L, ctypes.create_string_buffer(256)
    if L.llama_model_meta_val_str(model._model, b"general.file_type", buf, len(buf)) > 0:
        try:
            code = int(buf.value)
        except ValueError:
            code = None
        for name in dir(L):
            if name.startswith("LLAMA_FTYPE_") and name != "LLAMA_FTYPE_GUESSED" and getattr(L, name) == code:
                return name.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_").removeprefix("ALL_")
    L.llama_model_desc(model._model, buf, len(buf))  # e.g. "qwen2 1B Q4_K - Medium"
    return buf.value.decode("utf-8", "replace")


def engine_info(target, draft) -> dict:
    """Engine, weight types and engine versions of a pair (the ``meta`` of a profile).

    transformers: ``dtype`` / ``draft_dtype`` (torch dtypes) and ``threads`` (torch's);
    llama.cpp: ``dtype`` / ``draft_dtype`` (GGUF file types), ``target_file`` /
    ``draft_file`` (GGUF file names), ``llama_cpp_python`` (its version) and ``threads``
    (the target's llama.cpp threads; ``draft_threads`` the draft's).
    """
    engines = {runner_engine(target), runner_engine(draft)}
    if len(engines) != 1:
        raise ValueError("target and draft must run on one engine (both transformers models or both "
                         "llama.cpp GGUF models)")
    engine = engines.pop()
    if engine == "llama.cpp":
        import llama_cpp

        return {"engine": engine, "dtype": _gguf_type(target), "draft_dtype": _gguf_type(draft),
                "target_file": target.path.name, "draft_file": draft.path.name,
                "llama_cpp_python": getattr(llama_cpp, "__version__", None),
                "threads": target.n_threads, "draft_threads": draft.n_threads}
    dt = lambda m: str(next(m.parameters()).dtype).replace("torch.", "")  # noqa: E731
    return {"engine": engine, "dtype": dt(target), "draft_dtype": dt(draft), "threads": torch.get_num_threads()}


def runner_engine(model) -> str:
    return "llama.cpp" if getattr(model, "engine", None) == "llama.cpp" else "transformers"


def measure_profile(target, draft, *, nodes=TARGET_NODES, draft_nodes=DRAFT_NODES, prefix: int = 128,
                    repeats: int = 5, warmup: int = 1, statistic: str = "median",
                    meta: dict | None = None) -> CostProfile:
    """Seconds (``statistic`` 'median' or 'min' of the repeats) of one target forward per n in ``nodes``
    and one draft level per m in ``draft_nodes``; every sample is kept in ``meta['samples']``.

    ``target`` and ``draft`` are models of one engine: transformers causal LMs or
    ``llamacpp.LlamaCppModel`` objects (``meta['engine']`` records which). On a shared machine
    'min' estimates the uncontended cost; the median what a decode under the current load
    sees (``meta['load_average']`` records the load). Each model's cache ends holding the
    ``prefix``-token prompt only.
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
    info = engine_info(target, draft)
    runs = {"target": runner_for(target), "draft": runner_for(draft)}
    for name, ns in (("target", nodes), ("draft", draft_nodes)):
        ctx = runs[name].context
        if prefix + 1 + ns[-1] > ctx:
            raise ValueError(f"prefix: {prefix} prompt tokens + {ns[-1]} tree tokens exceed the {name}'s "
                             f"context of {ctx}")
    out, raw = {}, {}
    load0 = _load()
    for name, ns in (("target", nodes), ("draft", draft_nodes)):
        run = runs[name]
        ids = (torch.arange(prefix) * 31 % run.vocab_size).view(1, prefix)
        with torch.inference_mode():
            run.prefill(ids)
        samples = measure_forward(run, ns, repeats=repeats, warmup=warmup)
        out[name] = [pick(samples[n]) for n in ns]
        raw[name] = {str(n): [round(x, 6) for x in samples[n]] for n in ns}
    info = {**machine_info(), **info}
    info.update({"prefix_tokens": prefix, "repeats": repeats, "warmup": warmup, "statistic": statistic,
                 "shape": "star: root + (n - 1) children, logits for every token",
                 "load_average_before": load0, "samples": raw,
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    info.update(meta or {})
    return CostProfile(nodes, out["target"], draft_nodes, out["draft"], 0.0, info)
