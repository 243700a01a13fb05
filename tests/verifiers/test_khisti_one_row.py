"""khisti_is on one row (issue 27, item 2): the decoder's path is the batched rule, token for token.

``KhistiIS._verify`` sends a single row to ``_verify_one`` (raw rows, a certified float32 top set,
the matches in numpy, the off-S histogram only when needed, chunked passes over V) and batches
to ``_verify_rows`` (the plan over all rows). These tests pin the one-row path to the batched
one: the same token and the same generator state for the same uniforms, on every route
(certified / fallback top set, drafts in and off S, accepted and rejected, iid and independent,
both off-S rules, a mass-limited S, several chunks), and its sampled law to the exact law. They
also pin the shortcuts inside: the hull chain against the enumeration of the lex split, the
compressed off-S recursion against the full one, the certified top set against the sort.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import multidraft as md
from multidraft.verifiers import khisti_is as KI
from multidraft.verifiers._residual import rows64


def _rows(V, seed, kind, K, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(V, generator=g, dtype=torch.float64) * [0.5, 2.0, 4.0][seed % 3]
    p = torch.softmax(lp, -1)
    if seed % 5 == 0:  # target zeros
        p[torch.randperm(V, generator=g)[: V // 3]] = 0
        p /= p.sum()
    if kind == "iid":
        q = torch.softmax(lp + torch.randn(V, generator=g, dtype=torch.float64), -1)
        if seed % 4 == 0:  # tied draft values
            q = (q * 64).round() + 1
            q /= q.sum()
    else:
        q = torch.softmax(lp + torch.randn(K, V, generator=g, dtype=torch.float64), -1)
    p, q = p.to(dtype), q.to(dtype)
    d = (md.drafts.iid(rows64(q), K) if kind == "iid" else md.drafts.independent(rows64(q))).sample(g)
    return p, q, d


class _Routes:
    """Counts which routes of the one-row path ran (wrapping the module's functions)."""

    def __init__(self, monkeypatch):
        self.n = {"certified": 0, "fallback": 0, "off_S": 0, "rejected": 0}
        cert, coef, res = KI._certified_top, KI._OffOne._coef, KI._residual_one

        def certified(R, n, K):
            out = cert(R, n, K)
            self.n["certified" if out is not None else "fallback"] += 1
            return out

        def off(o):
            self.n["off_S"] += o.A is None
            return coef(o)

        def rejected(*a):
            self.n["rejected"] += 1
            return res(*a)

        monkeypatch.setattr(KI, "_certified_top", certified)
        monkeypatch.setattr(KI._OffOne, "_coef", off)
        monkeypatch.setattr(KI, "_residual_one", rejected)


CONFIGS = [({}, "iid"), ({}, "independent"), ({"off": "rank"}, "iid"), ({"s": 3, "mass": 0.5}, "iid"), ({"s": 2}, "independent")]


@pytest.mark.parametrize("kw,kind", CONFIGS, ids=[f"{k}-{c}" for c, k in CONFIGS])
def test_one_row_path_is_the_batched_rule_token_for_token(monkeypatch, kw, kind):
    routes = _Routes(monkeypatch)
    monkeypatch.setattr(KI, "OFF_CHUNK", 1 << 12)  # several chunks at V = 9000
    v = KI.KhistiIS(**kw)
    checked = 0
    for V, dtypes in ((7, (torch.float64,)), (60, (torch.float64, torch.float32)), (9000, (torch.float32, torch.bfloat16))):
        for dtype in dtypes:
            for K in (1, 2, 3, 5):
                for seed in range(3):
                    p, q, d = _rows(V, seed, kind, K, dtype)
                    for gs in range(2):
                        g1, g2 = torch.Generator().manual_seed(gs), torch.Generator().manual_seed(gs)
                        one = v.verify(p, q, d, generator=g1, law=kind, validate=False).token  # N = 1: _verify_one
                        rows = v._verify_rows(rows64(p)[None], rows64(q)[None], d[None], g2)[0]
                        assert int(one) == int(rows), (V, dtype, K, seed, gs)
                        assert torch.equal(g1.get_state(), g2.get_state()), (V, dtype, K, seed, gs)
                        checked += 1
    assert checked >= 100
    n = routes.n
    assert n["certified"] > 0 and n["off_S"] > 0 and n["rejected"] > 0, n


def test_certified_top_set_falls_back_on_ties_and_matches_the_sort():
    """At V = 151,936: on distinct scores the float32 bound certifies the top set, which is the
    stable sort's; with bf16-rounded logits (ties at the boundary) it may decline, never err."""
    g = torch.Generator().manual_seed(3)
    V = 151_936
    got = {"certified": 0, "declined": 0}
    for trial in range(6):
        z = torch.randn(V, generator=g) * (1.0 + trial)
        if trial >= 3:
            z = z.bfloat16().float()
        p = torch.softmax(z, -1)
        q = torch.softmax(z + torch.randn(V, generator=g), -1)
        R = KI._Row(p, q)
        S = KI._certified_top(R, 10, 2)
        got["certified" if S is not None else "declined"] += 1
        if S is not None:
            score = rows64(p) - rows64(q) * rows64(q)
            assert torch.equal(S, KI._top_set(score.unsqueeze(0), 10)[0]), trial
        assert torch.equal(R.top_set(10, 2), KI._top_set((rows64(p) - rows64(q) ** 2).unsqueeze(0), 10)[0])
    assert got["certified"] >= 3, got


def test_one_row_sampling_matches_the_exact_law():
    """Many one-row calls (the decoder's shape) against ``output_distribution``: chi-square."""
    g = torch.Generator().manual_seed(11)
    V, K, n = 9, 3, 6000
    p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, -1)
    q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, -1)
    v = KI.KhistiIS(s=3)
    law = md.drafts.iid(q, K)
    tuples, probs = law.enumerate()
    for t in tuples[probs.argsort(descending=True)[:2]]:
        exact = v.output_distribution(p, q, t, law=law)
        counts = torch.zeros(V)
        for _ in range(n):
            counts[int(v.verify(p, q, t, generator=g, law="iid", validate=False).token)] += 1
        assert float(counts[exact == 0].sum()) == 0
        e = exact * n
        big = e >= 5
        o = torch.cat([counts[big].double(), counts[~big].double().sum().reshape(1)])
        ee = torch.cat([e[big], e[~big].sum().reshape(1)])
        keep = ee > 0
        chi2 = float(((o[keep] - ee[keep]) ** 2 / ee[keep]).sum())
        assert chi2 <= stats.chi2.ppf(1 - 1e-6, int(keep.sum()) - 1), (t.tolist(), chi2)


