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

__all__ = ["sweep_configs", "sweep_config", "run_experiment"]


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


def sweep_config(
    *,
    draft_temperatures: Sequence[float],
    target_temperatures: Sequence[float],
    fixed_target: float = 1.0,
    fixed_draft: float = 1.0,
    ks: Sequence[int] = (2, 4, 8),
    **fields,
):
    """The temperature experiment's config: an ``acceptance.AcceptanceConfig`` over both sweeps,
    written to ``temperature.jsonl``, validated once (each sweep value under its own name:
    ``draft_temperatures``, ``target_temperatures``, ``fixed_target``, ``fixed_draft``).
    ``fields``: the other fields of ``AcceptanceConfig`` (datasets, laws, verifiers, ...)."""
    from .._validate import ArgumentError, as_temperature
    from .acceptance import AcceptanceConfig

    def draft_t(t, name):  # the drafts are sampled: > 0
        t = as_temperature(t, name)
        if not t > 0:
            raise ArgumentError(name, f"must be > 0 (the drafts are sampled), got {t}")
        return t

    dts = [draft_t(t, "draft_temperatures") for t in draft_temperatures]
    tts = [as_temperature(t, "target_temperatures") for t in target_temperatures]
    temps = sweep_configs(dts, tts, fixed_target=as_temperature(fixed_target, "fixed_target"),
                          fixed_draft=draft_t(fixed_draft, "fixed_draft"))
    return AcceptanceConfig(temperatures=tuple(temps), ks=tuple(ks), file="temperature.jsonl",
                            experiment="temperature", **fields)


def run_experiment(
    run_dir: str | Path,
    config=None,
    *,
    draft_temperatures: Sequence[float] = (),
    target_temperatures: Sequence[float] = (),
    fixed_target: float = 1.0,
    fixed_draft: float = 1.0,
    ks: Sequence[int] = (2, 4, 8),
    models,
    model_names: dict,
    seed: int = 0,
    mapper=None,
    log=None,
    progress=None,
    **fields,
):
    """Both sweeps into ``RUN_DIR/temperature.jsonl``: ``config`` from :func:`sweep_config`, or
    made here from the sweep keywords and ``fields`` (those of ``AcceptanceConfig``). Returns
    :func:`multidraft.experiments.acceptance.run_experiment`'s ``ExperimentResult``."""
    from .acceptance import run_experiment as _run

    if config is None:
        config = sweep_config(draft_temperatures=draft_temperatures, target_temperatures=target_temperatures,
                              fixed_target=fixed_target, fixed_draft=fixed_draft, ks=ks, **fields)
    run_kw = {k: v for k, v in dict(mapper=mapper, log=log, progress=progress).items() if v is not None}
    return _run(run_dir, config=config, models=models, model_names=model_names, seed=seed, **run_kw)
