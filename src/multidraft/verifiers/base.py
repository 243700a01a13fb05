"""The verifier contract shared by every family.

A verifier maps ``(p, q, drafts, randomness)`` to one output token whose law is exactly
``p`` when the drafts follow a law the verifier supports. Subclasses implement

* ``_verify(p, q, drafts, g, law)`` -> output tokens ``[...]`` (batched, sampling path);
* ``_output_distribution(p, q, drafts, law)`` -> float64 ``[..., V]`` (exact path);
* optionally ``_prepare`` / ``_output_prepared``: the work on ``(p, q)`` alone, shared by
  every draft tuple of ``Verifier.prepare(p, q).output_distribution(drafts)``.

The base class validates input, resolves the law (``implied_law`` when none is given),
checks that the drafts and draft_probs can come from it (``_validate.check_law``: K, V,
batch and q of a law object, identical per-draft rows under a single-q law, distinct drafts
under 'wor' and 'greedy', the top K-1 tokens under 'greedy'), and derives
``accepted_index`` from the output token: the lowest ``k`` with ``drafts[..., k] == token``, or -1. So acceptance is
always ``P(accepted_index >= 0) = P(output in drafts)``, whatever the rule's internals.

The prologue, once for every rule (``Verifier._rows``): after the checks, p and q reach
``_verify`` and ``_output_distribution`` as float64 rows divided by their own float64 sums
(``_residual.rows64``), whatever the caller's dtype (float16, bfloat16, float32, float64) and
however well the rows were normalised in it. Every rule is therefore the exact rule for the
laws ``p / sum(p)`` and ``q / sum(q)``: a float32 q = [1, 1e-9, 1e-9, 0] (which sums to 1 in
float32) is read as the law it represents, whose residual against a one-hot p is not empty.
The residual and acceptance arithmetic the rules share (``_residual``) is written so that a
token with p = 0 can never be output (``accept``, ``residual_or``, ``inverse_cdf``).

The registry table lives here (``Verifier._registered``, filled by ``registry.register``), so
this module imports nothing of the registry.
"""
from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch

from .._validate import as_generator, as_int, as_probs, as_tokens, check_law, check_law_shape
from ..drafts import DraftLaw, law_kind
from ._residual import rows64

