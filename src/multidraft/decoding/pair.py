"""``load_pair(engine, ...)``: the target and draft model for one decoding engine, loaded once.

Every command and benchmark that decodes loads its pair here:

* ``"transformers"``: Hugging Face causal LMs from local directories or ``.gguf`` files
  (``models.resolve_pair``: the default pair converted once to bf16 safetensors where an
  argument is None; one shared vocabulary checked); ``dtype`` their weight type;
  ``n_threads`` sets torch's thread count before anything loads;
* ``"llama.cpp"``: :class:`decoding.llamacpp.LlamaCppModel` objects on GGUF files (the
  default pair's Q4_K_M files where an argument is None, made by
  :func:`decoding.quantize.ensure_gguf`); ``bf16_target`` takes the default target's BF16
  requantisation, ``draft_ftype`` (e.g. ``"q4_0"``, the fast CPU draft) the default draft
  requantized; ``n_threads`` / ``n_ctx`` are each model's llama.cpp threads and context.

Both return ``(target, draft, tokenizer)``: for llama.cpp the tokenizer is the target
itself (it has ``tokenize``, ``detokenize``, ``chat_prompt``, ``eos_token_ids``). Pass
``draft=False`` to load the target alone (``draft`` is then None).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from ..models.assets import Log, quiet
from ..models.gguf import check_gguf_ftype

__all__ = ["ENGINES", "load_pair"]

ENGINES = ("transformers", "llama.cpp")


def load_pair(
    engine: str = "transformers",
    *,
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None | bool = None,
    dtype: torch.dtype | None = None,
    bf16_target: bool = False,
    draft_ftype: str | None = None,
    n_threads: int | None = None,
    n_ctx: int = 4096,
    cache_dir: str | os.PathLike | None = None,
    log: Log | None = None,
):
    """``(target, draft, tokenizer)`` for ``engine`` (one of :data:`ENGINES`); see the module
    docstring. Options of the other engine are refused with a ``ValueError`` naming them:
    ``dtype`` is transformers' (default ``torch.bfloat16``), ``bf16_target``,
    ``draft_ftype`` and ``n_ctx`` llama.cpp's. ``draft=False``: the target alone."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1):
        raise ValueError(f"n_threads must be a positive integer or None, got {n_threads!r}")
    if engine == "llama.cpp":
        if dtype is not None:
            raise ValueError("dtype applies to the transformers engine only (llama.cpp runs the GGUF's own types)")
        target_model, draft_model = _llama_pair(target, draft, bf16_target=bf16_target, draft_ftype=draft_ftype,
                                                n_threads=n_threads, n_ctx=n_ctx, cache_dir=cache_dir, log=log)
        return target_model, draft_model, target_model
    for name, val in (("bf16_target", bf16_target), ("draft_ftype", draft_ftype)):
        if val not in (None, False):
            raise ValueError(f"{name} applies to the llama.cpp engine only")
    dtype = torch.bfloat16 if dtype is None else dtype
    if n_threads is not None:
        torch.set_num_threads(n_threads)
    from .. import models  # looked up at call time (tests replace models.resolve_pair)

    if draft is False:
        target_model, tokenizer = _hf_target(models, target, dtype, cache_dir, log)
        return target_model, None, tokenizer
    return models.resolve_pair(target, draft, dtype, cache_dir=cache_dir, log=log)


def _hf_target(models, target, dtype, cache_dir, log):
    """The transformers target alone (the default target converted once where ``target`` is None)."""
    if target is not None and not Path(target).expanduser().exists():
        raise FileNotFoundError(f"target: model path {target} does not exist (a local model directory or .gguf file)")
    path = models.ensure_model(models.DEFAULT_TARGET, cache_dir, log=log) if target is None else target
    t0 = time.perf_counter()
    model, tok = models.load_model(path, dtype)
    quiet(log)(f"loaded target {Path(path).name} in {time.perf_counter() - t0:.1f} s")
    return model, tok


def _llama_pair(target, draft, *, bf16_target, draft_ftype, n_threads, n_ctx, cache_dir, log):
    """``(target, draft)`` as :class:`LlamaCppModel` objects from GGUF files (the arguments are
    :func:`load_pair`'s, passed on).

    ``None`` means the default pair's Q4_K_M file (:func:`decoding.quantize.ensure_gguf`);
    ``bf16_target`` takes the default target's BF16 requantisation instead (an explicit
    ``target`` path and ``bf16_target`` together are refused); ``draft_ftype`` likewise takes
    the default draft requantized (an explicit ``draft`` path and ``draft_ftype`` together are
    refused). ``draft=False``: no draft (target alone). The two must share one vocabulary size.
    """
    from .llamacpp import LlamaCppModel, import_llama_cpp
    from .quantize import ensure_gguf

    if target is not None and bf16_target:
        raise ValueError("bf16_target applies to the default target only; give either a target path or bf16_target")
    if draft_ftype is not None and draft is not None:
        raise ValueError("draft_ftype applies to the default draft only; give either a draft path or draft_ftype")
    draft_ftype = check_gguf_ftype(draft_ftype, "draft_ftype")
    for name, path in (("target", target), ("draft", draft)):
        if path not in (None, False) and not Path(path).expanduser().is_file():
            raise FileNotFoundError(f"{name}: no GGUF file at {path} (the llama.cpp engine reads .gguf files)")
    import_llama_cpp()
    t_path = Path(target).expanduser() if target is not None else ensure_gguf("target", bf16=bf16_target, cache_dir=cache_dir, log=log)
    d_path = None if draft is False else (Path(draft).expanduser() if draft is not None else ensure_gguf("draft", ftype=draft_ftype, cache_dir=cache_dir, log=log))
    say = quiet(log)
    t0 = time.perf_counter()
    t = LlamaCppModel(t_path, n_threads=n_threads, n_ctx=n_ctx)
    d = LlamaCppModel(d_path, n_threads=n_threads, n_ctx=n_ctx) if d_path is not None else None
    say(f"llama.cpp: loaded target {t_path.name}" + (f" and draft {d_path.name}" if d else "")
        + f" in {time.perf_counter() - t0:.1f} s ({t.n_threads} threads)")
    if d is not None and d.vocab_size != t.vocab_size:
        raise ValueError(f"draft {d_path.name} has {d.vocab_size} tokens but target {t_path.name} has "
                         f"{t.vocab_size}; they must share one tokenizer")
    return t, d
