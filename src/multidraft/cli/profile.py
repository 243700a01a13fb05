"""``multidraft profile``: the cost model of a model pair on this machine (for ``decode --tree auto``).

Measures the target forward time for n tree tokens (``--nodes``, default 1,2,4,...,64) and
the draft forward time of one tree level of m nodes (``--draft-nodes``, default 1-8) over a
``--prefix``-token cached prompt (median, or ``--statistic min``, of ``--repeats`` interleaved over the sizes after ``--warmup``
rounds), prints a
table and writes the :class:`~multidraft.decoding.treeopt.CostProfile` JSON (with cpu,
cores, torch/transformers versions and dtype) to ``--out``.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ._args import int_list


def register(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="measure target/draft forward seconds per tree size (the cost model for --tree auto)",
        description="Time one target forward over n tree tokens and one draft level over m nodes on a "
                    "cached prompt prefix; print a table and write the cost profile as JSON.",
    )
    p.add_argument("--target", metavar="DIR", default=None, help="target model directory (default: the default pair)")
    p.add_argument("--draft", metavar="DIR", default=None, help="draft model directory (default: the default pair)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"), help="model dtype")
    p.add_argument("--nodes", default="1,2,4,8,16,32,64", help="target tree sizes n (root included, 1..64; must include 1)")
    p.add_argument("--draft-nodes", default="1-8", help="draft level sizes m (1..64)")
    p.add_argument("--prefix", type=int, default=128, metavar="T", help="cached prompt tokens before the tree (default 128)")
    p.add_argument("--repeats", type=int, default=5, help="timed forwards per point, median kept (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed forwards before each point (default 1)")
    p.add_argument("--statistic", default="median", choices=("median", "min"),
                   help="per point: median of the repeats (default) or min (the uncontended cost on a shared machine)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--out", metavar="FILE", default="profile.json", help="JSON output file (default profile.json)")
    p.add_argument("--quiet", action="store_true", help="no loading messages on stderr")
    p.set_defaults(func=run)


def check_args(args):
    nodes = int_list(args.nodes, "--nodes", lo=1)
    draft_nodes = int_list(args.draft_nodes, "--draft-nodes", lo=1)
    if nodes[-1] > 64 or draft_nodes[-1] > 64:
        raise ValueError("--nodes and --draft-nodes must be <= 64 (the tree chooser's node budget)")
    if nodes[0] != 1:
        raise ValueError(f"--nodes must include 1 (the target alone), got {args.nodes!r}")
    for flag, val, lo in (("--prefix", args.prefix, 1), ("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0)):
        if val < lo:
            raise ValueError(f"{flag} must be >= {lo}, got {val}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    out = Path(args.out).expanduser()
    if out.is_dir():
        raise ValueError(f"--out: {out} is a directory; give a file name")
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise ValueError(f"--out: directory {out.parent} does not exist")
    return nodes, draft_nodes, out


def run(args) -> int:
    nodes, draft_nodes, out = check_args(args)

    import torch

    from ..decoding.profiling import measure_profile
    from ..models import resolve_pair

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    target, draft, _ = resolve_pair(args.target, args.draft, getattr(torch, args.dtype), log=log)
    prof = measure_profile(target, draft, nodes=nodes, draft_nodes=draft_nodes, prefix=args.prefix,
                           repeats=args.repeats, warmup=args.warmup, statistic=args.statistic,
                           meta={"target": args.target or "default", "draft": args.draft or "default"})
    try:
        out.write_text(prof.to_json() + "\n", encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--out: cannot write {out}: {exc.strerror or exc}") from None
    one = prof.target_seconds(1)
    m = prof.meta
    print(f"# {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch threads), torch {m['torch']}, "
          f"transformers {m['transformers']}, {m['dtype']}, prefix {args.prefix}, {args.statistic} of {args.repeats}, "
          f"load average {m['load_average_before']} -> {m['load_average']}")
    print(f"{'target n':>9} {'ms':>10} {'x n=1':>7} {'ms/node':>9}")
    for n, s in zip(prof.target_nodes, prof.target_times):
        print(f"{n:>9} {1e3 * s:>10.2f} {s / one:>7.2f} {1e3 * s / n:>9.2f}")
    print(f"{'draft m':>9} {'ms':>10} {'x target':>9}")
    for n, s in zip(prof.draft_nodes, prof.draft_times):
        print(f"{n:>9} {1e3 * s:>10.2f} {s / one:>9.2f}")
    print(f"wrote {out}")
    return 0
