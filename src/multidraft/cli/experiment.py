"""``multidraft experiment acceptance|temperature|blocks RUN_DIR``: experiments on real models.

``acceptance`` and ``temperature`` collect (target, draft) next-token distributions once
into ``RUN_DIR/positions/`` (the only step that runs the models) and evaluate alpha* and
every verifier on them; ``blocks`` decodes end to end. All write JSONL rows to RUN_DIR,
skip what is already there, and can be interrupted and rerun. A run directory is bound to
its settings: rerunning with other settings is refused (naming them, with both values),
except for adding values of --k, --laws, --verifiers, --datasets or temperatures, which
extends the run (a larger K collects the position stores again, for the wider draft support
it needs; the rows already written are kept). One process at a time runs in a run directory.
"""
from __future__ import annotations

import sys

from ..datasets import DATASETS
from ..experiments.collect import POSITIONS_FROM
from . import UserError
from ._args import close_mapper as _close
from ._args import eprint as _log
from ._args import check_common, float_list, int_list, k_list, name_list
from ._args import mapper_kw as _mapper_kw
from ._args import model_loader as _models
from ._args import model_names as _model_names
from ._args import progress_bar as _progress

ENGINES = ("transformers", "llama.cpp")  # decoding.pair.ENGINES, spelled here so --help imports no torch


def _common(p, *, positions: bool = True) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="results directory (created; rerun to resume)")
    p.add_argument("--target", metavar="PATH", help="target model directory or .gguf (default: Qwen2.5-Coder-1.5B-Instruct)")
    p.add_argument("--draft", metavar="PATH", help="draft model directory or .gguf (default: Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--engine", choices=ENGINES, default="transformers",
                   help="run the models on transformers (default) or llama.cpp (the GGUF files; needs the llama extra); "
                        "collection on llama.cpp takes positions from continuations only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verifiers", default=None, help="comma-separated verifier names (default: all registered but lp_optimal)")
    p.add_argument("--laws", default="iid,wor,greedy", help="draft laws, comma-separated (default iid,wor,greedy)")
    p.add_argument("--top-k", type=int, default=None, help="top-k filter applied to both models")
    p.add_argument("--top-p", type=float, default=None, help="top-p filter applied to both models")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    if positions:
        p.add_argument("--datasets", default="humaneval,kjv", help=f"{', '.join(DATASETS)} and/or file:PATH, comma-separated (default humaneval,kjv)")
        p.add_argument("--positions-from", choices=POSITIONS_FROM, default="continuation",
                       help="continuation: positions along the target's own sampled continuation of each prompt (what a "
                            "decoder sees; default); teacher-forcing: positions of a reference text")
        p.add_argument("--texts", type=int, default=4, help="prompts or texts per dataset (default 4; a cap with --min-positions)")
        p.add_argument("--positions-per-text", type=int, default=None,
                       help="sampled positions per text (default: every continuation position; 8 with teacher forcing)")
        p.add_argument("--new-tokens", type=int, default=64, help="continuation length per prompt (default 64)")
        p.add_argument("--sample-temperature", type=float, default=1.0,
                       help="target temperature the continuations are sampled at (default 1)")
        p.add_argument("--min-positions", type=int, default=None,
                       help="continue prompts (seeded random order, at most --texts) until a dataset has this many positions")
        p.add_argument("--independent-temperatures", default=None, metavar="T1,T2,...",
                       help="also store the draft at these temperatures: the independent law's K <= J drafts use t_1..t_K "
                            "(needed by --laws independent)")
        p.add_argument("--max-tokens", type=int, default=256, help="tokens per text, teacher-forced (default 256)")
        p.add_argument("--eps", type=float, default=1e-4, help="tail mass left out of the stored support (default 1e-4)")
        p.add_argument("--draws", type=int, default=200, help="draft tuples per position for Monte Carlo (default 200)")
        p.add_argument("--eval-support", type=int, default=None, metavar="N",
                       help="evaluate on at most N tokens per model and position (coarser lumping: a hidden truncation, "
                            "flagged in every row and as a WARNING line in the report; default: none)")
        p.add_argument("--ray", default=None, metavar="auto|ADDRESS",
                       help="evaluate on a Ray cluster: each cell's 64-position shards run as Ray tasks, with the same "
                            "rows as a single-process run (same seeds). 'auto' connects to a running cluster (RAY_ADDRESS "
                            "or the latest on this machine) or starts a local one; ADDRESS is HOST:PORT or ray://HOST:PORT. "
                            "Collection still runs here. Needs: pip install 'multidraft[ray]' (default: one process)")


