"""Requantized GGUF files, written by llama.cpp (the ``llama`` extra).

:func:`requantize_gguf` rewrites any GGUF llama.cpp reads with its weight matrices in one
file type (:data:`models.gguf.GGUF_FTYPES`); :func:`ensure_gguf` keeps the default pair's
files in ``<cache>/gguf/`` (``multidraft setup-models --gguf --bf16-target --draft-ftype
q4_0``): the assembled Q4_K_M file (``models.gguf.ensure_assembled_gguf``), the target's
BF16 requantisation and the draft's Q4_0 one. File names and places are ``models.gguf``'s;
only the writing, which runs llama.cpp, is here.
"""
from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path
from typing import Sequence

from ..models.assets import SPACE_MARGIN, Log, ModelSpec, check_space, default_spec, partial_file, quiet
from ..models.gguf import GGUF_FTYPES, check_gguf_ftype, default_gguf, ensure_assembled_gguf, requantized_size
from .llamacpp import LOG_ERROR, import_llama_cpp, llama_log_to

__all__ = ["requantize_gguf", "ensure_gguf"]


def requantize_gguf(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    ftype: str = "bf16",
    *,
    nthread: int = 0,
    log: Log | None = None,
) -> Path:
    """Write ``src`` (any GGUF llama.cpp reads, quantized or not) to ``dst`` with its weight
    matrices in ``ftype`` (``"bf16"``, ``"f16"``, ``"f32"`` or ``"q4_0"``); returns ``dst``.

    ``"q4_0"`` is for drafts: llama.cpp repacks Q4_0 matrices into its interleaved CPU layout
    (AVX2 / AVX-512), which the default draft's Q4_K_M file mostly cannot use (Qwen2.5-0.5B's
    width 896 is not a multiple of the k-quants' 256-blocks, so 133 of its 170 matrices are
    Q5_0, the rest Q8_0, Q6_K and Q4_K; the Q4_0 file keeps ``output.weight`` in Q8_0).
    Measured on the 2-core EPYC VM, 2 threads (``data/profiles/llama-bf16-q4_0.json`` against
    ``llama-bf16-q4.json``): a draft token costs 13.1 ms against 19.3 ms for the Q4_K_M file
    (a level of 2 nodes 24 against 35 ms, of 4 nodes 34 against 47), with the same block
    efficiency on HumanEval (SD depth 4, 20 prompts x 2 rounds: 3.93 against 3.87,
    ``docs/results/decode_speed``). A draft's precision costs acceptance only, never exactness: the
    verifiers use the q it computes.

    Uses llama.cpp's ``llama_model_quantize`` (``allow_requantize=True``): each quantized
    matrix is dequantised to float32 and rounded to ``ftype``; norms and biases (1-D) stay
    float32; metadata and tokenizer are copied. From the Q4_K_M target this gives the same
    weight values up to bf16 rounding (a dequantised Q4_K/Q6_K value has up to ~20
    significant bits, bf16 keeps 8); ``"f32"`` keeps them exactly. ``nthread`` 0 means every
    core. The file goes to ``dst + '.partial'`` and is renamed when complete.

    Measured for the default target, Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1,117,320,768 bytes,
    169 Q4_K + 29 Q6_K matrices) -> BF16: 3,560,416,320 bytes (3.32 GiB; 198 BF16 matrices,
    ``output.weight`` stored apart from ``token_embd.weight``), 9-13 s on 2 CPU cores
    (13.1 s with a cold page cache), 1.8 GB peak memory. Every BF16 weight is within half a
    bf16 ulp (2^-8 relative) of the dequantised Q4_K/Q6_K value. In llama.cpp the BF16 file's
    next-token distributions (a 13-token code prompt) are within total variation 0.006 on
    average of Hugging Face's float32 forward on the bf16 safetensors of
    :func:`models.hf.convert_gguf`, the Q4_K_M file's 0.08 (llama.cpp's Q4_K kernels also round
    activations to 8 bits; TV 0.8 at the first position).

    Needs the ``llama`` extra (``ImportError`` naming it otherwise). ``OSError`` when the
    disk lacks room for the output (bounded by 3.6x the Q4_K_M size for BF16); ``RuntimeError``
    with llama.cpp's own error text when it refuses the file. While it runs, llama.cpp's
    log (process-wide) is captured, so do not run it concurrently with other llama.cpp work
    that logs.
    """
    say = quiet(log)
    key = str(ftype).lower()
    if key not in GGUF_FTYPES:
        raise ValueError(f"ftype must be one of {sorted(GGUF_FTYPES)}, got {ftype!r}")
    if isinstance(nthread, bool) or not isinstance(nthread, int) or nthread < 0:
        raise ValueError(f"nthread must be a non-negative int (0 = every core), got {nthread!r}")
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise FileNotFoundError(f"no GGUF file at {src}")
    if dst.exists() and dst.resolve() == src.resolve():
        raise ValueError(f"dst must differ from src ({src}); llama.cpp reads the source while writing")
    llama_cpp = import_llama_cpp()
    need = requantized_size(src, key)
    check_space(dst.parent, need + SPACE_MARGIN, f"requantizing {src.name} to {key.upper()}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, GGUF_FTYPES[key])
    params.allow_requantize = True
    params.nthread = nthread
    messages: list[tuple[int, str]] = []
    say(f"requantizing {src.name} to {key.upper()} with llama.cpp")
    t0 = time.perf_counter()
    with partial_file(dst) as tmp:
        with llama_log_to(llama_cpp, messages):
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0 or not tmp.is_file():
            errors = [text for level, text in messages if level == LOG_ERROR] or [text for _, text in messages]
            detail = "; ".join(errors[-3:]) if errors else "no message from llama.cpp"
            raise RuntimeError(f"llama.cpp could not requantize {src} to {key.upper()} "
                               f"(llama_model_quantize returned {rc}): {' '.join(detail.split())}")
    say(f"wrote {dst} ({dst.stat().st_size / 2**30:.2f} GiB, {time.perf_counter() - t0:.1f} s)")
    return dst



def ensure_gguf(
    spec_or_name: ModelSpec | str,
    *,
    bf16: bool = False,
    cache_dir: str | os.PathLike | None = None,
    search_path: Sequence[str | os.PathLike] | None = None,
    verify: bool = False,
    log: Log | None = None,
    ftype: str | None = None,
) -> Path:
    """Path of a default model's GGUF for llama.cpp, made (and cached) when missing.

    ``spec_or_name``: a :class:`ModelSpec`, ``"target"``, ``"draft"`` or a default model's
    cache name. Files live in ``<cache>/gguf/`` (``models.gguf.default_gguf``):

    * ``bf16=False``: ``<name>.Q4_K_M.gguf``, the assembled slices
      (``models.gguf.ensure_assembled_gguf``; ``verify=True`` re-hashes a file already there).
    * ``bf16=True``: ``<name>.BF16.gguf``, the Q4_K_M file requantized by
      :func:`requantize_gguf` (needs the ``llama`` extra, checked before anything is
      assembled); rebuilt only when missing, and the Q4_K_M file it comes from is kept.
    * ``ftype="q4_0"`` (any key of :data:`GGUF_FTYPES`; ``"bf16"`` is ``bf16=True``):
      ``<name>.Q4_0.gguf`` the same way (the fast CPU draft, see :func:`requantize_gguf`).
    """
    spec = default_spec(spec_or_name)
    key = check_gguf_ftype(ftype, none_ok=True)
    if bf16 and key not in (None, "bf16"):
        raise ValueError(f"bf16=True and ftype={ftype!r} disagree; give one of them")
    ftype = "bf16" if bf16 else key
    if ftype is not None:
        out = default_gguf(spec, ftype, cache_dir)
        if out.is_file():
            return out
        import_llama_cpp()
    src = ensure_assembled_gguf(spec, cache_dir=cache_dir, search_path=search_path, verify=verify, log=log)
    if ftype is None:
        return src
    return requantize_gguf(src, out, ftype, log=log)
