"""The exact next-token law of llama.cpp's ``llama-speculative`` at one draft-tree node.

A lossy peer's law, for comparison (not a ceiling: ``limits`` holds those); pure maths on
``(p, q)`` rows, at the floor of the layers with ``drafts`` and ``sampling``.

The peer (``examples/speculative/speculative.cpp`` of llama.cpp commit 0c1e57098, the copy
vendored in llama-cpp-python 0.3.36; docs/guide/llama_cpp_peer.md describes it in full) does, at a
node whose target distribution is ``p`` and whose draft distribution is ``q`` (both the
processed, full-vocabulary distributions its sampler chains produce), at temperature > 0:

* **branches**: the node gets ``n = min(k, 8, 1 + #{f in 1..7 : q_(f) > p_split})`` children,
  ``q_(f)`` the f-th largest draft probability (0-based, so ``q_(0)`` is the largest) and
  ``k`` the number of parallel draft sequences (``-np``); with ``k = 1`` the tree is a chain;
* **drafts**: child i carries the i-th **top-ranked** token of ``q`` (i = 0..n-1) — the
  token its draft sampler drew is not used;
* **verification**: the children are visited in a uniformly random order; the j-th visited
  child's token ``x`` is accepted with probability ``min(1, p_j(x) / q(x))``, where
  ``p_0 = p`` and after each rejection ``p_(j+1) = norm((p_j - q)+)`` (the same ``q`` every
  time: all children of the node share it); if every child is rejected the output is a
  sample of ``p_n``.

``llama_speculative_law`` returns the exact law of the output token of that rule
(``draft_choice="top"``) and its total-variation distance to ``p``. The random visiting order
is averaged exactly (a dynamic program over the subsets of visited children, weights
``(n - |S| - 1)! / n!``), so the result is a float64 computation with no sampling.

``draft_choice="sampled"`` is the counterfactual control: the same tree shape and the same
verification, but the children's tokens drawn i.i.d. from ``q`` (as a lossless multi-draft
rule — SpecInfer's recursive rejection — would draft them). Its law is ``p`` for every
``(p, q)``; computing it through the same residual recursion is a check of that recursion.

Ties in ``q`` are ranked by token id (lowest first); llama.cpp's ``std::sort`` leaves the
order of tied tokens unspecified, so on an exact tie at the cut the peer may draft another
of the tied tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._validate import as_k, as_probs64

__all__ = ["PeerLaw", "MAX_CHILDREN", "DRAFT_CHOICES", "peer_branches", "llama_speculative_law"]

MAX_CHILDREN = 8  # speculative.cpp tries splits f = 1..7 at one node: at most 8 children
DRAFT_CHOICES = ("top", "sampled")


@dataclass(frozen=True)
class PeerLaw:
    """The peer's exact output law at a batch of nodes.

    output      float64 [..., V]  law of the emitted token
    tv          float64 [...]     total-variation distance of ``output`` to ``p``
    acceptance  float64 [...]     probability that one of the node's drafts is accepted
    branches    int64   [...]     number of children (drafts) at the node
    drafts      int64   [..., n]  the children's tokens for ``draft_choice="top"`` (``-1`` past
                                  ``branches``); empty last dimension for ``"sampled"``
    """

    output: torch.Tensor
    tv: torch.Tensor
    acceptance: torch.Tensor
    branches: torch.Tensor
    drafts: torch.Tensor


def _check_p_split(p_split) -> float:
    if isinstance(p_split, bool) or not isinstance(p_split, (int, float)) or not math.isfinite(float(p_split)):
        raise ValueError(f"p_split must be a finite real number, got {p_split!r}")
    return float(p_split)


def peer_branches(q: torch.Tensor, k, *, p_split: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The children of a node with draft distribution ``q`` ``[..., V]``: ``(drafts, branches)``.

    ``drafts`` int64 ``[..., min(k, 8, V)]``: the top-ranked tokens of ``q`` (ties by lowest id),
    ``-1`` past ``branches``; ``branches`` int64 ``[...]``: ``min(k, 8, 1 + #{f in 1..7 :
    q_(f) > p_split})``. With ``p_split >= 0`` every child has ``q > 0``; ``p_split < 0`` is
    refused (it would draft tokens the draft model gives probability 0, whose ratio
    ``p/q`` the peer computes as inf or NaN).
    """
    q = as_probs64(q, "draft_probs")
    k = as_k(k)
    p_split = _check_p_split(p_split)
    if p_split < 0:
        raise ValueError(f"p_split must be >= 0 (a child with q = 0 has no acceptance ratio), got {p_split}")
    n_max = min(k, MAX_CHILDREN, q.shape[-1])
    ranked, order = torch.sort(q, dim=-1, descending=True, stable=True)
    top = order[..., :n_max]
    # split f (1-based rank f+1) happens while the f-th ranked probability exceeds p_split;
    # the probabilities are sorted, so "the first failure stops the loop" is a count
    above = (ranked[..., 1:n_max] > p_split).to(torch.int64).cumprod(-1).sum(-1) if n_max > 1 \
        else torch.zeros(q.shape[:-1], dtype=torch.int64)
    branches = 1 + above
    pos = torch.arange(n_max)
    drafts = torch.where(pos < branches.unsqueeze(-1), top, torch.full_like(top, -1))
    return drafts, branches


