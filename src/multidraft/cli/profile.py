"""``multidraft profile``: the cost model of a model pair on this machine (for ``decode --tree auto``).

Measures the target forward time for n tree tokens (``--nodes``, default 1,2,4,...,64) and
the draft forward time of one tree level of m nodes (``--draft-nodes``, default 1-8) over a
``--prefix``-token cached prompt (median, or ``--statistic min``, of ``--repeats`` interleaved
over the sizes after ``--warmup`` rounds), and the decoder's own time per step and per draft
node from real decodes of ``--overhead-tokens`` tokens (the target alone, chains of 2 and 4),
prints tables and writes the :class:`~multidraft.decoding.treeopt.CostProfile` JSON (with the
engine, cpu, cores, versions, dtype or GGUF types and files, threads) to ``--out``.

``--engine transformers`` (default) times model directories in ``--dtype``;
``--engine llama.cpp`` times GGUF files (the default pair's Q4_K_M files, ``--bf16-target``
for the default target's BF16 GGUF) with ``--threads`` llama.cpp threads. Both go through
the decoder's runners (``decoding.profiling``), so the numbers mean the same on both.
"""
from __future__ import annotations

import sys

from ._args import check_common, check_out_file, draft_ftype, int_list, quiet_loading


def register(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="measure target/draft forward seconds per tree size (the cost model for --tree auto)",
        description="Time one target forward over n tree tokens and one draft level over m nodes on a "
                    "cached prompt prefix; print a table and write the cost profile as JSON.",
    )
    p.add_argument("--engine", default=None, choices=("transformers", "llama.cpp"),
                   help="transformers (default; model directories) or llama.cpp (GGUF files, the llama extra)")
    p.add_argument("--target", metavar="PATH", default=None,
                   help="target model directory, or .gguf file with llama.cpp (default: the default pair)")
    p.add_argument("--draft", metavar="PATH", default=None,
                   help="draft model directory, or .gguf file with llama.cpp (default: the default pair)")
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                   help="model dtype (transformers engine; default bfloat16)")
    p.add_argument("--bf16-target", action="store_true",
                   help="llama.cpp: the default target's BF16 GGUF (made once from the Q4_K_M file) instead of Q4_K_M")
    p.add_argument("--draft-ftype", default=None, metavar="FTYPE",
                   help="llama.cpp: the default draft requantized to FTYPE (e.g. q4_0, the fast CPU draft)")
    p.add_argument("--nodes", default=None, help="target tree sizes n (root included, 1..64; must include 1; default 1,2,4,8,16,32,64)")
    p.add_argument("--draft-nodes", default=None, help="draft level sizes m (1..64; default 1-8)")
    p.add_argument("--prefix", type=int, default=None, metavar="T", help="cached prompt tokens before the tree (default 128)")
    p.add_argument("--repeats", type=int, default=None, help="timed forwards per point, median kept (default 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed forwards before each point (default 1)")
    p.add_argument("--statistic", default=None, choices=("median", "min"),
                   help="per point: median of the repeats (default) or min (the uncontended cost on a shared machine)")
    p.add_argument("--overhead-tokens", type=int, default=None, metavar="N",
                   help="besides the points, decode N tokens with the target alone and with chains of 2 and 4 "
                        "drafts and fit the decoder's own time per step and per node to what those steps took "
                        "beyond the points (default 64; 0 skips it and leaves both at 0)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch threads with transformers (default: torch's own), llama.cpp threads with llama.cpp "
                        "(default: all cores)")
    p.add_argument("--out", metavar="FILE", default=None, help="JSON output file (default profile.json)")
    p.add_argument("--quiet", action="store_true", help="no loading messages on stderr")
    c = p.add_argument_group("comparing profiles (no measurement)")
    c.add_argument("--compare", nargs="+", metavar="FILE", default=None,
                   help="read these cost profiles instead of measuring and print what width costs on each "
                        "machine and, with --accept-stats, whether the cost model's best tree branches there")
    c.add_argument("--accept-stats", metavar="FILE", default=None,
                   help="with --compare: a study's acceptance JSONL or an AcceptStats JSON (as decode --accept-stats)")
    c.add_argument("--accept-dataset", metavar="NAME", default=None,
                   help="with --compare: the data set of a study with several")
    c.add_argument("--verifier", default=None, help="with --compare: the verifier whose acceptances rate the trees "
                                                           "(default specinfer)")
    c.add_argument("--k", type=int, default=None, help="with --compare: the most drafts a node may get (default 2)")
    c.add_argument("--temperature", type=float, default=None, help="with --compare: the study's temperature (default 1)")
    c.add_argument("--max-nodes", type=int, default=None, help="with --compare: tree budget, root included (default 16)")
    c.add_argument("--max-depth", type=int, default=None, help="with --compare: deepest tree (default 6)")
    c.add_argument("--markdown", metavar="FILE", default=None, help="with --compare: also write the table as markdown")
    p.set_defaults(func=run)


