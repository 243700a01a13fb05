"""Exact certificates: enumerate every draft tuple of a law.

``certify(v, p, law)`` mixes the verifier's exact output law over all tuples,
``sum_tuples P(tuple) * v.output_distribution(p, q, tuple)``, and compares it with p.
For small V and K only (the tuple count is up to V^K).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._validate import as_probs64
from .drafts import DraftLaw
from .verifiers import get as _get_verifier

__all__ = ["Certificate", "certify", "output_law", "acceptance_given"]


class Certificate(NamedTuple):
    max_abs_error: float       # max_y |P(output = y) - p(y)|
    acceptance: float          # P(output in drafts)
    output: torch.Tensor       # float64 [V], the mixed output law


def acceptance_given(out: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """P(output in drafts | drafts): out ``[..., V]`` float64, drafts ``[..., K]`` -> ``[...]``."""
    picked = out.gather(-1, drafts)
    K = drafts.shape[-1]
    dup = (drafts.unsqueeze(-1) == drafts.unsqueeze(-2)).tril(-1).any(-1) if K > 1 else torch.zeros_like(drafts, dtype=torch.bool)
    return torch.where(dup, torch.zeros_like(picked), picked).sum(-1)


def output_law(verifier, p, law: DraftLaw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tuples [N, K], probs [N], per-tuple output laws [N, V], p float64 [V])."""
    v = _get_verifier(verifier)
    if not isinstance(law, DraftLaw):
        raise ValueError(f"law must be a DraftLaw (from multidraft.drafts), got {type(law).__name__}")
    p = as_probs64(p, "target_probs")  # the rule optimal_acceptance and the LPs apply
    if p.ndim != 1:
        raise ValueError(f"target_probs must be a single distribution [V] for certify, got shape {tuple(p.shape)}")
    if p.shape[-1] != law.V:
        raise ValueError(f"target_probs has V = {p.shape[-1]} but the law has V = {law.V}")
    if not v.supports(law):
        raise ValueError(f"law: verifier {v.name!r} does not support the {law.kind!r} law with K = {law.k}")
    tuples, probs = law.enumerate()
    N = tuples.shape[0]
    P = p.expand(N, p.shape[-1])
    q = law._q64()
    Q = q.expand(N, *q.shape)
    out = v.output_distribution(P, Q, tuples, law=law)
    return tuples, probs, out, p


def certify(verifier, p, law: DraftLaw) -> Certificate:
    """Exact max deviation of the verifier's output law from p, and its exact acceptance."""
    tuples, probs, out, p = output_law(verifier, p, law)
    mixed = probs @ out
    acc = float(probs @ acceptance_given(out, tuples))
    return Certificate(float((mixed - p).abs().max()), acc, mixed)
