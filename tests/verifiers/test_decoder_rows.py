"""Issue 29, item 1: certificates, chi-square tests and a property test on the rows the
decoder really builds, in their own precision.

* p from ``sampling.process_logits`` in float32: temperature 0 (one-hot) and temperature 1;
* q from a confident draft in float32 (tails near 1e-9, some far below), normalised in float32;
* the property test: random float16/bfloat16/float32 rows with subnormal entries, normalised
  only in their own dtype; every registered verifier x supported law x K: no output with
  p = 0, no draft with q = 0, exact output laws that are laws on the support of p.
"""
from __future__ import annotations

import pytest
import torch
from scipy import stats

import multidraft as md
from multidraft import drafts as D
from multidraft.sampling import process_logits

V = 6


def _decoder_rows(seed):
    """(p at temperature 0, p at temperature 1, confident q) float32 ``[V]``, as the engine builds them."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, generator=g) * 2
    draft = logits + 0.5 * torch.randn(V, generator=g)
    draft[int(torch.randint(V, (1,), generator=g))] += 22.0  # confident: tails of 1e-9 .. 1e-11
    return process_logits(logits, 0.0), process_logits(logits, 1.0), process_logits(draft, 1.0)


def _law(kind, q, k, seed):
    if kind == "independent":
        g = torch.Generator().manual_seed(seed)
        other = process_logits(torch.log(q.double()).float() + torch.randn(V, generator=g), 1.0)
        return D.independent(torch.stack([q] + [other] * (k - 1)))
    return D.make(kind, q, k)


def _cases():
    for name in md.verifiers.names():
        v = md.verifiers.get(name)
        for k in (1, 2, 3):
            for kind in v.laws_for(k):
                if name == "lp_optimal" and k == 3:
                    continue  # the LP at K = 3 is covered by tests/test_lp_optimal.py
                yield name, kind, k


@pytest.mark.parametrize("name,kind,k", list(_cases()))
def test_certificates_on_float32_decoder_rows(name, kind, k):
    for seed in range(3):
        p0, p1, q = _decoder_rows(seed)
        law = _law(kind, q, k, seed)
        for p in (p0, p1):
            cert = md.exact.certify(name, p, law)
            assert cert.max_abs_error <= 1e-12, (name, kind, k, seed, cert.max_abs_error)
            assert float(cert.output[p == 0].abs().sum()) == 0.0


def _chi2(counts, probs, n, alpha=1e-6):
    exp = probs * n
    assert float(counts[probs == 0].sum()) == 0, "a token of target probability 0 was output"
    big = exp >= 5
    o = torch.cat([counts[big].double(), counts[~big].sum().double().reshape(1)])
    e = torch.cat([exp[big], exp[~big].sum().reshape(1)])
    o, e = o[e > 0], e[e > 0]
    chi2 = float(((o - e) ** 2 / e).sum())
    return chi2 <= stats.chi2.ppf(1 - alpha, max(len(o) - 1, 1)), chi2


@pytest.mark.parametrize("name,kind,k", [("specinfer", "iid", 2), ("rrs_wor", "wor", 3), ("spectr", "iid", 2),
                                         ("khisti_is", "iid", 2), ("greedy_optimal", "greedy", 2),
                                         ("spechub", "greedy", 2), ("optimal", "iid", 3), ("naive", "iid", 1)])
def test_chi_square_on_float32_decoder_rows(name, kind, k):
    """Drafts drawn from the float32 law, verified as the engine does (validate=False): the
    outputs follow p normalised in float64, and no p = 0 token appears."""
    n = 20_000
    v = md.verifiers.get(name)
    for seed in range(2):
        _, p, q = _decoder_rows(10 + seed)
        law = _law(kind, q, k, seed)
        g = torch.Generator().manual_seed(100 + seed)
        drafts = law.sample(g, num_samples=n)
        tok = v.verify(p.expand(n, V), law.q.expand(n, *law.q.shape), drafts, generator=g, law=kind, validate=False).token
        ok, chi2 = _chi2(torch.bincount(tok, minlength=V), p.double() / p.double().sum(), n)
        assert ok, (name, kind, k, seed, chi2)


# property test: random low-precision rows -------------------------------------------------
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _subnormal(dt):
    return float(torch.nextafter(torch.tensor(0.0, dtype=dt), torch.tensor(1.0, dtype=dt)))


def _row(g, n, dt):
    """A random probability row in dtype dt, normalised only in dt: some zeros, some of the
    dtype's smallest subnormals, some tails of 1e-9 (0 or subnormal in half precision)."""
    x = torch.rand(n, generator=g, dtype=torch.float64)
    kind = torch.randint(0, 5, (n,), generator=g)
    if bool(torch.rand(1, generator=g) < 0.3):  # peaked
        x = torch.zeros(n, dtype=torch.float64)
        x[int(torch.randint(n, (1,), generator=g))] = 1.0
    s = _subnormal(dt)
    x = torch.where(kind == 0, torch.zeros_like(x), x)
    x = torch.where(kind == 1, torch.randint(1, 4, (n,), generator=g).double() * s, x)
    x = torch.where(kind == 2, x * 1e-9, x)
    if float(x.sum()) == 0.0:
        x[0] = 1.0
    y = (x / x.sum()).to(dt)
    y = y / y.sum(dtype=dt) if float(y.sum()) > 0 else y
    if float(y.sum()) == 0.0:
        y = torch.zeros(n, dtype=dt)
        y[0] = 1
    return y