def _residuals(p: torch.Tensor, q: torch.Tensor, n: int) -> torch.Tensor:
    """``P [..., n+1, V]``: ``P_0 = p``, ``P_(j+1) = norm((P_j - q)+)``.

    Where ``(P_j - q)+`` has no mass, ``P_j = q``: every token with ``q > 0`` is then accepted
    at step j with probability 1, so step j+1 is never reached (its weight is 0) and
    ``P_(j+1)`` is set to 0.
    """
    out = [p]
    cur = p
    for _ in range(n):
        r = (cur - q).clamp_min(0.0)
        z = r.sum(-1, keepdim=True)
        ok = z > 0
        cur = torch.where(ok, r / torch.where(ok, z, torch.ones_like(z)), torch.zeros_like(r))
        out.append(cur)
    return torch.stack(out, -2)


def _top_law(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, n: int):
    """Exact law for rows that all have ``n`` children with tokens ``drafts`` ``[R, n]``."""
    R, V = p.shape
    P = _residuals(p, q, n)  # [R, n+1, V]
    qd = q.gather(-1, drafts)  # [R, n] > 0
    pd = P[:, :n].gather(-1, drafts.unsqueeze(1).expand(R, n, n))  # [R, step j, child i]
    A = torch.minimum(torch.ones_like(pd), pd / qd.unsqueeze(1))  # accept prob of child i at step j
    # W[S] = sum over orders of the visited set S of prod_t (1 - A[t, child at t])
    W = torch.zeros(R, 1 << n, dtype=torch.float64)
    W[:, 0] = 1.0
    size = [bin(s).count("1") for s in range(1 << n)]
    acc = torch.zeros(R, n, dtype=torch.float64)  # P(child i is accepted)
    fact = math.factorial(n)
    for s in range(1 << n):  # subsets in increasing order: every S is complete before it is used
        j = size[s]
        if j == n:
            continue
        w = W[:, s]
        weight = math.factorial(n - j - 1) / fact  # probability of one given ordered prefix (S, i)
        for i in range(n):
            if s >> i & 1:
                continue
            acc[:, i] += w * A[:, j, i] * weight
            W[:, s | 1 << i] += w * (1.0 - A[:, j, i])
    reject_all = W[:, (1 << n) - 1] / fact
    out = reject_all.unsqueeze(-1) * P[:, n]
    out = out.scatter_add(-1, drafts, acc)
    return out, acc.sum(-1)


def _sampled_law(p: torch.Tensor, q: torch.Tensor, n: int):
    """Exact law for rows with ``n`` children whose tokens are drawn i.i.d. from ``q``."""
    P = _residuals(p, q, n)
    out = torch.zeros_like(p)
    reach = torch.ones(p.shape[0], dtype=torch.float64)
    accepted = torch.zeros_like(reach)
    for j in range(n):
        take = torch.minimum(P[:, j], q)  # q(x) * min(1, P_j(x)/q(x)), 0 where q = 0
        out += reach.unsqueeze(-1) * take
        beta = take.sum(-1)
        accepted += reach * beta
        reach = reach * (1.0 - beta).clamp_min(0.0)
    out += reach.unsqueeze(-1) * P[:, n]
    return out, accepted


def llama_speculative_law(p, q, k, *, p_split: float = 0.0, draft_choice: str = "top") -> PeerLaw:
    """Exact output law of ``llama-speculative``'s verification at one node (see the module notes).

    p, q      target and draft distributions ``[..., V]`` (the processed distributions,
              temperature and truncation applied, over the same vocabulary)
    k         the number of parallel draft sequences (``-np``), >= 1; ``k = 1`` is a chain
    p_split   the split threshold (``--draft-p-split``; llama.cpp's default is 0.1); the
              default 0 here gives ``min(k, 8, |supp q|)`` children, i.e. always K drafts
    draft_choice  ``"top"`` (what the peer does) or ``"sampled"`` (the lossless control)
    """
    if not isinstance(draft_choice, str) or draft_choice not in DRAFT_CHOICES:
        raise ValueError(f"draft_choice must be one of {DRAFT_CHOICES}, got {draft_choice!r}")
    p = as_probs64(p, "target_probs")
    q = as_probs64(q, "draft_probs")
    if p.shape != q.shape:
        raise ValueError(f"target_probs {tuple(p.shape)} and draft_probs {tuple(q.shape)} must have the same shape [..., V]")
    drafts, branches = peer_branches(q, k, p_split=p_split)
    batch, V = p.shape[:-1], p.shape[-1]
    pf, qf = p.reshape(-1, V), q.reshape(-1, V)
    df, bf = drafts.reshape(-1, drafts.shape[-1]), branches.reshape(-1)
    out = torch.empty_like(pf)
    acc = torch.empty(pf.shape[0], dtype=torch.float64)
    for n in torch.unique(bf).tolist():  # at most 8 groups
        rows = (bf == n).nonzero().squeeze(-1)
        if draft_choice == "top":
            o, a = _top_law(pf[rows], qf[rows], df[rows, :n], n)
        else:
            o, a = _sampled_law(pf[rows], qf[rows], n)
        out[rows], acc[rows] = o, a
    out = out.reshape(p.shape)
    tv = 0.5 * (out - p).abs().sum(-1)
    if draft_choice == "sampled":
        drafts = torch.empty(*batch, 0, dtype=torch.int64)
    return PeerLaw(output=out, tv=tv, acceptance=acc.reshape(batch), branches=branches, drafts=drafts)
