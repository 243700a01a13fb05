"""Exact certificates: enumerate every draft tuple of a law.

``certify(v, p, law)`` mixes the verifier's exact output law over all tuples,
``sum_tuples P(tuple) * v.output_distribution(p, q, tuple)``, and compares it with p.
For small V and K only (the tuple count is up to V^K).

Memory. The per-tuple output laws are ``N x V`` float64 (8 bytes each) for N tuples.
``certify`` mixes them a chunk of tuples at a time (``CHUNK_BYTES`` of output laws per
call), and refuses up front, before anything is enumerated, when the laws to compute
exceed ``MAX_CERTIFY_BYTES``; ``output_law``, which returns all of them, refuses above
``MAX_OUTPUT_LAW_BYTES``. Both errors give the size and the limit.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._validate import as_probs64
from .drafts import DraftLaw
from .limits.lp import tuple_count
from .verifiers import get as _get_verifier

__all__ = ["Certificate", "certify", "output_law", "acceptance_given", "MAX_CERTIFY_BYTES", "MAX_OUTPUT_LAW_BYTES"]

MAX_CERTIFY_BYTES = 2 << 30      # per-tuple output laws certify may compute (in chunks): 2 GiB
MAX_OUTPUT_LAW_BYTES = 1 << 30   # per-tuple output laws output_law may return at once: 1 GiB
CHUNK_BYTES = 32 << 20           # output laws per verifier call inside certify: 32 MiB


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def _guard(law: DraftLaw, limit: int, what: str) -> int:
    """Tuple count of the law; ValueError when N x V x 8 bytes of output laws exceed limit."""
    n = tuple_count(law, cap=limit)  # stops counting above the limit: no n**K at K = 10^8
    need = n * law.V * 8
    if need > limit:
        many, over = (f"{n:,}", "") if n <= limit else (f"more than {limit:,}", "over ")
        raise ValueError(
            f"law: {what} needs {many} per-tuple output laws of V = {law.V} ({over}{_gib(need)} in float64, "
            f"K = {law.k}, {law.kind!r} law); the limit is {_gib(limit)}: certificates are for small V and K"
        )
    return n


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
    v, p, tuples, probs = _prepare(verifier, p, law, MAX_OUTPUT_LAW_BYTES, "output_law")
    return tuples, probs, _laws(v, p, law, tuples), p


def _laws(v, p, law: DraftLaw, tuples: torch.Tensor, prepared=None) -> torch.Tensor:
    """Output laws ``[n, V]`` of the verifier for the given tuples ``[n, K]`` (``prepared``:
    ``v.prepare(p, q, law=law)``, reused across calls for the same law)."""
    prepared = prepared if prepared is not None else v.prepare(p, law._q64(), law=law)
    return prepared.output_distribution(tuples)


def _prepare(verifier, p, law: DraftLaw, limit: int, what: str):
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
    _guard(law, limit, what)  # before enumerating: counts bytes from the support sizes
    tuples, probs = law.enumerate()
    return v, p, tuples, probs


def certify(verifier, p, law: DraftLaw) -> Certificate:
    """Exact max deviation of the verifier's output law from p, and its exact acceptance.

    The tuples are mixed a chunk at a time, so memory stays near ``CHUNK_BYTES`` of output
    laws whatever the tuple count (up to ``MAX_CERTIFY_BYTES`` in all)."""
    v, p, tuples, probs = _prepare(verifier, p, law, MAX_CERTIFY_BYTES, "certify")
    N, V = tuples.shape[0], p.shape[-1]
    step = max(1, CHUNK_BYTES // (8 * V))
    mixed = torch.zeros(V, dtype=torch.float64)
    acc = torch.zeros((), dtype=torch.float64)
    prepared = v.prepare(p, law._q64(), law=law)  # the rule's work on (p, q) once for all chunks
    for s0 in range(0, N, step):
        t, w = tuples[s0 : s0 + step], probs[s0 : s0 + step]
        out = _laws(v, p, law, t, prepared)  # [n, V]
        mixed += w @ out
        acc += w @ acceptance_given(out, t)
    return Certificate(float((mixed - p).abs().max()), float(acc), mixed)
