"""``multidraft experiment acceptance|temperature|blocks RUN_DIR``: experiments on real models.

``acceptance`` and ``temperature`` collect (target, draft) next-token distributions once
into ``RUN_DIR/positions/`` (the only step that runs the models) and evaluate alpha* and
every verifier on them; ``blocks`` decodes end to end. All write JSONL rows to RUN_DIR,
skip what is already there, and can be interrupted and rerun.
"""
from __future__ import annotations

import sys
from pathlib import Path


def _list(s: str, name: str, cast=str) -> list:
    try:
        out = [cast(x.strip()) for x in str(s).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name}: expected a comma-separated list, got {s!r}") from None
    if not out:
        raise ValueError(f"{name} is empty")
    return out


def _ks(s: str, name: str = "--ks") -> list[int]:
    out = []
    for part in _list(s, name):
        if "-" in part:
            a, b = part.split("-", 1)
            try:
                out += list(range(int(a), int(b) + 1))
            except ValueError:
                raise ValueError(f"{name}: bad range {part!r}") from None
        else:
            try:
                out.append(int(part))
            except ValueError:
                raise ValueError(f"{name}: {part!r} is not an integer") from None
    if min(out) < 1:
        raise ValueError(f"{name}: every value must be >= 1, got {s!r}")
    return sorted(set(out))


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _models(args):
    def load():
        from ..models import resolve_pair

        _log("loading models ...")
        return resolve_pair(args.target, args.draft, log=_log)

    return load


def _model_names(args) -> dict:
    from ..models import DEFAULT_DRAFT, DEFAULT_TARGET

    return {
        "target": str(args.target) if args.target else DEFAULT_TARGET.title,
        "draft": str(args.draft) if args.draft else DEFAULT_DRAFT.title,
    }


def _progress(args):
    if args.no_progress:
        return None
    from ..experiments.progress import progress

    return progress


def _common(p, *, positions: bool = True) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="results directory (created; rerun to resume)")
    p.add_argument("--target", metavar="PATH", help="target model directory (default: Qwen2.5-Coder-1.5B-Instruct)")
    p.add_argument("--draft", metavar="PATH", help="draft model directory (default: Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verifiers", default=None, help="comma-separated verifier names (default: all registered but lp_optimal)")
    p.add_argument("--laws", default="iid,wor,greedy", help="draft laws, comma-separated (default iid,wor,greedy)")
    p.add_argument("--top-k", type=int, default=None, help="top-k filter applied to both models")
    p.add_argument("--top-p", type=float, default=None, help="top-p filter applied to both models")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    if positions:
        p.add_argument("--datasets", default="humaneval,kjv", help="humaneval, kjv and/or file:PATH (default humaneval,kjv)")
        p.add_argument("--texts", type=int, default=4, help="texts per dataset (default 4)")
        p.add_argument("--positions-per-text", type=int, default=8, help="sampled positions per text (default 8)")
        p.add_argument("--max-tokens", type=int, default=256, help="tokens per text, teacher-forced (default 256)")
        p.add_argument("--eps", type=float, default=1e-4, help="tail mass left out of the stored support (default 1e-4)")
        p.add_argument("--draws", type=int, default=200, help="draft tuples per position for Monte Carlo (default 200)")
        p.add_argument("--eval-support", type=int, default=None, metavar="N",
                       help="evaluate on at most N tokens per model and position (coarser lumping, bounds reported)")


