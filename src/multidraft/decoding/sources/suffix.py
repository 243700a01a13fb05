"""Suffix-index drafts (SuffixDecoding): the most frequent continuations of the context's longest
matched suffix, as a small trie, from the request's own text and from earlier outputs.

SuffixDecoding (Oliaro et al., NeurIPS 2025, arXiv 2411.04975; in vLLM through Arctic
Inference) keeps suffix trees over the prompt and the text so far (one per request) and over
the outputs of earlier requests (one per process), matches the longest suffix of the context,
and speculates a tree of its most frequent continuations whose size grows with the match
length (``MAX_SPEC = alpha * p``). Here the index is a suffix automaton (Blumer et al. 1985;
as in SAM Decoding, Hu et al. 2024, arXiv 2411.10666): built online in amortized ``O(1)``
states and transitions a token, ``<= 2N`` states for ``N`` tokens, with exact occurrence
counts. The rules, precisely:

- **Counts.** For a string ``u``, ``C(u)`` is its number of occurrences in the indexed text
  (the request's tokens, or the earlier outputs, each its own document: no occurrence crosses
  two). A state's strings share their end positions, so ``C(u) = |endpos(state(u))|``;
  appending a token adds one end position to the states on the suffix-link path of the new
  text's suffixes, which is how the counts are kept, for the strings of at most
  ``max_match + depth`` tokens only (the only ones a proposal reads): at most that many
  states a token, whatever the text.
- **Match.** ``w`` is the longest suffix of the context, at most ``max_match`` tokens, that
  occurs in the index with a follower: in the request's own index, an occurrence other than
  the one ending the context (the suffix link of the last state); in the shared index, the
  matching statistic of the context (kept incrementally; recomputed from the last
  ``max_match`` tokens when the index changed). A match whose occurrences have no proposable
  follower (an output's end) falls back along suffix links to a shorter one. ``m = |w|``.
- **Tree.** Child ``c`` of a node ``u`` (``u`` extends ``w``) has count ``C(u c)`` and
  probability ``P(c | u) = C(u c) / sum_c' C(u c')``, the sum over every follower of ``u``,
  an output's end included (the occurrence ending the request's text has none); a node's
  score is the product of the probabilities on its path from ``w``. Best-first
  (SuffixDecoding's greedy expansion), the highest-scoring candidate is added (ties: the
  smaller path) until the tree has ``min(ceil(alpha * m), depth)`` nodes; a node is a
  candidate only if it is among its parent's ``width`` most frequent children (ties: the
  smaller token), ``C(u c) >= min_count`` and its score ``>= min_prob`` (Arctic Inference's
  ``min_token_prob``). The chains proposed are the tree's root-to-leaf paths.
- **Which index.** Both indexes' trees are built; the one with the larger total score (the
  expected number of accepted tokens under the counts' law) is proposed (ties: the request's),
  as SuffixDecoding does.

The proposal is deterministic: each chain is a one-hot draft law at each node (DESIGN "Draft
sources"), whatever the counts say. The shared :class:`SuffixIndex` is bounded: it keeps at
most ``max_tokens`` output tokens; adding past the cap evicts the oldest outputs until at most
``3/4`` of the cap remains and rebuilds (amortized ``O(1)`` a token).
"""
from __future__ import annotations

import heapq
import math
import threading
from collections import deque

from ..._validate import as_int

__all__ = ["SuffixIndex", "SuffixProposer"]