def register(sub) -> None:
    ap = sub.add_parser("experiment", help="acceptance / temperature / block-efficiency experiments on real models",
                        description=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    es = ap.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    ap.set_defaults(func=lambda args: (ap.print_help(sys.stderr), 2)[1])

    a = es.add_parser("acceptance", help="alpha* and each verifier's acceptance vs K per draft law")
    _common(a)
    a.add_argument("--k", default="1-8", help="numbers of drafts, e.g. 1-8 or 2,4 (default 1-8)")
    a.add_argument("--target-temperature", type=float, default=1.0)
    a.add_argument("--draft-temperature", type=float, default=1.0)
    a.set_defaults(func=run_acceptance)

    t = es.add_parser("temperature", help="the acceptance experiment over draft and target temperature sweeps")
    _common(t)
    t.add_argument("--k", default="2,4,8", help="numbers of drafts (default 2,4,8)")
    t.add_argument("--draft-temperatures", default="0.4,0.7,1.0,1.3,1.6")
    t.add_argument("--target-temperatures", default="0,0.4,0.7,1.0,1.3")
    t.add_argument("--fixed-target-temperature", type=float, default=1.0, help="target T during the draft sweep")
    t.add_argument("--fixed-draft-temperature", type=float, default=1.0, help="draft T during the target sweep")
    t.set_defaults(func=run_temperature)

    b = es.add_parser("blocks", help="end-to-end block efficiency and tokens/s vs K and depth per verifier")
    _common(b, positions=False)
    b.add_argument("--k", default="1,2,4", help="numbers of drafts (default 1,2,4)")
    b.add_argument("--depths", default=None, help="draft depths (default 1,3)")
    b.add_argument("--budget", type=int, default=None, metavar="B",
                   help="equal tree budget instead of --depths: K draft sequences of length B // K (SpecTr's and "
                        "Khisti et al.'s trees, as the paper study's blocks stage)")
    b.add_argument("--prompts", type=int, default=2, help="HumanEval prompts (default 2)")
    b.add_argument("--max-new-tokens", type=int, default=32)
    b.add_argument("--max-prompt-tokens", type=int, default=None, help="keep only the last N prompt tokens")
    b.add_argument("--temperature", type=float, default=1.0)
    b.add_argument("--draft-temperature", type=float, default=None, help="default: --temperature")
    b.add_argument("--no-baseline", action="store_true", help="skip the target-only autoregressive baseline")
    b.set_defaults(func=run_blocks)

    from .paper import register as register_paper

    register_paper(es)


def _collect_kw(args) -> dict:
    """The collector's position options (bound into the results' config); teacher forcing
    without independent temperatures gives {} (the config of runs made before these options)."""
    kw: dict = {}
    if args.positions_from == "continuation":
        kw.update(positions_from="continuation", new_tokens=args.new_tokens, sample_temperature=args.sample_temperature)
        if args.min_positions is not None:
            kw["min_positions"] = args.min_positions
    elif args.min_positions is not None:
        raise UserError("--min-positions needs --positions-from continuation")
    if getattr(args, "engine", "transformers") == "llama.cpp" and args.positions_from != "continuation":
        raise UserError("--engine llama.cpp collects --positions-from continuation only")
    if args.independent_temperatures:
        kw["independent_temperatures"] = float_list(args.independent_temperatures, "independent_temperatures")
    return kw


def _config_fields(args) -> dict:
    """The fields of ``acceptance.AcceptanceConfig`` from the flags: parsed here, validated once
    by the config (an ``ArgumentError`` there names the field; ``cli.ARG_FLAGS`` gives its flag)."""
    laws = name_list(args.laws, "laws")
    if "independent" in laws and not args.independent_temperatures:
        raise UserError("--laws independent needs --independent-temperatures (one draft temperature per draft, e.g. 1,0.7,1.3,0.5)")
    ppt = args.positions_per_text
    if ppt is None and args.positions_from == "teacher-forcing":
        ppt = 8
    return dict(
        datasets=tuple(name_list(args.datasets, "datasets")), ks=tuple(k_list(args.k)), laws=tuple(laws),
        verifiers=tuple(name_list(args.verifiers, "verifiers")) if args.verifiers else None,
        draws=args.draws, eval_support=args.eval_support, top_k=args.top_k, top_p=args.top_p, n_texts=args.texts,
        positions_per_text=ppt, max_tokens=args.max_tokens, eps=args.eps, collect_kw=_collect_kw(args) or None,
    )


def _run_kw(args) -> dict:
    """What a run needs besides its config: the models (loaded on demand), seed, log, progress, mapper.
    The shared flags are checked first (``check_common``)."""
    check_common(args)
    return dict(models=_models(args), model_names=_model_names(args), seed=args.seed, log=_log,
                progress=_progress(args), **_mapper_kw(args))


def _print(rows, path, kind: str, run_dir) -> None:
    from ..experiments.report import summary

    print(summary(rows, kind))
    print(f"results: {path}  (make the report with: multidraft report {run_dir})")


def run_acceptance(args) -> int:
    from ..experiments.acceptance import AcceptanceConfig, run_experiment

    config = AcceptanceConfig(temperatures=((args.target_temperature, args.draft_temperature),), **_config_fields(args))
    return _run_config(run_experiment, config, args, "acceptance")


def run_temperature(args) -> int:
    from ..experiments.temperature import run_experiment, sweep_config

    config = sweep_config(
        draft_temperatures=float_list(args.draft_temperatures, "draft_temperatures"),
        target_temperatures=float_list(args.target_temperatures, "target_temperatures"),
        fixed_target=args.fixed_target_temperature, fixed_draft=args.fixed_draft_temperature, **_config_fields(args),
    )
    return _run_config(run_experiment, config, args, "temperature")


def _run_config(run_experiment, config, args, kind: str) -> int:
    """Run an acceptance-type experiment on its config (the models, seed, log, progress and mapper
    from the flags), close the mapper, print where the rows went."""
    kw = _run_kw(args)
    try:
        res = run_experiment(args.run_dir, config=config, **kw)
    finally:
        _close(kw)
    _print(res.rows, res.path, kind, args.run_dir)
    return 0


def run_blocks(args) -> int:
    from ..experiments.blocks import BlocksConfig, run
    from ..experiments.records import read_jsonl

    # parsed here, validated once by the config (an ArgumentError there names the field; cli.ARG_FLAGS its flag)
    config = BlocksConfig(
        verifiers=tuple(name_list(args.verifiers, "verifiers")) if args.verifiers else None,
        laws=tuple(name_list(args.laws, "laws")), ks=tuple(k_list(args.k)),
        depths=tuple(int_list(args.depths, "depths", lo=1)) if args.depths is not None else None,
        budget=args.budget, n_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature,
        draft_temperature=args.draft_temperature, top_k=args.top_k, top_p=args.top_p, baseline=not args.no_baseline,
        engine=args.engine,
    )
    check_common(args)
    path = run(args.run_dir, config, models=_models(args), model_names=_model_names(args), seed=args.seed, log=_log,
               progress=_progress(args))
    _print(read_jsonl(path)[1], path, "blocks", args.run_dir)
    return 0