def register(sub) -> None:
    ap = sub.add_parser("experiment", help="acceptance / temperature / block-efficiency experiments on real models",
                        description=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    es = ap.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    ap.set_defaults(func=lambda args: (ap.print_help(sys.stderr), 2)[1])

    a = es.add_parser("acceptance", help="alpha* and each verifier's acceptance vs K per draft law")
    _common(a)
    a.add_argument("--ks", default="1-8", help="numbers of drafts (default 1-8)")
    a.add_argument("--target-temperature", type=float, default=1.0)
    a.add_argument("--draft-temperature", type=float, default=1.0)
    a.set_defaults(func=run_acceptance)

    t = es.add_parser("temperature", help="the acceptance experiment over draft and target temperature sweeps")
    _common(t)
    t.add_argument("--ks", default="2,4,8", help="numbers of drafts (default 2,4,8)")
    t.add_argument("--draft-temperatures", default="0.4,0.7,1.0,1.3,1.6")
    t.add_argument("--target-temperatures", default="0,0.4,0.7,1.0,1.3")
    t.add_argument("--fixed-target-temperature", type=float, default=1.0, help="target T during the draft sweep")
    t.add_argument("--fixed-draft-temperature", type=float, default=1.0, help="draft T during the target sweep")
    t.set_defaults(func=run_temperature)

    b = es.add_parser("blocks", help="end-to-end block efficiency and tokens/s vs K and depth per verifier")
    _common(b, positions=False)
    b.add_argument("--ks", default="1,2,4", help="numbers of drafts (default 1,2,4)")
    b.add_argument("--depths", default="1,3", help="draft depths (default 1,3)")
    b.add_argument("--prompts", type=int, default=2, help="HumanEval prompts (default 2)")
    b.add_argument("--max-new-tokens", type=int, default=32)
    b.add_argument("--max-prompt-tokens", type=int, default=None, help="keep only the last N prompt tokens")
    b.add_argument("--temperature", type=float, default=1.0)
    b.add_argument("--draft-temperature", type=float, default=None, help="default: --temperature")
    b.add_argument("--no-baseline", action="store_true", help="skip the target-only autoregressive baseline")
    b.set_defaults(func=run_blocks)


def _config(args, names: dict) -> dict:
    cfg = {k: v for k, v in vars(args).items() if k not in ("func", "run_dir", "no_progress")}
    cfg["models"] = names
    return cfg


def _evaluate(args, configs, ks, file: str) -> Path:
    from ..experiments import acceptance, collect, report, store

    names = _model_names(args)
    from ..drafts import parse_laws

    laws = parse_laws(args.laws, acceptance.LAWS, "--laws")
    verifiers = _list(args.verifiers, "--verifiers") if args.verifiers else None
    if verifiers:
        from .. import verifiers as V

        for n in verifiers:
            V.get(n)
    if args.draws < 2:
        raise ValueError(f"--draws must be >= 2, got {args.draws}")
    paths = collect.collect(
        args.run_dir, models=_models(args), model_names=names, datasets=_list(args.datasets, "--datasets"),
        configs=configs, top_k=args.top_k, top_p=args.top_p, n_texts=args.texts,
        positions_per_text=args.positions_per_text, max_tokens=args.max_tokens, eps=args.eps,
        k_max=max(ks), seed=args.seed, log=_log, progress=_progress(args),
    )
    stores = list(paths.values())
    # the truncation bound in force
    for s in stores:
        ps = store.load(s)
        _log(f"{s.name}: {len(ps)} positions, eps = {args.eps:g}, max p(T) = {float(ps.p_tail.max()):.3g}, "
             f"max q(T) = {float(ps.q_tail.max()):.3g}  =>  0 <= alpha*_stored - alpha* <= {float(ps.p_tail.max()):.3g} (iid, greedy)")
    path = acceptance.run(
        args.run_dir, stores, file=file, config=_config(args, names), seed=args.seed,
        laws=laws, ks=ks, verifiers=verifiers, draws=args.draws, eval_support=args.eval_support, log=_log, progress=_progress(args),
    )
    from ..experiments.records import read_jsonl

    _, rows = read_jsonl(path)
    lines: list[str] = []
    if file == "acceptance.jsonl":
        findings = report._acceptance_section(rows, Path(args.run_dir), False, lines)
        print("\n".join(lines + ["## Findings", ""] + findings))
    else:
        report._temperature_section(rows, Path(args.run_dir), False, lines)
        print("\n".join(lines))
    print(f"results: {path}  (make the report with: multidraft report {args.run_dir})")
    return path


def run_acceptance(args) -> int:
    _evaluate(args, [(args.target_temperature, args.draft_temperature)], _ks(args.ks), "acceptance.jsonl")
    return 0


def run_temperature(args) -> int:
    from ..experiments.temperature import sweep_configs

    configs = sweep_configs(
        _list(args.draft_temperatures, "--draft-temperatures", float),
        _list(args.target_temperatures, "--target-temperatures", float),
        fixed_target=args.fixed_target_temperature, fixed_draft=args.fixed_draft_temperature,
    )
    _evaluate(args, configs, _ks(args.ks), "temperature.jsonl")
    return 0


def run_blocks(args) -> int:
    from .. import verifiers as V
    from ..drafts import parse_laws
    from ..experiments import blocks, report
    from ..experiments.records import read_jsonl

    names = _model_names(args)
    verifiers = _list(args.verifiers, "--verifiers") if args.verifiers else [n for n in V.names() if n != "lp_optimal"]
    for n in verifiers:
        V.get(n)
    path = blocks.run(
        args.run_dir, models=_models(args), model_names=names, verifiers=verifiers, laws=parse_laws(args.laws, name="--laws"),
        ks=_ks(args.ks), depths=_ks(args.depths, "--depths"), n_prompts=args.prompts,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, draft_temperature=args.draft_temperature,
        top_k=args.top_k, top_p=args.top_p, max_prompt_tokens=args.max_prompt_tokens, seed=args.seed, config=_config(args, names), baseline=not args.no_baseline, log=_log, progress=_progress(args),
    )
    _, rows = read_jsonl(path)
    lines: list[str] = []
    report._blocks_section(rows, Path(args.run_dir), False, lines)
    print("\n".join(lines))
    print(f"results: {path}  (make the report with: multidraft report {args.run_dir})")
    return 0