# the measurement's flags and their defaults: --compare reads none of them
_MEASURE = dict(engine="transformers", target=None, draft=None, dtype=None, bf16_target=False, draft_ftype=None,
                nodes="1,2,4,8,16,32,64", draft_nodes="1-8", prefix=128, repeats=5, warmup=1, statistic="median",
                overhead_tokens=64, threads=None, out="profile.json", quiet=False)
# the comparison's flags and their defaults: the measurement reads none of them; the tree rating needs --accept-stats
_RATING = dict(verifier="specinfer", k=2, temperature=1.0, max_nodes=16, max_depth=6, accept_dataset=None)
_COMPARE = dict(accept_stats=None, markdown=None, **_RATING)


def _given(args, names) -> list[str]:
    return [n for n in names if getattr(args, n) is not None and getattr(args, n) is not False]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _fill(args, defaults: dict) -> None:
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def check_args(args):
    given = _given(args, _COMPARE)
    if given:
        raise ValueError(f"{_flag(given[0])} applies to --compare only (comparing profiles, no measurement)")
    _fill(args, _MEASURE)
    nodes = int_list(args.nodes, "--nodes", lo=1, hi=64)  # bounded before anything is expanded:
    draft_nodes = int_list(args.draft_nodes, "--draft-nodes", lo=1, hi=64)  # 64, the tree chooser's budget
    if nodes[0] != 1:
        raise ValueError(f"--nodes must include 1 (the target alone), got {args.nodes!r}")
    for flag, val, lo in (("--prefix", args.prefix, 1), ("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0),
                          ("--overhead-tokens", args.overhead_tokens, 0)):
        if val < lo:
            raise ValueError(f"{flag} must be >= {lo}, got {val}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.engine == "llama.cpp":
        from .. import _optional

        if not _optional.available("llama_cpp"):
            raise ValueError(f"--engine llama.cpp needs llama-cpp-python: {_optional.hint('llama_cpp')}")
        if args.dtype is not None:
            raise ValueError("--dtype applies to --engine transformers only (llama.cpp runs the GGUF's own types)")
        if args.bf16_target and args.target is not None:
            raise ValueError("--bf16-target picks the default target's BF16 GGUF; drop it or --target")
        args.draft_ftype = draft_ftype(args.draft_ftype, args.draft)
    elif args.bf16_target:
        raise ValueError("--bf16-target applies to --engine llama.cpp only")
    elif args.draft_ftype is not None:
        raise ValueError("--draft-ftype applies to --engine llama.cpp only")
    out = check_out_file(args.out)
    check_common(args)  # --target / --draft
    _check_prefix(args, args.prefix + 1 + max(nodes[-1], draft_nodes[-1]))
    return nodes, draft_nodes, out


def _context(path) -> int | None:
    """The training context of a model file without loading it: ``max_position_embeddings`` of a
    model directory's config.json, or ``<arch>.context_length`` of a GGUF header (read with the
    ``gguf`` package where installed); None when it cannot be read (the load then checks it)."""
    import json
    from pathlib import Path

    path = Path(path).expanduser()
    try:
        if path.is_dir():
            cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
            n = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
            return int(n) if n else None
        if path.is_file() and path.suffix.lower() == ".gguf":
            from gguf import GGUFReader

            fields = GGUFReader(str(path)).fields
            arch = fields["general.architecture"]
            arch = bytes(arch.parts[arch.data[0]]).decode()
            f = fields.get(f"{arch}.context_length")
            return int(f.parts[f.data[0]][0]) if f is not None else None
    except Exception:  # noqa: BLE001 (an unreadable header: the load reports it)
        return None
    return None


def _default_paths(args) -> dict:
    """Where the default pair lies on disk (``{"target": path, "draft": path}`` for the flags not
    given), without downloading or assembling anything."""
    from .. import models

    out = {}
    for name, spec in (("target", models.DEFAULT_TARGET), ("draft", models.DEFAULT_DRAFT)):
        if getattr(args, name) is not None:
            continue
        if args.engine == "llama.cpp":
            out[name] = models.default_gguf(spec)
        else:
            out[name] = models.cache_root() / spec.name
    return out


# the default pair's training context (Qwen2.5-Coder 0.5B and 1.5B: config.json's max_position_embeddings and
# the GGUFs' qwen2.context_length), for the check before its files are downloaded or assembled
DEFAULT_PAIR_CONTEXT = 32768


def _check_prefix(args, need: int) -> None:
    """``--prefix`` and the largest tree (``need`` tokens in one cache) within each model's
    training context, read from its files before any model loads (``_context``)."""
    paths = {name: getattr(args, name) for name in ("target", "draft") if getattr(args, name) is not None}
    try:
        paths.update(_default_paths(args))
    except Exception:  # noqa: BLE001 (no default pair installed: the load says so)
        pass
    for name, path in paths.items():
        ctx = _context(path)
        if ctx is None and getattr(args, name) is None:
            ctx = DEFAULT_PAIR_CONTEXT
        if ctx is not None and need > ctx:
            raise ValueError(f"--prefix {args.prefix}: the prefix and the largest tree take {need:,} positions; "
                             f"the {name} model's context is {ctx:,}")


OVERHEAD_PROMPT = ("humaneval", 163)  # the last HumanEval task: no benchmark here decodes it


def _load(args, nodes, draft_nodes, log):
    """``(target, draft, ids, name)`` of the chosen engine (threads set before anything loads);
    ``ids`` ``[1, T]`` is :data:`OVERHEAD_PROMPT` through the chat template, as a decode sees it
    (``None, None`` with ``--overhead-tokens 0``: nothing decodes it)."""
    import torch

    from ._args import load_models

    llama = args.engine == "llama.cpp"
    target, draft, tokenizer = load_models(
        args.engine, target=args.target, draft=args.draft, dtype=None if llama else getattr(torch, args.dtype or "bfloat16"),
        bf16_target=args.bf16_target, draft_ftype=args.draft_ftype, n_threads=args.threads,
        n_ctx=max(4096, args.prefix + 1 + max(nodes[-1], draft_nodes[-1])), log=log)
    if not args.overhead_tokens:
        return target, draft, None, None
    from ..datasets import encode_prompt, instruction_for, load_prompts

    dataset, index = OVERHEAD_PROMPT
    pid, text = load_prompts(dataset, 1, start=index)[0]
    return target, draft, encode_prompt(tokenizer, text, instruction=instruction_for(dataset)), pid


def run(args) -> int:
    if args.compare is not None:
        return compare(args)
    nodes, draft_nodes, out = check_args(args)

    from ..decoding.profiling import measure_profile
    from ..decoding.treeopt import chain, step_seconds

    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.quiet:
        quiet_loading()
    target, draft, prompt, pid = _load(args, nodes, draft_nodes, log)
    default_target = "default (BF16 GGUF)" if args.bf16_target else "default"
    prof = measure_profile(target, draft, nodes=nodes, draft_nodes=draft_nodes, prefix=args.prefix,
                           repeats=args.repeats, warmup=args.warmup, statistic=args.statistic,
                           overhead_tokens=args.overhead_tokens, overhead_prompt=prompt,
                           meta={**({"overhead_prompt": f"{pid} through the chat template, {prompt.shape[1]} tokens"}
                                    if prompt is not None else {}),
                                 "target": args.target or default_target,
                                 "draft": args.draft or ("default" + (f" ({args.draft_ftype.upper()} GGUF)"
                                                                       if args.draft_ftype else ""))})
    from ..experiments.records import write_file

    try:
        write_file(out, prof.to_json() + "\n", "write the --out file")  # the whole profile or nothing
    except OSError as exc:
        raise ValueError(f"--out: {out}: {exc.strerror or exc}") from None  # nothing written
    one = prof.target_seconds(1)
    m = prof.meta
    if m["engine"] == "llama.cpp":
        eng = (f"{m['threads']} llama.cpp threads), llama-cpp-python {m['llama_cpp_python']}, "
               f"{m['target_file']} ({m['dtype']}) + {m['draft_file']} ({m['draft_dtype']})")
    else:
        eng = f"{m['torch_threads']} torch threads), torch {m['torch']}, transformers {m['transformers']}, {m['dtype']}"
    print(f"# {m['cpu']} ({m['cores']} cores, {eng}, prefix {args.prefix}, {args.statistic} of {args.repeats}, "
          f"load average {m['load_average_before']} -> {m['load_average']}")
    print(f"{'target n':>9} {'ms':>10} {'x n=1':>7} {'ms/node':>9}")
    for n, s in zip(prof.target_nodes, prof.target_times):
        print(f"{n:>9} {1e3 * s:>10.2f} {s / one:>7.2f} {1e3 * s / n:>9.2f}")
    print(f"{'draft m':>9} {'ms':>10} {'x target':>9}")
    for n, s in zip(prof.draft_nodes, prof.draft_times):
        print(f"{n:>9} {1e3 * s:>10.2f} {s / one:>9.2f}")
    if "overhead" in m:
        print(f"{'decode':>9} {'steps':>6} {'ms/step':>9} {'models':>9} {'rest':>7}")
        bare = prof.without_overhead()
        for r in m["overhead"]["runs"]:
            model = step_seconds(chain(r["depth"]), bare)
            name = f"chain {r['depth']}" if r["depth"] else "target"
            print(f"{name:>9} {r['steps']:>6} {1e3 * r['seconds'] / r['steps']:>9.2f} {1e3 * model:>9.2f} "
                  f"{1e3 * (r['seconds'] / r['steps'] - model):>7.2f}")
        print(f"decoder's own time: {1e3 * prof.per_step_seconds:.2f} ms a step + {1e3 * prof.per_node_seconds:.2f} ms "
              f"a draft node (target alone {1e3 / prof.target_only_rate():.2f} ms a token)")
    print(f"wrote {out}")
    return 0


_WIDTH_N = (2, 4, 8, 16)
_WIDTH_M = (2, 4)


def _read_profiles(files):
    from pathlib import Path

    from ..decoding.treeopt import CostProfile

    out = []
    for f in files:
        path = Path(f).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--compare: cannot read {path}: {exc.strerror or exc}") from None
        try:
            out.append((path, CostProfile.from_json(text)))
        except ValueError as exc:
            raise ValueError(f"--compare: {path}: {exc}") from None
    return out


def compare(args) -> int:
    """``--compare``: the price of width on each profile's machine and, given acceptances, the
    best chain against the best tree of the cost model (``treeopt.chain_vs_tree``)."""
    from ..decoding.treeopt import chain_vs_tree, width_price

    given = _given(args, _MEASURE)
    if given:
        raise ValueError(f"{_flag(given[0])} applies to measuring a profile; --compare reads profiles only")
    if args.accept_stats is None:
        given = _given(args, _RATING)
        if given:
            raise ValueError(f"{_flag(given[0])} rates trees by acceptances: it applies to --compare with --accept-stats "
                             "only")
    _fill(args, _COMPARE)
    for flag, val, lo in (("--k", args.k, 1), ("--max-nodes", args.max_nodes, 2), ("--max-depth", args.max_depth, 1)):
        if val < lo:
            raise ValueError(f"{flag} must be >= {lo}, got {val}")
    if args.max_nodes > 64 or args.max_depth > 8:
        raise ValueError(f"--max-nodes <= 64 and --max-depth <= 8 (the tree chooser's limits), got "
                         f"{args.max_nodes} and {args.max_depth}")
    md_out = check_out_file(args.markdown, "--markdown") if args.markdown else None
    profiles = _read_profiles(args.compare)
    stats = None
    if args.accept_stats is not None:
        from ..experiments.acceptance import tree_acceptance
        from ..trees.walk import node_ks
        from ..verifiers import get as get_verifier

        try:
            v = get_verifier(args.verifier)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"--verifier: {exc}") from None
        law = v.implied_law(args.k)
        ks = node_ks(v, law, args.k)
        try:
            stats, _ = tree_acceptance(args.accept_stats, verifier=v.name, law=law, ks=ks, t_target=args.temperature,
                                       t_draft=args.temperature, dataset=args.accept_dataset)
        except ValueError as exc:
            raise ValueError(f"--accept-stats: {exc}") from None
        stats = stats.restrict([k for k in ks if k in stats.accept])
    head = (["profile", "engine", "cpu", "weights", "target 1 tok ms"] + [f"target {n} / 1" for n in _WIDTH_N]
            + [f"draft {m} / 1" for m in _WIDTH_M])
    if stats is not None:
        head += ["best chain", "best tree", "tree / chain", "tree / target alone"]
    rows = []
    for path, prof in profiles:
        m = prof.meta
        w = width_price(prof, _WIDTH_N, _WIDTH_M)
        weights = f"{m.get('dtype', '?')} / {m.get('draft_dtype', m.get('dtype', '?'))}"
        row = [path.name, m.get("engine", "?"), f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores)", weights,
               f"{1e3 * prof.target_seconds(1):.1f}"] + [f"{w['target'][n]:.2f}" for n in _WIDTH_N] \
            + [f"{w['draft'][x]:.2f}" for x in _WIDTH_M]
        if stats is not None:
            cv = chain_vs_tree(prof, stats, args.max_nodes, args.max_depth)
            tree = (f"{cv.tree.nodes - 1} nodes, depth {cv.tree.depth}, branches" if cv.branches
                    else f"chain of {cv.tree.depth}")
            row += [f"depth {cv.chain.depth}: {cv.chain.tokens_per_s:.2f} tok/s", f"{tree}: {cv.tree.tokens_per_s:.2f} tok/s",
                    f"{cv.tree_over_chain:.3f}x", f"{cv.tree.tokens_per_s / cv.target_only_tokens_per_s:.2f}x"]
        rows.append(row)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    if stats is not None:
        lines.append("")
        lines.append(f"acceptances: {stats.source}; trees of at most {args.max_nodes} nodes (root included), depth "
                     f"<= {args.max_depth}, nodes of {', '.join(map(str, stats.ks))} drafts; predicted by the "
                     "cost model (decoding.treeopt), not measured")
    text = "\n".join(lines)
    print(text)
    if md_out is not None:
        from ..experiments.records import write_file

        try:
            write_file(md_out, text + "\n", "write the --markdown file")  # the whole table or nothing
        except OSError as exc:
            raise ValueError(f"--markdown: {md_out}: {exc.strerror or exc}") from None  # nothing written
    return 0
