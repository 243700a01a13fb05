"""Input checks shared by every public entry point.

Every check raises ``ValueError`` naming the offending argument; nothing is silently
repaired except the documented renormalisation of half-precision inputs.

Tolerance on ``sum(x) == 1`` along the last dimension, by dtype (``SUM_TOLERANCE``):
float64 1e-6, float32 1e-4, float16 1e-2, bfloat16 2e-2. Inputs in float16/bfloat16 are
cast to float64 and divided by their float64 sum; float32 and float64 inputs are used as given.

Tensors are read by value: a dense (strided) tensor on a device that holds values; a sparse
or meta tensor is refused, and one that requires grad is read detached (verification samples:
no gradient flows through it, and the results never require grad).

Integers: wherever a count is expected (``k``, ``num_samples``, a seed) any integer type is
accepted through ``operator.index`` (Python ``int``, ``numpy.int64``, a 0-d integer tensor);
``bool`` and floats (even ``2.0``) are refused.

Randomness (``as_generator``): a ``torch.Generator`` is used as given, so one generator
passed to ``law.sample`` and then to ``verify`` is one stream read in order. An integer
seed is never fed to ``manual_seed`` directly by a library entry point: it is turned into
a stream for one *purpose* (``"drafts"`` for ``DraftLaw.sample``, ``"verify"`` for
``Verifier.verify``) whose seed is ``derive_seed(seed, purpose)``, a 64-bit BLAKE2b hash of
``(seed, purpose)``. So ``law.sample(generator=11)`` followed by ``verify(...,
generator=11)`` draws the drafts and the acceptance coins from two independent streams
(passing the same seed twice cannot correlate them), and the same seed still reproduces
the same result. Note that ``law.sample(11)`` therefore differs from
``law.sample(torch.Generator().manual_seed(11))``.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import operator
import zlib

import torch

from ._errors import ArgumentError  # noqa: F401  (re-exported: the checks below raise it)

SUM_TOLERANCE = {
    torch.float64: 1e-6,
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
}


def values_of(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` as values (module notes): refuses sparse and meta tensors naming ``name``; detaches."""
    if x.layout != torch.strided:
        raise ValueError(f"{name} must be a dense tensor, got layout {x.layout} (call .to_dense() first)")
    if x.device.type == "meta":
        raise ValueError(f"{name} is a meta tensor: it has a shape but no values")
    return x.detach() if x.requires_grad else x


def as_probs(x, name: str, *, min_ndim: int = 1) -> torch.Tensor:
    """Validate a probability tensor ``x`` (``[..., V]``) and return it in float32 or float64
    (float16 and bfloat16 rows as float64 rows divided by their float64 sum)."""
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x, dtype=torch.float64)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"{name} must be a tensor of probabilities, got {type(x).__name__}") from exc
    x = values_of(x, name)
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor of probabilities, got dtype {x.dtype}")
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s) [..., V], got shape {tuple(x.shape)}")
    if x.shape[-1] < 1:
        raise ValueError(f"{name} has an empty vocabulary dimension (V = 0)")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)})")
    tol = SUM_TOLERANCE.get(x.dtype, 1e-4)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    s = x.sum(-1, dtype=acc)
    if not bool(torch.isfinite(s).all()):
        raise ValueError(f"{name} contains NaN or inf")
    lo = x.amin()
    if bool(lo < 0):
        raise ValueError(f"{name} has negative entries (min {float(lo):.3g}); probabilities must be >= 0")
    dev = (s - 1).abs().max()
    if bool(dev > tol):
        worst = s.flatten()[(s - 1).abs().flatten().argmax()]
        raise ValueError(
            f"{name} must sum to 1 along its last dimension (tolerance {tol:g} for {x.dtype}); "
            f"a row sums to {float(worst):.6g}"
        )
    if x.dtype in (torch.float16, torch.bfloat16):
        # normalised in float64 (half values are exact there): the law the row represents, the very
        # numbers of ``as_probs64`` and ``rows64``; a float32 division would move it by ~1e-8
        x = x.double()
        x = x / x.sum(-1, keepdim=True)
    elif x.dtype not in (torch.float32, torch.float64):
        x = x.double()
    return x


def as_probs64(x, name: str, *, min_ndim: int = 1) -> torch.Tensor:
    """``as_probs`` in float64 for the exact paths (certificates, alpha*, LPs): inputs that
    are not float64 are divided by their float64 sum, float64 inputs are used as given.
    The one normalisation rule every exact path applies (``DraftLaw._q64`` does the same for q)."""
    x = as_probs(x, name, min_ndim=min_ndim)
    if x.dtype == torch.float64:
        return x
    x = x.double()
    return x / x.sum(-1, keepdim=True)


