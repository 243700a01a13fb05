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
  appending a token adds one end position to every state on the suffix-link path of the new
  state, which is how the counts are kept (that path is as long as the number of distinct
  end-position classes among the text's suffixes: short on natural text, long only on a run
  of one repeated token).
- **Match.** ``w`` is the longest suffix of the context, at most ``max_match`` tokens, that
  occurs in the index with a follower: in the request's own index, an occurrence other than
  the one ending the context (the suffix link of the last state); in the shared index, the
  matching statistic of the context (kept incrementally; recomputed from the last
  ``max_match`` tokens when the index changed). A match whose occurrences have no proposable
  follower (an output's end) falls back along suffix links to a shorter one. ``m = |w|``.
- **Tree.** Child ``c`` of a node ``u`` (``u`` extends ``w``) has count ``C(u c)`` and
  probability ``P(c | u) = C(u c) / sum_c' C(u c')``; a node's score is the product of the
  probabilities on its path from ``w``. Best-first (SuffixDecoding's greedy expansion), the
  highest-scoring candidate is added until the tree has ``min(ceil(alpha * m), depth)`` nodes;
  a node is a candidate only if it is among its parent's ``width`` most frequent children
  (ties: the smaller token), ``C(u c) >= min_count`` and its score ``>= min_prob`` (Arctic
  Inference's ``min_token_prob``). The chains proposed are the tree's root-to-leaf paths.
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

__all__ = ["SuffixIndex", "SuffixProposer"]


class _Automaton:
    """A suffix automaton over a token sequence with occurrence counts (state 0 is the root).

    ``nxt[s]`` the transitions, ``link[s]`` the suffix link, ``length[s]`` the longest string's
    length, ``cnt[s] = |endpos(s)|``. Negative tokens are separators (never proposed)."""

    __slots__ = ("nxt", "link", "length", "cnt", "last", "n")

    def __init__(self):
        self.nxt: list[dict] = [{}]
        self.link = [-1]
        self.length = [0]
        self.cnt = [0]
        self.last = 0
        self.n = 0

    def add(self, t: int) -> None:
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
        s = cur
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

    def tree(self, state: int, m: int, cap: int, alpha: float, width: int, min_count: int, min_prob: float):
        """The best-first continuation trie of the match (state, m): ``(m, nodes, score)``, ``m``
        the match length used, nodes a list of ``(path, count)`` in the order added, at most
        ``min(cap, ceil(alpha * m))`` of them; see the module docstring."""
        nxt, cnt, link, length = self.nxt, self.cnt, self.link, self.length
        # fall back along suffix links while the match has no proposable follower
        while state > 0 and not any(c >= 0 for c in nxt[state]):
            state = link[state]
            m = length[state]
        if state <= 0 or m <= 0:
            return 0, [], 0.0
        budget = min(cap, math.ceil(alpha * m))
        heap: list = []

        def push(s, path, prob):
            kids = nxt[s]
            total = sum(cnt[v] for v in kids.values())
            best = sorted(((cnt[v], c, v) for c, v in kids.items() if c >= 0), key=lambda e: (-e[0], e[1]))
            for k, c, v in best[:width]:
                pr = prob * k / total
                if k >= min_count and pr >= min_prob:
                    heapq.heappush(heap, (-pr, path + (c,), v, k))

        push(state, (), 1.0)
        nodes, score = [], 0.0
        while heap and len(nodes) < budget:
            neg, path, v, k = heapq.heappop(heap)
            nodes.append((path, k))
            score -= neg
            push(v, path, -neg)
        return m, nodes, score


def _leaves(nodes) -> list[tuple[int, ...]]:
    """The root-to-leaf paths of a trie given by its node paths (each node's parent present)."""
    inner = {p[:-1] for p, _ in nodes}
    return [p for p, _ in nodes if p not in inner]


class SuffixIndex:
    """The shared suffix index over earlier outputs (one per process; the server holds one).

    ``max_tokens`` the most output tokens kept (default 65536: about 30 MB of Python objects);
    an ``add`` past the cap evicts the oldest outputs until at most ``3 * max_tokens // 4``
    remain (one output longer than the cap keeps its last ``max_tokens`` tokens) and rebuilds
    the automaton. Thread-safe (one lock); ``version`` changes with every change."""

    def __init__(self, max_tokens: int = 65536):
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"SuffixIndex: max_tokens must be a positive int, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.lock = threading.Lock()
        self.outputs: deque = deque()
        self.tokens = 0
        self.version = 0
        self._sep = 0
        self.automaton = _Automaton()

    def _append(self, out) -> None:
        for t in out:
            self.automaton.add(t)
        self._sep += 1
        self.automaton.add(-self._sep)  # a separator of its own: no match crosses two outputs

    def add(self, tokens) -> None:
        """Index one finished output (token ids), evicting the oldest past the cap."""
        out = tuple(int(t) for t in tokens)[-self.max_tokens:]
        if not out:
            return
        with self.lock:
            self.outputs.append(out)
            self.tokens += len(out)
            self.version += 1
            if self.tokens <= self.max_tokens:
                self._append(out)
                return
            keep = (3 * self.max_tokens) // 4
            while self.tokens > keep and len(self.outputs) > 1:
                self.tokens -= len(self.outputs.popleft())
            self.automaton = _Automaton()
            for o in self.outputs:
                self._append(o)

    def __len__(self) -> int:
        return self.tokens


class SuffixProposer:
    """One decode's suffix drafts: its own index over the prompt and the text so far, plus the
    shared ``index`` (None: none) over earlier outputs, to which ``finish`` adds this output."""

    def __init__(self, depth: int = 16, width: int = 2, min_count: int = 1, alpha: float = 1.0,
                 min_prob: float = 0.1, max_match: int = 64, index: SuffixIndex | None = None):
        self.depth, self.width, self.min_count = depth, width, min_count
        self.alpha, self.min_prob, self.max_match = alpha, min_prob, max_match
        self.index = index
        self.tokens: list[int] = []
        self.local = _Automaton()
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
        a = self.local
        s = a.link[a.last] if a.last > 0 else 0
        if s <= 0:
            return 0, 0
        m = a.length[s]
        if m > self.max_match:
            m = self.max_match
            while a.length[a.link[s]] >= m:
                s = a.link[s]
        return s, m

    def explain(self, depth: int):
        """``(where, m, nodes)``: the index proposed from (``"request"``, ``"shared"`` or None),
        the match length and the trie's nodes ``(path, count)`` (count = occurrences of the
        match followed by the path in that index), in the order added."""
        args = (min(depth, self.depth), self.alpha, self.width, self.min_count, self.min_prob)
        best = ("request", *self.local.tree(*self._local_match(), *args))
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
