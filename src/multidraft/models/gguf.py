"""GGUF files of the default pair for llama.cpp: file types, names and places in the cache.

``<cache>/gguf/`` (``cache_dir`` as in :func:`models.assets.cache_root`) holds

* ``<name>.Q4_K_M.gguf``, the default model's slices assembled (:func:`ensure_assembled_gguf`);
* ``<name>.<FTYPE>.gguf``, that file requantized by llama.cpp to a key of
  :data:`GGUF_FTYPES` (``BF16`` for the target, ``Q4_0`` for the fast CPU draft). Writing
  one runs llama.cpp, so it lives in ``decoding.quantize`` (``ensure_gguf``); this module
  only names the files and never imports ``llama_cpp``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from .assets import Log, ModelSpec, assemble_gguf, cache_root, default_spec

__all__ = [
    "GGUF_FTYPES",
    "check_gguf_ftype",
    "gguf_dir",
    "default_gguf",
    "ensure_assembled_gguf",
    "requantized_size",
]

# ftype name -> llama_cpp constant (enum llama_ftype); the 2-D weight matrices get this type,
# 1-D tensors (norms, biases) stay float32
GGUF_FTYPES = {
    "f32": "LLAMA_FTYPE_ALL_F32",
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
}
# bytes per weight for the disk-space bound; q4_0 is bounded by 1 byte (llama.cpp keeps the
# output / embedding matrix in a wider type such as Q8_0 or Q6_K)
_FTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "q4_0": 1}


def check_gguf_ftype(ftype, name: str = "ftype", *, none_ok: bool = False) -> str | None:
    """``ftype`` as a key of :data:`GGUF_FTYPES` (case-insensitive); None stays None. A
    ``ValueError`` naming ``name`` (an argument or a CLI flag) otherwise."""
    if ftype is None:
        return None
    key = str(ftype).lower()
    if key not in GGUF_FTYPES:
        raise ValueError(f"{name} must be {'None or ' if none_ok else ''}one of {', '.join(sorted(GGUF_FTYPES))}, "
                         f"got {ftype!r}")
    return key


def gguf_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """``<cache>/gguf``, where the default pair's GGUF files live."""
    return cache_root(cache_dir) / "gguf"


def default_gguf(spec_or_name: ModelSpec | str, ftype: str | None = None,
                 cache_dir: str | os.PathLike | None = None) -> Path:
    """Where a default model's GGUF lives (made or not): the assembled Q4_K_M file for
    ``ftype=None``, else its requantization to ``ftype`` (a key of :data:`GGUF_FTYPES`)."""
    spec = default_spec(spec_or_name)
    key = check_gguf_ftype(ftype, none_ok=True)
    return gguf_dir(cache_dir) / (spec.gguf_name if key is None else spec.requantized_name(key))


def ensure_assembled_gguf(
    spec_or_name: ModelSpec | str,
    *,
    cache_dir: str | os.PathLike | None = None,
    search_path: Sequence[str | os.PathLike] | None = None,
    verify: bool = False,
    log: Log | None = None,
) -> Path:
    """``<cache>/gguf/<name>.Q4_K_M.gguf``, the default model's slices assembled when missing
    (:func:`models.assets.assemble_gguf`). A file already there with the right size is trusted
    (files are renamed into place only after their sha256 matched; ``models.hf.ensure_model``
    deletes it after conversion unless ``keep_gguf``, and then it is assembled again here);
    ``verify=True`` re-hashes it."""
    spec = default_spec(spec_or_name)
    q4 = default_gguf(spec, None, cache_dir)
    if q4.is_file() and q4.stat().st_size == spec.size and not verify:
        return q4
    return assemble_gguf(spec, q4, search_path=search_path, log=log)


def requantized_size(src: str | os.PathLike, ftype: str) -> int:
    """Upper bound on the bytes of ``src`` requantized to ``ftype``: a Q4_K_M file holds at
    least 4.5 bits per weight (the default target: bound 3.97 GB, actual 3.56 GB for BF16).
    A bound, not the tensor table, because gguf-py needs ~7 s to parse a Qwen vocabulary."""
    return int(Path(src).stat().st_size * max(1.0, 8 * _FTYPE_BYTES[ftype] / 4.5))