def as_int(x, name: str, *, minimum: int | None = None, what: str = "an integer") -> int:
    """``x`` as a Python int via ``operator.index`` (int, numpy integer, 0-d integer tensor);
    ``ValueError`` naming ``name`` for bool, float or anything else, or when below ``minimum``."""
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and (x.dtype == torch.bool or x.numel() != 1)):
        raise ArgumentError(name, f"must be {what}, got {x!r}")
    try:
        n = operator.index(x)
    except TypeError:
        raise ArgumentError(name, f"must be {what}, got {x!r}") from None
    if type(x).__name__ == "bool_":  # numpy.bool_ (operator.index accepts it on old numpy)
        raise ArgumentError(name, f"must be {what}, got {x!r}")
    if minimum is not None and n < minimum:
        raise ArgumentError(name, f"must be >= {minimum}, got {n}")
    return int(n)


# The most drafts a draft law takes: the law's closed forms raise probabilities to the power k in float64
# and torch reads k as an int64, both exact up to 2**53 (a sample holds far fewer: drafts.MAX_SAMPLE_TOKENS).
MAX_K = 1 << 53


def as_k(k, name: str = "k") -> int:
    """A number of drafts: an integer >= 1 (any integer type, see the module notes)."""
    k = as_int(k, name, what="a positive integer (number of drafts)")
    if k < 1:
        raise ArgumentError(name, f"must be >= 1 (number of drafts), got {k}")
    if k > MAX_K:
        raise ArgumentError(name, f"must be <= 2**53 = {MAX_K:,} (number of drafts, counted exactly in float64), got {k:.3g}")
    return k


def as_ks(ks, name: str = "k") -> tuple[int, ...]:
    """Numbers of drafts (a sequence, or one integer): each an integer >= 1; sorted, no duplicates."""
    items = [ks] if not isinstance(ks, (list, tuple, set, frozenset, range)) else list(ks)
    if not items:
        raise ArgumentError(name, "is empty; give at least one number of drafts")
    return tuple(sorted({as_k(k, name) for k in items}))


def _is_bool(x) -> bool:
    return isinstance(x, bool) or getattr(x, "dtype", None) == bool  # Python or numpy bool


# The smallest positive temperature: softmax(logits / T) is computed in float32, where logits / T
# overflows to inf (and the row to NaN) once |logits| / T > 3.4e38; at T >= 1e-30 that needs
# |logits| > 3.4e8, far beyond any model's (sampling.process_logits also shifts the row's max to
# 0 first for T < 1e-3, so no row is ever NaN there). Below it, 0 is greedy decoding.
MIN_TEMPERATURE = 1e-30


def as_temperature(x, name: str = "temperature") -> float:
    """A sampling temperature: 0 (greedy) or a finite real number >= ``MIN_TEMPERATURE``, as a float."""
    if not isinstance(x, numbers.Real) or _is_bool(x) or not math.isfinite(x):
        raise ArgumentError(name, f"must be a finite number >= 0, got {x!r}")
    if x < 0:
        raise ArgumentError(name, f"must be >= 0 (0 = greedy), got {x}")
    if 0 < x < MIN_TEMPERATURE:
        raise ArgumentError(name, f"must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got {x:g} (the scaled logits "
                                  "would overflow float32 and the law be undefined; use 0 for greedy decoding)")
    return float(x)


def as_top_k(x, name: str = "top_k") -> int | None:
    """None or an integer >= 1 (any integer type; bools refused)."""
    if x is None:
        return None
    try:
        k = None if _is_bool(x) else operator.index(x)
    except TypeError:
        k = None
    if k is None or k < 1:
        raise ArgumentError(name, f"must be None or an integer >= 1, got {x!r}")
    return int(k)


def as_top_p(x, name: str = "top_p") -> float | None:
    """None or a real number in (0, 1]."""
    if x is None:
        return None
    if not isinstance(x, numbers.Real) or _is_bool(x) or not (0.0 < x <= 1.0):
        raise ArgumentError(name, f"must be None or a number in (0, 1], got {x!r}")
    return float(x)


def as_tokens(drafts, name: str, V: int) -> torch.Tensor:
    """Validate integer token ids in ``[0, V)``; returns int64."""
    if not isinstance(drafts, torch.Tensor):
        try:
            drafts = torch.as_tensor(drafts)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"{name} must be a tensor of token ids") from exc
    drafts = values_of(drafts, name)
    if drafts.is_floating_point() or drafts.is_complex() or drafts.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {drafts.dtype}")
    drafts = drafts.long()
    if drafts.numel() and bool(((drafts < 0) | (drafts >= V)).any()):
        bad = drafts[(drafts < 0) | (drafts >= V)].flatten()[0]
        raise ValueError(f"{name} holds token id {int(bad)} outside the vocabulary [0, {V})")
    return drafts


PURPOSES = ("drafts", "verify")


SEED_RULES = ("stream", "unit", "linear")