class _Automaton:
    """A suffix automaton over a token sequence with occurrence counts (state 0 is the root).

    ``nxt[s]`` the transitions, ``link[s]`` the suffix link, ``length[s]`` the longest string's
    length, ``cnt[s] = |endpos(s)|`` for every state with a string of at most ``span`` tokens
    (the only ones a query reaches: a match of at most ``max_match`` tokens and ``depth``
    transitions below it). Appending a token adds its end position to the states on the
    suffix-link path of the new text's suffix of length ``min(n, span)``, kept by matching
    statistics (``(sb, mb)``): at most ``span + 1`` states a token, whatever the text (a run of
    one repeated token included). States with only longer strings are never counted and never
    read: a state's shortest length only grows (a split keeps the longer strings; a clone copies
    a count kept exactly). Negative tokens are separators (never proposed)."""

    __slots__ = ("nxt", "link", "length", "cnt", "last", "n", "span", "sb", "mb")

    def __init__(self, span: int):
        self.nxt: list[dict] = [{}]
        self.link = [-1]
        self.length = [0]
        self.cnt = [0]
        self.last = 0
        self.n = 0
        self.span = span
        self.sb, self.mb = 0, 0  # the state and length of the text's suffix of min(n, span) tokens

    def add(self, t: int) -> None:
        """Blumer et al.'s online construction, then the counts (see the class docstring)."""
        nxt, link, length, cnt = self.nxt, self.link, self.length, self.cnt
        cur = len(nxt)
        nxt.append({})
        link.append(0)
        length.append(length[self.last] + 1)
        cnt.append(0)
        p = self.last
        while p != -1 and t not in nxt[p]:
            nxt[p][t] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][t]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(nxt)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                cnt.append(cnt[q])
                while p != -1 and nxt[p].get(t) == q:
                    nxt[p][t] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.last = cur
        self.n += 1
        s, m = self.sb, self.mb
        # the old suffix followed by t occurs: the transition exists (if the add split the old
        # suffix's state, the clone took its transitions: either lands on the same state)
        s, m = nxt[s][t], m + 1
        if m > self.span:
            m = self.span
            while length[link[s]] >= m:
                s = link[s]
        self.sb, self.mb = s, m
        while s > 0:
            cnt[s] += 1
            s = link[s]

    def step(self, state: int, m: int, t: int, cap: int) -> tuple[int, int]:
        """Matching statistics: (state, m) of the longest suffix (at most ``cap`` tokens) of the
        matched text extended by ``t`` that is a substring of the indexed text."""
        nxt, link, length = self.nxt, self.link, self.length
        while state > 0 and t not in nxt[state]:
            state = link[state]
            m = length[state]
        if t in nxt[state]:
            state, m = nxt[state][t], m + 1
        else:
            state, m = 0, 0
        if m > cap:
            m = cap
            while length[link[state]] >= cap:
                state = link[state]
        return state, m

    def tree(self, state: int, m: int, cap: int, alpha: float, width: int, min_count: int, min_prob: float,
             text=None):
        """The best-first continuation trie of the match (state, m): ``(m, nodes, score)``, ``m``
        the match length used, nodes a list of ``(path, count, score)`` in the order added, at most
        ``min(cap, ceil(alpha * m))`` of them; see the module docstring. ``text``: the indexed
        tokens when the match ends them (a request's own index: the occurrence ending the text
        has no follower); None for the shared index (every occurrence has one)."""
        nxt, cnt, link, length = self.nxt, self.cnt, self.link, self.length
        # fall back along suffix links while the match has no proposable follower
        while state > 0 and not any(c >= 0 for c in nxt[state]):
            state = link[state]
            m = length[state]
        if state <= 0 or m <= 0:
            return 0, [], 0.0
        budget = min(cap, math.ceil(alpha * m))
        heap: list = []
        L = len(text) if text is not None else 0

        def push(s, path, prob):
            kids = nxt[s]
            total = cnt[s]  # occurrences of the node's string, less the one ending the text
            if text is not None:
                d = len(path)
                if d == 0 or (text[L - d:] == list(path) and text[L - d - m:L - d] == text[L - m:]):
                    total -= 1
            if len(kids) == 1:
                ((c, v),) = kids.items()
                best = [(-cnt[v], c, v)] if c >= 0 else []
            else:  # count descending, then the smaller token
                best = sorted([(-cnt[v], c, v) for c, v in kids.items() if c >= 0])[:width]
            for k, c, v in best:
                pr = prob * -k / total
                if -k >= min_count and pr >= min_prob:
                    heapq.heappush(heap, (-pr, path + (c,), v, -k))

        push(state, (), 1.0)
        nodes, score = [], 0.0
        while heap and len(nodes) < budget:
            neg, path, v, k = heapq.heappop(heap)
            nodes.append((path, k, -neg))
            score -= neg
            if len(nodes) < budget:
                push(v, path, -neg)
        return m, nodes, score


def _leaves(nodes) -> list[tuple[int, ...]]:
    """The root-to-leaf paths of a trie given by its node paths (each node's parent present)."""
    inner = {n[0][:-1] for n in nodes}
    return [n[0] for n in nodes if n[0] not in inner]


class SuffixIndex:
    """The shared suffix index over earlier outputs (one per process; the server holds one).

    ``max_tokens`` the most output tokens kept (default 65536: about 30 MB of Python objects,
    measured on Zipf-distributed tokens); an ``add`` past the cap evicts the oldest outputs
    until at most ``3 * max_tokens // 4`` remain (one output longer than the cap keeps its last
    ``max_tokens`` tokens) and rebuilds the automaton (amortized ``O(1)`` a token), outside the
    readers' lock. ``max_span`` the longest string whose count is kept (a proposer's
    ``max_match + depth`` must not exceed it). Thread-safe: ``lock`` guards what proposers read
    (an in-place add holds it while it appends one output), ``add`` calls run one at a time;
    ``version`` changes with every change."""

    def __init__(self, max_tokens: int = 65536, max_span: int = 256):
        self.max_tokens = as_int(max_tokens, "SuffixIndex.max_tokens", minimum=1)
        self.max_span = as_int(max_span, "SuffixIndex.max_span", minimum=1)
        self.lock = threading.Lock()  # the readers' (proposers') lock
        self._writer = threading.Lock()  # one add at a time
        self.outputs: deque = deque()
        self.tokens = 0
        self.version = 0
        self._sep = 0
        self.automaton = _Automaton(self.max_span)

    def _append(self, automaton: _Automaton, out) -> None:
        for t in out:
            automaton.add(t)
        self._sep += 1
        automaton.add(-self._sep)  # a separator of its own: no match crosses two outputs

    def add(self, tokens) -> None:
        """Index one finished output (token ids), evicting the oldest past the cap."""
        out = tuple(int(t) for t in tokens)[-self.max_tokens:]
        if not out:
            return
        with self._writer:
            if self.tokens + len(out) <= self.max_tokens:
                with self.lock:
                    self._append(self.automaton, out)
                    self.outputs.append(out)
                    self.tokens += len(out)
                    self.version += 1
                return
            kept, total, keep = deque(self.outputs), self.tokens + len(out), (3 * self.max_tokens) // 4
            kept.append(out)
            while total > keep and len(kept) > 1:
                total -= len(kept.popleft())
            automaton = _Automaton(self.max_span)
            for o in kept:
                self._append(automaton, o)
            with self.lock:
                self.automaton, self.outputs, self.tokens = automaton, kept, total
                self.version += 1

    def __len__(self) -> int:
        return self.tokens


