"""multidraft: multi-draft speculative sampling done right.

Draft laws (``drafts``), lossless verifiers (``verifiers``), the optimal acceptance
ceiling (``limits``) and exact certificates (``exact``) are pure torch; the decoder on real
language models lives in ``decoding`` (needs the ``models`` extra).
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import drafts, verifiers, exact  # noqa: E402
from . import limits  # noqa: E402
from .exact import certify  # noqa: E402
from .limits import optimal_acceptance  # noqa: E402

__all__ = ["drafts", "verifiers", "exact", "limits", "certify", "optimal_acceptance", "__version__"]


def __getattr__(name):  # lazy: ``import multidraft`` never imports the decoder or transformers
    if name == "generate":
        from .decoding import generate

        return generate
    if name == "decoding":
        import importlib

        return importlib.import_module(".decoding", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
