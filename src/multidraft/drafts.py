"""Draft laws: the joint law of the K draft tokens at one position.

``iid(q, k)``                  K draws from q with replacement.
``without_replacement(q, k)``  K distinct draws, sequentially proportional to q
                               (Gumbel-top-k / exponential race); order matters.
``greedy(q, k)``               the top k-1 tokens of q (ties broken by lower id), then one
                               token from q restricted to the rest and renormalised.
``independent(qs)``            draft j from its own q_j (qs is ``[..., K, V]``).

Every law samples batched over leading dimensions with an explicit generator (a
``torch.Generator``, read in order, or an integer seed, which selects that seed's "drafts"
stream: ``_validate.derive_seed``; ``verify`` reads a different stream for the same
integer, so one seed passed to both cannot correlate drafts and acceptance), gives the
probability of draft tuples (``prob``, float64) and, for an unbatched law, enumerates
every tuple of positive probability (``enumerate``).

Cost at full vocabulary (one row of V = 151,936): a single draw from a row (K = 1, the
greedy law's last draft, each draft of the independent law) is an inverse CDF on a float64
cumulative sum (``_categorical``; ``torch.multinomial`` would draw it by an exponential race
over all V tokens, 5-7 ms), and the greedy top set is a ``topk`` with exact tie handling
(``_scan.top_desc_stable``), never a sort of the vocabulary.
"""
from __future__ import annotations

import itertools
import math

import torch

from ._scan import cdf_search, top_desc_stable
from ._validate import ArgumentError, as_generator, as_int, as_k, as_probs, as_tokens

__all__ = ["DraftLaw", "iid", "without_replacement", "greedy", "independent", "make", "LAW_KINDS", "law_kind", "parse_laws"]

# The law vocabulary, in one place: every module, CLI flag and result row uses these names.
LAW_KINDS = ("iid", "wor", "greedy", "independent")
# single-q laws (one draft distribution shared by the K drafts)
SHARED_Q_KINDS = ("iid", "wor", "greedy")
_ALIASES = {"with_replacement": "iid", "without_replacement": "wor"}
MAX_ENUMERATE = 2_000_000
# The most draft tokens one ``sample`` call holds (int64: 2 GiB), checked from the sizes before any draw.
MAX_SAMPLE_TOKENS = 1 << 28


def law_kind(law, name: str = "law") -> str:
    """The kind of a law object or a law name (a kind from ``LAW_KINDS`` or a long alias)."""
    if isinstance(law, DraftLaw):
        return law.kind
    if isinstance(law, str):
        s = law.strip().lower()
        if s in LAW_KINDS:
            return s
        if s in _ALIASES:
            return _ALIASES[s]
    raise ArgumentError(
        name, f": unknown draft law {law!r}; expected a DraftLaw or one of {', '.join(LAW_KINDS)} "
        f"(aliases: {', '.join(_ALIASES)})"
    )


def parse_laws(laws, allowed=LAW_KINDS, name: str = "laws") -> tuple[str, ...]:
    """Law kinds from a comma-separated string or a sequence of names, each in ``allowed``
    (``ValueError`` naming ``name`` and the allowed kinds otherwise); order kept, no duplicates."""
    items = [x for x in laws.split(",")] if isinstance(laws, str) else list(laws)
    out: list[str] = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            continue
        kind = law_kind(item, name)
        if kind not in allowed:
            raise ArgumentError(name, f": the {kind!r} law is not available here; choose from {', '.join(allowed)}")
        if kind not in out:
            out.append(kind)
    if not out:
        raise ArgumentError(name, f"is empty; choose from {', '.join(allowed)}")
    return tuple(out)


