"""``multidraft compare``: every verifier's acceptance per draft law and K on given (p, q).

For each case (a built-in pair or the user's ``.npy`` files), each draft law and each K,
the runner records one row per verifier that supports the law: its acceptance (exact by
enumerating every draft tuple when the tuple count is small, otherwise Monte-Carlo with a
printed standard error), the certificate error ``max_y |P(out = y) - p(y)|`` when exact,
and the optimal acceptance alpha* (the LP where it is small enough, otherwise the exact
dual ``optimal_acceptance``; the ``method`` column says which).

Sizes are estimated before any work (:func:`plan`): the tuple count of every (law, K)
decides exact enumeration vs Monte Carlo and LP vs dual, and ``lp_optimal`` (a verifier
that solves the LP for every instance) is skipped with a note where its LP is too large,
or refused up front when it was asked for by name. Rows have fields ``case``, ``V``,
``law``, ``K``, ``verifier``, ``acceptance``, ``se``, ``method``, ``certificate_error``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from .. import drafts as D
from .. import exact
from .. import verifiers as V
from .._validate import ArgumentError, as_int, as_ks, as_probs
from ..limits import lp_optimal_acceptance, optimal_acceptance
from ..limits.lp import COUNT_CAP, MAX_LP_TUPLES, tuple_count
from .progress import progress
from .records import JsonlWriter, row_key

__all__ = ["EXACT_MAX_TUPLES", "MAX_MC_DRAFT_TOKENS", "KEY", "KEYED", "load_array", "CompareConfig", "Cell", "Plan",
           "builtin_cases", "load_case", "plan", "estimate_seconds", "run", "jsonl_config", "write_jsonl", "format_table"]

EXACT_MAX_TUPLES = 20_000   # enumerate every draft tuple up to this many (the LP limit is limits.lp.MAX_LP_TUPLES)
KEY = ("case", "law", "K", "verifier")
KEYED = ("k", "laws", "verifiers")  # --out may be extended with more of these (rows are keyed by them)
LP_VERIFIERS = ("lp_optimal",)      # verifiers that solve the coupling LP for every instance
# The most draft tokens one Monte-Carlo run may draw (samples x K): beyond it a run takes hours
# whatever the verifier (each draw is at least K tokens), so ``plan`` refuses it up front.
MAX_MC_DRAFT_TOKENS = 10**9


def _softmax(x, t=1.0):
    x = torch.as_tensor(x, dtype=torch.float64) / t
    return torch.softmax(x, -1)


def builtin_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Two small pairs (V = 6): a peaked target with a flatter draft, and a flat target with a
    draft that puts its mass elsewhere."""
    peaked_logits = torch.tensor([3.0, 1.6, 1.0, 0.4, -0.5, -1.5], dtype=torch.float64)
    draft_logits = peaked_logits + torch.tensor([-0.6, 0.5, -0.3, 0.6, 0.2, 0.4], dtype=torch.float64)
    flat_p = _softmax([0.3, 0.1, 0.0, -0.1, 0.2, -0.2])
    flat_q = _softmax([-0.5, 1.2, 0.8, -0.2, -1.0, 0.6])
    return {
        "peaked": (_softmax(peaked_logits), _softmax(draft_logits, 1.3)),
        "flat": (flat_p, flat_q),
    }


