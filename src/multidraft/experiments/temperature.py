"""Temperature experiment: the acceptance experiment over temperature sweeps.

Two sweeps share the collector's single forward pass per text: draft temperatures at a
fixed target temperature, and target temperatures at a fixed draft temperature. Rows go to
``RUN_DIR/temperature.jsonl`` with the acceptance experiment's keys (so the temperatures
are part of every row), for a few K. The file is bound to the run's config like
``acceptance.jsonl`` (:mod:`.records`); adding temperatures, Ks, laws or verifiers extends it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

__all__ = ["sweep_configs", "run_experiment"]


def sweep_configs(
    draft_temperatures: Sequence[float],
    target_temperatures: Sequence[float],
    *,
    fixed_target: float = 1.0,
    fixed_draft: float = 1.0,
) -> list[tuple[float, float]]:
    """(t_target, t_draft) pairs of both sweeps, without duplicates, in sweep order."""
    if not draft_temperatures and not target_temperatures:
        raise ValueError("temperature sweep is empty: give draft and/or target temperatures")
    out: list[tuple[float, float]] = []
    for td in draft_temperatures:
        c = (float(fixed_target), float(td))
        if c not in out:
            out.append(c)
    for tt in target_temperatures:
        c = (float(tt), float(fixed_draft))
        if c not in out:
            out.append(c)
    return out


def run_experiment(
    run_dir: str | Path,
    *,
    draft_temperatures: Sequence[float],
    target_temperatures: Sequence[float],
    fixed_target: float = 1.0,
    fixed_draft: float = 1.0,
    ks: Sequence[int] = (2, 4, 8),
    **kw,
):
    """Both sweeps into ``RUN_DIR/temperature.jsonl``; the other keywords are those of
    :func:`multidraft.experiments.acceptance.run_experiment`. Returns its ``ExperimentResult``."""
    from .acceptance import run_experiment as _run

    temps = sweep_configs(draft_temperatures, target_temperatures, fixed_target=fixed_target, fixed_draft=fixed_draft)
    return _run(run_dir, temperatures=temps, ks=ks, file="temperature.jsonl", experiment="temperature", **kw)