class DraftLaw:
    """Base class. ``q`` is ``[..., V]`` (``[..., K, V]`` for ``independent``)."""

    kind: str = ""

    def __init__(self, q: torch.Tensor, k: int):
        self.q = q
        self.k = k

    # shapes -----------------------------------------------------------------------------
    @property
    def V(self) -> int:
        return self.q.shape[-1]

    @property
    def batch_shape(self) -> torch.Size:
        return self.q.shape[:-2] if self.kind == "independent" else self.q.shape[:-1]

    def draft_probs(self) -> torch.Tensor:
        """Per-draft marginal-generating distributions ``[..., K, V]`` (a view)."""
        if self.kind == "independent":
            return self.q
        return self.q.unsqueeze(-2).expand(*self.q.shape[:-1], self.k, self.V)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, k={self.k}, V={self.V}, batch_shape={tuple(self.batch_shape)})"

    # interface --------------------------------------------------------------------------
    def sample(self, generator, num_samples: int | None = None) -> torch.Tensor:
        """Draft tuples ``[..., K]`` (``[num_samples, ..., K]`` if num_samples is given).

        ``generator``: a ``torch.Generator`` or an integer seed (its "drafts" stream, see the
        module notes); ``num_samples``: None or an integer >= 1 (any integer type)."""
        q = self.q
        n = 1 if num_samples is None else as_int(num_samples, "num_samples", minimum=1, what="an integer >= 1 (or None)")
        rows = n * self.batch_shape.numel()
        if self.k > MAX_SAMPLE_TOKENS or rows * self.k > MAX_SAMPLE_TOKENS:
            what = "k" if self.k > MAX_SAMPLE_TOKENS or num_samples is None else "num_samples"
            raise ArgumentError(what, f": a sample of {rows:,} tuple(s) of k = {self.k:,} drafts holds {rows * self.k:,} "
                                      f"draft tokens; the limit is {MAX_SAMPLE_TOKENS:,} a call (drafts.MAX_SAMPLE_TOKENS)")
        if num_samples is not None:
            q = q.unsqueeze(0).expand(n, *q.shape)
        g = as_generator(generator, self.q.device, purpose="drafts")
        return self._sample(q, g)

    def prob(self, drafts) -> torch.Tensor:
        """float64 probability of each draft tuple; drafts is ``[..., K]`` broadcastable to the batch."""
        drafts = as_tokens(drafts, "drafts", self.V)
        if drafts.ndim < 1 or drafts.shape[-1] != self.k:
            raise ValueError(f"drafts must have last dimension K = {self.k}, got shape {tuple(drafts.shape)}")
        return self._prob(drafts)

    def log_prob(self, drafts) -> torch.Tensor:
        return self.prob(drafts).log()

    def enumerate(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All tuples of positive probability ``[N, K]`` and their float64 probabilities ``[N]``."""
        if len(self.batch_shape) != 0:
            raise ValueError(f"enumerate() needs an unbatched law, got batch_shape {tuple(self.batch_shape)}")
        tuples = self._tuples()
        probs = self._prob(tuples)
        keep = probs > 0
        return tuples[keep], probs[keep]

    # helpers ----------------------------------------------------------------------------
    def _support(self, row: torch.Tensor) -> list[int]:
        return torch.nonzero(row > 0).flatten().tolist()

    def _check_size(self, n: int) -> None:
        if n > MAX_ENUMERATE:
            raise ValueError(f"enumerate() would list {n} tuples (> {MAX_ENUMERATE}); it is meant for small V and K")

    def _q64(self) -> torch.Tensor:
        # theory paths: float64, renormalised so that float32 inputs give exact laws
        q = self.q.double()
        return q if self.q.dtype == torch.float64 else q / q.sum(-1, keepdim=True)


def _multinomial(q: torch.Tensor, n: int, replacement: bool, g: torch.Generator) -> torch.Tensor:
    if n == 1:  # torch.multinomial draws one sample by an exponential race over all V tokens
        return _categorical(q, g).unsqueeze(-1)
    flat = q.reshape(-1, q.shape[-1])
    out = torch.multinomial(flat.float() if flat.dtype != torch.float64 else flat, n, replacement=replacement, generator=g)
    return out.reshape(*q.shape[:-1], n)


# rows of the float64 cumulative sum per chunk: big temporaries are handed back to the OS by
# glibc when freed and cost page faults (about 1 ms per MB on the 2-core VM) when retaken
CATEGORICAL_CHUNK_ELEMS = 1 << 18


def _categorical(q: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """One token per row of q ``[..., V]`` (nonnegative, positive rows, any scale): inverse CDF
    with one float64 uniform per row (drawn in row order) on a float64 cumulative sum.

    P(x) = q(x) / sum(q) up to float64 rounding of the cumulative sum, and x always has
    q(x) > 0: the search returns the first index whose cumulative sum exceeds u * total, which
    is a strict increase; a target that rounds up to the total (u within 2^-53 of 1) is moved
    to the row's last positive token."""
    V = q.shape[-1]
    flat = q.reshape(-1, V)
    n = flat.shape[0]
    u = torch.rand(n, 1, generator=g, dtype=torch.float64, device=q.device)  # all rows first: chunking cannot change draws
    step = max(1, CATEGORICAL_CHUNK_ELEMS // V)
    if n <= step:
        return _icdf(flat, u).reshape(q.shape[:-1])
    out = torch.cat([_icdf(flat[s0 : s0 + step], u[s0 : s0 + step]) for s0 in range(0, n, step)])
    return out.reshape(q.shape[:-1])


def _icdf(flat: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``_categorical`` on rows flat ``[n, V]`` with uniforms u ``[n, 1]``: indices ``[n]``."""
    V = flat.shape[-1]
    c = torch.cumsum(flat, -1, dtype=torch.float64)  # [n, V]
    idx = cdf_search(c, u)  # [n]; subnormal totals at full precision
    over = (idx >= V).nonzero()[:, 0]
    if over.numel():
        ar = torch.arange(V, device=flat.device)
        last = torch.where(flat.index_select(0, over) > 0, ar, torch.zeros_like(ar)).amax(-1)
        idx[over] = last
    return idx


def _check_nnz(q: torch.Tensor, k: int, what: str) -> None:
    # the k-th largest entry of each row is positive iff the row has >= k positive entries;
    # topk keeps the check at [..., k] (a (q > 0).sum(-1) would build [..., V] int64)
    if k > q.shape[-1]:
        raise ValueError(f"q has V = {q.shape[-1]} tokens; the {what} law needs at least k = {k} with positive probability")
    kth = torch.topk(q, k, dim=-1).values[..., -1]
    if bool((kth <= 0).any()):
        row = q.reshape(-1, q.shape[-1])[(kth <= 0).reshape(-1).nonzero()[0, 0]]
        raise ValueError(
            f"q has only {int((row > 0).sum())} token(s) with positive probability in some row; "
            f"the {what} law needs at least k = {k}"
        )


class IID(DraftLaw):
    kind = "iid"

    def _sample(self, q, g):
        return _multinomial(q, self.k, True, g)

    def _prob(self, drafts):
        q = self._q64()
        return _gather(q, drafts).prod(-1)

    def _tuples(self):
        s = self._support(self.q)
        self._check_size(len(s) ** self.k)
        return torch.tensor(list(itertools.product(s, repeat=self.k)), dtype=torch.long).reshape(-1, self.k)


class WithoutReplacement(DraftLaw):
    kind = "wor"

    # rows per chunk of the sampler: at most CHUNK_BYTES of float64 [rows, V] work at a time
    CHUNK_BYTES = 64 << 20
    STREAM_MAX_TOP = 0.75

    def _sample(self, q, g):
        # The order of first appearance of distinct tokens in an i.i.d. stream from q is
        # exactly successive sampling without replacement. Rows whose top k-1 tokens hold at
        # most STREAM_MAX_TOP of the mass read a stream (cheap inverse-CDF draws, extended
        # until it shows k distinct tokens); the others (peaked q, where a stream would be
        # long) use the exponential race: token x arrives at E_x / q(x), first k in order.
        # The split depends on q only, never on the draws, so both paths are exact. Rows are
        # independent, so both paths run on chunks of rows (CHUNK_BYTES of float64 work
        # each): the law is unchanged and peak memory is the input plus one chunk.
        V = q.shape[-1]
        flat = q.reshape(-1, V)
        n, k = flat.shape[0], self.k
        if k == 1:
            return _multinomial(q, 1, True, g)
        out = torch.empty(n, k, dtype=torch.long, device=q.device)
        top = torch.topk(flat, k - 1, dim=-1).values.sum(-1)
        streamed = (top <= self.STREAM_MAX_TOP).nonzero().squeeze(-1)
        raced = (top > self.STREAM_MAX_TOP).nonzero().squeeze(-1)
        step = max(1, self.CHUNK_BYTES // (8 * V))
        for s0 in range(0, streamed.numel(), step):
            rows = streamed[s0 : s0 + step]
            out[rows] = self._stream(flat.index_select(0, rows), k, g)
        for s0 in range(0, raced.numel(), step):
            rows = raced[s0 : s0 + step]
            keys = torch.rand(rows.numel(), V, generator=g, dtype=torch.float64, device=q.device)
            out[rows] = torch.topk(_race_keys(keys, flat.index_select(0, rows)), k, dim=-1, largest=False, sorted=True).indices
        return out.reshape(*q.shape[:-1], k)

    @staticmethod
    def _stream(flat: torch.Tensor, k: int, g: torch.Generator) -> torch.Tensor:
        """First k distinct tokens of an i.i.d. stream from each row of flat ``[n, V]``."""
        w = flat.float() if flat.dtype != torch.float64 else flat
        n = flat.shape[0]
        m = 4 * k
        stream = torch.multinomial(w, m, replacement=True, generator=g)
        while True:
            new = ~(stream.unsqueeze(-1) == stream.unsqueeze(-2)).tril(-1).any(-1)  # [n, L]
            rank = new.cumsum(-1)
            short = (rank[:, -1] < k).nonzero().squeeze(-1)
            if short.numel() == 0:
                break
            more = torch.full((n, m), -1, dtype=torch.long, device=flat.device)
            more[short] = torch.multinomial(w[short], m, replacement=True, generator=g)
            # rows already complete get a filler that can never be a new token
            more[rank[:, -1] >= k] = stream[rank[:, -1] >= k, :1].expand(-1, m)
            stream = torch.cat([stream, more], -1)
        L = stream.shape[-1]
        pick = new & (rank <= k)
        pos = torch.where(pick, torch.arange(L, device=flat.device).expand(n, L), torch.full_like(stream, L))
        pos = pos.sort(-1).values[:, :k]
        return stream.gather(-1, pos)

    def _prob(self, drafts):
        q = self._q64()
        qx = _gather(q, drafts)  # [..., K]
        # mass not yet drawn before step i, summed directly (1 - cumsum cancels badly)
        shape = torch.broadcast_shapes(q.shape[:-1], drafts.shape[:-1])
        oh = torch.nn.functional.one_hot(drafts.expand(*shape, self.k), self.V).to(q.dtype)  # [..., K, V]
        drawn_before = (torch.cumsum(oh, -2) - oh).clamp_(max=1.0)
        denom = (q.unsqueeze(-2) * (1.0 - drawn_before)).sum(-1)
        terms = torch.where(denom > 0, qx / torch.where(denom > 0, denom, 1.0), torch.zeros_like(qx))
        out = terms.prod(-1)
        distinct = _all_distinct(drafts)
        return torch.where(distinct, out, torch.zeros_like(out))

    def _tuples(self):
        s = self._support(self.q)
        self._check_size(math.perm(len(s), self.k))
        return torch.tensor(list(itertools.permutations(s, self.k)), dtype=torch.long).reshape(-1, self.k)


def _race_keys(u: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Arrival times of the exponential race, in place of u ``[n, V]`` (float64 uniforms):
    ``log E_x - log q(x)`` with ``E_x = -log(1 - u_x)``, and +inf exactly where q(x) = 0.

    The log of ``E_x / q(x)``, so the order (and so the draws) is the same, but computed in log
    space: ``E / q`` overflows to inf for subnormal q (1 / 5e-324), which would tie a token of
    positive mass with the q = 0 tokens; ``log q`` of a subnormal is finite (>= -745)."""
    u.neg_().log1p_().neg_().log_()  # log E, -inf where u = 0 (that token arrives first)
    lq = q.double().log()
    u.sub_(torch.where(q > 0, lq, torch.zeros_like(lq)))
    return u.masked_fill_(q <= 0, float("inf"))


class Greedy(DraftLaw):
    kind = "greedy"

    def top_set(self) -> torch.Tensor:
        """The k-1 deterministic drafts ``[..., K-1]``: top of q, ties to the lower id (the
        first k-1 of a stable descending sort, found without sorting the vocabulary)."""
        return top_desc_stable(self.q, self.k - 1)

    def rest_probs(self) -> torch.Tensor:
        """q' = q restricted to the complement of the top set, renormalised ``[..., V]`` (float64)."""
        q = self._q64()
        T = self.top_set()
        rest = q.scatter(-1, T, 0.0)
        return rest / rest.sum(-1, keepdim=True)

    def _sample(self, q, g):
        T = top_desc_stable(q, self.k - 1)
        rest = q.scatter(-1, T, 0.0) if self.k > 1 else q  # q restricted to the rest (unnormalised)
        x = _categorical(rest, g).unsqueeze(-1)
        return torch.cat([T, x], -1)

    def _prob(self, drafts):
        T = self.top_set()
        T = T.expand(*drafts.shape[:-1], self.k - 1) if T.ndim < drafts.ndim else T
        ok = (drafts[..., : self.k - 1] == T).all(-1)
        qr = self.rest_probs()
        px = _gather(qr, drafts[..., -1:]).squeeze(-1)
        return torch.where(ok, px, torch.zeros_like(px))

    def _tuples(self):
        T = self.top_set().tolist()
        s = [x for x in self._support(self.q) if x not in T]
        return torch.tensor([T + [x] for x in s], dtype=torch.long).reshape(-1, self.k)


class Independent(DraftLaw):
    kind = "independent"

    def _sample(self, q, g):
        return _multinomial(q, 1, False, g).squeeze(-1)

    def _prob(self, drafts):
        q = self._q64()  # [..., K, V]
        shape = torch.broadcast_shapes(q.shape[:-1], drafts.shape)
        picked = q.expand(*shape, q.shape[-1]).gather(-1, drafts.expand(shape).unsqueeze(-1))
        return picked.squeeze(-1).prod(-1)

    def _tuples(self):
        supports = [self._support(self.q[j]) for j in range(self.k)]
        self._check_size(math.prod(len(s) for s in supports))
        return torch.tensor(list(itertools.product(*supports)), dtype=torch.long).reshape(-1, self.k)


def _gather(q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """q ``[..., V]`` at token ids ``[..., K]`` with broadcasting of the leading dims."""
    shape = torch.broadcast_shapes(q.shape[:-1], drafts.shape[:-1])
    q = q.expand(*shape, q.shape[-1])
    drafts = drafts.expand(*shape, drafts.shape[-1])
    return q.gather(-1, drafts)


def _all_distinct(drafts: torch.Tensor) -> torch.Tensor:
    eq = drafts.unsqueeze(-1) == drafts.unsqueeze(-2)
    k = drafts.shape[-1]
    off = ~torch.eye(k, dtype=torch.bool, device=drafts.device)
    return ~(eq & off).any(-1).any(-1)


# constructors -------------------------------------------------------------------------------
def iid(q, k) -> IID:
    """K drafts drawn independently from q (with replacement). q is ``[..., V]``."""
    return IID(as_probs(q, "q"), as_k(k))


def without_replacement(q, k) -> WithoutReplacement:
    """K distinct drafts, drawn sequentially proportional to q (Gumbel-top-k). q is ``[..., V]``."""
    q = as_probs(q, "q")
    k = as_k(k)
    _check_nnz(q, k, "without_replacement")
    return WithoutReplacement(q, k)


def greedy(q, k) -> Greedy:
    """Top k-1 tokens of q deterministically plus one sampled from q on the rest. q is ``[..., V]``."""
    q = as_probs(q, "q")
    k = as_k(k)
    _check_nnz(q, k, "greedy")
    return Greedy(q, k)


def independent(qs) -> Independent:
    """Draft j drawn from its own q_j. qs is ``[..., K, V]``."""
    qs = as_probs(qs, "qs", min_ndim=2)
    return Independent(qs, as_k(qs.shape[-2], "K (qs.shape[-2])"))


def make(kind, q, k: int | None = None) -> DraftLaw:
    """The law of ``kind`` ('iid', 'wor', 'greedy', 'independent' or an alias) for q.

    q is ``[..., V]`` with ``k`` drafts; for 'independent' q is ``[..., K, V]`` (one row per
    draft), or ``[..., V]`` with ``k`` given, meaning K identical draft distributions.
    """
    kind = law_kind(kind)
    if kind == "independent":
        q = torch.as_tensor(q)
        if k is not None and (q.ndim == 1 or (q.ndim >= 2 and q.shape[-2] != k)):
            q = q.unsqueeze(-2).expand(*q.shape[:-1], as_k(k), q.shape[-1])
        return independent(q)
    if k is None:
        raise ValueError(f"k is required for the {kind!r} law")
    return {"iid": iid, "wor": without_replacement, "greedy": greedy}[kind](q, k)
