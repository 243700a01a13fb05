"""``multidraft report RUN_DIR``: Markdown report and PNG plots from a run's JSONL files alone."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "report",
        help="Markdown report with plots from an experiment run directory (no model calls)",
        description="Read RUN_DIR/{acceptance,temperature,blocks}.jsonl and write report.md and plots/*.png. "
                    "Damaged or duplicated rows are left out, each named on stderr (file:line, field, what was "
                    "expected) and listed in the report; the exit status is then 2.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--out", metavar="DIR", default=None, help="output directory (default: RUN_DIR)")
    p.add_argument("--no-plots", action="store_true", help="Markdown only")
    p.add_argument("--blocks-baseline", metavar="FILE", default=None,
                   help="a second blocks.jsonl whose target-only rows (same prompts) every blocks row is also "
                        "paired with: an extra speed-up column, e.g. against a baseline remeasured on an idle machine")
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from ..experiments.report import build
    from ._args import print_skipped

    skipped: list[str] = []
    notes: list[str] = []
    try:
        path = build(args.run_dir, args.out, make_plots=not args.no_plots, blocks_baseline=args.blocks_baseline,
                     skipped=skipped, notes=notes)
    except ValueError as exc:  # nothing left to report: the rows left out first, unless the error names them
        for line in skipped:
            if line not in str(exc):
                print(f"multidraft report: {line}", file=sys.stderr)
        raise
    print_skipped("report", skipped, " (all listed in the report)")  # the report has the good rows; exit 2 says so
    print(f"wrote {path}" + (f" ({len(skipped)} damaged row(s) left out, listed in it)" if skipped else ""))
    for line in notes:  # valid but incomplete rows (older runs): said, not an error
        print(f"note: {line}")
    return 2 if skipped else 0
