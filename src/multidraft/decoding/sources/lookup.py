"""Prompt lookup: copy what followed the latest earlier occurrence of the context's longest
recent n-gram (a free, deterministic draft source).

The rule (prompt lookup decoding, Saxena 2023; transformers' ``prompt_lookup_num_tokens``,
vLLM's ``ngram`` method, llama.cpp's ``lookup`` example): with committed tokens
``x_0 .. x_{L-1}``, for ``n`` from ``max_ngram`` down to ``min_ngram`` (``n < L``), let
``g = x_{L-n} .. x_{L-1}``; take the largest start ``s`` with ``s + n < L`` and
``x_s .. x_{s+n-1} = g`` (the most recent earlier occurrence that has a follower); the first
``n`` with such an ``s`` wins and the proposal is the one chain ``x_{s+n} .. x_{s+n+d-1}``
truncated at ``L`` (``d`` the depth). No ``n`` matches: no proposal. (transformers takes the
*earliest* match; the latest is the one nearest in the text, and the one an incremental index
keeps for free.) The chain is a one-hot draft law at each node (DESIGN "Draft sources").

Incremental: ``_last[n]`` maps an n-gram to the position of the token that followed its latest
occurrence; appending ``x_i`` records ``x_{i-n} .. x_{i-1} -> i`` for every ``n``, so ``extend``
costs ``O(max_ngram)`` hashes a token and ``propose`` ``O(max_ngram + depth)``, whatever ``L``.
"""
from __future__ import annotations

__all__ = ["LookupProposer"]


class LookupProposer:
    """One decode's prompt-lookup index (see the module docstring for the rule).

    ``max_ngram >= min_ngram >= 1`` the n-gram sizes tried, longest first; ``depth`` the most
    tokens a chain copies (``propose``'s own ``depth`` caps it further)."""

    __slots__ = ("max_ngram", "min_ngram", "depth", "tokens", "_last")

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, depth: int = 8):
        self.max_ngram, self.min_ngram, self.depth = max_ngram, min_ngram, depth
        self.tokens: list[int] = []
        # _last[n - min_ngram]: n-gram (tuple) -> position of the token after its latest occurrence
        self._last: list[dict] = [{} for _ in range(min_ngram, max_ngram + 1)]

    def extend(self, tokens) -> None:
        """Append committed tokens, in order (the prompt first, then each step's emitted tokens)."""
        xs, lo, hi, last = self.tokens, self.min_ngram, self.max_ngram, self._last
        for t in tokens:
            i = len(xs)
            for n in range(lo, min(hi, i) + 1):
                last[n - lo][tuple(xs[i - n:i])] = i
            xs.append(int(t))

    def propose(self, depth: int) -> list[tuple[int, ...]]:
        """``[chain]``: at most ``min(depth, self.depth)`` tokens copied after the latest earlier
        occurrence of the longest matching n-gram; ``[]`` when none matches or depth < 1."""
        d = min(depth, self.depth)
        xs, lo, L = self.tokens, self.min_ngram, len(self.tokens)
        if d < 1:
            return []
        for n in range(min(self.max_ngram, L - 1), lo - 1, -1):
            p = self._last[n - lo].get(tuple(xs[L - n:]))
            if p is not None:
                return [tuple(xs[p:p + d])]
        return []

    def finish(self) -> None:
        """End of the decode: nothing is kept beyond it."""
