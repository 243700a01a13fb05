"""``multidraft demo`` (what ``make demo`` runs, after ``multidraft setup-models``, ``cli.setup``).

``demo`` compares target-only decoding, single-draft SD and the multi-draft verifiers on
HumanEval prompts and writes ``demo.jsonl``, ``demo.md`` and ``demo.png`` in ``--out``.
"""
from __future__ import annotations

import sys

from . import UserError
from ._args import check_common, check_out_dir, k_list, name_list


def _eprint(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def register(subparsers) -> None:
    d = subparsers.add_parser(
        "demo",
        help="end-to-end speed: target-only vs single-draft SD vs multi-draft verifiers",
        description="Decode a few HumanEval prompts with the target alone, single-draft SD and every "
                    "multi-draft verifier at each K; print block efficiency, tokens/s and speedup, and "
                    "save JSONL, Markdown and PNG results. The defaults (2 prompts x 32 tokens, three "
                    "verifiers at K=2) take about 3 minutes on 2 CPU cores.",
    )
    d.add_argument("--target", default=None, help="local target model directory or .gguf (default: Qwen2.5-Coder-1.5B-Instruct)")
    d.add_argument("--draft", default=None, help="local draft model directory or .gguf (default: Qwen2.5-Coder-0.5B-Instruct)")
    d.add_argument("--prompts", type=int, default=2, help="number of HumanEval prompts (default 2)")
    d.add_argument("--max-new-tokens", type=int, default=32, help="new tokens per prompt (default 32)")
    d.add_argument("--depth", type=int, default=3, help="draft tree depth L (default 3)")
    d.add_argument("--k", default="2", help="drafts per node for the multi-draft rows, e.g. 2,4 or 2-4 (default 2)")
    d.add_argument("--temperature", type=float, default=1.0, help="target and draft temperature (default 1)")
    d.add_argument("--verifiers", default=None, help="comma-separated verifiers, or 'all' for every registered one "
                   "(default: specinfer,spectr,optimal)")
    d.add_argument("--rules", default=None,
                   help="comma-separated sequence-level tree rules (block, traversal, ...) or 'all', each on the "
                        "full K-ary trees it is lossless for, else on the chain (default: none)")
    d.add_argument("--no-mixed", action="store_true",
                   help="leave out the mixed row (SD with prompt lookup and the suffix index joining its tree)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--out", default="results/demo", help="output directory (default results/demo)")
    d.add_argument("--cache-dir", default=None, help="model cache directory")
    d.add_argument("--no-chat", action="store_true", help="feed the raw code prompt instead of the chat template")
    d.add_argument("--no-eos", action="store_true", help="do not stop at the end-of-sequence token")
    d.add_argument("--time-budget", type=float, default=180.0,
                   help="seconds of decoding after which no new prompt round starts (default 180; 0 = none)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    d.set_defaults(func=run)


def run(args) -> int:
    from ..experiments.demo import DemoConfig, run_demo

    ks = tuple(k_list(args.k, "--k"))
    check_out_dir(args.out, "--out")  # before any model loads: a read-only --out would lose the work
    check_common(args)
    verifiers = tuple(name_list(args.verifiers, "--verifiers")) if args.verifiers else None
    rules = tuple(name_list(args.rules, "--rules")) if args.rules else None
    # parsed here, validated once by the config (an ArgumentError there names the field; cli.ARG_FLAGS its flag)
    cfg = DemoConfig(
        target=args.target, draft=args.draft, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
        depth=args.depth, ks=ks, temperature=args.temperature, seed=args.seed, verifiers=verifiers, rules=rules,
        out_dir=args.out, cache_dir=args.cache_dir, chat=not args.no_chat, stop_at_eos=not args.no_eos,
        time_budget_s=args.time_budget if args.time_budget else None, mixed=not args.no_mixed,
    )
    try:
        res = run_demo(cfg, log=_eprint, show_progress=not args.no_progress)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UserError(str(exc)) from None
    print(res["title"])
    s = res["settings"]
    print(f"prompts {', '.join(s['prompts'])}; torch threads {s['torch_threads']}; seed {s['seed']}")
    print()
    print(res["table"])
    print()
    for note in res["skipped"]:
        print(f"skipped {note}")
    print(f"wall time {res['seconds']:.0f} s; results: {res['jsonl']}, {res['markdown']}"
          + (f", {res['png']}" if res["png"] else " (no plot: matplotlib missing)"))
    return 0