def load_array(path: str | Path, flag: str, *, ndims: tuple[int, ...] = (1,), neg_inf: bool = False) -> torch.Tensor:
    """A float64 tensor from a ``.npy`` file (or an ``.npz`` holding exactly one array), checked
    before any use: a readable array (never unpickled), a real numeric dtype (float or integer),
    ``ndim`` in ``ndims``, no empty dimension, every entry finite (or -inf with ``neg_inf``: logits,
    where -inf is a masked token of probability 0). Every failure names ``flag`` and the path in
    one line (``FileNotFoundError`` for a missing file, ``ValueError`` else)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, f"{flag}: no such file", str(path))
    if not path.is_file():
        raise IsADirectoryError(21, f"{flag}: expected a .npy file, found a directory", str(path))
    try:
        arr = np.load(path, allow_pickle=False)
    except OSError as exc:
        raise OSError(exc.errno, f"{flag}: cannot read ({exc.strerror or exc})", str(path)) from None
    except Exception:  # noqa: BLE001 (numpy's many errors for a damaged or pickled file)
        # never relay numpy's text: for a pickle it suggests allow_pickle=True, i.e. running the file's code
        raise ValueError(f"{flag}: {path} is not a readable .npy/.npz array (corrupt, truncated, pickled objects "
                         "or not numpy's format)") from None
    if isinstance(arr, np.lib.npyio.NpzFile):
        with arr:
            names = list(arr.files)
            if len(names) != 1:
                raise ValueError(f"{flag}: {path} is an .npz archive of {len(names)} arrays ({', '.join(names[:5]) or 'none'}); "
                                 "give a .npy file or an .npz holding one array")
            try:
                arr = arr[names[0]]
            except Exception:  # noqa: BLE001
                raise ValueError(f"{flag}: {path}: array {names[0]!r} is not readable (corrupt, or pickled objects)") from None
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{flag}: {path} does not hold an array")
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{flag}: {path} holds dtype {arr.dtype}; expected floating-point numbers")
    if arr.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{flag}: {path} must hold a {want} array, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{flag}: {path} is empty (shape {arr.shape})")
    out = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64))
    bad = ~torch.isfinite(out)
    if neg_inf:
        bad &= ~torch.isneginf(out)
    if bool(bad.any()):
        at = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{flag}: {path} has a NaN or {'+' if neg_inf else ''}infinite entry (at index {at[0] if len(at) == 1 else at})")
    return out


def load_case(p_path: str | Path, q_path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, q) from two ``.npy`` files holding probability vectors of the same length
    (:func:`load_array`, then ``as_probs``; every error names the flag and the file)."""
    out = []
    for name, path in (("p", p_path), ("q", q_path)):
        t = load_array(path, f"--{name}")
        try:
            out.append(as_probs(t, name))
        except ValueError as exc:
            raise ValueError(f"--{name}: {path}: {exc}") from None
    if out[0].shape != out[1].shape:
        raise ValueError(f"--p {p_path} has V = {out[0].shape[-1]} but --q {q_path} has V = {out[1].shape[-1]}")
    return out[0], out[1]


@dataclass(frozen=True)
class CompareConfig:
    """What ``multidraft compare`` computes, validated once when made (``ArgumentError`` naming the field):
    ``ks`` numbers of drafts (sorted, each >= 1), ``laws`` checked kinds of the single-q laws
    (names or aliases accepted, stored as kinds), ``verifiers`` registered names or None (all),
    ``samples`` Monte-Carlo draws (>= 1), ``seed``."""

    ks: tuple[int, ...] = (1, 2, 3, 4)
    laws: tuple[str, ...] = D.SHARED_Q_KINDS
    verifiers: tuple[str, ...] | None = None
    samples: int = 200_000
    seed: int = 0

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("ks", as_ks(self.ks, "k"))
        set_("laws", D.parse_laws(self.laws, D.SHARED_Q_KINDS, "laws"))
        if self.verifiers is not None:
            set_("verifiers", V.check_names(self.verifiers))
        set_("samples", as_int(self.samples, "samples", minimum=1))
        set_("seed", as_int(self.seed, "seed"))


def _count(n: int) -> str:
    if n > COUNT_CAP:  # tuple counts are capped there (limits.lp.tuple_count)
        return f"> 10^{len(str(COUNT_CAP)) - 1}"
    return f"{n:,}" if n < 10**12 else f"about 10^{len(str(n)) - 1}"


@dataclass
class Cell:
    case: str
    law: str
    k: int
    tuples: int
    alpha_method: str               # "lp" or "dual"
    verifiers: list = field(default_factory=list)  # [(name, "exact" | "mc")]


@dataclass
class Plan:
    cells: list
    notes: list                     # one line per skipped combination or fallback

    @property
    def n_exact(self) -> int:
        return sum(m == "exact" for c in self.cells for _, m in c.verifiers)

    @property
    def n_monte_carlo(self) -> int:
        return sum(m == "mc" for c in self.cells for _, m in c.verifiers)

    def describe(self, samples: int) -> str:
        """One line: what will be computed, before it is."""
        lp = sum(c.alpha_method == "lp" for c in self.cells)
        big = max((c.tuples for c in self.cells), default=0)
        return (f"compare: {len(self.cells)} (case, law, K) cells, up to {_count(big)} draft tuples; alpha* by LP in {lp}, "
                f"by the dual in {len(self.cells) - lp}; {self.n_exact} exact certificates, "
                f"{self.n_monte_carlo} Monte-Carlo runs of {samples:,} draws")


