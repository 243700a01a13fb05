"""A model-free sequence model for the mathematics of trees: ``TableModel``.

p and q depend on the path, so a tree draft law and a tree rule need p(.|prefix) and
q(.|prefix) at every node. ``TableModel`` gives both at small V, from tables (dicts keyed
by prefix tuples), from callables, or from a seeded generator of rows (``TableModel.random``):
the rows at a prefix are a function of (seed, style, prefix) alone, so every tree and every
continuation sees the same conditional laws.

Styles of ``random`` (all float64, rows exactly normalised):

==========  ====================================================================
random      p and q drawn independently, uniformly on the simplex
peaked      p and q softmax of 4 x Gaussian logits (one or two tokens dominate)
flat        p uniform, q random
one_hot     p one-hot on a random token, q random (full support)
same        q equal to p (random)
q_zero      p random with full support, q zero on a random nonempty strict subset
mixed       one of the styles above, chosen per prefix
==========  ====================================================================
"""
from __future__ import annotations

import torch

from .._validate import as_int, as_probs64
from .shapes import MAX_TREE_NODES

__all__ = ["MAX_SEQUENCE_LAW", "MAX_V", "STYLES", "TableModel", "as_sequence_model"]

# A table's rows are dense float64 [V] (two per prefix): V is bounded by a size far above any model's
# vocabulary (Qwen 151,936; Gemma 262,144), 16 MiB a (p, q) pair at the bound.
MAX_V = 1 << 20
# ``sequence_law`` is dense, V^n float64 entries (the ceiling LP needs V^(L+1) <= its variables anyway)
MAX_SEQUENCE_LAW = 1 << 24

STYLES = ("random", "peaked", "flat", "one_hot", "same", "q_zero", "mixed")
_BASIC = STYLES[:-1]


def _simplex(g: torch.Generator, V: int) -> torch.Tensor:
    e = -torch.log(torch.rand(V, generator=g, dtype=torch.float64).clamp_min(1e-300))  # [V]
    return e / e.sum()