__all__ = ["Prepared", "Verdict", "Verifier", "first_match", "per_draft"]


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
    # the registry table (name -> class, in registration order): filled by registry.register,
    # read here for the alternatives an error message names
    _registered: ClassVar[dict[str, type["Verifier"]]] = {}
    laws: ClassVar[tuple[str, ...]] = ()
    default_law: ClassVar[str] = "iid"
    # True for a rule whose sampling path reads the rows in the caller's dtype and divides by
    # ``_residual.row_scale`` itself, only where it touches them (``specinfer``: most rows
    # need two gathers); False: ``_verify`` gets ``rows64(p), rows64(q)``
    raw_rows: ClassVar[bool] = False
    min_k: ClassVar[int] = 1
    max_k: ClassVar[int | None] = None

    def __repr__(self) -> str:
        return f"<verifier {self.name!r} laws={self.laws}>"

    # law support ------------------------------------------------------------------------
    def _k_ok(self, k: int) -> bool:
        return k >= self.min_k and (self.max_k is None or k <= self.max_k)

    def supports(self, law, k=None) -> bool:
        """Whether the rule is lossless for drafts from ``law`` (a DraftLaw or kind name),
        with ``k`` drafts when given (a law object carries its own K)."""
        kind = law_kind(law)
        if isinstance(law, DraftLaw):
            k = law.k
        if kind not in self.laws:
            return False
        if k is not None and not self._k_ok(as_int(k, "k", what="an integer number of drafts")):
            return False
        return True

    def laws_for(self, k) -> tuple[str, ...]:
        """The law kinds (from ``drafts.LAW_KINDS``) this verifier is lossless for with K = k."""
        k = as_int(k, "k", what="an integer number of drafts")
        return tuple(kind for kind in self.laws if self._k_ok(k)) if k >= 1 else ()

    def implied_law(self, k) -> str:
        """The law used when none is given, for K = k drafts: the verifier's only law at this K
        when it has exactly one (``rrs_wor`` -> 'wor', ``greedy_optimal`` and ``spechub`` ->
        'greedy'), else ``default_law`` ('iid'). ``ValueError`` naming ``k`` when the verifier
        takes no law at this K. For callers (decoder, CLI) that let the user omit the law."""
        laws = self.laws_for(k)
        if not laws:
            raise ValueError(f"k: verifier {self.name!r} takes {self._k_range()} drafts, got K = {int(k)}")
        if len(laws) == 1:
            return laws[0]
        return self.default_law if self.default_law in laws else laws[0]

    def _k_range(self) -> str:
        if self.max_k == self.min_k:
            return f"K = {self.min_k}"
        if self.max_k is None:
            return f"K >= {self.min_k}"
        return f"{self.min_k} <= K <= {self.max_k}"

    def _resolve_law(self, law, K: int) -> str:
        kind = self.implied_law(K) if law is None else law_kind(law)
        if self.supports(kind, K):
            return kind
        here = self.laws_for(K)
        if not here:
            what = f"it takes {self._k_range()} drafts (laws {', '.join(map(repr, self.laws))})"
        elif len(here) == 1:
            what = f"it supports only the {here[0]!r} law with K = {K}"
        else:
            what = f"it supports the laws {', '.join(map(repr, here))} with K = {K}"
        others = [n for n, cls in Verifier._registered.items() if n != self.name and cls().supports(kind, K)]
        alt = f"; for {kind!r} with K = {K} use one of {', '.join(others)}" if others else ""
        raise ValueError(
            f"law: verifier {self.name!r} is not lossless for the {kind!r} draft law with K = {K}: {what}{alt}"
        )

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
        if isinstance(law, DraftLaw):  # the law object first: its K, V, batch name the mistake
            check_law_shape(law, V, K, batch, drafts.shape)
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
        q = check_law(law, kind, p, q, drafts, validate=validate, law_given=law is not None)
        return p, q, drafts, kind

    # public API -------------------------------------------------------------------------
    def verify(self, p, q, drafts, generator, *, law=None, validate: bool = True) -> Verdict:
        """Sample the output token. p ``[..., V]``, q ``[..., V]`` or ``[..., K, V]``, drafts ``[..., K]``.

        ``generator``: a ``torch.Generator`` (read in order, so the one that drew the drafts
        may be passed again) or an integer seed, which selects the seed's "verify" stream
        (``_validate.derive_seed``), independent of the "drafts" stream ``law.sample`` reads
        for the same integer. ``law``: a DraftLaw object (checked against drafts and q), a
        law name, or None for ``implied_law(K)``. ``validate=False`` skips the
        full-vocabulary checks (for callers that already validated, e.g. the decoder); shape
        and law-shape checks are always done.
        """
        p, q, drafts, kind = self._check(p, q, drafts, law, validate)
        g = as_generator(generator, p.device, purpose="verify")
        if self.raw_rows:  # the rule divides by row_scale itself, on the rows it touches
            token = self._verify(p, q, drafts, g, kind)
        else:
            token = self._verify(rows64(p), rows64(q), drafts, g, kind)
        return Verdict(token, first_match(drafts, token))

    def output_distribution(self, p, q, drafts, *, law=None) -> torch.Tensor:
        """Exact float64 law ``[..., V]`` of the output token given these drafts."""
        p, q, drafts, kind = self._check(p, q, drafts, law, True)
        return self._output_distribution(rows64(p), rows64(q), drafts, kind)

    def prepare(self, p, q, *, law=None) -> "Prepared":
        """The rule with ``(p, q)`` fixed, for the exact output laws of many draft tuples.

        p ``[*B, V]``, q ``[*B, V]`` or ``[*B, K, V]``. ``Prepared.output_distribution(drafts)``
        takes drafts ``[c, *B, K]`` (c tuples per row) and returns ``[c, *B, V]``, equal to
        ``output_distribution(p.expand(c, ...), q.expand(c, ...), drafts, law=law)``. Rules
        whose work on ``(p, q)`` alone is large (``optimal``'s fit, ``khisti_is``'s LPs) do it
        once here instead of once per call and per tuple (``_prepare``)."""
        return Prepared(self, p, q, law)

    # the shared batching of the rules: flat rows ---------------------------------------
    @staticmethod
    def _flat(p, q, drafts):
        """(P ``[N, V]``, Q ``[N, V]`` or ``[N, K, V]``, X ``[N, K]``, batch): the rows of p, q and
        drafts ``[*batch, ...]`` flattened to N rows (views where possible)."""
        V, K = p.shape[-1], drafts.shape[-1]
        batch = p.shape[:-1]
        P = p.reshape(-1, V)
        Q = q.reshape(-1, K, V) if q.ndim == p.ndim + 1 else q.reshape(-1, V)
        return P, Q, drafts.reshape(-1, K), batch

    # to implement (optional) ------------------------------------------------------------------
    def _prepare(self, p, q, k: int, law: str):
        """State computed from p ``[N, V]`` float64, q ``[N, V]`` or ``[N, K, V]`` float64 alone
        (N rows, flattened), or None (the default: nothing to share between tuples)."""
        return None

    def _output_prepared(self, state, p, q, drafts, law: str) -> torch.Tensor:  # pragma: no cover
        """Output laws ``[c * N, V]`` for drafts ``[c * N, K]`` (row i of copy j is row j * N + i
        of p, q ``[N, ...]``) from ``_prepare``'s state."""
        raise NotImplementedError

    # to implement: p [..., V] and q [..., V] / [..., K, V] arrive as float64 rows normalised
    # in float64 (the prologue), drafts [..., K] as int64 -----------------------------------
    def _verify(self, p, q, drafts, g, law: str) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _output_distribution(self, p, q, drafts, law: str) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError


