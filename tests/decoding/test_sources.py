"""The free draft sources (decoding.sources): prompt lookup and the suffix index, each against a
brute-force reference over random token sequences (small vocabularies, so matches are many)."""
import heapq
import math
import random

import pytest

from multidraft._errors import ArgumentError
from multidraft.decoding.sources import (SOURCE_NAMES, DraftModel, PromptLookup, SuffixIndex, SuffixSource,
                                         free_source, parse_sources)


# ---------------------------------------------------------------- references (brute force)

def ref_lookup(xs, max_ngram, min_ngram, depth):
    """The longest n-gram suffix with an earlier occurrence that has a follower; its latest such
    occurrence's continuation (scans the whole text)."""
    L = len(xs)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= L:
            continue
        g = xs[L - n:]
        for s in range(L - n - 1, -1, -1):
            if xs[s:s + n] == g:
                return [tuple(xs[s + n:s + n + depth])] if depth >= 1 else []
    return []


END = None  # an occurrence's follower at the end of an output


def followers(docs, u, skip_end=None):
    """{follower: count} over every occurrence of u in docs (END at an output's end); the
    occurrence ending at ``skip_end = (doc, end)`` (the context's own end) is left out."""
    out = {}
    n = len(u)
    for d, doc in enumerate(docs):
        for s in range(len(doc) - n + 1):
            if doc[s:s + n] == u and (d, s + n) != skip_end:
                f = doc[s + n] if s + n < len(doc) else END
                out[f] = out.get(f, 0) + 1
    return out


def ref_tree(docs, ctx, skip_end, depth, width, min_count, alpha, min_prob, max_match):
    """(m, nodes, score) of the module docstring's rules, counts counted by brute force."""
    m = 0
    for k in range(min(max_match, len(ctx)), 0, -1):
        if any(f is not END for f in followers(docs, ctx[len(ctx) - k:], skip_end)):
            m = k
            break
    if m == 0:
        return 0, [], 0.0
    w = ctx[len(ctx) - m:]
    budget = min(depth, math.ceil(alpha * m))
    heap = []

    def push(path, prob):
        fs = followers(docs, w + list(path), skip_end)
        total = sum(fs.values())
        best = sorted(((k, c) for c, k in fs.items() if c is not END), key=lambda e: (-e[0], e[1]))
        for k, c in best[:width]:
            pr = prob * k / total
            if k >= min_count and pr >= min_prob:
                heapq.heappush(heap, (-pr, path + (c,), k))

    push((), 1.0)
    nodes, score = [], 0.0
    while heap and len(nodes) < budget:
        neg, path, k = heapq.heappop(heap)
        nodes.append((path, k, -neg))
        score -= neg
        push(path, -neg)
    return m, nodes, score


def ref_suffix(outputs, ctx, depth, src):
    args = (depth, src.width, src.min_count, src.alpha, src.min_prob, src.max_match)
    req = ref_tree([ctx], ctx, (0, len(ctx)), *args)
    best = ("request", *req)
    if outputs is not None:
        sh = ref_tree(outputs, ctx, None, *args)
        if sh[2] > best[3]:
            best = ("shared", *sh)
    where, m, nodes, _ = best
    return (where, m, nodes) if nodes else (None, 0, [])


def chunks(rng, xs):
    i = 0
    while i < len(xs):
        j = i + rng.randint(1, 4)
        yield xs[i:j]
        i = j


# ---------------------------------------------------------------- descriptions

def test_source_names_and_parse_sources():
    assert SOURCE_NAMES == ("model", "lookup", "suffix")
    assert parse_sources("suffix, model,lookup") == ("suffix", "model", "lookup")
    assert parse_sources(["model", "lookup"]) == ("model", "lookup")
    assert parse_sources(None) == ("model",)
    assert parse_sources("lookup") == ("lookup",) and parse_sources("lookup,suffix") == ("lookup", "suffix")  # free-only
    for bad in ("model,model", "lookup,lookup", "model,ngram", "", ",lookup"):
        with pytest.raises(ArgumentError) as info:
            parse_sources(bad)
        assert info.value.arg == "sources"


def test_descriptions():
    assert free_source("lookup") == PromptLookup() and free_source("suffix") == SuffixSource()
    assert PromptLookup().free and SuffixSource().free and not DraftModel((1.0,)).free
    assert [s.describe() for s in (DraftModel((1.0,)), PromptLookup(), SuffixSource())] == list(SOURCE_NAMES)
    for name in ("model", "ngram"):
        with pytest.raises(ValueError):
            free_source(name)
    with pytest.raises(ValueError):
        DraftModel((1.0,)).proposer()
    for bad in (dict(min_ngram=0), dict(max_ngram=1, min_ngram=2), dict(depth=0), dict(depth=2.0)):
        with pytest.raises(ValueError):
            PromptLookup(**bad)
    for bad in (dict(width=0), dict(alpha=0.0), dict(alpha=math.inf), dict(min_prob=1.5), dict(max_match=True)):
        with pytest.raises(ValueError):
            SuffixSource(**bad)
    with pytest.raises(ValueError):
        SuffixSource().proposer(index=object())
    with pytest.raises(ValueError):
        SuffixIndex(0)


