"""``multidraft compare-runs FIRST SECOND``: two results files of one evaluation side by side."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "compare-runs",
        help="two results files side by side: same rows (tokens, values) or not, and the seconds of each",
        description="For two acceptance/temperature JSONL files: the common cells, how many have identical "
                    "per-position values, each one that differs, the seconds by data set and verifier. For two "
                    "blocks files (rows with prompts): the common runs, how many made the same tokens with the same "
                    "calls, each one that differs, the seconds by verifier. Nothing is rerun.",
    )
    p.add_argument("first", metavar="FIRST", help="a results JSONL file")
    p.add_argument("second", metavar="SECOND", help="a results JSONL file of the same evaluation")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..experiments.run_diff import compare_files
    from ._args import print_skipped

    skipped: list[str] = []
    compare_files(args.first, args.second, skipped=skipped)
    print_skipped("compare-runs", skipped)  # damaged or duplicated rows, left out of the comparison
    return 2 if skipped else 0
