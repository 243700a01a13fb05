"""``multidraft compare``: every verifier's acceptance per draft law and K on given (p, q).

For each case (a built-in pair or the user's ``.npy`` files), each draft law and each K,
the runner records one row per verifier that supports the law: its acceptance (exact by
enumerating every draft tuple when the tuple count is small, otherwise Monte-Carlo with a
printed standard error), the certificate error ``max_y |P(out = y) - p(y)|`` when exact,
and the optimal acceptance alpha* (the LP where it is small enough, otherwise the dual).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from .. import drafts as D
from .. import exact
from .. import verifiers as V
from .._validate import as_probs
from .progress import progress

EXACT_MAX_TUPLES = 20_000   # enumerate every draft tuple up to this many
LP_MAX_VARIABLES = 60_000   # tuples x V for the coupling LP


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


def load_case(p_path: str | Path, q_path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, q) from two ``.npy`` files holding probability vectors of the same length."""
    out = []
    for name, path in (("p", p_path), ("q", q_path)):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"--{name}: no such file {path}")
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"--{name}: {path} is not a readable .npy array ({exc})") from None
        t = torch.from_numpy(np.asarray(arr, dtype=np.float64)).flatten() if arr.ndim <= 1 else None
        if t is None:
            raise ValueError(f"--{name}: expected a 1-D probability vector, got shape {arr.shape}")
        out.append(as_probs(t, name))
    if out[0].shape != out[1].shape:
        raise ValueError(f"p has V = {out[0].shape[-1]} but q has V = {out[1].shape[-1]}")
    return out[0], out[1]


@dataclass
class Settings:
    ks: tuple[int, ...] = (1, 2, 3, 4)
    laws: tuple[str, ...] = D.SHARED_Q_KINDS
    verifiers: tuple[str, ...] | None = None
    samples: int = 200_000
    seed: int = 0


def _alpha_star(p, law) -> tuple[float | None, str]:
    n_tuples = law.V ** law.k if law.kind == "iid" else math.perm(law.V, law.k) if law.kind == "wor" else law.V
    if n_tuples * law.V <= LP_MAX_VARIABLES:
        try:
            from ..limits import lp_optimal_acceptance
        except ImportError:
            lp_optimal_acceptance = None
        if lp_optimal_acceptance is not None:
            return float(lp_optimal_acceptance(p, law)), "lp"
    try:
        from .. import optimal_acceptance  # type: ignore[attr-defined]
    except ImportError:
        return None, "-"
    return float(optimal_acceptance(p, law)), "dual"


def _monte_carlo(v, p, law, n: int, g: torch.Generator) -> tuple[float, float]:
    """Acceptance and its standard error from n batched draws of drafts + verdicts."""
    hits = 0
    done = 0
    chunk = max(1, min(n, 2_000_000 // max(1, law.V)))
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


def run(cases: dict[str, tuple[torch.Tensor, torch.Tensor]], s: Settings, *, show_progress: bool = True) -> list[dict]:
    """All rows, one per (case, law, K, verifier), plus one 'alpha*' row per (case, law, K)."""
    names = list(s.verifiers) if s.verifiers else V.names()
    for n in names:
        V.get(n)  # unknown name -> ValueError
    laws = D.parse_laws(s.laws, D.SHARED_Q_KINDS, "--laws")
    g = torch.Generator().manual_seed(s.seed)
    jobs = [(c, law, k) for c in cases for law in laws for k in s.ks]
    rows: list[dict] = []
    for case, law_name, k in progress(jobs, desc="compare", enabled=show_progress):
        p, q = cases[case]
        if law_name in ("wor", "greedy") and int((q > 0).sum()) < k:
            continue
        law = D.make(law_name, q, k)
        a_star, how = _alpha_star(p, law)
        rows.append(dict(case=case, V=law.V, draft_law=law_name, K=k, verifier="alpha*", acceptance=a_star,
                         stderr=0.0, method=how, certificate_error=None))
        n_tuples = law.V ** k
        for name in names:
            v = V.get(name)
            if not v.supports(law):
                continue
            if n_tuples <= EXACT_MAX_TUPLES and v.exact_output:
                cert = exact.certify(v, p, law)
                rows.append(dict(case=case, V=law.V, draft_law=law_name, K=k, verifier=name, acceptance=cert.acceptance,
                                 stderr=0.0, method="exact", certificate_error=cert.max_abs_error))
            else:
                a, se = _monte_carlo(v, p, law, s.samples, g)
                rows.append(dict(case=case, V=law.V, draft_law=law_name, K=k, verifier=name, acceptance=a,
                                 stderr=se, method=f"mc{s.samples}", certificate_error=None))
    return rows


def format_table(rows: Iterable[dict]) -> str:
    """One block per (case, law): verifiers as rows, K as columns, alpha* first."""
    rows = list(rows)
    out = []
    blocks: dict[tuple, list[dict]] = {}
    for r in rows:
        blocks.setdefault((r["case"], r["draft_law"]), []).append(r)
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
                if r["stderr"]:
                    txt += f"±{r['stderr']:.4f}"
                elif n == "alpha*":
                    txt += f" ({r['method']})"
                cells.append(f"{txt:>16}")
                if r["certificate_error"] is not None:
                    errs.append(r["certificate_error"])
            err = f"{max(errs):.1e}" if errs else ("-" if n != "alpha*" else "")
            out.append(f"  {n:<16}" + "".join(cells) + f"  {err:>16}")
        out.append("")
    return "\n".join(out)