def _rows(style: str, g: torch.Generator, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, q) of one prefix, both float64 ``[V]``."""
    if style == "mixed":
        style = _BASIC[int(torch.randint(len(_BASIC), (), generator=g))]
    if style == "random":
        return _simplex(g, V), _simplex(g, V)
    if style == "peaked":
        lp = 4 * torch.randn(V, generator=g, dtype=torch.float64)
        lq = 4 * torch.randn(V, generator=g, dtype=torch.float64)
        return torch.softmax(lp, -1), torch.softmax(lq, -1)
    if style == "flat":
        return torch.full((V,), 1.0 / V, dtype=torch.float64), _simplex(g, V)
    if style == "one_hot":
        p = torch.zeros(V, dtype=torch.float64)
        p[int(torch.randint(V, (), generator=g))] = 1.0
        return p, _simplex(g, V)
    if style == "same":
        p = _simplex(g, V)
        return p, p.clone()
    if style == "q_zero":
        p, q = _simplex(g, V), _simplex(g, V)
        if V >= 2:
            zero = torch.randperm(V, generator=g)[: 1 + int(torch.randint(V - 1, (), generator=g))]
            q[zero] = 0.0
            q = q / q.sum()
        return p, q
    raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")


def as_sequence_model(model, name: str = "model"):
    """``model`` if it reads as a sequence model (``V``, ``p(prefix)``, ``q(prefix)``: a ``TableModel``),
    else one ``ValueError`` naming ``name``."""
    if not (callable(getattr(model, "p", None)) and callable(getattr(model, "q", None)) and hasattr(model, "V")):
        raise ValueError(f"{name}: must be a sequence model with V, p(prefix) and q(prefix) (trees.TableModel), "
                         f"got {type(model).__name__}")
    return model


def _check_cols(n: int, name: str) -> None:
    if n > MAX_TREE_NODES - 1:
        raise ValueError(f"{name}: {n:,} draft columns; at most {MAX_TREE_NODES - 1} "
                         "(one per draft of a node, trees.MAX_TREE_NODES)")


def _as_v(V) -> int:
    V = as_int(V, "V", minimum=1)
    if V > MAX_V:
        raise ValueError(f"V: {V:,} tokens; a table model takes at most {MAX_V:,} (trees.MAX_V: dense float64 rows)")
    return V


def _what(which) -> str:
    return which if isinstance(which, str) else ("draft" if which[1] == 0 else f"draft column {which[1]}")


class TableModel:
    """q(.|prefix) and p(.|prefix) at small V, for tree draft laws and exact certificates.

    ``target`` and ``draft``: dicts ``{prefix tuple: row [V]}`` or callables
    ``prefix -> row [V]``; rows are validated once and cached (the same tensor object is
    returned for the same prefix). ``draft`` may be a list or tuple of such sources, one per
    draft column (the 'independent' law: one draft distribution per draft temperature):
    ``q(prefix, col)`` reads column ``col`` and ``q(prefix)`` column 0; ``n_cols`` counts them.
    ``TableModel.random(V, seed, style, cols)`` draws the rows.
    """

    def __init__(self, V: int, target, draft):
        self.V = _as_v(V)
        if target is None:
            raise ValueError("target: give a dict {prefix: row} or a callable prefix -> row, got None")
        drafts = list(draft) if isinstance(draft, (list, tuple)) else [draft]
        if not drafts:
            raise ValueError("draft: give at least one draft column")
        if any(d is None for d in drafts):
            raise ValueError("draft: give a dict {prefix: row} or a callable prefix -> row (one per column), got None")
        _check_cols(len(drafts), "draft")
        self.n_cols = len(drafts)
        self._src = {"target": target, **{("draft", c): src for c, src in enumerate(drafts)}}
        self._cache: dict[tuple, torch.Tensor] = {}

    @classmethod
    def random(cls, V: int, seed: int, style: str = "random", cols: int = 1) -> TableModel:
        """Rows drawn from a generator seeded by (seed, prefix): reproducible, any prefix.
        ``cols`` draft columns: column 0 is the q of ``style``; column c >= 1 is the q of the same
        style drawn from a generator seeded by (seed, prefix, c) (for 'same' a random row)."""
        if style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
        V = _as_v(V)
        seed = as_int(seed, "seed", minimum=0)
        cols = as_int(cols, "cols", minimum=1)
        _check_cols(cols, "cols")  # before the columns are built
        pairs: dict[tuple, tuple] = {}

        def pair(prefix: tuple, col: int = 0) -> tuple:
            got = pairs.get((col,) + prefix)
            if got is None:
                code = seed
                for t in prefix:
                    code = (code * (V + 1) + t + 1) % (1 << 61)
                base = (code * 1_000_003 + len(prefix)) % (1 << 63)
                if col:
                    base = (base * 7_919 + 104_729 * col) % (1 << 63)
                g = torch.Generator().manual_seed(base)
                got = pairs[(col,) + prefix] = _rows(style, g, V)
            return got

        def column(c: int):
            return lambda s: pair(s, c)[1]

        m = cls(V, lambda s: pair(s)[0], [column(c) for c in range(cols)] if cols > 1 else column(0))
        m.style, m.seed = style, seed
        return m

    def _row(self, which, prefix) -> torch.Tensor:
        prefix = tuple(int(t) for t in prefix)
        key = (which,) + prefix
        row = self._cache.get(key)
        if row is None:
            src = self._src[which]
            try:
                raw = src(prefix) if callable(src) else src[prefix]
            except KeyError:
                raise ValueError(f"{_what(which)}: no row for prefix {list(prefix)}") from None
            row = as_probs64(raw, f"{_what(which)} row at prefix {list(prefix)}")
            if row.shape != (self.V,):
                raise ValueError(f"{_what(which)} row at prefix {list(prefix)} has shape {tuple(row.shape)}, expected ({self.V},)")
            self._cache[key] = row
        return row

    def p(self, prefix=()) -> torch.Tensor:
        """Target distribution ``[V]`` (float64) after ``prefix``."""
        return self._row("target", prefix)

    def q(self, prefix=(), col: int = 0) -> torch.Tensor:
        """Draft distribution ``[V]`` (float64) of draft column ``col`` after ``prefix``."""
        if not 0 <= col < self.n_cols:
            raise ValueError(f"col: the model has draft columns 0..{self.n_cols - 1}, got {col}")
        return self._row(("draft", col), prefix)

    def sequence_law(self, prefix=(), n: int = 1) -> torch.Tensor:
        """The target's law of the next n tokens after ``prefix``: float64 ``[V] * n``
        (a 0-d tensor 1.0 for n = 0), ``prod_i p(s_i | prefix, s_<i)``."""
        prefix = tuple(int(t) for t in prefix)
        n = as_int(n, "n", minimum=0)
        if n > MAX_TREE_NODES or self.V ** n > MAX_SEQUENCE_LAW:  # checked by its ends: V ** n is computed only for small n
            raise ValueError(f"n: the law of {n:,} tokens at V = {self.V:,} has {self.V:,}^{n:,} entries; "
                             f"the limit is {MAX_SEQUENCE_LAW:,} (small V and depth only)")
        if n == 0:
            return torch.ones((), dtype=torch.float64)
        if self.V == 1:  # one sequence, up to n = MAX_TREE_NODES long: its product without recursing n deep
            w = torch.ones((), dtype=torch.float64)
            for j in reversed(range(n)):
                w = self.p(prefix + (0,) * j)[0] * w
            return w.reshape((1,) * n)
        p = self.p(prefix)
        out = torch.zeros((self.V,) * n, dtype=torch.float64)
        for y in torch.nonzero(p > 0).flatten().tolist():
            out[y] = p[y] * self.sequence_law(prefix + (y,), n - 1)
        return out
