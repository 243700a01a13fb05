"""Seeded random (p, q) instances for the exact tests, including the degenerate corners."""
from __future__ import annotations

import torch


def _dirichlet(V, g, alpha=1.0):
    # exponential trick (exact Dirichlet(1)) sharpened or flattened by a power: a random
    # simplex point whose peakedness follows alpha; only the generator's uniforms are used
    u = torch.rand(V, generator=g, dtype=torch.float64).clamp_min(1e-300)
    e = (-torch.log(u)) ** (1.0 / alpha)
    return e / e.sum()


def instances(n: int, seed: int, max_v: int = 6):
    """Yield ``(label, p, q)`` float64 pairs: n random ones after the fixed corner cases."""
    g = torch.Generator().manual_seed(seed)
    corners = []
    for V in (1, 2, 3, 5, 6):
        q = _dirichlet(V, g)
        onehot = torch.zeros(V, dtype=torch.float64)
        onehot[V - 1] = 1.0
        corners.append((f"onehot_p_V{V}", onehot, q))
        corners.append((f"p_eq_q_V{V}", q.clone(), q.clone()))
    q = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0], dtype=torch.float64)
    p = torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2], dtype=torch.float64)
    corners.append(("q_zero_where_p_positive", p, q))
    p = torch.tensor([1 - 2e-15, 1e-15, 1e-15, 0.0], dtype=torch.float64)
    q = torch.tensor([1e-15, 0.5, 0.5 - 2e-15, 1e-15], dtype=torch.float64)
    corners.append(("near_degenerate_1e-15", p / p.sum(), q / q.sum()))
    corners.append(("uniform_p_sparse_q", torch.full((4,), 0.25, dtype=torch.float64), torch.tensor([0.7, 0.3, 0.0, 0.0], dtype=torch.float64)))
    yield from corners
    for i in range(n):
        V = int(torch.randint(2, max_v + 1, (1,), generator=g))
        alpha = [0.2, 0.5, 1.0, 3.0][i % 4]
        p = _dirichlet(V, g, alpha)
        q = _dirichlet(V, g, alpha)
        if i % 5 == 0:  # zeros in q where p > 0
            q[int(torch.randint(0, V, (1,), generator=g))] = 0.0
            if q.sum() == 0:
                q[0] = 1.0
            q = q / q.sum()
        if i % 7 == 0:  # zeros in p
            p[int(torch.randint(0, V, (1,), generator=g))] = 0.0
            if p.sum() == 0:
                p[0] = 1.0
            p = p / p.sum()
        yield f"random_{i}_V{V}", p, q


def make_law(kind: str, q: torch.Tensor, k: int, seed: int = 0):
    """The law of ``kind`` for q, or None when q cannot support it (too few nonzeros)."""
    from multidraft import drafts as D

    nnz = int((q > 0).sum())
    if kind == "iid":
        return D.iid(q, k)
    if kind in ("wor", "greedy"):
        if nnz < k:
            return None
        return D.without_replacement(q, k) if kind == "wor" else D.greedy(q, k)
    if kind == "independent":
        g = torch.Generator().manual_seed(seed)
        qs = [q]
        for _ in range(k - 1):
            w = q * torch.rand(q.shape, generator=g, dtype=torch.float64) + 0.05 * torch.rand(q.shape, generator=g, dtype=torch.float64)
            qs.append(w / w.sum())
        return D.independent(torch.stack(qs))
    raise ValueError(kind)


def perturbed_pair(B, V, seed, noise=0.7, temp=1.2, dtype=torch.float64):
    """(p, q) ``[B, V]``: q a noisy, tempered copy of p (most first drafts accepted)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, V, generator=g, dtype=torch.float64) * 2
    p = torch.softmax(z, -1)
    q = torch.softmax((z + noise * torch.randn(B, V, generator=g, dtype=torch.float64)) / temp, -1)
    return p.to(dtype), q.to(dtype)
