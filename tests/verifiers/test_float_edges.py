"""Issue 29, item 1: the known failures at the float32 and subnormal edges, as the decoder
passes them (``decoding/engine.py``: p from ``sampling.process_logits``, one-hot float32 at
temperature 0; q from a confident draft, float32 with tails near 1e-9; ``validate=False``).

Each test failed before the shared float64 prologue and residual/acceptance helpers
(``verifiers/_residual.py``): see the comment on each for what the old code did.
"""
from __future__ import annotations

import pytest
import torch

import multidraft as md
from multidraft import drafts as D

SUB64 = 5e-324  # the smallest float64 subnormal
N = 1000

# the confident-draft family: p one-hot on token 0, q puts ~1e-9 on two tokens with p = 0
P32 = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float32)
Q32 = torch.tensor([1.0, 1e-9, 1e-9, 0.0], dtype=torch.float32)  # sums to 1 in float32, to 1 + 2e-9 exactly


def _engine_verify(name, p, q, drafts, law, n=N, seed=0):
    v = md.verifiers.get(name)
    V, K = p.shape[-1], drafts.shape[-1]
    qq = q.expand(n, *q.shape)
    g = torch.Generator().manual_seed(seed)
    return v.verify(p.expand(n, V), qq, drafts.expand(n, K), generator=g, law=law, validate=False).token


@pytest.mark.parametrize("name,law", [
    ("specinfer", "iid"), ("specinfer", "independent"), ("rrs_wor", "wor"),  # old: token 2 (p = 0) in 1000 of 1000 draws
    ("spectr", "iid"), ("khisti_is", "iid"), ("khisti_is", "independent"),  # old: output law summing to 0 / RuntimeError
    ("lp_optimal", "iid"), ("lp_optimal", "independent"), ("lp_optimal", "wor"), ("optimal", "iid"), ("nss", "iid"),
])
def test_confident_float32_draft_never_outputs_a_p0_token(name, law):
    drafts = torch.tensor([1, 2])
    q = Q32 if law != "independent" else Q32.expand(2, 4)
    tok = _engine_verify(name, P32, q, drafts, law)
    assert bool((tok == 0).all()), f"{name}/{law}: tokens {torch.bincount(tok, minlength=4).tolist()}"
    out = md.verifiers.get(name).output_distribution(P32, q, drafts, law=law)
    assert out.dtype == torch.float64
    assert float(out.sum()) == pytest.approx(1.0, abs=1e-12)  # old spectr/khisti_is/lp_optimal: 0 or an error
    assert float(out[0]) == pytest.approx(1.0, abs=1e-12)


def test_confident_float32_draft_single_draft_sd():
    # old: naive raised "RuntimeError: internal error: a residual row has no mass"
    for x in (1, 2):
        tok = _engine_verify("naive", P32, Q32, torch.tensor([x]), "iid")
        assert bool((tok == 0).all())
        out = md.verifiers.get("naive").output_distribution(P32, Q32, torch.tensor([x]))
        assert out.tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0], abs=1e-15)


def test_confident_float32_draft_is_accepted_exactly_as_often_as_before_on_its_token():
    # the draft of the argmax is accepted with probability 1 (one-hot p, q(0) ~ 1 - 2e-9):
    # the fix costs nothing where the old behaviour was right
    for name, law in (("specinfer", "iid"), ("spectr", "iid"), ("rrs_wor", "wor"), ("optimal", "iid")):
        verdict = md.verifiers.get(name).verify(P32.expand(N, 4), Q32.expand(N, 4), torch.tensor([0, 1]).expand(N, 2),
                                                 generator=torch.Generator().manual_seed(1), law=law, validate=False)
        assert bool((verdict.token == 0).all()) and bool((verdict.accepted_index == 0).all())


@pytest.mark.parametrize("name,p,q,drafts", [
    # old: greedy_optimal output token 3 (u * q(x) underflowed to 0 <= p(x) = 0: accepted)
    ("greedy_optimal", [0.0, 0.0, 1.0, 0.0], [0.999999997082378, 10 * SUB64, 2.917622031654932e-09, 3 * SUB64], [0, 2, 3]),
    ("greedy_optimal", [0.0, 0.0, 1.0, 4 * SUB64], [0.0, 3 * SUB64, 1.0, 0.0], [2, 1]),
    ("spechub", [0.0, 0.0, 1.0, 4 * SUB64], [0.0, 3 * SUB64, 1.0, 0.0], [2, 1]),
])
def test_subnormal_masses_greedy_law_rules_never_output_a_p0_token(name, p, q, drafts):
    p = torch.tensor(p, dtype=torch.float64)
    q = torch.tensor(q, dtype=torch.float64)
    tok = _engine_verify(name, p, q, torch.tensor(drafts), "greedy")
    assert bool((p[tok] > 0).all()), f"{name}: tokens {torch.bincount(tok, minlength=4).tolist()}"
    out = md.verifiers.get(name).output_distribution(p, q, torch.tensor(drafts), law="greedy")
    assert float(out[p == 0].abs().max()) == 0.0 and float(out.sum()) == pytest.approx(1.0, abs=1e-12)


