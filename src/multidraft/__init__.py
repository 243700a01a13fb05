"""multidraft: multi-draft speculative sampling done right.

Draft laws (``drafts``), lossless verifiers (``verifiers``), the optimal acceptance
ceiling (``limits``) and exact certificates (``exact``) are pure torch; the decoder on real
language models lives in ``decoding`` (needs the ``models`` extra).

This package only re-exports, and lazily: ``import multidraft`` imports nothing heavy
(not even torch) until a name is used, so ``multidraft --help`` is instant and Ctrl-C
while torch loads is handled by the command line like any other interrupt.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = ("drafts", "verifiers", "exact", "limits", "sampling", "trees", "datasets", "models", "decoding",
               "experiments")
_NAMES = {"certify": "exact", "optimal_acceptance": "limits", "generate": "decoding", "generate_batch": "decoding",
          "custom_generate": "decoding"}

__all__ = ["drafts", "verifiers", "exact", "limits", "trees", "certify", "optimal_acceptance", "generate", "generate_batch", "custom_generate",
           "__version__"]


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _NAMES:
        return getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES) | set(_NAMES))
