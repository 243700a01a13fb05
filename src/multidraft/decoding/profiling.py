"""Measure a :class:`~multidraft.decoding.treeopt.CostProfile` for a model pair on this machine.

Engine-agnostic: both models are timed through their *runner* (``runners.runner_for``:
``HFRunner`` for transformers, ``llamacpp.LlamaRunner`` for llama.cpp), i.e. through the very
calls the decoder makes. Each model's runner prefills a ``prefix``-token prompt once
(``runner.prefill``); then every timed forward is one ``runner.extend`` of n tokens shaped as a
star (the root at position ``prefix`` and n - 1 children at ``prefix + 1``, parents
``[-1, 0, 0, ...]``: the first level of a tree; the cost does not depend on the mask pattern)
with logits for every token, followed by an untimed ``runner.commit([])`` that rolls the cache
back to the prefix, so every forward sees the same prefix length.

The target point n is one target forward over n tree tokens (what ``step.score_tree``
costs, n = 1 being the target alone); the draft point m is one draft level of m nodes. Each
point is the median (or minimum) of ``repeats`` timed forwards after ``warmup`` untimed
rounds, interleaved over the sizes.

The points are the models' time only; a decoding step also pays the decoder's own work
(logits processing, sampling, verification, cache bookkeeping, Python). To price it,
:func:`measure_overhead` decodes with the real engine (the target alone and two single-draft
chains; before the points, whose prefill then leaves each cache holding the prefix only) and
:func:`treeopt.fit_overhead` fits what those steps took beyond the points as a per-step and a
per-node term.
"""
from __future__ import annotations

import ctypes
import statistics
import time
from dataclasses import replace

import torch

from .. import _optional
from .._machine import SPEED_FLAGS, load_average, provenance  # noqa: F401 (SPEED_FLAGS: re-exported)
from .runners import runner_for
from .treeopt import CostProfile, fit_overhead

__all__ = ["measure_forward", "measure_overhead", "measure_profile", "machine_info", "engine_info"]

TARGET_NODES = (1, 2, 4, 8, 16, 32, 64)
DRAFT_NODES = tuple(range(1, 9))
OVERHEAD_DEPTHS = (0, 2, 4)   # the target alone and two chains: per step and per node


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


def machine_info() -> dict:
    """The machine of a timing: ``_machine.provenance()`` (CPU model, its ``SPEED_FLAGS``, cores,
    threads, load average, platform, versions) with the keys profiles have always had beside it
    (``python``, ``torch``, ``transformers``: the installed version, imported or not)."""
    p = provenance(also=("transformers",) if _optional.available("transformers") else ())
    v = p["versions"]
    return {**p, "python": v["python"], "torch": torch.__version__, "transformers": v.get("transformers")}


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
        llama_cpp = _optional.require("llama_cpp")
        return {"engine": engine, "dtype": _gguf_type(target), "draft_dtype": _gguf_type(draft),
                "target_file": target.path.name, "draft_file": draft.path.name,
                "llama_cpp_python": getattr(llama_cpp, "__version__", None),
                "threads": target.n_threads, "draft_threads": draft.n_threads}
    dt = lambda m: str(next(m.parameters()).dtype).replace("torch.", "")  # noqa: E731
    return {"engine": engine, "dtype": dt(target), "draft_dtype": dt(draft), "threads": torch.get_num_threads()}


def runner_engine(model) -> str:
    return "llama.cpp" if getattr(model, "engine", None) == "llama.cpp" else "transformers"


