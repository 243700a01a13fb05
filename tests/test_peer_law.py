"""The exact law of llama-speculative's node rule (multidraft.peers).

References written here, independently of the module: an enumeration over the visiting
orders (and, for sampled drafts, over the draft tuples) with plain Python floats, and a
literal Monte-Carlo replay of speculative.cpp's verification loop.
"""
from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from multidraft.peers import MAX_CHILDREN, llama_speculative_law, peer_branches


# ---------------------------------------------------------------- references (no torch)

def _ranked(q):
    return sorted(range(len(q)), key=lambda t: (-q[t], t))


def _children(q, k, p_split):
    cand = _ranked(q)
    n = 1
    for f in range(1, 8):  # speculative.cpp: f = 1..7, stop at the first failure
        if n < k and f < len(q) and q[cand[f]] > p_split:
            n += 1
        else:
            break
    return cand[:n]


def _residual(d, q):
    r = [max(0.0, a - b) for a, b in zip(d, q)]
    z = sum(r)
    return [x / z for x in r] if z > 0 else [0.0] * len(r)


def _law_given(p, q, tokens):
    """Exact law of the rule for fixed child tokens (any, repeats allowed), averaged over
    all visiting orders by enumeration (n! orders, each weight 1/n!)."""
    V, n = len(p), len(tokens)
    out = [0.0] * V
    for order in itertools.permutations(range(n)):
        reach, cur = 1.0 / math.factorial(n), list(p)
        for s in order:
            x = tokens[s]
            a = min(1.0, cur[x] / q[x])
            out[x] += reach * a
            reach *= 1.0 - a
            cur = _residual(cur, q)
        for y in range(V):
            out[y] += reach * cur[y]
    return out


def _top_reference(p, q, k, p_split):
    return _law_given(p, q, _children(q, k, p_split))


def _sampled_reference(p, q, k, p_split):
    n = len(_children(q, k, p_split))
    out = [0.0] * len(p)
    for tup in itertools.product(range(len(q)), repeat=n):
        w = math.prod(q[x] for x in tup)
        if w == 0:
            continue
        law = _law_given(p, q, list(tup))
        out = [a + w * b for a, b in zip(out, law)]
    return out


def _replay(p, q, k, p_split, rng):
    """One run of speculative.cpp's node verification at temperature > 0 (the loop at its
    lines 279-395), with lists: random active child, r <= p_tgt/p_dft, residual in place."""
    tokens = _children(q, k, p_split)
    dist_tgt = list(p)
    active = set(range(len(tokens)))
    while active:
        s = sorted(active)[rng.randrange(len(active))]
        r = rng.random()
        if r <= dist_tgt[tokens[s]] / q[tokens[s]]:
            return tokens[s]
        dist_tgt = _residual(dist_tgt, q)
        active.discard(s)
    return rng.choices(range(len(p)), weights=dist_tgt)[0]


def _random_pair(V, seed, zeros=True):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(V, generator=g, dtype=torch.float64) ** 2
    q = torch.rand(V, generator=g, dtype=torch.float64) ** 2
    if zeros and V > 2:
        p[int(torch.randint(V, (1,), generator=g))] = 0.0
        q[int(torch.randint(V, (1,), generator=g))] = 0.0
    return p / p.sum(), q / q.sum()