def plan(cases: dict[str, tuple[torch.Tensor, torch.Tensor]], s: CompareConfig) -> Plan:
    """Sizes first: how every (case, law, K, verifier) will be computed, without computing it.

    ``ArgumentError`` (verifiers) when a verifier asked for by name cannot run at some K
    (``lp_optimal`` over more than ``limits.lp.MAX_LP_TUPLES`` draft tuples)."""
    explicit = s.verifiers is not None
    names = list(s.verifiers) if explicit else V.names()
    cells, notes = [], []
    for case, (p, q) in cases.items():
        for law_name in s.laws:
            for k in s.ks:
                if law_name in ("wor", "greedy") and int((q > 0).sum()) < k:
                    notes.append(f"{case}: the {law_name} law needs K <= {int((q > 0).sum())} tokens with q > 0; K = {k} skipped")
                    continue
                law = D.make(law_name, q, k)
                nt = tuple_count(law, cap=COUNT_CAP)  # capped: never n**K at huge K
                lp_ok = nt <= MAX_LP_TUPLES
                cell = Cell(case, law_name, k, nt, "lp" if lp_ok else "dual")
                for name in names:
                    v = V.get(name)
                    if not v.supports(law):
                        continue
                    if name in LP_VERIFIERS and not lp_ok:
                        msg = (f"{name} at {law_name} K = {k} (case {case}) needs an LP over {_count(nt)} draft tuples "
                               f"(limit {MAX_LP_TUPLES:,}); alpha* comes from the exact dual instead")
                        if explicit:
                            raise ArgumentError("verifiers", f": {msg}; lower K or leave {name} out")
                        notes.append(f"skipped {msg}")
                        continue
                    how = "exact" if nt <= EXACT_MAX_TUPLES else "mc"
                    if how == "mc" and s.samples * k > MAX_MC_DRAFT_TOKENS:
                        raise ArgumentError("k", f": K = {k:,} is too many drafts to sample: {s.samples:,} Monte-Carlo "
                                                 f"draws of K drafts are {s.samples * k:,} draft tokens per verifier; "
                                                 f"the limit is {MAX_MC_DRAFT_TOKENS:,} (lower --k or --samples)")
                    cell.verifiers.append((name, how))
                cells.append(cell)
    return Plan(cells, notes)


PILOT_SECONDS = 0.05  # each Monte-Carlo run's pilot grows until one batch takes this long


def estimate_seconds(cases: dict, s: CompareConfig, pl: Plan) -> float:
    """Seconds the Monte-Carlo runs of the plan will take, from timed pilots (own generator:
    the run's draws are unchanged): per (cell, verifier), batches of 16, 32, ... draws until one
    takes ``PILOT_SECONDS`` (or is a full batch), the last one's cost per draw times the draws.
    Per-draw cost grows with the batch for some verifiers, hence pilots of real size, not tiny
    ones. Exact cells and alpha* are bounded by the tuple limits (seconds at most), not counted."""
    import time

    g = torch.Generator().manual_seed(0)
    total = 0.0
    for cell in pl.cells:
        p, q = cases[cell.case]
        law = D.make(cell.law, q, cell.k)
        top = _chunk(law, s.samples)
        for name, how in cell.verifiers:
            if how != "mc":
                continue
            v, n = V.get(name), min(16, top)
            while True:
                t0 = time.perf_counter()
                _monte_carlo(v, p, law, n, g)
                took = time.perf_counter() - t0
                if took >= PILOT_SECONDS or n >= top:
                    break
                n = min(2 * n, top)
            total += took / n * s.samples
    return total


