"""Regression tests for the numerics at the edges (issue 10): tiny (subnormal) masses,
per-row reductions, one float32 normalisation rule, byte-counting size guards."""
from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest
import torch

import multidraft as md
from multidraft import drafts as D
from multidraft.limits import lp_optimal_acceptance, optimal_acceptance


# ---- 1. optimal_acceptance with tiny (subnormal) masses ------------------------------------
@pytest.mark.parametrize("tiny", [1e-310, 1e-321, 5e-324])
def test_wor_alpha_star_with_subnormal_draft_masses(tiny):
    # q puts all but a subnormal mass on token 0: the second draft (without replacement) is
    # token 1 or 2 with probability 1/2 each, so every H has p(H) >= Q(all in H): alpha* = 1
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    q = torch.tensor([1.0, tiny, tiny], dtype=torch.float64)
    law = D.without_replacement(q, 2)
    assert optimal_acceptance(p, law) == pytest.approx(1.0, abs=1e-12)
    assert lp_optimal_acceptance(p, law) == pytest.approx(1.0, abs=1e-9)


def _tiny_instances(n, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        V = int(torch.randint(2, 7, (1,), generator=g))
        p = torch.rand(V, generator=g, dtype=torch.float64)
        q = torch.rand(V, generator=g, dtype=torch.float64)
        for x in (p, q):
            m = torch.rand(V, generator=g) < 0.5
            x[m] = 10.0 ** (-300.0 - 20.0 * torch.rand(V, generator=g, dtype=torch.float64))[m]
            if float(x.max()) < 1e-200:
                x[int(torch.randint(0, V, (1,), generator=g))] = 1.0
        yield p / p.sum(), q / q.sum()


@pytest.mark.parametrize("kind", ["iid", "wor", "greedy", "independent"])
def test_dual_equals_lp_with_tiny_masses(kind):
    checked = 0
    for p, q in _tiny_instances(40, seed={"iid": 1, "wor": 2, "greedy": 3, "independent": 4}[kind]):
        for K in (2, 3):
            if kind in ("wor", "greedy") and int((q > 0).sum()) < K:
                continue
            law = D.independent(torch.stack([q, q.flip(0)] + [q.roll(1)] * (K - 2))) if kind == "independent" else D.make(kind, q, K)
            a = optimal_acceptance(p, law)
            b = lp_optimal_acceptance(p, law)
            assert math.isfinite(a) and a == pytest.approx(b, abs=1e-8), (kind, K, p.tolist(), q.tolist())
            checked += 1
    assert checked >= 40


def test_wor_batched_tiny_rows_match_unbatched():
    rows = list(_tiny_instances(12, seed=7))
    rows = [(p, q) for p, q in rows if int((q > 0).sum()) >= 2]
    V = 6
    P = torch.stack([torch.nn.functional.pad(p, (0, V - p.numel())) for p, _ in rows])
    Q = torch.stack([torch.nn.functional.pad(q, (0, V - q.numel())) for _, q in rows])
    batched = optimal_acceptance(P, D.without_replacement(Q, 2))
    single = torch.tensor([optimal_acceptance(P[i], D.without_replacement(Q[i], 2)) for i in range(len(rows))], dtype=torch.float64)
    assert torch.allclose(batched, single, atol=1e-13, rtol=0)


# ---- 2. multidraft bound at a temperature that makes subnormal probabilities ---------------
def _bound(tmp_path, p_logits, q_logits, *extra):
    from multidraft.cli import main

    np.save(tmp_path / "p.npy", np.asarray(p_logits, dtype=np.float64))
    np.save(tmp_path / "q.npy", np.asarray(q_logits, dtype=np.float64))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["bound", "--p", str(tmp_path / "p.npy"), "--q", str(tmp_path / "q.npy"), "--logits", *extra])
    return rc, out.getvalue(), err.getvalue()


def test_bound_cli_at_temperature_003_on_subnormal_softmax(tmp_path):
    T = 0.03
    logits = [0.0, -21.25, -21.25]
    rc, out, err = _bound(tmp_path, logits, logits, "--temperature", str(T))
    assert rc == 0 and "Traceback" not in out + err, err
    assert "optimal acceptance" in out
    # a nontrivial value, checked against the LP: q is peaked with subnormal tails
    ptarget = torch.tensor([0.1, 0.1, 0.1, 0.7], dtype=torch.float64)
    q_logits = [0.0, -21.5, -21.5, -21.5]
    rc, out, err = _bound(tmp_path, (T * ptarget.log()).tolist(), q_logits, "--temperature", str(T), "--json", "--k", "1-3")
    assert rc == 0 and "Traceback" not in out + err, err
    rows = {(r["law"], r["K"]): r["acceptance"] for r in json.loads(out)["rows"]}
    p = torch.softmax(T * ptarget.log() / T, -1)
    q = torch.softmax(torch.tensor(q_logits, dtype=torch.float64) / T, -1)
    assert 0 < float(q[1]) < 2.2e-308  # really subnormal
    for K in (2, 3):
        for kind in ("iid", "wor", "greedy"):
            assert rows[(kind, K)] == pytest.approx(lp_optimal_acceptance(p, D.make(kind, q, K)), abs=1e-8), (kind, K)
    assert rows[("wor", 2)] == pytest.approx(1 - (2 / 3 - 0.3), abs=1e-8)