def test_hull_chain_gives_the_enumerated_law():
    """The lex split with the hull candidate (``rt`` given) realises the same winner law as the
    enumeration of the chain, on random matches with peaked, flat and tiny masses, r = t and
    r != t; where the hull candidate is taken (realised), its blocks are the enumeration's."""
    rng = np.random.default_rng(5)
    n = 10
    a, b = np.triu_indices(n, 1)
    taken = 0
    for t_ in range(120):
        conc = rng.choice([0.1, 1.0, 5.0], 3)
        p = rng.dirichlet(np.ones(n) * conc[0]) * rng.uniform(0.05, 1)
        t = rng.dirichlet(np.ones(n) * conc[2]) * rng.uniform(0.05, 1)
        r = t.copy() if t_ % 2 == 0 else rng.dirichlet(np.ones(n) * conc[1]) * rng.uniform(0.05, 1)
        r_out, t_out = 1 - r.sum(), 1 - t.sum()
        fixed = r * t + r * t_out + r_out * t
        M = r[a] * t[b] + r[b] * t[a]
        w = np.maximum(p, KI._P_FLOOR)
        lam0, blk0 = KI._lex_chain_enum(w, M, fixed, a, b)
        chain = KI._lex_chain_hull(w, r, t, r_out, t_out)
        if t_ % 2 == 0:
            assert chain is not None, t_  # r = t: a prefix chain (no ties here)
        if chain is not None and KI._lex_realise(*chain, w, M, fixed, a, b)[1]:
            taken += 1
            assert np.array_equal(chain[1], blk0), t_
            np.testing.assert_allclose(chain[0] * w, lam0 * w, rtol=1e-12, atol=1e-15)
        f, ok = KI._lex_decomp_row(p, M, fixed, a, b, (r, t, r_out, t_out))
        f0, ok0 = KI._lex_decomp_row(p, M, fixed, a, b)
        assert ok and ok0 and (f >= 0).all() and (f <= M).all(), t_
        m = fixed + np.bincount(a, f, n) + np.bincount(b, M - f, n)
        m0 = fixed + np.bincount(a, f0, n) + np.bincount(b, M - f0, n)
        np.testing.assert_allclose(m, m0, rtol=1e-12, atol=1e-15)
    assert taken >= 80, taken


