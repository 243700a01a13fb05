"""``multidraft experiment acceptance|temperature|blocks RUN_DIR`` (and ``realtrees``, ``seqrules``): experiments.

``acceptance`` and ``temperature`` collect (target, draft) next-token distributions once
into ``RUN_DIR/positions/`` (the only step that runs the models) and evaluate alpha* and
every verifier on them; ``blocks`` decodes end to end. All write JSONL rows to RUN_DIR,
skip what is already there, and can be interrupted and rerun. A run directory is bound to
its settings: rerunning with other settings is refused (naming them, with both values),
except for adding values of --k, --laws, --verifiers, --datasets or temperatures, which
extends the run (a larger K collects the position stores again, for the wider draft support
it needs; the rows already written are kept). One process at a time runs in a run directory.

Two studies of the tree rules (issue 26) run here too, results where the user says:
``realtrees run --out FILE`` (every tree rule on the decoder's own trees, ``experiments.realtrees``;
``realtrees report FILE...`` the tables) and ``seqrules RUN_DIR`` (every tree rule against the
tree-level ceiling on random small instances, ``experiments.seqrules``; ``--report`` the table).
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import UserError
from ._args import close_mapper as _close
from ._args import eprint as _log
from ._args import check_common, float_list, int_list, k_list, name_list
from ._args import mapper_kw as _mapper_kw
from ._args import model_loader as _models
from ._args import model_names as _model_names
from ._args import progress_bar as _progress

ENGINES = ("transformers", "llama.cpp")  # decoding.pair.ENGINES, spelled here so --help imports no torch
# datasets.DATASETS and experiments.collect.POSITIONS_FROM, spelled here for the same reason (a test pins them equal)
DATASETS = ("humaneval", "kjv", "mtbench", "codeedit", "mtbench2", "aclsum")
POSITIONS_FROM = ("continuation", "teacher-forcing")


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
        p.add_argument("--new-tokens", type=int, default=None, help="continuation length per prompt (default 64)")
        p.add_argument("--sample-temperature", type=float, default=None,
                       help="target temperature the continuations are sampled at (default 1)")
        p.add_argument("--min-positions", type=int, default=None,
                       help="continue prompts (seeded random order, at most --texts) until a dataset has this many positions")
        p.add_argument("--independent-temperatures", default=None, metavar="T1,T2,...",
                       help="also store the draft at these temperatures: the independent law's K <= J drafts use t_1..t_K "
                            "(needed by --laws independent)")
        p.add_argument("--max-tokens", type=int, default=None, help="tokens per text, teacher-forced (default 256)")
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

    _register_realtrees(es)
    _register_seqrules(es)

    from .paper import register as register_paper

    register_paper(es)


# the real-tree study (experiments.realtrees) ---------------------------------------------------
_SHAPES = ("chain", "seq2", "seq4", "kary2")   # realtrees.SHAPES, spelled here so --help imports no torch
_BUDGETS = (4, 8, 12)                         # realtrees.BUDGETS


def _register_realtrees(es) -> None:
    rt = es.add_parser("realtrees", help="every tree rule's exact tokens per call on the decoder's own draft trees "
                                         "(run: build and score them, report: tables from the JSONL)",
                       description="Every tree rule's exact tokens per call on the decoder's own draft trees, built "
                                   "along the target's continuations (experiments.realtrees): run writes JSONL rows "
                                   "to --out (resumable), report makes the tables from JSONL files alone.")
    sub = rt.add_subparsers(dest="realtrees", metavar="STEP")
    rt.set_defaults(func=lambda args: (rt.print_help(sys.stderr), 2)[1])
    r = sub.add_parser("run", help="build the decoder's trees along target continuations and write JSONL rows")
    r.add_argument("--dataset", required=True, help="humaneval, mtbench, kjv or file:PATH")
    r.add_argument("-n", type=int, default=8, help="prompts (default 8)")
    r.add_argument("--prompt-seed", type=int, default=None, help="sample the prompts with this seed (default: the first n)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--cont-tokens", type=int, default=128, help="target continuation length (T = 1; default 128)")
    r.add_argument("--stride", type=int, default=8, help="positions every this many tokens of the continuation (default 8)")
    r.add_argument("--shapes", default=",".join(_SHAPES), help=f"tree shapes (default {','.join(_SHAPES)})")
    r.add_argument("--budgets", default=",".join(map(str, _BUDGETS)),
                   help=f"node budgets, drafted nodes (default {','.join(map(str, _BUDGETS))})")
    r.add_argument("--max-trees", type=int, default=None, help="stop after this many trees built (new or filled)")
    r.add_argument("--minutes", type=float, default=None, help="stop after this many minutes (resumable)")
    r.add_argument("--threads", type=int, default=1, help="torch threads (default 1: fastest on a shared machine)")
    r.add_argument("--out", required=True, metavar="FILE", help="JSONL file (created, or resumed)")
    r.add_argument("--no-fill", action="store_true",
                   help="do not rebuild trees written before some of today's rules existed (tree_fill rows)")
    r.set_defaults(func=run_realtrees)
    rp = sub.add_parser("report", help="markdown tables from JSONL files only")
    rp.add_argument("files", nargs="+", metavar="FILE", help="JSONL files of `realtrees run`")
    rp.add_argument("--markdown", metavar="FILE", default=None, help="also write the tables here")
    rp.set_defaults(func=run_realtrees_report)


def _check_realtrees(args) -> tuple[list[str], list[int]]:
    """Every flag of ``realtrees run`` checked before any model loads: ``(shapes, budgets)``."""
    from ..datasets import check_dataset
    from ._args import check_out_dir

    try:
        check_dataset(args.dataset)
    except ValueError as exc:
        raise ValueError(f"--dataset: {exc}") from None
    if args.dataset.startswith("file:") and not Path(args.dataset[5:]).expanduser().is_file():
        raise ValueError(f"--dataset: {args.dataset}: no such file")
    for flag, val in (("-n", args.n), ("--cont-tokens", args.cont_tokens), ("--stride", args.stride),
                      ("--threads", args.threads), ("--max-trees", args.max_trees)):
        if val is not None and val < 1:
            raise ValueError(f"{flag} must be >= 1, got {val}")
    if args.minutes is not None and not args.minutes > 0:
        raise ValueError(f"--minutes must be a positive number of minutes, got {args.minutes}")
    shapes = name_list(args.shapes, "shapes")
    bad = [x for x in shapes if x not in _SHAPES]
    if bad:
        raise ValueError(f"--shapes: unknown shape {bad[0]!r}; choose from {', '.join(_SHAPES)}")
    budgets = [int(b) for b in int_list(args.budgets, "budgets", lo=1)]
    from .._errors import ArgumentError
    from ..experiments.realtrees import shape_settings

    for sh in shapes:
        for b in budgets:
            try:
                shape_settings(sh, b)
            except ValueError as exc:
                raise ValueError(ArgumentError.of("budget", exc).restated("--budgets")) from None
    out = Path(args.out).expanduser()
    if out.is_dir():
        raise ValueError(f"--out: {out} is a directory; give a file name")
    check_out_dir(out.parent, "--out")  # created with its parents when missing, as the results file's writer does
    check_common(args)  # --seed
    return shapes, budgets


def run_realtrees(args) -> int:
    import time

    shapes, budgets = _check_realtrees(args)
    from .. import models
    from ._args import load_models
    from ..experiments.realtrees import run

    target, draft, tok = load_models("transformers", n_threads=args.threads)
    names = {"target": getattr(models.DEFAULT_TARGET, "name", None), "draft": getattr(models.DEFAULT_DRAFT, "name", None),
             "dtype": str(next(target.parameters()).dtype), "engine": "transformers"}
    print(f"seed {args.seed}; continuations sampled at T = 1 from the target", file=sys.stderr)
    deadline = time.time() + 60 * args.minutes if args.minutes else None
    got = run(target, draft, tok, dataset=args.dataset, n=args.n, out=args.out, seed=args.seed,
              prompt_seed=args.prompt_seed, cont_tokens=args.cont_tokens, stride=args.stride, shapes=shapes,
              budgets=budgets, max_trees=args.max_trees, deadline=deadline,
              log=lambda s: print(s, file=sys.stderr, flush=True), model_names=names, fill=not args.no_fill)
    print(f"{got['trees']} new trees and {got['filled']} filled in {got['seconds']:.0f} s: {got['trees_per_min']:.1f} trees/min "
          f"({got['stopped']}); filled trees' written values recomputed within {got['recheck_max']:.3g}")
    c = got["cpu_seconds"]
    print(f"CPU seconds: trees {c['trees']:.1f} ({60 * (got['trees'] + got['filled']) / max(c['trees'], 1e-9):.1f} trees per "
          f"CPU-minute, positions' chunks included), prompt prefills {c['prefill']:.1f}, continuations {c['continuations']:.1f} "
          f"({got['continuation_tokens']} tokens); model calls " + ", ".join(f"{k} {v}" for k, v in got["model_calls"].items()))
    return 0


def run_realtrees_report(args) -> int:
    from ._args import check_out_file

    for f in args.files:
        if not Path(f).expanduser().is_file():
            raise ValueError(f"{f}: no such file")
    md = check_out_file(args.markdown, "--markdown")
    from ..experiments.realtrees import report

    text = report(args.files)
    if md is not None:
        from ..experiments.records import write_file

        write_file(md, text, "write the --markdown file")
    print(text)
    return 0


# sequence-level rules against the tree-level ceiling (experiments.seqrules) ------------------------
_LAWS = ("sequences", "kary", "chain")  # seqrules.LAWS


def _register_seqrules(es) -> None:
    q = es.add_parser("seqrules", help="every tree rule against the tree-level ceiling on random small instances",
                      description="Every tree rule against the tree-level ceiling on random small instances "
                                  "(experiments.seqrules): one JSONL per cell in RUN_DIR (only missing rows are "
                                  "computed), the table from the files alone with --report.")
    q.add_argument("run_dir", metavar="RUN_DIR", help="the cell files' directory (created; rerun to add missing rows)")
    q.add_argument("--grid", action="store_true", help="run every cell of seqrules.GRID (only the missing rows)")
    q.add_argument("--report", action="store_true", help="write the markdown table from the cell files only")
    q.add_argument("--root", action="store_true", help="item 5: trees.root_tradeoff on seqrules.ROOT_CELLS")
    q.add_argument("--law", choices=_LAWS, help="one cell: its tree draft law (with --k, --depth, --vocab)")
    q.add_argument("--k", type=int, default=None, help="one cell: drafts per node (default 2)")
    q.add_argument("--depth", type=int, default=None, help="one cell: depth (default 2)")
    q.add_argument("--vocab", type=int, default=None, help="one cell: vocabulary size (default 3)")
    q.add_argument("-n", type=int, default=500, help="instances per cell (default 500)")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--rules", nargs="*", help="sequence-level rules (default: every registered one and the variants "
                                              "of trees.rule_table.VARIANTS)")
    q.add_argument("--markdown", metavar="FILE", default=None, help="report file (default RUN_DIR/table.md)")
    q.set_defaults(func=run_seqrules)


def _check_seqrules(args) -> tuple[list, list, Path | None]:
    """Every flag of ``seqrules`` checked before any file is written: ``(cells, rules, markdown)``."""
    from .._errors import ArgumentError
    from ._args import check_out_file

    if not (args.grid or args.report or args.law or args.root):
        raise ValueError("give --grid, --report, --root, or one cell (--law ...)")
    given = [f for f, v in (("--k", args.k), ("--depth", args.depth), ("--vocab", args.vocab)) if v is not None]
    if given and args.law is None:
        raise ValueError(f"{given[0]} describes one cell: give --law too")
    k, depth, vocab = (2 if args.k is None else args.k, 2 if args.depth is None else args.depth,
                       3 if args.vocab is None else args.vocab)
    for flag, val, lo in (("-n", args.n, 1), ("--k", k, 1), ("--depth", depth, 1), ("--vocab", vocab, 2)):
        if val < lo:
            raise ValueError(f"{flag} must be >= {lo}, got {val}")
    check_common(args)  # --seed, RUN_DIR
    md = check_out_file(args.markdown, "--markdown")
    from ..experiments import seqrules
    from ..trees import rule_table

    cells = list(seqrules.GRID) if args.grid else ([(args.law, k, depth, vocab)] if args.law else [])
    rules = args.rules if args.rules is not None else rule_table.sequence_rules() + list(rule_table.VARIANTS)
    for law, ck, cd, _ in cells + (list(seqrules.ROOT_CELLS) if args.root else []):
        try:
            tl = seqrules.make_law(law, ck, cd)
        except ValueError as exc:
            raise ArgumentError.of("k", exc) from None
        try:
            rule_table.rule_names(tl, rules=rules)
        except ValueError as exc:  # an unknown rule
            raise ArgumentError.of("rules", exc) from None
    if args.report and not (cells or args.root) and not Path(args.run_dir).expanduser().is_dir():
        raise ValueError(f"RUN_DIR: {args.run_dir} does not exist (no cell files to report)")
    return cells, rules, md


def run_seqrules(args) -> int:
    import time

    cells, rules, md = _check_seqrules(args)
    from ..experiments import seqrules

    t0 = time.perf_counter()
    for law, k, depth, V in cells:
        got = seqrules.run_cell(law, k, depth, V, n=args.n, seed=args.seed, out_dir=args.run_dir, rules=rules)
        print(f"{seqrules.cell_name(law, k, depth, V)}: {got['ceilings']} ceilings and {got['rules']} rule rows added in "
              f"{got['seconds']:.1f} s", file=sys.stderr)
    if cells:
        print(f"all cells: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.root:
        t1 = time.perf_counter()
        for law, k, depth, V in seqrules.ROOT_CELLS:
            seqrules.run_root(law, k, depth, V, n=seqrules.ROOT_N, seed=args.seed, out_dir=args.run_dir)
        print(f"root trade-off: {time.perf_counter() - t1:.1f} s", file=sys.stderr)
    if args.report:
        paths = sorted([*Path(args.run_dir).glob("*.jsonl"), *Path(args.run_dir).glob("*.jsonl.gz")])  # committed cells are .gz
        table = seqrules.report(paths)
        dest = md if md is not None else Path(args.run_dir) / "table.md"
        from ..experiments.records import write_file

        write_file(dest, table, "write the table")
        print(f"wrote {dest} ({len(paths)} cells)", file=sys.stderr)
    return 0


_COLLECT_DEFAULTS = dict(new_tokens=64, sample_temperature=1.0, max_tokens=256)  # flags of one --positions-from only


def _collect_kw(args) -> dict:
    """The collector's position options (bound into the results' config); teacher forcing
    without independent temperatures gives {} (the config of runs made before these options)."""
    kw: dict = {}
    if args.positions_from != "continuation" and args.min_positions is not None:
        raise UserError("--min-positions needs --positions-from continuation")
    if getattr(args, "engine", "transformers") == "llama.cpp" and args.positions_from != "continuation":
        raise UserError("--engine llama.cpp collects --positions-from continuation only")
    for name, mode in (("new_tokens", "continuation"), ("sample_temperature", "continuation"),
                       ("max_tokens", "teacher-forcing")):
        if getattr(args, name) is not None and args.positions_from != mode:
            raise UserError(f"--{name.replace('_', '-')} applies to --positions-from {mode} only")
    for name, value in _COLLECT_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.positions_from == "continuation":
        kw.update(positions_from="continuation", new_tokens=args.new_tokens, sample_temperature=args.sample_temperature)
        if args.min_positions is not None:
            kw["min_positions"] = args.min_positions
    if args.independent_temperatures:
        kw["independent_temperatures"] = float_list(args.independent_temperatures, "independent_temperatures")
    return kw


def _config_fields(args) -> dict:
    """The fields of ``acceptance.AcceptanceConfig`` from the flags: parsed here, validated once
    by the config (an ``ArgumentError`` there names the field; ``cli.ARG_FLAGS`` gives its flag)."""
    laws = name_list(args.laws, "laws")
    if "independent" in laws and not args.independent_temperatures:
        raise UserError("--laws independent needs --independent-temperatures (one draft temperature per draft, e.g. 1,0.7,1.3,0.5)")
    collect_kw = _collect_kw(args) or None  # first: it fills in the defaults of the --positions-from flags
    ppt = args.positions_per_text
    if ppt is None and args.positions_from == "teacher-forcing":
        ppt = 8
    return dict(
        datasets=tuple(name_list(args.datasets, "datasets")), ks=tuple(k_list(args.k)), laws=tuple(laws),
        verifiers=tuple(name_list(args.verifiers, "verifiers")) if args.verifiers else None,
        draws=args.draws, eval_support=args.eval_support, top_k=args.top_k, top_p=args.top_p, n_texts=args.texts,
        positions_per_text=ppt, max_tokens=args.max_tokens, eps=args.eps, collect_kw=collect_kw,
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