# ---- 3. SpecTr: per-row reductions, exact near q = p ---------------------------------------
def _mixed_rows(B, V, seed):
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(torch.randn(B, V, generator=g, dtype=torch.float64) * 2, -1)
    Q = torch.softmax(torch.log(P) + torch.randn(B, V, generator=g, dtype=torch.float64), -1)
    return P, Q


@pytest.mark.parametrize("V", [7, 3000])
@pytest.mark.parametrize("K", [2, 4])
def test_spectr_identical_rows_are_bitwise_identical_anywhere_in_the_batch(V, K):
    from multidraft.verifiers.spectr import solve_rho

    P, Q = _mixed_rows(16, V, seed=V + K)
    for i in (3, 9, 15):  # one row, repeated at several positions among different rows
        P[i], Q[i] = P[0], Q[0]
    rho = solve_rho(P, Q, K)
    alone = solve_rho(P[:1], Q[:1], K)
    assert bool((rho[[3, 9, 15]] == rho[0]).all()) and bool(rho[0] == alone[0])
    drafts = D.iid(Q, K).sample(torch.Generator().manual_seed(1))
    drafts = drafts.clone()
    drafts[[3, 9, 15]] = drafts[0].clone()
    out = md.verifiers.get("spectr").output_distribution(P, Q, drafts)  # [B, V]
    one = md.verifiers.get("spectr").output_distribution(P[0], Q[0], drafts[0])
    assert bool((out[[3, 9, 15]] == out[0]).all()) and bool((out[0] == one).all())


@pytest.mark.parametrize("K", [2, 3, 4])
def test_spectr_certificate_exact_when_q_is_close_to_p(K):
    g = torch.Generator().manual_seed(K)
    worst = 0.0
    for i in range(60):
        V = int(torch.randint(2, 7, (1,), generator=g))
        p = torch.rand(V, generator=g, dtype=torch.float64) + 0.05
        p = p / p.sum()
        eps = 10.0 ** float(-3 - 12 * torch.rand(1, generator=g, dtype=torch.float64))
        q = p * (1 + eps * (torch.rand(V, generator=g, dtype=torch.float64) - 0.5))
        q = q / q.sum()
        for qq in (q, p.clone()):
            cert = md.certify("spectr", p, D.iid(qq, K))
            worst = max(worst, cert.max_abs_error)
            assert cert.acceptance <= optimal_acceptance(p, D.iid(qq, K)) + 1e-12
    assert worst <= 1e-12, worst


def test_spectr_rho_is_one_exactly_when_p_equals_q():
    from multidraft.verifiers.spectr import solve_rho

    P, _ = _mixed_rows(8, 50, seed=3)
    for K in (2, 3, 5):
        assert bool((solve_rho(P, P.clone(), K) == 1.0).all())


# ---- 4. one normalisation rule for float32 inputs on every exact path ---------------------
def test_float32_inputs_one_normalisation_rule():
    from multidraft._validate import as_probs64
    from multidraft.limits import k2_optimal_acceptance

    # a float32 pair whose float64 sums are off by ~1e-7; before the fix certify (which
    # renormalised p) reported lp_optimal acceptance 2.5e-7 above optimal_acceptance (which did not)
    p = torch.tensor([3.2369218843086855e-06, 0.00019397940195631236, 0.00019635957141872495,
                      2.304407047404311e-07, 0.0008085057488642633, 0.9987976551055908], dtype=torch.float32)
    q = torch.tensor([0.3895387649536133, 0.00386927742511034, 0.009956262074410915,
                      0.38069674372673035, 0.1956222802400589, 0.020316803827881813], dtype=torch.float32)
    assert abs(float(p.double().sum()) - 1) > 1e-8  # the case where the rule matters
    p64, q64 = as_probs64(p, "p"), as_probs64(q, "q")
    assert p64.dtype == torch.float64 and abs(float(p64.sum()) - 1) < 1e-15
    for kind in ("iid", "wor", "greedy"):
        law32, law64 = D.make(kind, q, 2), D.make(kind, q64, 2)
        a32 = optimal_acceptance(p, law32)
        assert a32 == optimal_acceptance(p64, law64)  # float32 in == its float64 renormalisation in
        assert lp_optimal_acceptance(p, law32) == pytest.approx(a32, abs=1e-9)
        for name in md.verifiers.names():
            v = md.verifiers.get(name)
            if v.supports(law32):
                cert = md.certify(v, p, law32)
                assert cert.acceptance <= a32 + 1e-12, (name, kind, cert.acceptance - a32)
    assert k2_optimal_acceptance(p, q) == optimal_acceptance(p64, D.iid(q64, 2))
    # float64 inputs are used as given
    x = torch.tensor([0.5, 0.5 + 1e-9], dtype=torch.float64)
    assert as_probs64(x, "p") is not None and bool((as_probs64(x, "p") == x).all())