def measure_overhead(target, draft, *, prompt=None, prefix: int = 128, tokens: int = 64, depths=OVERHEAD_DEPTHS,
                     seed: int = 0) -> list[dict]:
    """Timed decodes of the real engine (``engine.generate``, T = 1) of ``prompt`` (LongTensor
    ``[1, T]``; default a synthetic ``prefix``-token one): the target alone (depth 0) and
    single-draft chains of each depth in ``depths``, ``tokens`` new tokens each after an
    untimed 4-token warm-up. ``[{"depth", "steps", "seconds", "new_tokens"}]``, for
    :func:`treeopt.fit_overhead`. A real prompt gives the draft its real acceptance, and with it
    the real share of steps whose next draft call carries two tokens.
    """
    from .engine import generate

    vocab = runner_for(target).vocab_size
    ids = (torch.arange(prefix) * 31 % vocab).view(1, prefix) if prompt is None else prompt
    runs = []
    for d in depths:
        kw = {"verifier": "naive", "k": 1, "depth": d} if d > 0 else {"verifier": None}
        dm = draft if d > 0 else None
        generate(target, dm, ids, temperature=1.0, max_new_tokens=4, generator=seed, **kw)
        r = generate(target, dm, ids, temperature=1.0, max_new_tokens=tokens, generator=seed, **kw)
        runs.append({"depth": d, "steps": r.target_calls, "seconds": round(r.seconds, 6), "new_tokens": r.new_tokens})
    return runs


def measure_profile(target, draft, *, nodes=TARGET_NODES, draft_nodes=DRAFT_NODES, prefix: int = 128,
                    repeats: int = 5, warmup: int = 1, statistic: str = "median",
                    overhead_tokens: int = 64, overhead_prompt=None, meta: dict | None = None) -> CostProfile:
    """Seconds (``statistic`` 'median' or 'min' of the repeats) of one target forward per n in ``nodes``
    and one draft level per m in ``draft_nodes``; every sample is kept in ``meta['samples']``.
    With ``overhead_tokens > 0`` the decoder's own time per step and per node is then fitted
    (:func:`treeopt.fit_overhead`) to :func:`measure_overhead`'s decodes of that many tokens
    (of ``overhead_prompt``, LongTensor ``[1, T]``, cut to its last tokens where a model's
    context is too short for it and the decodes, or a synthetic prompt), kept in
    ``meta['overhead']``; 0 leaves both at 0.

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
    if isinstance(overhead_tokens, bool) or not isinstance(overhead_tokens, int) or overhead_tokens < 0:
        raise ValueError(f"overhead_tokens must be an integer >= 0, got {overhead_tokens!r}")
    info = engine_info(target, draft)
    runs = {"target": runner_for(target), "draft": runner_for(draft)}
    cut = None
    for name, ns in (("target", nodes), ("draft", draft_nodes)):
        ctx = runs[name].context
        if prefix + 1 + ns[-1] > ctx:
            raise ValueError(f"prefix: {prefix} prompt tokens + {ns[-1]} tree tokens exceed the {name}'s "
                             f"context of {ctx}")
        room = ctx - overhead_tokens - max(OVERHEAD_DEPTHS) - 1   # prompt tokens the decodes leave room for
        if overhead_tokens and (prefix if overhead_prompt is None else 1) > room:
            raise ValueError(f"overhead_tokens: {prefix if overhead_prompt is None else 1} prompt tokens + "
                             f"{overhead_tokens} decoded tokens exceed the {name}'s context of {ctx}")
        if overhead_tokens and overhead_prompt is not None and overhead_prompt.shape[-1] > room:
            overhead_prompt = overhead_prompt[:, -room:]   # a short context: the prompt's last tokens
            cut = room
    out, raw = {}, {}
    load0 = load_average()
    # the calibration decodes first: the points' prefill below leaves each cache holding the prefix only
    decodes = (measure_overhead(target, draft, prompt=overhead_prompt, prefix=prefix, tokens=overhead_tokens)
               if overhead_tokens else None)
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
    prompt_name = info.pop("overhead_prompt", None) or (
        f"synthetic, {prefix} tokens" if overhead_prompt is None else f"{overhead_prompt.shape[-1]} tokens")
    if cut is not None:
        prompt_name += f", cut to its last {cut} to fit the context"
    profile = CostProfile(nodes, out["target"], draft_nodes, out["draft"], 0.0, info)
    if decodes is None:
        return profile
    per_step, per_node = fit_overhead(profile, decodes)
    info["overhead"] = {"tokens": overhead_tokens, "temperature": 1.0, "verifier": "naive", "runs": decodes,
                        "prompt": prompt_name,
                        "model": "residual = w / s - models' step time = per_step + per_node * depth, "
                                 "least squares, both >= 0"}
    return replace(profile, per_step_seconds=per_step, per_node_seconds=per_node, meta=info)