def test_off_coef_on_used_buckets_equals_the_full_recursion():
    g = torch.Generator().manual_seed(2)
    for kind, C in (("ratio", KI._R_C), ("rank", KI._n_buckets(torch.float64))):
        for k1, K in ((1, 4), (3, 3)):
            H = torch.zeros(2, k1, C, dtype=torch.float64)
            cols = torch.randperm(C, generator=g)[:40]
            H[..., cols] = torch.rand(2, k1, 40, generator=g, dtype=torch.float64)
            rule = KI._OffRule(kind, torch.zeros(2, 5, dtype=torch.long), C)
            used = KI._off_coef(H, rule, K)
            full = H.new_zeros(2, used.shape[1], C)
            # the recursion on all C buckets (what _off_coef did before it dropped empty ones)
            A = torch.zeros(2, K, C, dtype=torch.float64)
            A[:, 0] = 1.0
            for m in range(1, K):
                Hm = H[:, m if k1 > 1 else 0]
                Hr = (A[:, :m] * (H[:, :m] if k1 > 1 else H)).sum(1)
                keep, win = rule.sums(Hm, Hr)
                A[:, :m] *= keep.unsqueeze(1)
                A[:, m] = win
            full = A if k1 > 1 else A.sum(1, keepdim=True)
            mask = (H > 0).flatten(0, 1).any(0)
            torch.testing.assert_close(used[..., mask], full[..., mask], rtol=1e-13, atol=0)
            assert float(used[..., ~mask].abs().max()) == 0.0


def test_workspace_survives_inference_mode_then_normal_mode():
    """The one-row path's workspace made under ``torch.inference_mode`` (as the decoder verifies)
    is still writable by a call outside it (a RuntimeError before: inference tensors reused)."""
    from multidraft.verifiers import khisti_is as ki

    ki._WS.__dict__.pop("bufs", None)  # this thread's workspace starts empty
    g = torch.Generator().manual_seed(3)
    V = 1 << 17
    p = torch.rand(V, generator=g) ** 8
    q = torch.rand(V, generator=g) ** 8
    p, q = p / p.sum(), q / q.sum()
    v = md.verifiers.get("khisti_is")
    drafts = torch.multinomial(q, 4, replacement=True, generator=g)
    with torch.inference_mode():
        a = v.verify(p, q, drafts, generator=torch.Generator().manual_seed(0), law="iid")
    assert ki._WS.__dict__.get("bufs"), "the call did not use the workspace: the test would prove nothing"
    b = v.verify(p, q, drafts, generator=torch.Generator().manual_seed(0), law="iid")
    assert int(a.token) == int(b.token)


def _sorted_top(p, q, n):
    qb = rows64(q) if q.ndim == 1 else rows64(q).mean(0)
    return KI._top_set((rows64(p) - qb * qb).unsqueeze(0), n)[0]


def test_draft_free_bound_declines_where_the_drafts_reorder_the_top_and_the_full_bound_certifies():
    """The top set is tried first from u = p a (no pass over the draft rows). Where the drafts'
    mass reverses the order of the likeliest tokens (qbar grows along them faster than p) that
    bound cannot certify and the bound with qbar^2 does; both, when they answer, give the sort's
    set, on shared and on per-draft q."""
    V, n = 151_936, 10
    i = torch.arange(20, dtype=torch.float64)
    p = torch.full((V,), 1e-9, dtype=torch.float64)
    p[:20] = 0.04 * (1 + 1e-3 * i)
    p[20:40] = 0.0099
    p = (p / p.sum()).float()
    q = torch.full((V,), 1e-9, dtype=torch.float64)
    q[:20] = 0.05 + 0.002 * i
    q = (q / q.sum()).float()
    for qq, K in ((q, 2), (torch.stack([q, q.roll(0), q]), 3)):
        R = KI._Row(p, qq)
        assert KI._certified_top_from(R, n, K, q_free=True) is None
        want = _sorted_top(p, qq, n)
        assert torch.equal(KI._certified_top_from(R, n, K, q_free=False), want)
        assert torch.equal(KI._certified_top(R, n, K), want)
    g = torch.Generator().manual_seed(11)
    for trial in range(4):  # random LM-like rows: each bound declines or is right
        z = torch.randn(V, generator=g) * (1.0 + trial)
        p = torch.softmax(z, -1)
        q = torch.softmax(z + torch.randn(3, V, generator=g), -1)
        R = KI._Row(p, q)
        for free in (True, False):
            S = KI._certified_top_from(R, n, 3, q_free=free)
            assert S is None or torch.equal(S, _sorted_top(p, q, n)), (trial, free)