def _property_sweep(trials, seed, n=64):
    g = torch.Generator().manual_seed(seed)
    bad = []
    for trial in range(trials):
        dt = DTYPES[trial % 3]
        Vr = int(torch.randint(3, 8, (1,), generator=g))
        p, q = _row(g, Vr, dt), _row(g, Vr, dt)
        for name in md.verifiers.names():
            v = md.verifiers.get(name)
            for k in (1, 2, 3):
                for kind in v.laws_for(k):
                    if name == "lp_optimal" and k == 3:
                        continue
                    try:
                        law = D.independent(torch.stack([q] + [_row(g, Vr, dt) for _ in range(k - 1)])) if kind == "independent" else D.make(kind, q, k)
                    except ValueError:
                        continue  # too few positive entries for this law and K
                    gs = torch.Generator().manual_seed(trial)
                    drafts = law.sample(gs, num_samples=n)
                    qd = law.q.expand(n, *law.q.shape)
                    qx = qd.gather(-1, drafts.unsqueeze(-1)).squeeze(-1) if kind == "independent" else qd.gather(-1, drafts)
                    if bool((qx == 0).any()):
                        bad.append(("draft with q = 0", kind, k, dt))
                        continue
                    tok = v.verify(p.expand(n, Vr), qd, drafts, generator=gs, law=kind, validate=False).token
                    if bool((p[tok] == 0).any()):
                        bad.append(("output with p = 0", name, kind, k, dt, p.tolist(), law.q.tolist(), drafts[(p[tok] == 0)][0].tolist()))
                    out = v.output_distribution(p, law.q, drafts[0], law=kind)
                    if float(out[p == 0].abs().sum()) > 0 or abs(float(out.sum()) - 1) > 1e-12 or bool((out < 0).any()):
                        bad.append(("output law", name, kind, k, dt, p.tolist(), law.q.tolist(), drafts[0].tolist()))
    return bad


def test_property_low_precision_rows_never_reach_p0_or_q0():
    bad = _property_sweep(trials=9, seed=0)
    assert not bad, bad[:3]


@pytest.mark.slow
def test_property_low_precision_rows_never_reach_p0_or_q0_sweep():
    bad = _property_sweep(trials=150, seed=1, n=256)
    assert not bad, bad[:3]
