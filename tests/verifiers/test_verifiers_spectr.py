"""verifiers/spectr.py (SpecTr K-SEQ): the rho* solver, its corner cases, and the batched
fast path against a plain per-row reference on the same uniforms.

Shared family tests (closed forms, sampling vs exact, precision, bad input) are in
test_verifiers_specinfer.py; exact certificates of every verifier are in test_exact.py.
"""
from __future__ import annotations

import pytest
import torch

import multidraft as md
from multidraft.verifiers._residual import inverse_cdf
from multidraft.verifiers.spectr import k_seq_f, kseq_sample, solve_rho
from instances import perturbed_pair

D = md.drafts


pytestmark = pytest.mark.usefixtures("one_thread")


def _f_direct(p, q, rho, K):
    """rho beta(rho) - p_acc(rho) computed directly; p, q [R, V], rho [R]."""
    beta = torch.minimum(p / rho.unsqueeze(-1), q).sum(-1)
    return rho * beta - (1 - (1 - beta) ** K)


# the rho* solver ---------------------------------------------------------------------------
@pytest.mark.parametrize("V", [1, 2, 6, 50, 3000])
@pytest.mark.parametrize("K", [2, 3, 4, 8])
def test_spectr_rho_is_the_smallest_root_in_1_K(V, K):
    p, q = perturbed_pair(16, V, seed=V * 10 + K, noise=1.5, temp=1.5)
    rho = solve_rho(p, q, K)
    assert bool(((rho >= 1) & (rho <= K)).all())
    f = _f_direct(p, q, rho, K)
    f1 = _f_direct(p, q, torch.ones(16, dtype=torch.float64), K)
    at_one = f1 >= 0
    assert bool((rho[at_one] == 1).all())
    inner = ~at_one
    assert float(torch.cat([f[inner].abs(), torch.zeros(1, dtype=torch.float64)]).max()) <= 1e-13  # a root
    assert bool((f[inner] >= -1e-13).all())  # on the lossless side (up to summation order)
    below = _f_direct(p, q, rho * (1 - 1e-9), K)
    assert bool((below[inner] < 0).all())  # the smallest one
    # the same value as a plain dense bisection
    lo, hi = torch.ones_like(rho), torch.full_like(rho, float(K))
    for _ in range(100):
        mid = (lo + hi) / 2
        up = _f_direct(p, q, mid, K) >= 0
        hi, lo = torch.where(up, mid, hi), torch.where(up, lo, mid)
    assert torch.allclose(rho, hi, atol=1e-12, rtol=0)


def test_spectr_rho_corner_cases():
    V = 7
    q = torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
    onehot = torch.zeros(V, dtype=torch.float64)
    onehot[2] = 1
    disjoint_p = torch.tensor([0.5, 0.5, 0, 0, 0, 0, 0], dtype=torch.float64)
    disjoint_q = torch.tensor([0, 0, 0.2, 0.2, 0.2, 0.2, 0.2], dtype=torch.float64)
    P = torch.stack([q, onehot, disjoint_p, onehot])
    Q = torch.stack([q, q, disjoint_q, onehot])
    rho = solve_rho(P, Q, 4)
    assert torch.isfinite(rho).all()
    assert float(rho[0]) == 1.0  # p == q: beta = 1, everything accepted at rho = 1
    assert float(rho[2]) == 1.0  # beta == 0: nothing can be accepted
    assert float(rho[3]) == 1.0  # p == q one-hot
    c = q[2]  # one-hot p: S(rho) = min(1, rho c), root (1 - (1 - c)^K) / c
    assert float(rho[1]) == pytest.approx(float((1 - (1 - c) ** 4) / c), abs=1e-12)
    for p_, q_ in zip(P, Q):
        for k in (1, 2, 4):
            cert = md.certify("spectr", p_, D.iid(q_, k))
            assert cert.max_abs_error <= 1e-13
            out = md.verifiers.get("spectr").output_distribution(p_, q_, D.iid(q_, k).sample(0))
            assert torch.isfinite(out).all()


def test_k_seq_f_signs():
    # f(1) <= 0 <= f(K) for any pair (Bernoulli), so [1, K] brackets the root
    p, q = perturbed_pair(64, 40, seed=3, noise=2.0, temp=2.0)
    for K in (2, 4, 7):
        S1 = torch.minimum(p, q).sum(-1)
        SK = torch.minimum(p, K * q).sum(-1)
        assert bool((k_seq_f(S1, torch.ones_like(S1), K) <= 1e-15).all())
        assert bool((k_seq_f(SK, torch.full_like(SK, float(K)), K) >= -1e-15).all())


def _ref_kseq(p, q, drafts, u, u_res):
    B, K = drafts.shape
    rho = solve_rho(p.double(), q.double(), K)
    out = torch.empty(B, dtype=torch.long)
    for b in range(B):
        pb, qb, r = p[b].double(), q[b].double(), float(rho[b])
        for i in range(K):
            x = int(drafts[b, i])
            if float(u[b, i]) * r * float(qb[x]) <= float(pb[x]):
                out[b] = x
                break
        else:
            m = torch.minimum(pb / r, qb)
            beta = float(m.sum())
            gamma = (1 - (1 - beta) ** K) / beta if beta > 0 else K
            res = (pb - gamma * m).clamp_min(0)
            out[b] = inverse_cdf(res.unsqueeze(0), u_res[b : b + 1])[0]
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("V", [9, 6000])
def test_spectr_fast_path_equals_reference(V, dtype):
    B, K = 96, 4
    p, q = perturbed_pair(B, V, seed=2 * V, noise=1.2, temp=1.4, dtype=dtype)
    g = torch.Generator().manual_seed(12)
    drafts = D.iid(q, K).sample(g)
    u = torch.rand(B, K, generator=g, dtype=torch.float64)
    u_res = torch.rand(B, generator=g, dtype=torch.float64)
    fast = kseq_sample(p, q, drafts, u, u_res)
    ref = _ref_kseq(p, q, drafts, u, u_res)
    assert int((fast != ref).sum()) <= 1
    assert int((fast != drafts[:, 0]).sum()) >= 10