class SuffixProposer:
    """One decode's suffix drafts: its own index over the prompt and the text so far, plus the
    shared ``index`` (None: none) over earlier outputs, to which ``finish`` adds this output."""

    def __init__(self, depth: int = 16, width: int = 2, min_count: int = 1, alpha: float = 2.0,
                 min_prob: float = 0.1, max_match: int = 64, index: SuffixIndex | None = None):
        self.depth, self.width, self.min_count = depth, width, min_count
        self.alpha, self.min_prob, self.max_match = alpha, min_prob, max_match
        if index is not None and max_match + depth > index.max_span:
            raise ValueError(f"suffix: max_match + depth = {max_match + depth} exceeds the index's max_span "
                             f"{index.max_span}")
        self.index = index
        self.tokens: list[int] = []
        self.local = _Automaton(max_match + depth)
        self._prompt = None  # the prompt's length, set by the first extend
        self._g = (0, 0, None)  # (state, m, version) of the match in the shared index
        self._done = False

    def extend(self, tokens) -> None:
        """Append committed tokens, in order (the prompt first, then each step's emitted tokens)."""
        new = [int(t) for t in tokens]
        if self._prompt is None:
            self._prompt = len(new)
        for t in new:
            self.local.add(t)
        self.tokens.extend(new)
        ix = self.index
        if ix is not None:
            with ix.lock:
                state, m, ver = self._g
                if ver == ix.version:
                    a = ix.automaton
                    for t in new:
                        state, m = a.step(state, m, t, self.max_match)
                    self._g = (state, m, ver)

    def _local_match(self) -> tuple[int, int]:
        """(state, m) of the longest suffix of at most ``max_match`` tokens occurring earlier in
        the request's text: the suffix link of the last state when it is short enough, else the
        suffix of ``max_match`` tokens, found below the automaton's span suffix (``sb``)."""
        a = self.local
        s = a.link[a.last] if a.last > 0 else 0
        if s <= 0 or a.length[s] <= self.max_match:
            return max(s, 0), a.length[s] if s > 0 else 0
        s = a.sb  # its string of min(n, span) >= max_match tokens is a suffix of the text
        while a.length[a.link[s]] >= self.max_match:
            s = a.link[s]
        return s, self.max_match

    def explain(self, depth: int):
        """``(where, m, nodes)``: the index proposed from (``"request"``, ``"shared"`` or None),
        the match length ``m`` and the trie's nodes ``(path, count, score)`` in the order added:
        ``count = C(w path)`` in that index and ``score`` the product of ``P(c | u)`` along the
        path (the probability, under the counts' law, that the path follows the match)."""
        args = (min(depth, self.depth), self.alpha, self.width, self.min_count, self.min_prob)
        best = ("request", *self.local.tree(*self._local_match(), *args, text=self.tokens))
        ix = self.index
        if ix is not None:
            with ix.lock:
                state, gm, ver = self._g
                a = ix.automaton
                if ver != ix.version:
                    state, gm = 0, 0
                    for t in self.tokens[-self.max_match:]:
                        state, gm = a.step(state, gm, t, self.max_match)
                    self._g = (state, gm, ix.version)
                shared = ("shared", *a.tree(state, gm, *args))
            if shared[3] > best[3]:
                best = shared
        where, m, nodes, _ = best
        return (where, m, nodes) if nodes else (None, 0, [])

    def propose(self, depth: int) -> list[tuple[int, ...]]:
        """The chains (root-to-leaf paths of the trie, each at most ``min(depth, self.depth)``
        tokens; ``[]`` when nothing matches)."""
        if depth < 1:
            return []
        return _leaves(self.explain(depth)[2])

    def finish(self) -> None:
        """End of the decode: this request's output (the tokens after the prompt) joins the
        shared index, once."""
        if not self._done and self.index is not None and self._prompt is not None:
            self.index.add(self.tokens[self._prompt:])
        self._done = True