def test_rrs_wor_subnormal_remaining_mass():
    # old: C = 1 / D overflowed to inf at a subnormal undrafted mass D; 0 * inf = nan rows
    p = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 32 * SUB64], dtype=torch.float64)
    q = torch.tensor([0.0, 0.0, 9.881312917e-315, 1.0, 0.0, 0.0], dtype=torch.float64)
    tok = _engine_verify("rrs_wor", p, q, torch.tensor([3, 2]), "wor")
    assert bool((p[tok] > 0).all()), torch.bincount(tok, minlength=6).tolist()


def test_without_replacement_sampler_never_draws_a_q0_token():
    # old: the race keys E / q(x) overflowed to inf for q = 5e-324 and tied with q = 0 tokens
    # (4000 of 4000 draws held tokens 4 and 5, which have q = 0)
    q = torch.tensor([0.5, 0.5, SUB64, SUB64, 0.0, 0.0], dtype=torch.float64)
    d = D.without_replacement(q, 4).sample(torch.Generator().manual_seed(0), num_samples=4000)
    assert bool((q[d] > 0).all())
    assert sorted(set(d.flatten().tolist())) == [0, 1, 2, 3]


def test_greedy_law_last_draft_at_subnormal_masses_is_fair():
    # old: u * total at a total of 2 subnormal units kept two bits of u: 986 / 3014 of 4000
    q = torch.tensor([1.0, SUB64, SUB64, 0.0], dtype=torch.float64)
    d = D.greedy(q, 2).sample(torch.Generator().manual_seed(0), num_samples=4000)
    c = torch.bincount(d[:, 1], minlength=4)
    assert int(c[0]) == 0 and int(c[3]) == 0
    assert abs(int(c[1]) - 2000) < 160  # 5 standard deviations of Binomial(4000, 1/2)


def test_inverse_cdf_at_subnormal_totals_is_fair():
    from multidraft.verifiers._residual import inverse_cdf, inverse_cdf_blocked

    w = torch.zeros(4000, 5000, dtype=torch.float64)
    w[:, 7] = SUB64
    w[:, 4999] = SUB64
    u = torch.rand(4000, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for f in (inverse_cdf, inverse_cdf_blocked):
        idx = f(w, u)
        assert set(idx.tolist()) <= {7, 4999}
        assert abs(int((idx == 7).sum()) - 2000) < 160


def test_inverse_cdf_top_end_lands_on_a_positive_weight():
    # a target that rounds up to the row total goes to the last positive entry, not to V - 1
    from multidraft.verifiers._residual import inverse_cdf

    w = torch.tensor([[0.3, 0.7, 0.0]], dtype=torch.float64)
    assert int(inverse_cdf(w, torch.tensor([1.0], dtype=torch.float64))[0]) == 1


def test_accept_never_keeps_a_zero_target_mass():
    from multidraft.verifiers._residual import accept, accept_prob

    u = torch.tensor([0.0, 0.0, 0.5, 0.999], dtype=torch.float64)
    num = torch.tensor([0.0, 0.0, 0.0, 1e-300], dtype=torch.float64)
    den = torch.tensor([1.0, 0.0, SUB64, 0.0], dtype=torch.float64)
    assert accept(u, num, den).tolist() == [False, False, False, True]
    assert accept_prob(num, den).tolist() == [0.0, 0.0, 0.0, 1.0]


def test_rows_are_read_as_the_law_they_represent():
    from multidraft.verifiers._residual import rows64

    r = rows64(Q32)
    assert r.dtype == torch.float64
    assert float(r[0]) == pytest.approx(1 / (1 + 2e-9), rel=1e-15) and float(r[0]) < 1.0
    assert torch.equal(rows64(r), r)  # idempotent: a normalised row keeps its bits
    p = torch.softmax(torch.randn(3, 50, dtype=torch.float64), -1)
    assert torch.equal(rows64(p), p)  # float64 rows normalised in float64 pass unchanged
    e = p[0].expand(4, 50)
    assert rows64(e).stride(0) == 0  # expanded rows stay expanded


def test_base_does_not_import_the_registry():
    import ast
    import inspect

    from multidraft.verifiers import base

    tree = ast.parse(inspect.getsource(base))
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "registry" not in mods and not any(m and m.endswith(".registry") for m in mods)
    assert md.verifiers.names() == list(base.Verifier._registered)
