"""The verifier contract shared by every family.

A verifier maps ``(p, q, drafts, randomness)`` to one output token whose law is exactly
``p`` when the drafts follow a law the verifier supports. Subclasses implement

* ``_verify(p, q, drafts, g, law)`` -> output tokens ``[...]`` (batched, sampling path);
* ``_output_distribution(p, q, drafts, law)`` -> float64 ``[..., V]`` (exact path).

The base class validates input, resolves the law, and derives ``accepted_index`` from the
output token: the lowest ``k`` with ``drafts[..., k] == token``, or -1. So acceptance is
always ``P(accepted_index >= 0) = P(output in drafts)``, whatever the rule's internals.
"""
from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch

from .._validate import as_generator, as_probs, as_tokens
from ..drafts import DraftLaw, law_kind

__all__ = ["Verdict", "Verifier", "first_match", "per_draft"]


def per_draft(q: torch.Tensor, p: torch.Tensor, K: int) -> torch.Tensor:
    """draft_probs as ``[..., K, V]``: q itself when per-draft, else a broadcast view of q ``[..., V]``."""
    if q.ndim == p.ndim + 1:
        return q
    return q.unsqueeze(-2).expand(*q.shape[:-1], K, q.shape[-1])


class Verdict(NamedTuple):
    token: torch.Tensor           # [...] int64, the output token
    accepted_index: torch.Tensor  # [...] int64, index of the kept draft, -1 when none


def first_match(drafts: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Lowest k with ``drafts[..., k] == token`` else -1.  drafts [..., K], token [...]."""
    eq = drafts == token.unsqueeze(-1)
    K = drafts.shape[-1]
    idx = torch.arange(K, device=drafts.device).expand_as(drafts)
    big = torch.full_like(idx, K)
    first = torch.where(eq, idx, big).amin(-1)
    return torch.where(first < K, first, torch.full_like(first, -1))


class Verifier:
    """Base class: subclasses set ``name``, ``laws``, ``default_law`` and the K range."""

    name: ClassVar[str] = ""
    laws: ClassVar[tuple[str, ...]] = ()
    default_law: ClassVar[str] = "iid"
    min_k: ClassVar[int] = 1
    max_k: ClassVar[int | None] = None
    exact_output: ClassVar[bool] = True  # output_distribution is available

    def __repr__(self) -> str:
        return f"<verifier {self.name!r} laws={self.laws}>"

    # law support ------------------------------------------------------------------------
    def supports(self, law, k: int | None = None) -> bool:
        """Whether the rule is lossless for drafts from ``law`` (a DraftLaw or kind name)."""
        kind = law_kind(law)
        if isinstance(law, DraftLaw):
            k = law.k
        if kind not in self.laws:
            return False
        if k is not None and (k < self.min_k or (self.max_k is not None and k > self.max_k)):
            return False
        return True

    def _resolve_law(self, law, K: int) -> str:
        kind = self.default_law if law is None else law_kind(law)
        if not self.supports(kind, K):
            krange = f"K in [{self.min_k}, {self.max_k if self.max_k is not None else 'inf'})"
            raise ValueError(
                f"law: verifier {self.name!r} is not lossless for the {kind!r} draft law with K = {K} "
                f"(it supports laws {list(self.laws)} with {krange})"
            )
        return kind

    # validation -------------------------------------------------------------------------
    def _check(self, p, q, drafts, law, validate: bool = True):
        if validate:
            p = as_probs(p, "target_probs")
            q = as_probs(q, "draft_probs")
        V = p.shape[-1]
        if q.shape[-1] != V:
            raise ValueError(f"draft_probs has V = {q.shape[-1]} but target_probs has V = {V}")
        drafts = as_tokens(drafts, "drafts", V) if validate else drafts.long()
        if drafts.ndim < 1 or drafts.shape[-1] < 1:
            raise ValueError(f"drafts must be [..., K] with K >= 1, got shape {tuple(drafts.shape)}")
        K = drafts.shape[-1]
        batch = p.shape[:-1]
        if drafts.shape[:-1] != batch:
            raise ValueError(f"drafts has batch shape {tuple(drafts.shape[:-1])} but target_probs has {tuple(batch)}")
        if q.ndim == p.ndim + 1:
            if q.shape[:-2] != batch or q.shape[-2] != K:
                raise ValueError(
                    f"draft_probs of shape {tuple(q.shape)} must be [..., V] or [..., K, V] with "
                    f"batch {tuple(batch)} and K = {K}"
                )
        elif q.ndim != p.ndim or q.shape[:-1] != batch:
            raise ValueError(f"draft_probs has shape {tuple(q.shape)}; expected {tuple(batch) + (V,)} or {tuple(batch) + (K, V)}")
        kind = self._resolve_law(law, K)
        if validate:
            qx = per_draft(q, p, K).gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
            if bool((qx <= 0).any()):
                bad = drafts[qx <= 0].flatten()[0]
                raise ValueError(f"drafts: token {int(bad)} has draft probability 0, so it cannot have been drawn from draft_probs")
        return p, q, drafts, kind

    # public API -------------------------------------------------------------------------
    def verify(self, p, q, drafts, generator=None, *, law=None, validate: bool = True) -> Verdict:
        """Sample the output token. p ``[..., V]``, q ``[..., V]`` or ``[..., K, V]``, drafts ``[..., K]``.

        ``validate=False`` skips the full-vocabulary checks (for callers that already
        validated, e.g. the decoder); shape checks are always done.
        """
        p, q, drafts, kind = self._check(p, q, drafts, law, validate)
        g = as_generator(generator, p.device)
        token = self._verify(p, q, drafts, g, kind)
        return Verdict(token, first_match(drafts, token))

    def output_distribution(self, p, q, drafts, *, law=None) -> torch.Tensor:
        """Exact float64 law ``[..., V]`` of the output token given these drafts."""
        p, q, drafts, kind = self._check(p, q, drafts, law, True)
        return self._output_distribution(p.double(), q.double(), drafts, kind)

    # to implement -----------------------------------------------------------------------
    def _verify(self, p, q, drafts, g, law: str) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _output_distribution(self, p, q, drafts, law: str) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError
