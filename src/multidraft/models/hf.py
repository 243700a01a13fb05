"""Hugging Face (transformers) models: GGUF -> bf16 safetensors conversion and local loading.

:func:`ensure_default_models` converts each GGUF of the default pair (``models.assets``)
once to bfloat16 safetensors (model and tokenizer, ``save_pretrained``) in the cache, so
later loads take seconds instead of a minute of dequantisation. ``<cache>/<name>/`` holds a
converted model; ``multidraft-model.json`` in it marks a finished conversion (written last)
and records the GGUF sha256 it came from.

Nothing here touches the network: every load is ``local_files_only=True`` with
``HF_HUB_OFFLINE=1``. Nothing here prints: long steps report through an optional
``log(message)`` callable (the CLI passes one that writes to stderr).

Vocabulary. The token-level verifiers compare ``p`` and ``q`` over one vocabulary of size
``V``, so :func:`resolve_pair` requires the two models to share a tokenizer (same
token -> id map and special tokens) and uses ``V = config.vocab_size`` (the logits width).
When the two models' embedding tables have different row counts but both cover every
tokenizer id, the extra rows are padding that no tokenizer id maps to: the larger model's
embeddings are trimmed to the smaller row count (``resize_token_embeddings``), which drops
only the logits of those unused ids, and this is recorded in ``config.multidraft_trimmed_vocab``.
Otherwise the pair is refused with a ``ValueError`` naming the model at fault.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Sequence

import torch

from .. import _optional
from .assets import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    SPACE_MARGIN,
    Log,
    ModelSpec,
    assemble_gguf,
    cache_root,
    check_space,
    find_parts,
    quiet,
)

__all__ = [
    "convert_gguf",
    "ensure_model",
    "ensure_default_models",
    "default_models_installed",
    "load_model",
    "resolve_pair",
    "check_same_vocabulary",
]

_STAMP = "multidraft-model.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tokenizer_config.json")
# bf16 safetensors of a Q4_K_M model take about 3.6x the GGUF bytes; keep a margin
_CONVERTED_RATIO = 3.8


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _transformers():
    _optional.require("transformers", "multidraft.decoding")
    _offline()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM, AutoTokenizer


def _load_gguf(path: Path, dtype: torch.dtype):
    """Dequantise a GGUF file into a plain dense model (every weight unpacked) and its tokenizer.

    transformers marks a model loaded from GGUF as quantized, which blocks
    ``save_pretrained`` even when every weight was unpacked; once no packed GGUF layer is
    left the quantizer is detached, so the result is an ordinary model.
    """
    AutoModelForCausalLM, AutoTokenizer = _transformers()
    from transformers import GgufConfig

    kw = dict(gguf_file=path.name, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(path.parent), **kw)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), dtype=dtype, quantization_config=GgufConfig(gguf_file=path.name, dequantize=True), **kw
    )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        if getattr(quantizer, "packed_modules", None):
            raise RuntimeError(f"{path.name}: transformers kept {len(quantizer.packed_modules)} weights packed; cannot convert")
        quantizer.remove_quantization_config(model)
    return model, tok


def _is_converted(directory: Path) -> bool:
    return (directory / _STAMP).is_file() and (directory / "config.json").is_file()


def convert_gguf(
    gguf_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    dtype: torch.dtype = torch.bfloat16,
    source_sha256: str | None = None,
    log: Log | None = None,
) -> Path:
    """Dequantise a GGUF file once and save model + tokenizer (safetensors) in ``out_dir``.

    Written to a sibling temporary directory and renamed when complete; the stamp file
    ``multidraft-model.json`` marks a finished conversion.
    """
    say = quiet(log)
    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf_path}")
    check_space(out_dir.parent, int(gguf_path.stat().st_size * _CONVERTED_RATIO) + SPACE_MARGIN,
                 f"converting {gguf_path.name} to {dtype}")
    tmp = out_dir.with_name(out_dir.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    t0 = time.perf_counter()
    say(f"converting {gguf_path.name} to {str(dtype).replace('torch.', '')} safetensors (dequantising; about a minute per model on 2 cores)")
    model, tok = _load_gguf(gguf_path, dtype)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    info = {
        "source": gguf_path.name,
        "source_sha256": source_sha256,
        "dtype": str(dtype).replace("torch.", ""),
        "vocab_size": int(model.config.vocab_size),
        "tokenizer_size": len(tok),
        "converted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (tmp / _STAMP).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    del model
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    say(f"saved {out_dir} ({info['seconds']} s)")
    return out_dir


def ensure_model(
    spec: ModelSpec,
    cache_dir: str | os.PathLike | None = None,
    *,
    search_path: Sequence[str | os.PathLike] | None = None,
    keep_gguf: bool = False,
    log: Log | None = None,
) -> Path:
    """Directory of the converted ``spec`` model, assembling and converting it if needed."""
    root = cache_root(cache_dir)
    out = root / spec.name
    if _is_converted(out):
        return out
    gguf = assemble_gguf(spec, root / "gguf" / spec.gguf_name, search_path=search_path, log=log)
    convert_gguf(gguf, out, source_sha256=spec.sha256, log=log)
    if not keep_gguf:
        gguf.unlink(missing_ok=True)  # the slices stay in site-packages; a rebuild reassembles
    return out


def ensure_default_models(cache_dir: str | os.PathLike | None = None, *, log: Log | None = None) -> tuple[Path, Path]:
    """``(target_dir, draft_dir)`` of the default pair, ready for :func:`load_model`."""
    draft = ensure_model(DEFAULT_DRAFT, cache_dir, log=log)
    target = ensure_model(DEFAULT_TARGET, cache_dir, log=log)
    return target, draft


def default_models_installed(cache_dir: str | os.PathLike | None = None) -> tuple[bool, str]:
    """(available, reason): the default pair is converted in the cache or its parts are installed."""
    root = cache_root(cache_dir)
    for spec in (DEFAULT_TARGET, DEFAULT_DRAFT):
        if _is_converted(root / spec.name):
            continue
        try:
            find_parts(spec)
        except FileNotFoundError as exc:
            return False, str(exc)
    try:
        _transformers()
    except ImportError as exc:
        return False, str(exc)
    return True, ""


def load_model(path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16):
    """``(model, tokenizer)`` from a local Hugging Face model directory or a ``.gguf`` file.

    Local files only (never the hub). The model is in eval mode. A ``.gguf`` file is
    dequantised on every load (slow); convert it once with :func:`convert_gguf`.
    """
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype, got {dtype!r}")
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model path {p} does not exist (a local model directory or .gguf file is required)")
    AutoModelForCausalLM, AutoTokenizer = _transformers()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ValueError(f"model path {p} is a file but not a .gguf file; give a model directory or a .gguf file")
        model, tok = _load_gguf(p, dtype)
    else:
        if not (p / "config.json").is_file():
            ggufs = sorted(p.glob("*.gguf"))
            if len(ggufs) == 1:
                return load_model(ggufs[0], dtype)
            raise FileNotFoundError(
                f"{p} is not a Hugging Face model directory (no config.json)"
                + (f"; it holds several .gguf files, pick one: {', '.join(g.name for g in ggufs)}" if ggufs else "")
            )
        if not any((p / f).is_file() for f in _TOKENIZER_FILES):
            raise FileNotFoundError(f"{p}: no tokenizer files (none of {', '.join(_TOKENIZER_FILES)})")
        try:
            tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise FileNotFoundError(f"{p}: no usable tokenizer files ({exc})") from None
        try:
            model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, local_files_only=True)
        except OSError as exc:
            raise FileNotFoundError(f"{p}: cannot load the model weights ({exc})") from None
    model.eval()
    return model, tok


def _vocab_signature(tok) -> tuple:
    special = tuple(sorted((str(k), str(v)) for k, v in getattr(tok, "special_tokens_map", {}).items()))
    return tok.get_vocab(), special


def check_same_vocabulary(target, draft, target_tok, draft_tok=None) -> int:
    """Check that target and draft can be verified token by token; returns the common ``V``.

    Requires identical tokenizers (token -> id map and special tokens) and equal
    ``config.vocab_size``, or different sizes that both cover every tokenizer id, in which
    case the larger model's embeddings are trimmed (see the module docstring).
    """
    if draft_tok is not None and draft_tok is not target_tok:
        tv, ts = _vocab_signature(target_tok)
        dv, ds = _vocab_signature(draft_tok)
        if tv != dv:
            only_t = len(set(tv) - set(dv))
            only_d = len(set(dv) - set(tv))
            moved = sum(1 for k in set(tv) & set(dv) if tv[k] != dv[k])
            raise ValueError(
                "draft: its tokenizer differs from the target's "
                f"({len(dv)} vs {len(tv)} tokens; {only_d} only in the draft, {only_t} only in the target, "
                f"{moved} with different ids); speculative decoding needs one shared vocabulary"
            )
        if ts != ds:
            raise ValueError(f"draft: its special tokens {dict(ds)} differ from the target's {dict(ts)}")
    vt = int(target.config.vocab_size) if hasattr(target, "config") else None
    vd = int(draft.config.vocab_size) if hasattr(draft, "config") else None
    if vt is None or vd is None:
        raise ValueError("target and draft must be causal LMs with a config.vocab_size")
    n_tok = len(target_tok)
    if vt == vd:
        if vt < n_tok:
            raise ValueError(f"target: config.vocab_size {vt} is smaller than its tokenizer ({n_tok} tokens)")
        return vt
    small, big, big_name = (vt, draft, "draft") if vt < vd else (vd, target, "target")
    if small < n_tok:
        name = "target" if vt < vd else "draft"
        raise ValueError(
            f"{name}: config.vocab_size {small} does not cover the {n_tok} tokenizer ids "
            f"(target {vt}, draft {vd}); the models do not share a vocabulary"
        )
    big.resize_token_embeddings(small)
    big.config.multidraft_trimmed_vocab = {"from": max(vt, vd), "to": small, "model": big_name}
    return small


def resolve_pair(
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.bfloat16,
    *,
    cache_dir: str | os.PathLike | None = None,
    log: Log | None = None,
):
    """``(target_model, draft_model, tokenizer)``; the default pair where an argument is None.

    Both models are loaded from local paths (see :func:`load_model`) and checked to share
    one vocabulary (:func:`check_same_vocabulary`); ``ValueError`` names the one at fault.
    """
    for name, path in (("target", target), ("draft", draft)):
        if path is not None and not Path(path).expanduser().exists():
            raise FileNotFoundError(f"{name}: model path {path} does not exist (a local model directory or .gguf file)")
    if target is None or draft is None:
        t_dir, d_dir = ensure_default_models(cache_dir, log=log)
        target = t_dir if target is None else target
        draft = d_dir if draft is None else draft
    say = quiet(log)
    t0 = time.perf_counter()
    target_model, target_tok = load_model(target, dtype)
    draft_model, draft_tok = load_model(draft, dtype)
    say(f"loaded target {Path(target).name} and draft {Path(draft).name} in {time.perf_counter() - t0:.1f} s")
    check_same_vocabulary(target_model, draft_model, target_tok, draft_tok)
    return target_model, draft_model, target_tok