def _chunk(law, n: int) -> int:
    """Monte-Carlo draws per batch: about 2M draft-probability entries (bounded memory)."""
    return max(1, min(n, 2_000_000 // max(1, law.V * law.k)))


def _alpha_star(p, law, method: str) -> float:
    return float(lp_optimal_acceptance(p, law) if method == "lp" else optimal_acceptance(p, law))


def _monte_carlo(v, p, law, n: int, g: torch.Generator) -> tuple[float, float]:
    """Acceptance and its standard error from n batched draws of drafts + verdicts."""
    hits = 0
    done = 0
    chunk = _chunk(law, n)
    while done < n:
        m = min(chunk, n - done)
        q = law.q.expand(m, *law.q.shape).contiguous()
        batch = D.make(law.kind, q, law.k)
        drafts = batch.sample(g)
        verdict = v.verify(p.expand(m, p.shape[-1]), q, drafts, generator=g, law=law.kind, validate=False)
        hits += int((verdict.accepted_index >= 0).sum())
        done += m
    a = hits / n
    return a, math.sqrt(max(a * (1 - a), 1.0 / n) / n)


def run(cases: dict[str, tuple[torch.Tensor, torch.Tensor]], s: CompareConfig, *, show_progress: bool = True,
        log: Callable[[str], None] = lambda _m: None, the_plan: Plan | None = None,
        step_log: Callable[[str], None] | None = None) -> list[dict]:
    """All rows, one per (case, law, K, verifier), plus one 'alpha*' row per (case, law, K).
    ``step_log``: a line before each Monte-Carlo step (progress where no bar can be drawn)."""
    pl = the_plan if the_plan is not None else plan(cases, s)
    for note in pl.notes:
        log(note)
    g = torch.Generator().manual_seed(s.seed)
    steps = [(c, nv) for c in pl.cells for nv in [None] + c.verifiers]  # cell by cell, alpha* first
    rows: list[dict] = []
    for i, (cell, nv) in enumerate(progress(steps, total=len(steps), desc="compare", enabled=show_progress)):
        if step_log is not None and nv is not None and nv[1] == "mc":
            step_log(f"compare: step {i + 1}/{len(steps)}: {cell.case} {cell.law} K = {cell.k}, {nv[0]}, "
                     f"{s.samples:,} Monte-Carlo draws")
        p, q = cases[cell.case]
        law = D.make(cell.law, q, cell.k)
        base = dict(case=cell.case, V=law.V, law=cell.law, K=cell.k)
        if nv is None:
            rows.append(dict(base, verifier="alpha*", acceptance=_alpha_star(p, law, cell.alpha_method), se=0.0,
                             method="lp" if cell.alpha_method == "lp" else "dual (LP too large)",
                             certificate_error=None, tuples=cell.tuples))
            continue
        name, how = nv
        v = V.get(name)
        if how == "exact":
            cert = exact.certify(v, p, law)
            rows.append(dict(base, verifier=name, acceptance=cert.acceptance, se=0.0, method="exact",
                             certificate_error=cert.max_abs_error, tuples=cell.tuples))
        else:
            a, se = _monte_carlo(v, p, law, s.samples, g)
            rows.append(dict(base, verifier=name, acceptance=a, se=se, method=f"mc{s.samples}",
                             certificate_error=None, tuples=cell.tuples))
    return rows


def jsonl_config(cases: dict, s: CompareConfig) -> dict:
    """The config a ``--out`` file is bound to (``KEYED`` keys may grow)."""
    return dict(k=list(s.ks), laws=list(s.laws), verifiers=list(s.verifiers) if s.verifiers else None,
                samples=s.samples, cases={k: {"p": v[0].tolist(), "q": v[1].tolist()} for k, v in cases.items()})


def write_jsonl(path: str | Path, rows: list[dict], cases: dict, s: CompareConfig) -> int:
    """Append the rows missing from ``path`` (bound to the cases, samples and seed; more Ks,
    laws or verifiers may be added to an existing file); returns how many were written."""
    with JsonlWriter(path, jsonl_config(cases, s), s.seed, keyed=KEYED) as w:
        done = w.done(KEY)
        new = [r for r in rows if row_key(r, KEY) not in done]
        for r in new:
            w.write(**r)
    return len(new)


def format_table(rows: Iterable[dict]) -> str:
    """One block per (case, law): verifiers as rows, K as columns, alpha* first."""
    rows = list(rows)
    out = []
    blocks: dict[tuple, list[dict]] = {}
    for r in rows:
        blocks.setdefault((r["case"], r["law"]), []).append(r)
    for (case, law), rs in blocks.items():
        ks = sorted({r["K"] for r in rs})
        order = {n: i for i, n in enumerate(["alpha*"] + V.names())}
        names = sorted(dict.fromkeys(r["verifier"] for r in rs), key=lambda n: order.get(n, len(order)))
        V_ = rs[0]["V"]
        out.append(f"case {case} (V = {V_}), draft law {law}: acceptance by K")
        header = f"  {'verifier':<16}" + "".join(f"{'K=' + str(k):>16}" for k in ks) + f"  {'max cert. error':>16}"
        out.append(header)
        out.append("  " + "-" * (len(header) - 2))
        for n in names:
            cells, errs = [], []
            for k in ks:
                r = next((r for r in rs if r["verifier"] == n and r["K"] == k), None)
                if r is None or r["acceptance"] is None:
                    cells.append(f"{'-':>16}")
                    continue
                txt = f"{r['acceptance']:.4f}"
                if r["se"]:
                    txt += f"±{r['se']:.4f}"
                elif n == "alpha*":
                    txt += f" ({r['method'].split()[0]})"
                cells.append(f"{txt:>16}")
                if r["certificate_error"] is not None:
                    errs.append(r["certificate_error"])
            err = f"{max(errs):.1e}" if errs else ("-" if n != "alpha*" else "")
            out.append(f"  {n:<16}" + "".join(cells) + f"  {err:>16}")
        dual = [r for r in rs if r["verifier"] == "alpha*" and str(r["method"]).startswith("dual")]
        if dual:
            out.append("  alpha* (dual): the exact dual optimal_acceptance, the LP being too large at "
                       + ", ".join(f"K={r['K']} ({_count(r['tuples'])} tuples)" if isinstance(r.get("tuples"), int)
                                   else f"K={r['K']}" for r in dual))
        out.append("")
    return "\n".join(out)
