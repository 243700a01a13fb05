"""``multidraft experiment paper RUN_DIR``: the whole study behind the published report.

Collects positions along the target's own continuations of HumanEval, KJV and MT-bench
prompts (at least 1,000 per data set), evaluates alpha* and every verifier for the iid,
without-replacement, greedy and independent laws at K = 1, 2, 3, 4, 6, 8, sweeps target
and draft temperature, decodes 20 HumanEval prompts x 64 tokens per verifier at K = 1, 2, 4,
6 with equal tree budget, then writes RUN_DIR/report.md. Resumable: kill it at any time and
rerun the same command; finished rows are kept and never written twice. Each stage's time
goes to RUN_DIR/stages.jsonl and into the report.
"""
from __future__ import annotations

from ._args import check_common, close_mapper, eprint, mapper_kw, model_loader, model_names, name_list, progress_bar

# experiments.paper.STAGES, spelled here so that parsing imports no torch (a test pins them equal)
STAGES = ("collect", "acceptance", "temperature", "blocks")


def register(es) -> None:
    """Add the ``paper`` subcommand to the ``experiment`` subparsers ``es``."""
    p = es.add_parser("paper", help="the whole study (collect, acceptance, temperature, blocks) and its report",
                      description=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    p.add_argument("run_dir", metavar="RUN_DIR", help="results directory (created; rerun to resume)")
    p.add_argument("--target", metavar="PATH", help="target model directory (default: Qwen2.5-Coder-1.5B-Instruct)")
    p.add_argument("--draft", metavar="PATH", help="draft model directory (default: Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", default=",".join(STAGES), help=f"stages to run, in this order: {','.join(STAGES)} (default: all)")
    p.add_argument("--quick", action="store_true", help="a small smoke run of every stage (minutes), not the published sizes")
    p.add_argument("--ray", default=None, metavar="auto|ADDRESS",
                   help="evaluate the acceptance and temperature stages on a Ray cluster (same rows as one process)")
    p.add_argument("--no-report", action="store_true", help="do not write RUN_DIR/report.md at the end")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..experiments import paper, report

    stages = name_list(args.stages, "--stages")
    config = paper.QUICK if args.quick else paper.PAPER
    check_common(args)
    kw = mapper_kw(args)
    try:
        spent = paper.run(args.run_dir, models=model_loader(args), model_names=model_names(args), config=config,
                          stages=stages, seed=args.seed, log=eprint, progress=progress_bar(args), **kw)
    finally:
        close_mapper(kw)
    for stage, secs in spent.items():
        print(f"{stage:12s} {secs:9.1f} s")
    if not args.no_report:
        print(f"report: {report.build(args.run_dir)}")
    return 0