def derive_seed(seed, *parts, rule: str = "stream", weights: tuple[int, ...] | None = None) -> int:
    """Every seed derived from a user's ``seed`` comes from here: the seed of one stream or unit of
    work named by ``parts`` (strings or integers). Three rules, each the one a family of committed
    results was made with (so no committed draw moves):

    ``"stream"`` (default): the first 8 bytes of BLAKE2b over ``"multidraft/<purpose>/<seed>"``
        (little endian), in [0, 2**64), where ``purpose`` is the parts joined by ``"|"``: the
        streams a library entry point reads (``"drafts"``, ``"verify"``, ``"tree-auto-warmup"``).
        Distinct purposes give unrelated streams for the same seed, and distinct seeds give
        unrelated streams for the same purpose (unlike ``seed + offset`` schemes, where seed 1's
        second stream is seed 2's first).
    ``"unit"``: ``(seed * 1_000_003 + crc32(name)) % (2**63 - 1)`` with ``name`` the parts joined
        by ``"|"``: one named unit of work of an experiment (a cell, a text, a decoding run), a
        function of (seed, name) alone, so units run in any order or process with the same draws.
    ``"linear"``: ``seed * w0 + parts[0] * w1 + ...`` for integer parts, ``weights`` (w0, w1, ...)
        all 1 when not given (``seed + i``): the documented per-prompt seeds of a batch (prompt i
        gets ``seed + i``) and the instance seeds of the synthetic benchmarks and studies.
    """
    if rule not in SEED_RULES:
        raise ArgumentError("rule", f"must be one of {', '.join(SEED_RULES)}, got {rule!r}")
    seed = as_int(seed, "generator" if rule == "stream" else "seed", what="a torch.Generator or an integer seed"
                  if rule == "stream" else "an integer seed")
    if rule == "linear":
        ints = [as_int(p, "parts") for p in parts]
        weights = (1,) * (len(ints) + 1) if weights is None else tuple(weights)
        if len(weights) != len(ints) + 1:
            raise ArgumentError("weights", f"needs one weight for the seed and one per part ({len(ints) + 1}), got {weights!r}")
        return seed * weights[0] + sum(p * w for p, w in zip(ints, weights[1:]))
    if weights is not None:
        raise ArgumentError("weights", f"only the linear rule takes weights, not {rule!r}")
    name = "|".join(str(p) for p in parts)
    if not name:
        raise ValueError(f"a seed's purpose must be a non-empty string, got {parts!r}")
    if rule == "unit":
        return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)
    digest = hashlib.blake2b(f"multidraft/{name}/{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def as_generator(generator, device=None, *, purpose: str | None = None) -> torch.Generator:
    """An explicit ``torch.Generator`` (returned as is) or an integer seed; never the global RNG.

    With ``purpose`` (``"drafts"``, ``"verify"``, ...) an integer seed gives a fresh generator
    seeded with ``derive_seed(seed, purpose)``: one independent stream per purpose, so the same
    integer passed to ``law.sample`` and to ``verify`` cannot correlate drafts and coins.
    Without ``purpose`` (a caller that draws everything from the one generator it builds,
    e.g. the decoder) the seed is used as is.
    """
    if isinstance(generator, torch.Generator):
        return generator
    try:
        seed = as_int(generator, "generator", what="a torch.Generator or an integer seed")
    except ValueError:
        raise ValueError(
            "generator must be a torch.Generator or an integer seed "
            "(randomness is always explicit), got " + repr(type(generator).__name__)
        ) from None
    g = torch.Generator(device=device or "cpu")
    g.manual_seed(seed if purpose is None else derive_seed(seed, purpose))
    return g


# draft law <-> (draft_probs, drafts) consistency: the one place every verifier goes through
SHARED_Q_KINDS = ("iid", "wor", "greedy")  # the same tuple as drafts.SHARED_Q_KINDS


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b broadcast to one shape hold identical values (no copy of the broadcast)."""
    try:
        shape = torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        return False
    return bool(torch.equal(a.expand(shape), b.expand(shape)))


def _law_q_as_read(law, q: torch.Tensor, per: bool) -> torch.Tensor | None:
    """draft_probs ``q`` (``[..., V]``, or ``[..., K, V]`` when ``per``) as the verifier should read
    it when it is the q the law was built from, else None. It is when it is the very tensor or
    holds equal values (to the law's q in its own dtype, or to its float64 renormalised form
    ``law._q64()`` for a float64 q): q is read as given. A float64 q that holds the values of a
    lower-precision ``law.q`` widened (``law.q.double()``) is the law's q too: it is read as
    ``law._q64()`` (shaped as q), the renormalised row the same law's float32 q gives, so the
    verifier reads the law the drafts were drawn from."""
    if q is law.q:
        return q

    def same(r):
        if law.kind == "independent":  # law.q is [..., K, V]
            return _same_values(r, q if per else q.unsqueeze(-2))
        return _same_values(r.unsqueeze(-2), q) if per else _same_values(r, q)  # law.q is [..., V]

    if q.dtype == law.q.dtype:
        return q if same(law.q) else None
    if q.dtype != torch.float64:
        return None
    r = law._q64()
    if same(r):
        return q
    if not same(law.q.double()):
        return None
    if law.kind == "independent":
        r = r if per else r[..., 0, :]
    elif per:
        r = r.unsqueeze(-2)
    return r.expand(q.shape)


def is_law_object(law) -> bool:
    return hasattr(law, "kind") and hasattr(law, "q") and hasattr(law, "batch_shape")


def check_law_shape(law, V: int, K: int, batch, drafts_shape=None) -> None:
    """A law object's K, V and batch shape against the call's (drafts ``[*batch, K]``, V)."""
    if law.k != K:
        shown = f" (shape {tuple(drafts_shape)})" if drafts_shape is not None else ""
        raise ValueError(
            f"law: the {law.kind!r} law was built for K = {law.k} drafts but drafts has K = {K}{shown}; "
            f"expected drafts of shape [..., {law.k}]"
        )
    if law.V != V:
        raise ValueError(f"law: the law has V = {law.V} but target_probs and draft_probs have V = {V}")
    lb, batch = torch.Size(law.batch_shape), torch.Size(batch)
    try:
        ok = torch.broadcast_shapes(lb, batch) == batch
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"law: batch shape {tuple(lb)} does not broadcast to the batch shape {tuple(batch)} of "
            f"target_probs and drafts; expected a law over {tuple(batch)} (or an unbatched one)"
        )


def check_law(law, kind: str, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, *,
              validate: bool, law_given: bool) -> torch.Tensor:
    """Check that ``(q, drafts)`` can come from the draft law and return draft_probs as the
    verifier should read it: ``[..., V]`` for the single-q laws (per-draft rows collapsed),
    as given otherwise.

    p ``[..., V]``, q ``[..., V]`` or ``[..., K, V]``, drafts ``[..., K]`` (shapes already
    checked against each other); ``law`` a DraftLaw object or a name, ``kind`` its kind.
    Cheap checks (K, V, batch of a law object; distinct drafts under 'wor'/'greedy') always
    run; the ones that read the full vocabulary (q equal to the law's q, identical per-draft
    rows, the greedy top set) only with ``validate``.
    """
    V, K = p.shape[-1], drafts.shape[-1]
    if is_law_object(law):
        check_law_shape(law, V, K, p.shape[:-1], drafts.shape)
        if validate:
            read = _law_q_as_read(law, q, q.ndim == p.ndim + 1)
            if read is None:
                raise ValueError(
                    "draft_probs: not the q the law was built from (law.q); pass law.q (or its values) "
                    "as draft_probs, or build the law on this draft_probs"
                )
            q = read
    per = q.ndim == p.ndim + 1
    if kind in SHARED_Q_KINDS and per:
        if validate and q.stride(-2) != 0 and K > 1 and not torch.equal(q, q[..., :1, :].expand_as(q)):
            if law_given:
                raise ValueError(
                    f"draft_probs: the per-draft rows [..., K, V] differ across the K = {K} drafts, but the "
                    f"{kind!r} law draws every draft from one q; pass one q [..., V], or law='independent' "
                    "for drafts drawn from their own rows"
                )
            raise ValueError(
                f"law: not given, and the per-draft rows of draft_probs [..., K, V] differ across the K = {K} "
                "drafts, so the default 'iid' law does not hold; pass law='independent' (one row per draft)"
            )
        q = q[..., 0, :]
    if kind in ("wor", "greedy") and K > 1:
        eq = (drafts.unsqueeze(-1) == drafts.unsqueeze(-2)).triu(1)
        if bool(eq.any()):
            raise ValueError(
                f"drafts: the {kind!r} law gives K distinct draft tokens, got a repeated token in a row; "
                "expected distinct tokens in every row of drafts"
            )
    if kind == "greedy" and K > 1 and validate:
        T = drafts[..., : K - 1]
        top = torch.topk(q, K - 1, dim=-1).values  # [..., K-1], descending
        qT = q.gather(-1, T).sort(-1, descending=True).values
        bad = (qT != top).any(-1)
        if bool(bad.any()):
            i = bad.reshape(-1).nonzero()[0, 0]
            got = T.reshape(-1, K - 1)[i].tolist()
            want = torch.topk(q.reshape(-1, V)[i], K - 1).indices.tolist()
            raise ValueError(
                f"drafts: under the greedy law drafts[..., :K-1] are the top K-1 = {K - 1} tokens of "
                f"draft_probs; a row has {got}, expected {want} (in any order; tied tokens may swap)"
            )
    return q