# ---- 6. the LP refuses impossible sizes up front -------------------------------------------
def test_lp_size_check_names_k_and_the_tuple_count():
    from multidraft.limits import MAX_LP_TUPLES, check_lp_size, tuple_count

    q = torch.softmax(torch.arange(6, dtype=torch.float64), -1)
    p = q.flip(0)
    for kind, K in (("iid", 1), ("iid", 3), ("wor", 3), ("greedy", 4)):
        law = D.make(kind, q, K)
        assert tuple_count(law) == law.enumerate()[0].shape[0] == check_lp_size(law)
    qs = torch.stack([q, torch.tensor([0.5, 0.5, 0, 0, 0, 0], dtype=torch.float64)])
    assert tuple_count(D.independent(qs)) == D.independent(qs).enumerate()[0].shape[0] == 12
    for K, n in ((8, 6**8), (50, 6**50)):
        law = D.iid(q, K)
        assert tuple_count(law) == n > MAX_LP_TUPLES
        for fn in (check_lp_size, lambda L: lp_optimal_acceptance(p, L), lambda L: md.limits.is_lp_optimal_acceptance(p, L)):
            with pytest.raises(ValueError, match=rf"k = {K}: .*{n:,} draft tuples"):
                fn(law)
    with pytest.raises(ValueError, match="k = 6"):
        check_lp_size(D.iid(q, 6))  # 46,656 tuples: minutes of HiGHS
    assert check_lp_size(D.iid(q, 6), max_tuples=10**5) == 6**6


# ---- 5. certify counts bytes before it enumerates; mixes in bounded chunks -----------------
def test_certify_size_guard_counts_bytes_before_enumerating(monkeypatch):
    from multidraft import exact

    V = 1000
    q = torch.full((V,), 1.0 / V, dtype=torch.float64)
    law = D.iid(q, 2)  # 1,000,000 tuples x 1000 x 8 bytes = 8 GB of output laws

    def boom(*a, **k):
        raise AssertionError("enumerated before the size guard")

    monkeypatch.setattr(law, "enumerate", boom)
    for fn, limit in ((exact.certify, exact.MAX_CERTIFY_BYTES), (exact.output_law, exact.MAX_OUTPUT_LAW_BYTES)):
        with pytest.raises(ValueError, match=r"1,000,000 per-tuple output laws of V = 1000 \(7\.45 GiB.*limit is") as ei:
            fn("specinfer", q, law)
        assert f"{limit / 2**30:.3g} GiB" in str(ei.value)
    # a law under the certify limit but over the output_law one: only output_law refuses
    monkeypatch.setattr(exact, "MAX_OUTPUT_LAW_BYTES", 1000)
    small = D.iid(torch.full((5,), 0.2, dtype=torch.float64), 3)  # 125 tuples x 5 x 8 = 5000 bytes
    with pytest.raises(ValueError, match="125 per-tuple output laws of V = 5"):
        exact.output_law("specinfer", small.q, small)
    assert exact.certify("specinfer", small.q, small).max_abs_error <= 1e-12


@pytest.mark.parametrize("name,kind", [("specinfer", "iid"), ("spectr", "iid"), ("rrs_wor", "wor"), ("lp_optimal", "iid")])
def test_certify_in_chunks_equals_one_shot(monkeypatch, name, kind):
    from multidraft import exact

    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(5, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(5, generator=g, dtype=torch.float64), -1)
    law = D.make(kind, q, 3)
    tuples, probs, out, p64 = exact.output_law(name, p, law)
    one_shot_acc = float(probs @ exact.acceptance_given(out, tuples))
    calls = []
    prepared = md.verifiers.base.Prepared
    orig = prepared.output_distribution  # what certify calls once per chunk of tuples

    def counted(self, drafts):
        calls.append(drafts.shape[0])
        return orig(self, drafts)

    monkeypatch.setattr(prepared, "output_distribution", counted)
    monkeypatch.setattr(exact, "CHUNK_BYTES", 7 * 8 * 5)  # 7 tuples per call
    cert = exact.certify(name, p, law)
    assert max(calls) == 7 and sum(calls) == tuples.shape[0]
    assert torch.allclose(cert.output, probs @ out, atol=1e-15, rtol=0)
    assert cert.acceptance == pytest.approx(one_shot_acc, abs=1e-15)
    assert cert.max_abs_error <= 1e-12