# ---------------------------------------------------------------- prompt lookup

def test_lookup_longest_then_latest():
    p = PromptLookup(max_ngram=3, depth=4).proposer()
    # "1 2 3" occurred at 0 (followed by 7 8); "2 3" more recently at 5 (followed by 9): longest wins
    p.extend([1, 2, 3, 7, 8, 2, 3, 9, 1, 2, 3])
    assert p.propose(8) == [(7, 8, 2, 3)]
    assert p.propose(2) == [(7, 8)]  # depth caps the chain
    q = PromptLookup(max_ngram=2, depth=8).proposer()
    q.extend([5, 1, 6, 5, 1, 7, 0, 5, 1])  # "5 1" at 0 and 3: the latest (3) wins
    assert q.propose(8) == [(7, 0, 5, 1)]  # truncated at the end of the text
    r = PromptLookup().proposer()
    r.extend([1, 2, 3, 4])
    assert r.propose(8) == [] and r.propose(0) == []
    r.extend([2])
    assert r.propose(8) == [(3, 4, 2)]
    s = PromptLookup(min_ngram=2).proposer()
    s.extend([1, 2, 3, 4, 2])  # only a 1-gram matches: below min_ngram
    assert s.propose(8) == []
    r.finish()


@pytest.mark.parametrize("seed", range(4))
def test_lookup_incremental_equals_brute_force(seed):
    rng = random.Random(seed)
    for _ in range(6):
        V, N = rng.randint(2, 5), rng.randint(1, 60)
        xs = [rng.randrange(V) for _ in range(N)]
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        depth = rng.randint(1, 9)
        p = PromptLookup(max_ngram=hi, min_ngram=lo, depth=depth).proposer()
        seen = []
        for chunk in chunks(rng, xs):
            p.extend(chunk)
            seen += chunk
            for d in (1, depth, depth + 3):
                assert p.propose(d) == ref_lookup(seen, hi, lo, min(d, depth)), (seen, d)


# ---------------------------------------------------------------- suffix index

def check_trie(chains, nodes, depth):
    assert len(set(chains)) == len(chains)
    paths = [n[0] for n in nodes]
    assert len(set(paths)) == len(paths) and all(p[:-1] in set(paths) | {()} for p in paths)
    assert sorted(chains) == sorted(p for p in paths if not any(q[:-1] == p for q in paths))
    assert all(1 <= len(c) <= depth for c in chains)


@pytest.mark.parametrize("seed", range(4))
def test_suffix_request_index_equals_brute_force(seed):
    rng = random.Random(100 + seed)
    for _ in range(5):
        V, N = rng.randint(1, 4), rng.randint(1, 45)
        xs = [rng.randrange(V) for _ in range(N)]
        src = SuffixSource(depth=rng.randint(1, 8), width=rng.randint(1, 3), min_count=rng.randint(1, 2),
                           alpha=rng.choice([0.5, 1.0, 2.0]), min_prob=rng.choice([0.0, 0.1, 0.4]),
                           max_match=rng.randint(1, 6))
        p = src.proposer()
        seen = []
        for chunk in chunks(rng, xs):
            p.extend(chunk)
            seen += chunk
            for d in (1, src.depth):
                got = p.explain(d)
                assert got == ref_suffix(None, seen, min(d, src.depth), src), (seen, src, d)
                check_trie(p.propose(d), got[2], min(d, src.depth))


@pytest.mark.parametrize("seed", range(3))
def test_suffix_shared_index_equals_brute_force(seed):
    """Earlier outputs in the shared index: counts per output (no match across two); the
    incremental match equals a fresh proposer's (rematched) one after every extend."""
    rng = random.Random(200 + seed)
    src = SuffixSource(depth=6, width=2, min_prob=0.0, max_match=5)
    index = SuffixIndex(max_span=11)  # counts kept for strings of at most max_match + depth tokens
    outputs, where = [], set()
    for _ in range(6):
        prompt = [rng.randrange(8) for _ in range(rng.randint(1, 12))]
        p = src.proposer(index)
        seen = []
        for chunk in [prompt] + list(chunks(rng, [rng.randrange(3) for _ in range(rng.randint(0, 20))])):
            p.extend(chunk)
            seen += chunk
            got = p.explain(src.depth)
            assert got == ref_suffix(outputs, seen, src.depth, src), (outputs, seen)
            where.add(got[0])
            fresh = src.proposer(index)
            fresh.extend(seen)
            assert fresh.explain(src.depth) == got
            check_trie(p.propose(src.depth), got[2], src.depth)
        p.finish()
        p.finish()  # once only
        if seen[len(prompt):]:
            outputs.append(seen[len(prompt):])
        assert len(index) == sum(map(len, outputs))
    assert where == {None, "request", "shared"}  # every case met


