"""``multidraft compare``: exact or Monte-Carlo acceptance of every verifier, per law and K."""
from __future__ import annotations

import json
import sys

from ..experiments import compare as C
from ..experiments.records import JsonlWriter


def _ints(s: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--k: expected comma-separated integers, got {s!r}") from None
    if not out or min(out) < 1:
        raise ValueError(f"--k: every K must be >= 1, got {s!r}")
    return out


def register(sub) -> None:
    ap = sub.add_parser(
        "compare",
        help="acceptance of every verifier per draft law and K, with alpha* and certificate errors",
        description=(
            "For built-in (p, q) pairs, or the probability vectors in --p/--q .npy files, print each "
            "verifier's acceptance per draft law and K: exact (all draft tuples enumerated) when small, "
            "Monte-Carlo with its standard error otherwise; alpha* from the LP (small V) or the dual."
        ),
    )
    ap.add_argument("--p", metavar="P.npy", help="target distribution (1-D .npy); needs --q")
    ap.add_argument("--q", metavar="Q.npy", help="draft distribution (1-D .npy); needs --p")
    ap.add_argument("--k", default="1,2,3,4", help="numbers of drafts, comma-separated (default 1,2,3,4)")
    ap.add_argument("--laws", default="iid,wor,greedy", help="draft laws, comma-separated (iid, wor, greedy)")
    ap.add_argument("--verifiers", default=None, help="comma-separated verifier names (default: all registered)")
    ap.add_argument("--samples", type=int, default=200_000, help="Monte-Carlo draws when enumeration is too large")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", metavar="FILE.jsonl", help="also write the rows as JSONL (with seed, versions, config)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    ap.set_defaults(func=run)


def run(args) -> int:
    if (args.p is None) != (args.q is None):
        raise ValueError("--p and --q go together")
    cases = {"user": C.load_case(args.p, args.q)} if args.p else C.builtin_cases()
    if args.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {args.samples}")
    s = C.Settings(
        ks=_ints(args.k),
        laws=tuple(x.strip() for x in args.laws.split(",") if x.strip()),
        verifiers=tuple(x.strip() for x in args.verifiers.split(",")) if args.verifiers else None,
        samples=args.samples,
        seed=args.seed,
    )
    rows = C.run(cases, s, show_progress=sys.stderr.isatty())
    if args.out:
        config = dict(ks=list(s.ks), laws=list(s.laws), verifiers=s.verifiers, samples=s.samples,
                      cases={k: {"p": v[0].tolist(), "q": v[1].tolist()} for k, v in cases.items()})
        with JsonlWriter(args.out, config, s.seed) as w:
            for r in rows:
                w.write(**r)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"multidraft compare (seed {s.seed})\n")
        print(C.format_table(rows))
    return 0
