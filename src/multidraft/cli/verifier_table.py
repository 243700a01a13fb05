"""``multidraft compare``: exact or Monte-Carlo acceptance of every verifier, per law and K."""
from __future__ import annotations

import contextlib
import json
import sys

from ._args import check_common, k_list, name_list


def register(sub) -> None:
    ap = sub.add_parser(
        "compare",
        help="acceptance of every verifier per draft law and K, with alpha* and certificate errors",
        description=(
            "For built-in (p, q) pairs, or the probability vectors in --p/--q .npy files, print each "
            "verifier's acceptance per draft law and K: exact (all draft tuples enumerated) when small, "
            "Monte-Carlo with its standard error otherwise; alpha* from the LP (small V) or the exact dual. "
            "Sizes are estimated first and printed on stderr; lp_optimal is skipped where its LP is too large."
        ),
    )
    ap.add_argument("--p", metavar="P.npy", help="target distribution (1-D .npy); needs --q")
    ap.add_argument("--q", metavar="Q.npy", help="draft distribution (1-D .npy); needs --p")
    ap.add_argument("--k", default="1,2,3,4", help="numbers of drafts, e.g. 1,2,4 or 1-4 (default 1,2,3,4)")
    ap.add_argument("--laws", default="iid,wor,greedy", help="draft laws, comma-separated (iid, wor, greedy)")
    ap.add_argument("--verifiers", default=None, help="comma-separated verifier names (default: all registered)")
    ap.add_argument("--samples", type=int, default=200_000, help="Monte-Carlo draws when enumeration is too large")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", metavar="FILE.jsonl",
                    help="also write the rows as JSONL (with seed, versions, config); an existing file of the same "
                         "cases, samples and seed gets the missing rows, one of other settings is refused")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown on a terminal)")
    ap.set_defaults(func=run)


LONG_SECONDS = 5.0  # work estimated longer than this is announced, with progress


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def run(args) -> int:
    from ..experiments import verifier_table as C
    from ..experiments.records import check_binding, ensure_dir, lock_results_file

    check_common(args)  # --seed
    if (args.p is None) != (args.q is None):
        raise ValueError("--p and --q go together")
    s = C.CompareConfig(  # every value validated here, once
        ks=k_list(args.k),
        laws=args.laws.split(","),
        verifiers=name_list(args.verifiers, "verifiers") if args.verifiers else None,
        samples=args.samples,
        seed=args.seed,
    )
    cases = {"user": C.load_case(args.p, args.q)} if args.p else C.builtin_cases()
    with contextlib.ExitStack() as held:
        if args.out:  # refuse a bad --out before minutes of work, and hold it until the rows are written
            from pathlib import Path

            out = Path(args.out)
            if out.is_dir():
                raise IsADirectoryError(21, "--out is a directory; give a file name such as rows.jsonl", str(out))
            ensure_dir(out.parent, "directory")
            held.enter_context(lock_results_file(out))
            check_binding(out, C.jsonl_config(cases, s), s.seed, C.KEYED)
        return _run(args, C, cases, s)


def _run(args, C, cases, s) -> int:
    plan = C.plan(cases, s)  # sizes first: refuses what cannot be done (ArgumentError naming the flag)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    log(plan.describe(s.samples))
    seconds = C.estimate_seconds(cases, s, plan) if plan.n_monte_carlo else 0.0
    long = seconds > LONG_SECONDS
    if long:  # say so before it starts, and show progress even where no bar is drawn
        log(f"compare: the Monte-Carlo runs will take about {_duration(seconds)} (from timed pilots; fewer "
            "--samples or --k make it shorter)")
    bar = sys.stderr.isatty() and not args.no_progress
    rows = C.run(cases, s, show_progress=bar, log=log, the_plan=plan,
                 step_log=log if long and not bar and not args.no_progress else None)
    if args.out:
        n = C.write_jsonl(args.out, rows, cases, s)
        print(f"wrote {n} rows to {args.out}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"multidraft compare (seed {s.seed})\n")
        print(C.format_table(rows))
    return 0