def test_suffix_shares_earlier_outputs_and_deepens_with_the_match():
    src = SuffixSource(alpha=1.0)
    index = SuffixIndex()
    first, second = src.proposer(index), src.proposer(index)  # both live at once
    first.extend([50, 51])
    second.extend([60, 61])
    out = list(range(10, 30))
    first.extend(out)
    assert second.propose(16) == []
    first.finish()  # the index changed under second's incremental match
    second.extend([10, 11, 12])
    assert second.explain(16) == ("shared", 3, [(tuple(range(13, 14 + i)), 1, 1.0) for i in range(3)])
    second.extend(range(13, 20))  # a longer match speculates deeper (alpha * m nodes, capped by depth)
    assert second.propose(16) == [tuple(range(20, 30))]
    second.finish()
    assert len(index) == 20 + 10


def test_suffix_most_frequent_continuations_form_a_small_trie():
    text = [1, 2, 3, 4, 7, 5, 1, 2, 3, 4, 7, 6, 1, 2, 3, 4, 7, 9, 1, 2, 3, 4, 8, 0, 1, 2, 3, 4, 8, 0, 11, 1, 2, 3]
    p = SuffixSource(width=2, min_prob=0.0, alpha=1.0).proposer()
    p.extend(text)
    # match "1 2 3" (m = 3: three nodes): then 4 five times (1); after it 7 thrice (3/5), 8 twice
    # (2/5); after "4 7" 5, 6, 9 once each (1/5)
    assert p.explain(16) == ("request", 3, [((4,), 5, 1.0), ((4, 7), 3, 3 / 5), ((4, 8), 2, 2 / 5)])
    assert p.propose(16) == [(4, 7), (4, 8)]
    q = SuffixSource(width=1, min_prob=0.0, alpha=1.0).proposer()
    q.extend(text)  # one branch a node: the most frequent (then smallest) token
    assert q.propose(16) == [(4, 7, 5)]
    r = SuffixSource(width=1, min_prob=0.5, alpha=1.0).proposer()
    r.extend(text)  # the 1/5 nodes are dropped
    assert r.propose(16) == [(4, 7)]
    assert SuffixSource(min_count=2).proposer().propose(4) == []


def test_suffix_match_at_an_outputs_end_falls_back_to_a_shorter_one():
    index = SuffixIndex()
    index.add([1, 2])
    index.add([2, 3])
    p = SuffixSource().proposer(index)
    p.extend([0, 1, 2])  # "1 2" only ends an output: "2" is followed by 3 in the other
    assert p.explain(8) == ("shared", 1, [((3,), 1, 0.5)])  # one of "2"'s two occurrences ends an output
    q = SuffixSource().proposer(index)
    q.extend([0, 3])  # "3" only ends an output: nothing to propose
    assert q.explain(8) == (None, 0, []) and q.propose(8) == []


def test_suffix_index_cap_evicts_oldest():
    index = SuffixIndex(max_tokens=10)
    src = SuffixSource(min_prob=0.0)
    for out in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]):
        p = src.proposer(index)
        p.extend([0])
        p.extend(out)
        p.finish()
    # 12 > 10 tokens: the oldest outputs go until at most 3/4 of the cap (7) remain
    assert list(index.outputs) == [(9, 10, 11, 12)] and len(index) == 4
    q = src.proposer(index)
    q.extend([40, 1, 2])
    assert q.propose(8) == []  # evicted
    q.extend([9, 10])
    assert q.propose(8) == [(11, 12)]
    index.add(range(100, 125))  # one output over the cap keeps its last max_tokens tokens
    assert list(index.outputs) == [tuple(range(115, 125))] and len(index) == 10


def test_suffix_index_shared_by_threads():
    """Requests finishing on several threads while another proposes: the index ends consistent
    (its kept outputs, under the cap, are what a fresh proposer matches against)."""
    import threading

    index = SuffixIndex(max_tokens=120)
    src = SuffixSource(depth=6, min_prob=0.0, max_match=5)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        try:
            for _ in range(8):
                p = src.proposer(index)
                p.extend([rng.randrange(3) for _ in range(5)])
                for _ in range(10):
                    p.propose(6)
                    p.extend([rng.randrange(3)])
                p.finish()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    outputs = [list(o) for o in index.outputs]
    assert len(index) == sum(map(len, outputs)) <= 120 and all(len(o) == 10 for o in outputs)
    rng = random.Random(9)
    for _ in range(5):
        ctx = [rng.randrange(3) for _ in range(8)]
        p = src.proposer(index)
        p.extend(ctx)
        assert p.explain(6) == ref_suffix(outputs, ctx, 6, src)
