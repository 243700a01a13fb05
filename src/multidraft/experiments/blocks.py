"""Blocks experiment: end-to-end block efficiency vs K and depth per verifier.

For each prompt (HumanEval by default), verifier, draft law, K and depth,
``multidraft.generate`` decodes ``max_new_tokens`` tokens; one JSONL row per run with block
efficiency (tokens per target forward pass), acceptance rate, target/draft calls and
tokens/s. A target-only run of the same engine (``verifier=None``: one token per target
call, KV cache) per prompt gives the tokens/s baseline (``verifier = "autoregressive"``,
K = depth = 0). The runs go through the one decode runner (:mod:`.decode_runs`: its seed rule,
row schema and interleaving); each prompt's prefill runs once (``PromptCache``) and is left
out of tokens/s. Rows are keyed by ``KEY``; a rerun writes only the missing ones.

Tree shapes: the full K-ary tree of each depth (default), or with ``budget`` = B the
``sequences`` trees of Khisti et al.'s and SpecTr's experiments at equal tree budget: K draft
sequences of length L = B // K (at most B draft nodes), one depth per K.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from .. import verifiers as _verifiers
from ..datasets import load_prompts, prompt_ids
from . import decode_runs
from .decode_runs import AUTOREGRESSIVE
from .records import JsonlWriter, lock_run_dir, resume, row_key

__all__ = ["KEY", "run"]

KEY = ("verifier", "law", "K", "depth", "temperature", "prompt")
# config keys that only choose which rows exist (rows carry them in KEY): may grow on a resume
KEYED = ("verifiers", "laws", "k", "depths", "temperature", "no_baseline")


def run(
    run_dir: str | Path,
    *,
    models: Callable[[], tuple],
    model_names: dict,
    verifiers: Sequence[str],
    laws: Sequence[str] | None,
    ks: Sequence[int],
    depths: Sequence[int],
    n_prompts: int = 2,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    draft_temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    max_prompt_tokens: int | None = None,
    seed: int = 0,
    config: dict,
    baseline: bool = True,
    budget: int | None = None,
    dataset: str = "humaneval",
    log: Callable[[str], None] = lambda _m: None,
    progress=None,
) -> Path:
    """Run the missing (prompt, verifier, law, K, depth) cells into ``RUN_DIR/blocks.jsonl``.

    ``laws=None`` gives each verifier the law it implies (``Verifier.implied_law``); with a
    list, each verifier runs the listed laws it is lossless for at each K. ValueError (naming
    the laws that would work) when no cell is left. ``budget``: equal-budget ``sequences``
    trees (``depths`` is then ignored: depth = budget // K).
    """
    if budget is not None and (int(budget) < 1 or any(int(k) > int(budget) for k in ks)):
        raise ValueError(f"budget must be >= every K (K sequences of length budget // K), got budget={budget}, K={list(ks)}")
    tree = "sequences" if budget is not None else None
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if any(int(d) < 1 for d in depths):
        raise ValueError(f"depths must be >= 1, got {list(depths)}")
    cells = []
    for name in verifiers:
        v = _verifiers.get(name)
        for k in ks:
            here = v.laws_for(k)
            for law in (laws if laws is not None else [v.implied_law(k)] if here else []):
                if law in here:
                    for depth in ([int(budget) // int(k)] if budget is not None else depths):
                        cells.append((name, law, int(k), int(depth)))
    if not cells:
        lf = {name: _verifiers.get(name).laws_for for name in verifiers}
        works = "; ".join(f"{name}: " + (", ".join(f"K={k} {'/'.join(lf[name](k))}" for k in ks if lf[name](k))
                                         or "none at these K") for name in verifiers)
        raise ValueError(f"laws: no (verifier, law, K) combination is supported for laws {list(laws or [])} "
                         f"and K in {list(ks)}; laws that would work: {works}")
    methods = [decode_runs.target_alone(AUTOREGRESSIVE, temperature=temperature, top_k=top_k, top_p=top_p)] \
        if baseline else []
    methods += [decode_runs.tree_method(f"{name} {law} K={k} depth {depth}", name, k, depth, law=law, tree=tree,
                                        temperature=temperature, draft_temperature=draft_temperature, top_k=top_k,
                                        top_p=top_p) for name, law, k, depth in cells]
    decode_runs.check_methods(methods, max_new_tokens=max_new_tokens)  # every argument, before any model loads
    prompts = load_prompts(dataset, n_prompts, seed=seed)
    path = Path(run_dir) / "blocks.jsonl"
    with lock_run_dir(run_dir):  # one process per run directory
        done = resume(path, config, seed, key_fields=KEY, keyed=KEYED)  # refuses another run's file

        def finished(pid: str, m) -> bool:
            return row_key(_key(pid, m), KEY) in done

        todo = [(pid, text) for pid, text in prompts if not all(finished(pid, m) for m in methods)]
        if not todo:
            return path
        target, draft, tokenizer = models()
        encoded = []
        for pid, text in todo:
            ids = prompt_ids(tokenizer, dataset, text)
            if max_prompt_tokens is not None:
                ids = ids[:, -int(max_prompt_tokens):]  # keep the end of the prompt (the function header)
            encoded.append((pid, ids))
        with JsonlWriter(path, config, seed, keyed=KEYED, models=model_names) as w:
            decode_runs.run(target, draft, encoded, methods, seed=seed, max_new_tokens=max_new_tokens, skip=finished,
                            write=lambda row: w.write(**row), progress=progress, desc="blocks", log=log)
        return path


def _key(pid: str, m) -> dict:
    return {"verifier": m.verifier or AUTOREGRESSIVE, "law": m.row_law, "K": m.k, "depth": m.depth,
            "temperature": float(m.temperature), "prompt": pid}
