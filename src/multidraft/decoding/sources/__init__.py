"""Draft sources: what proposes the drafts of a step's tree, each stating the law it drew from.

A decode's ``Settings.sources`` is an ordered tuple of sources (the columns of the step's tree
come from them in that order). A source here is a model-free description (a frozen dataclass,
checked once, before any model loads):

- :class:`DraftModel` (``"model"``): at every node its processed distribution ``q`` (one per
  draft column, at that column's temperature) is the law the node's drafts are drawn from, by
  the settings' draft law; the drafting itself is the engine's (``decoding.engine``).
- :class:`PromptLookup` (``"lookup"``, :mod:`.lookup`) and :class:`SuffixSource` (``"suffix"``,
  :mod:`.suffix`) are *free* (``free = True``: proposing costs about nothing next to a model
  pass). Each ``proposer(index=None)`` is a fresh per-decode object with ``extend(tokens)``
  (committed tokens, in order: the prompt first, then each step's emitted tokens),
  ``propose(depth) -> list[tuple[int, ...]]`` (chains of at most ``depth`` tokens continuing
  the committed text; they form a trie, no chain twice; ``[]`` when nothing matches) and
  ``finish()`` (end of the decode). Proposals are deterministic: a proposed token ``x`` is
  drawn from the one-hot law ``q = one-hot(x)`` (DESIGN "Draft sources"), which the token walk
  verifies free drafts first at a node, then the model's drafts with any verifier of the model's
  law on the residual target (``trees.TokenWalk``).

Without ``"model"`` the free sources draft alone (free-only decoding, as vLLM's ``ngram`` method
or transformers' ``prompt_lookup_num_tokens``): the draft model is never run, and a step whose
sources propose nothing is one plain target step (``Settings.free_only``).

``SOURCE_NAMES`` lists the names a user may give (``--sources``, a request's ``sources``,
``generate(sources=...)``); :func:`parse_sources` reads them, once, at the edge.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..._errors import ArgumentError
from ..._validate import as_int
from .lookup import LookupProposer
from .suffix import SuffixIndex, SuffixProposer

__all__ = ["DraftModel", "PromptLookup", "SuffixSource", "SuffixIndex", "SOURCE_NAMES", "free_source",
           "parse_sources"]


def _positive(src, name: str, lo: int = 1) -> None:
    """Source ``src``'s field ``name`` as an int >= ``lo`` (``_validate.as_int``; ArgumentError
    naming ``<source>.<field>``), stored back as a Python int."""
    object.__setattr__(src, name, as_int(getattr(src, name), f"{src.name}.{name}", minimum=lo))


@dataclass(frozen=True)
class DraftModel:
    """The draft model: drafts drawn from its processed distribution at each node.

    ``temperatures`` one draft temperature per draft column (one entry unless the draft law is
    'independent', where column j is drawn at ``temperatures[j]``)."""

    temperatures: tuple
    name = "model"
    free = False

    def describe(self) -> str:
        return self.name

    def proposer(self, index=None):
        """The draft model drafts in the engine (its q rows need the model): no proposer here."""
        raise ValueError("the draft model's drafts are the engine's: it has no model-free proposer")


@dataclass(frozen=True)
class PromptLookup:
    """Prompt lookup (:mod:`.lookup`): the longest n-gram suffix of the committed tokens
    (``n`` from ``max_ngram`` down to ``min_ngram``) that occurred earlier in the context; its
    most recent earlier occurrence's continuation, up to ``depth`` tokens, is the one chain.
    Defaults: n-grams of 1 to 4 tokens (vLLM's ``prompt_lookup_max`` in its examples;
    transformers' ``max_matching_ngram_size`` is 2) and depth 8. On the simulated code-editing
    set of :class:`SuffixSource`'s note, depth 16 copied 9.2 tokens a step against 6.4 at 8
    (14.3 drafted tokens a step against 7.5)."""

    max_ngram: int = 4
    min_ngram: int = 1
    depth: int = 8
    name = "lookup"
    free = True

    def __post_init__(self):
        _positive(self, "min_ngram")
        _positive(self, "max_ngram", self.min_ngram)
        _positive(self, "depth")

    def describe(self) -> str:
        return self.name

    def proposer(self, index=None) -> LookupProposer:
        """A fresh per-decode proposer (``index`` is ignored: lookup reads this decode's text only)."""
        return LookupProposer(self.max_ngram, self.min_ngram, self.depth)


@dataclass(frozen=True)
class SuffixSource:
    """SuffixDecoding (Oliaro et al., arXiv 2411.04975; :mod:`.suffix`): a trie of the most
    frequent continuations of the longest matched suffix (at most ``max_match`` tokens, length
    ``m``) in the request's own text or in earlier outputs (a shared :class:`SuffixIndex`),
    of ``min(ceil(alpha * m), depth)`` nodes, at most ``width`` children a node, each with at
    least ``min_count`` occurrences and path probability ``>= min_prob``.

    Defaults (no setting to tune before it helps): ``min_prob = 0.1`` is Arctic Inference's
    ``min_token_prob``; ``alpha = 2`` (Arctic Inference's ``max_spec_factor`` is 1): on a
    simulated code-editing set (20 functions of this package, a variable renamed, Qwen2.5
    tokens, every correct draft token accepted) 2 copied 8.3 tokens a step against 7.3 at 1
    (3.0 and 4.0: 8.9), for 1.0 drafted token a step instead of 0.5 on text with nothing to
    copy; ``depth = 16``, ``width = 2`` keep the tree a long chain with a fork where the counts
    disagree; ``max_match = 64``."""

    depth: int = 16
    width: int = 2
    min_count: int = 1
    alpha: float = 2.0
    min_prob: float = 0.1
    max_match: int = 64
    name = "suffix"
    free = True

    def __post_init__(self):
        for field in ("depth", "width", "min_count", "max_match"):
            _positive(self, field)
        if not isinstance(self.alpha, (int, float)) or isinstance(self.alpha, bool) or not self.alpha > 0 \
                or not math.isfinite(self.alpha):
            raise ValueError(f"suffix: alpha must be a finite number > 0, got {self.alpha!r}")
        if not isinstance(self.min_prob, (int, float)) or isinstance(self.min_prob, bool) \
                or not 0 <= self.min_prob <= 1:
            raise ValueError(f"suffix: min_prob must be a number in [0, 1], got {self.min_prob!r}")

    def describe(self) -> str:
        return self.name

    def proposer(self, index: SuffixIndex | None = None) -> SuffixProposer:
        """A fresh per-decode proposer over the request's text and, when given, the shared
        ``index`` of earlier outputs (which its ``finish`` extends)."""
        if index is not None and not isinstance(index, SuffixIndex):
            raise ValueError(f"suffix: index must be a SuffixIndex or None, got {type(index).__name__}")
        return SuffixProposer(self.depth, self.width, self.min_count, float(self.alpha), float(self.min_prob),
                              self.max_match, index)


SOURCE_NAMES = (DraftModel.name, PromptLookup.name, SuffixSource.name)
_FREE = {PromptLookup.name: PromptLookup, SuffixSource.name: SuffixSource}


def free_source(name: str):
    """The default description of the free source ``name`` (``"lookup"`` or ``"suffix"``);
    ``ValueError`` for any other name."""
    if name not in _FREE:
        raise ValueError(f"not a free draft source: {name!r}; free sources: {', '.join(_FREE)}")
    return _FREE[name]()


def parse_sources(value) -> tuple[str, ...]:
    """The source names of ``value`` (None: the draft model alone; a name, a comma list or a
    list of names), each known and given once; ``ArgumentError`` naming ``sources`` otherwise.
    A list without ``"model"`` (``"lookup"``, ``"suffix"``, ``"lookup,suffix"``) is free-only
    decoding: no draft model runs (``Settings.free_only``)."""
    if value is None:
        return (DraftModel.name,)
    names = [s.strip() for s in value.split(",")] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(s, str) and s for s in names):
        raise ArgumentError("sources", f"must be a non-empty list of draft source names ({', '.join(SOURCE_NAMES)}), "
                                       f"got {value!r}")
    for s in names:
        if s not in SOURCE_NAMES:
            raise ArgumentError("sources", f": unknown draft source {s!r}; sources: {', '.join(SOURCE_NAMES)}")
    if len(set(names)) != len(names):
        raise ArgumentError("sources", f"lists a source twice: {list(names)}")
    return tuple(names)