class Prepared:
    """A verifier with ``(p, q)`` fixed (``Verifier.prepare``): exact output laws of many
    draft tuples of the same rows, the work on ``(p, q)`` alone done once, on first use."""

    def __init__(self, verifier: Verifier, p, q, law=None):
        self.verifier, self.law = verifier, law
        self.p = as_probs(p, "target_probs")
        self.q = as_probs(q, "draft_probs")
        self._state = None
        self._key = None  # (K, law kind) the state was made for

    def output_distribution(self, drafts) -> torch.Tensor:
        """Exact float64 laws ``[c, *B, V]`` for drafts ``[c, *B, K]``: each of the c tuples of a
        row is verified against that row's (p, q)."""
        v, p, q = self.verifier, self.p, self.q
        B = p.shape[:-1]
        if not torch.is_tensor(drafts) or drafts.ndim != len(B) + 2 or tuple(drafts.shape[1:-1]) != tuple(B):
            shape = tuple(drafts.shape) if torch.is_tensor(drafts) else type(drafts).__name__
            raise ValueError(f"drafts must be [c, {', '.join(map(str, B))}{', ' if B else ''}K] for prepared rows of batch {tuple(B)}, got {shape}")
        c, K = drafts.shape[0], drafts.shape[-1]
        pc = p.unsqueeze(0).expand(c, *p.shape)
        qc = q.unsqueeze(0).expand(c, *q.shape)
        pc, qc, drafts, kind = v._check(pc, qc, drafts, self.law, True)  # the checks of output_distribution
        if self._key is None or self._key != (K, kind):
            V = p.shape[-1]
            p64 = rows64(p).reshape(-1, V)
            q64 = rows64(q).reshape(-1, V) if q.ndim == p.ndim else rows64(q).reshape(-1, K, V)
            self._state, self._key, self._flat = v._prepare(p64, q64, K, kind), (K, kind), (p64, q64)
        if self._state is None:
            return v._output_distribution(rows64(pc), rows64(qc), drafts, kind)
        p64, q64 = self._flat
        out = v._output_prepared(self._state, p64, q64, drafts.reshape(-1, K), kind)
        return out.reshape(*drafts.shape[:-1], p.shape[-1])
