"""``multidraft experiment paper RUN_DIR``: the whole study behind the published report.

Stages, in order, each resumable (kill the run at any time and rerun the same command: the
stores and JSONL files keep every finished row, nothing is recomputed or written twice):

1. ``collect``: for each dataset (HumanEval, KJV, MT-bench) prompts in a seeded random order
   are continued by the target alone at temperature 1 until the dataset has
   ``min_positions`` positions; both models' distributions along those continuations are
   stored at every temperature pair of stages 2-3, with the draft at the independent law's
   temperatures on the same support (:mod:`.collect`). The only model calls of 2-3.
2. ``acceptance``: alpha* and every verifier, per law (iid, wor, greedy, independent) and K,
   at target and draft temperature 1 (``acceptance.jsonl``).
3. ``temperature``: the same at a target-temperature and a draft-temperature sweep, for a
   few K and verifiers (``temperature.jsonl``).
4. ``blocks``: end-to-end block efficiency and tokens/s per verifier and K at equal tree
   budget (K sequences of length budget // K), over ``block_prompts`` HumanEval prompts,
   with the target-only baseline (``blocks.jsonl``).

Each invocation appends one row per stage it ran to ``stages.jsonl`` (seconds, rows
written, whether the stage finished, the load average), so the report states the time of
each stage; ``multidraft report RUN_DIR`` then builds the report from the JSONL alone.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from .._machine import load_average
from . import acceptance as _acceptance
from . import blocks as _blocks
from . import collect as _collect
from .records import JsonlWriter, lock_run_dir, read_jsonl, results_path
from .temperature import sweep_configs

__all__ = ["PaperConfig", "PAPER", "QUICK", "STAGES", "blocks_configs", "run"]

STAGES = ("collect", "acceptance", "temperature", "blocks")
# verifiers of Khisti et al.'s Table 1 plus the without-replacement and greedy families and ours
BLOCK_VERIFIERS = ("specinfer", "spectr", "khisti_is", "rrs_wor", "greedy_optimal", "optimal")


@dataclass(frozen=True)
class PaperConfig:
    """Every size of the study (``PAPER`` is the published one, ``QUICK`` a small smoke run)."""

    datasets: tuple = ("humaneval", "kjv", "mtbench")
    min_positions: int = 1000          # positions per dataset (continuations of 64 tokens)
    new_tokens: int = 64               # continuation length per prompt
    max_prompts: int = 80              # cap on prompts per dataset
    eps: float = 1e-4                  # stored tail mass (the proved lumping bound)
    ks: tuple = (1, 2, 3, 4, 6, 8)
    laws: tuple = ("iid", "wor", "greedy", "independent")
    independent_temperatures: tuple = (1.0, 0.7, 1.3, 0.5)  # draft k of the independent law at t_k
    verifiers: tuple | None = None     # None: every registered verifier but lp_optimal
    draws: int = 32                    # draft tuples per position (Rao-Blackwellised)
    sweep_target_temperatures: tuple = (0.5, 0.8, 1.0, 1.3)
    sweep_draft_temperatures: tuple = (0.5, 0.8, 1.3)
    sweep_ks: tuple = (2, 4)
    sweep_laws: tuple = ("iid", "wor")
    # `optimal` joined the sweep once its fit was done once per position (Verifier.prepare)
    # instead of once per chunk of draws: the iid K = 2 cell of 1,007 HumanEval positions went
    # from 245 s of 300 to seconds
    sweep_verifiers: tuple = ("specinfer", "spectr", "khisti_is", "rrs_wor", "optimal")
    block_prompts: int = 20
    block_new_tokens: int = 64
    block_ks: tuple = (1, 2, 4, 6)
    block_budget: int = 12             # draft nodes per step: K sequences of length 12 // K
    block_verifiers: tuple = BLOCK_VERIFIERS
    block_temperature: float = 1.0
    block_dataset: str = "humaneval"

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


PAPER = PaperConfig()
QUICK = replace(PAPER, min_positions=64, new_tokens=16, max_prompts=8, ks=(1, 2, 4), draws=8,
                sweep_target_temperatures=(0.5, 1.0), sweep_draft_temperatures=(0.5,), sweep_ks=(2,),
                block_prompts=2, block_new_tokens=8, block_ks=(1, 2), block_budget=4,
                block_verifiers=("specinfer", "optimal"))


def blocks_configs(c: PaperConfig) -> list[_blocks.BlocksConfig]:
    """The blocks stage's configs (validated once, when made), run in this order into one
    ``blocks.jsonl``: K = 1 is single-draft SD for every verifier of the list, so it runs once,
    as ``naive``; then ``block_verifiers`` at the K > 1 of ``block_ks``. Equal tree budget
    (``sequences`` trees of length budget // K), the target-only baseline, ``block_dataset``."""
    multi = tuple(k for k in c.block_ks if k > 1)
    out = []
    for names, ks in ((("naive",), (1,) if 1 in c.block_ks else ()), (tuple(c.block_verifiers), multi)):
        if ks:
            out.append(_blocks.BlocksConfig(verifiers=names, laws=None, ks=ks, budget=c.block_budget,
                                            n_prompts=c.block_prompts, max_new_tokens=c.block_new_tokens,
                                            temperature=c.block_temperature, dataset=c.block_dataset))
    return out


def run(
    run_dir: str | Path,
    *,
    models: Callable[[], tuple],
    model_names: dict,
    config: PaperConfig = PAPER,
    stages: Sequence[str] = STAGES,
    seed: int = 0,
    mapper=None,
    log: Callable[[str], None] = lambda _m: None,
    progress=None,
) -> dict[str, float]:
    """Run (or resume) the study's ``stages`` into ``run_dir``; returns seconds per stage run.

    ``models()`` is called once, and only when a stage has model work left."""
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise ValueError(f"stages: unknown {bad}; the stages are {list(STAGES)}")
    c = config
    run_dir = Path(run_dir)
    loaded: list = []

    def models_once():
        if not loaded:
            loaded.append(models())
        return loaded[0]

    temps_sweep = sweep_configs(c.sweep_draft_temperatures, c.sweep_target_temperatures)
    collect_kw = dict(positions_from="continuation", new_tokens=c.new_tokens, sample_temperature=1.0,
                      independent_temperatures=list(c.independent_temperatures), min_positions=c.min_positions)
    common = dict(models=models_once, model_names=model_names, datasets=list(c.datasets), eps=c.eps,
                  n_texts=c.max_prompts, positions_per_text=None, seed=seed, log=log, progress=progress)
    run_kw = dict(models=models_once, model_names=model_names, seed=seed, log=log, progress=progress,
                  **({"mapper": mapper} if mapper else {}))
    # the two evaluation stages' configs, validated once here, before any stage runs
    fields = dict(datasets=tuple(c.datasets), eps=c.eps, n_texts=c.max_prompts, positions_per_text=None,
                  draws=c.draws, collect_kw=collect_kw)
    acceptance_cfg = _acceptance.AcceptanceConfig(temperatures=((1.0, 1.0),), ks=c.ks, laws=c.laws,
                                                  verifiers=tuple(c.verifiers) if c.verifiers else None, **fields)
    temperature_cfg = _acceptance.AcceptanceConfig(temperatures=tuple(temps_sweep), ks=c.sweep_ks, laws=c.sweep_laws,
                                                   verifiers=tuple(c.sweep_verifiers), file="temperature.jsonl",
                                                   experiment="temperature", **fields)
    blocks_cfgs = blocks_configs(c)
    all_temps = [(1.0, 1.0)] + [t for t in temps_sweep if t != (1.0, 1.0)]
    k_max = max(max(c.ks), max(c.sweep_ks))
    stage_file = run_dir / "stages.jsonl"

    def _store_paths():
        return [run_dir / "positions" / _collect.store_name(ds, tt, td, None, None) for ds in c.datasets for tt, td in all_temps]

    def run_stage(stage: str) -> int:
        """Run one stage; the number of stores (collect) or rows it wrote."""
        if stage == "collect":
            before = sum(p.exists() for p in _store_paths())
            return len(_collect.collect(run_dir, configs=all_temps, k_max=k_max, **common, **collect_kw)) - before
        if stage == "acceptance":
            return _acceptance.run_experiment(run_dir, config=acceptance_cfg, **run_kw).written
        if stage == "temperature":
            return _acceptance.run_experiment(run_dir, config=temperature_cfg, **run_kw).written
        before = _count(run_dir / "blocks.jsonl")
        for bcfg in blocks_cfgs:
            _blocks.run(run_dir, bcfg, models=models_once, model_names=model_names, seed=seed, log=log,
                        progress=progress)
        return _count(run_dir / "blocks.jsonl") - before

    with lock_run_dir(run_dir):  # one process per run directory, every stage
        spent: dict[str, float] = {}
        for stage in STAGES:
            if stage not in stages:
                continue
            log(f"== stage {stage} ==")
            t0 = time.perf_counter()
            try:
                written = run_stage(stage)
            except BaseException:  # interrupted or failed: the time spent is recorded all the same
                _record(stage_file, c, seed, stage, time.perf_counter() - t0, None, complete=False)
                raise
            spent[stage] = time.perf_counter() - t0
            _record(stage_file, c, seed, stage, spent[stage], written, complete=True)
            log(f"== stage {stage}: {spent[stage]:.0f} s, {written} new ==")
    return spent


def _record(path: Path, c: PaperConfig, seed: int, stage: str, seconds: float, written, *, complete: bool) -> None:
    # the sizes travel with each row: a run may be extended (e.g. one data set first, all later)
    with JsonlWriter(path, {"experiment": "paper"}, seed) as w:
        w.write(stage=stage, seconds=seconds, rows_written=written, complete=complete, load_average=load_average() or [],
                config=c.as_dict())


def _count(path: Path) -> int:
    return len(read_jsonl(path)[1]) if results_path(path).exists() else 0