def _cases():
    yield "equal", torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    yield "one-hot p", torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64), torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    yield "one-hot q", torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    yield "q = 0 where p > 0", torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64), torch.tensor([0.6, 0.4, 0.0, 0.0], dtype=torch.float64)
    yield "V = 1", torch.tensor([1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    for i in range(12):
        yield f"random {i}", *_random_pair(3 + i % 4, 1000 + i, zeros=i % 2 == 0)


# ---------------------------------------------------------------- exactness

@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("p_split", [0.0, 0.1, 0.3])
def test_top_law_equals_order_enumeration(k, p_split):
    for label, p, q in _cases():
        law = llama_speculative_law(p, q, k, p_split=p_split)
        ref = torch.tensor(_top_reference(p.tolist(), q.tolist(), k, p_split), dtype=torch.float64)
        assert (law.output - ref).abs().max() <= 1e-12, label
        assert abs(float(law.output.sum()) - 1.0) <= 1e-12, label
        assert abs(float(law.tv) - 0.5 * float((ref - p).abs().sum())) <= 1e-12, label
        n = len(_children(q.tolist(), k, p_split))
        assert int(law.branches) == n, label
        assert law.drafts[:n].tolist() == _children(q.tolist(), k, p_split), label
        assert (law.drafts[n:] == -1).all(), label


@pytest.mark.parametrize("k", [1, 2, 3])
def test_sampled_law_equals_tuple_enumeration_and_p(k):
    """With drafts drawn i.i.d. from q the same verification is lossless: law = p (1e-12)."""
    for label, p, q in _cases():
        law = llama_speculative_law(p, q, k, draft_choice="sampled")
        ref = torch.tensor(_sampled_reference(p.tolist(), q.tolist(), k, 0.0), dtype=torch.float64)
        assert (law.output - ref).abs().max() <= 1e-12, label
        assert (law.output - p).abs().max() <= 1e-12, label
        assert float(law.tv) <= 1e-12, label


def test_sampled_is_lossless_on_large_random_batches():
    g = torch.Generator().manual_seed(7)
    p = torch.softmax(3 * torch.randn(64, 500, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(3 * torch.randn(64, 500, generator=g, dtype=torch.float64), -1)
    for k in (1, 2, 4, 8):
        law = llama_speculative_law(p, q, k, draft_choice="sampled")
        assert (law.output - p).abs().max() <= 1e-12
        assert float(law.tv.max()) <= 1e-12
    # single draft: plain speculative sampling, acceptance 1 - TV(p, q)
    law = llama_speculative_law(p, q, 1, draft_choice="sampled")
    assert torch.allclose(law.acceptance, 1 - 0.5 * (p - q).abs().sum(-1), atol=1e-12, rtol=0)


def test_top_ranked_drafts_are_not_lossless_closed_form():
    """p = q = (0.5, 0.3, 0.2) (a perfect draft at T = 1): the top-1 chain always emits token 0."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    law1 = llama_speculative_law(p, p, 1)
    assert law1.output.tolist() == [1.0, 0.0, 0.0]
    assert abs(float(law1.tv) - 0.5) <= 1e-12
    assert float(law1.acceptance) == 1.0
    law2 = llama_speculative_law(p, p, 2)  # the first visited child is always accepted
    assert (law2.output - torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)).abs().max() <= 1e-12
    assert abs(float(law2.tv) - 0.2) <= 1e-12
    law3 = llama_speculative_law(p, p, 3)
    assert (law3.output - torch.full((3,), 1 / 3, dtype=torch.float64)).abs().max() <= 1e-12
    assert abs(float(law3.tv) - 1 / 6) <= 1e-12
    # with the same (p, q), sampled drafts are exact
    assert float(llama_speculative_law(p, p, 1, draft_choice="sampled").tv) <= 1e-12


def test_top_chain_closed_form():
    """k = 1: out = a * delta_x + (1 - a) * norm((p - q)+), x = argmax q, a = min(1, p(x)/q(x))."""
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(20, 50, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(20, 50, generator=g, dtype=torch.float64), -1)
    law = llama_speculative_law(p, q, 1)
    x = q.argmax(-1, keepdim=True)
    a = torch.clamp(p.gather(-1, x) / q.gather(-1, x), max=1.0)
    res = (p - q).clamp_min(0)
    res = res / res.sum(-1, keepdim=True)
    ref = (1 - a) * res
    ref.scatter_add_(-1, x, a)
    assert (law.output - ref).abs().max() <= 1e-12
    assert (law.acceptance - a.squeeze(-1)).abs().max() <= 1e-12


def test_batched_rows_equal_single_rows():
    g = torch.Generator().manual_seed(11)
    p = torch.softmax(2 * torch.randn(2, 3, 9, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(2, 3, 9, generator=g, dtype=torch.float64), -1)
    law = llama_speculative_law(p, q, 4, p_split=0.1)  # rows get different numbers of children
    assert law.output.shape == (2, 3, 9) and law.tv.shape == (2, 3) and law.drafts.shape == (2, 3, 4)
    assert len(set(law.branches.flatten().tolist())) > 1
    for i in range(2):
        for j in range(3):
            one = llama_speculative_law(p[i, j], q[i, j], 4, p_split=0.1)
            assert (law.output[i, j] - one.output).abs().max() <= 1e-15
            assert int(law.branches[i, j]) == int(one.branches)


def test_branch_rule():
    q = torch.tensor([0.05, 0.3, 0.12, 0.2, 0.08, 0.25], dtype=torch.float64)  # ranked 1, 5, 3, 2, 4, 0
    d, n = peer_branches(q, 8, p_split=0.1)
    assert int(n) == 4 and d.tolist() == [1, 5, 3, 2, -1, -1]
    d, n = peer_branches(q, 2, p_split=0.1)
    assert int(n) == 2 and d.tolist() == [1, 5]
    d, n = peer_branches(q, 8, p_split=0.0)
    assert int(n) == 6
    d, n = peer_branches(q, 8, p_split=0.5)
    assert int(n) == 1 and d.tolist() == [1, -1, -1, -1, -1, -1]
    flat = torch.full((20,), 0.05, dtype=torch.float64)
    d, n = peer_branches(flat, 16, p_split=0.0)
    assert int(n) == MAX_CHILDREN and d.tolist() == list(range(8))  # ties: lowest id first
    d, n = peer_branches(torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64), 3)
    assert int(n) == 1 and d.tolist() == [1, -1, -1]  # no child with q = 0


# ---------------------------------------------------------------- Monte Carlo replay

MC_CASES = [
    ("perfect draft, chain", [0.5, 0.3, 0.2], [0.5, 0.3, 0.2], 1, 0.0),
    ("random, 3 children", [0.1, 0.35, 0.05, 0.3, 0.2], [0.3, 0.1, 0.25, 0.2, 0.15], 3, 0.0),
    ("random, 4 children, split 0.1", [0.05, 0.05, 0.4, 0.1, 0.25, 0.15], [0.22, 0.18, 0.2, 0.05, 0.15, 0.2], 4, 0.1),
]


@pytest.mark.parametrize("label,p,q,k,p_split", MC_CASES)
def test_monte_carlo_replay_matches_exact_law(label, p, q, k, p_split):
    N = 40_000
    rng = random.Random(20240 + k)
    counts = [0] * len(p)
    for _ in range(N):
        counts[_replay(p, q, k, p_split, rng)] += 1
    emp = torch.tensor(counts, dtype=torch.float64) / N
    pt, qt = torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64)
    exact = llama_speculative_law(pt, qt, k, p_split=p_split).output
    sd = (exact * (1 - exact) / N).sqrt()
    assert ((emp - exact).abs() <= 5 * sd + 1e-12).all(), (label, emp, exact)
    # and the replay is far from the target law: the deviation is real, not a modelling artefact
    z = ((emp - pt).abs() / (pt * (1 - pt) / N).sqrt().clamp_min(1e-3)).max()
    assert z > 10, (label, emp, pt)


# ---------------------------------------------------------------- bad input

def test_bad_input():
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    with pytest.raises(ValueError, match="same shape"):
        llama_speculative_law(p, torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64), 2)
    with pytest.raises(ValueError, match="draft_choice"):
        llama_speculative_law(p, p, 2, draft_choice="greedy")
    with pytest.raises(ValueError, match="p_split"):
        llama_speculative_law(p, p, 2, p_split=-0.1)
    with pytest.raises(ValueError, match="p_split"):
        llama_speculative_law(p, p, 2, p_split=float("nan"))
    with pytest.raises(ValueError, match="k"):
        llama_speculative_law(p, p, 0)
    with pytest.raises(ValueError, match="target_probs"):
        llama_speculative_law(torch.tensor([0.7, 0.7], dtype=torch.float64), p, 1)
    with pytest.raises(ValueError, match="draft_probs"):
        llama_speculative_law(p, torch.tensor([float("nan"), 1.0], dtype=torch.float64), 1)
