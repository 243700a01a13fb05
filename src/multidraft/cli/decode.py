"""``multidraft decode``: multi-draft speculative decoding of one prompt on local models.

Models default to the default pair (``multidraft.decoding.pair.load_pair``);
``--target DIR --draft DIR`` take any local Hugging Face causal LM directories sharing a
tokenizer. ``--verifier none`` runs the target alone (the baseline). ``--draft-law``
defaults to the law the verifier implies (``rrs_wor`` -> wor, ``spechub`` -> greedy, ...).

``--rule NAME`` picks the tree rule that verifies each step's tree (``decoding.decoder_rules()``):
``token_walk`` (default: the root-first walk of ``--verifier``, default specinfer), or a
sequence-level rule given without ``--verifier``: ``block`` (one chain, ``--k 1``),
``traversal`` (i.i.d. drafts, every tree mode), and any other registered rule for the tree
modes it supports; ``--draft-law`` then defaults to iid. A rule that is not lossless for the
tree mode is refused before any model loads, naming what would work. With ``--tree auto`` a
sequence-level rule gets a tree of the node sizes it supports, rated with the acceptances of
the specinfer walk under the iid law (what the rule reaches at depth 1 for traversal; the
positional model of ``treeopt`` describes token-level walks only).

``--tree auto --profile FILE`` picks the tree (node budget ``--max-nodes``, depth
``--max-depth``, at most ``--k`` drafts per node) that maximises the predicted tokens per
second (``decoding.treeopt.choose_tree``) from the cost profile written by ``multidraft
profile`` (its points recomputed from the kept samples by ``--profile-statistic``, default
median) and acceptance statistics: ``--accept-stats FILE``, either a study's acceptance JSONL
(``multidraft experiment paper|acceptance``; the verifier's per-position acceptances under its
law at the decode's temperatures, data set ``--accept-dataset``, rated along the text) or a
statistics JSON, or else a warm-up decode of ``--warmup-tokens`` on the prompt with a K-ary
tree of depth 2 (its own seed stream, so the choice is independent of the decode's randomness
and the decode stays lossless). It prints the tree, its expected tokens per step and the
predicted tokens/s against the target alone; when no tree is predicted faster it decodes
target-only, unless ``--force-tree``.

``--tree dynamic`` builds each step's tree level by level: a node gets 0..``--k-max`` drafts
chosen from the draft distribution at that node before its drafts are drawn (more where the
draft is uncertain), under a node budget ``--max-nodes`` (default 16, root included) and depth
``--max-depth``; with ``--min-gain G`` a draft is granted only if it is worth at least G
expected tokens, so confident stretches stay chains (``trees.allocate``; lossless,
see ``trees.walk``).

Every argument is checked once, before any model is loaded or built: the decoding settings
by ``decoding.Settings.from_args`` (the object then passed to ``generate``), the rest here; a
mistake is one line on stderr naming the flag (``cli.ARG_FLAGS``) and exit status 2.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .._errors import ArgumentError
from ..drafts import LAW_KINDS
from ._args import check_common, check_out_file, draft_ftype, float_list, k_list, quiet_loading


def register(sub) -> None:
    p = sub.add_parser(
        "decode",
        help="generate from a prompt with multi-draft speculative decoding",
        description="Lossless multi-draft speculative decoding of one prompt; prints the text (or --json).",
    )
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    add_settings_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    p.add_argument("--out", metavar="FILE", default=None, help="also write the JSON object to FILE")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def add_settings_flags(p, engine: str = "transformers") -> None:
    """The models, engine and decoding settings flags of ``decode``, shared with ``serve`` (one
    table of flags; checked by :func:`check_settings`); ``engine`` the default engine."""
    p.add_argument("--target", metavar="DIR", default=None, help="target model directory (default: the default pair)")
    p.add_argument("--draft", metavar="DIR", default=None, help="draft model directory (default: the default pair)")
    p.add_argument("--verifier", default=None,
                   help="registered verifier name of the token walk (default specinfer), or 'none' for the target alone")
    p.add_argument("--rule", default=None, metavar="NAME",
                   help="tree rule verifying each step's tree: token_walk (default, the walk of --verifier), block "
                        "(one chain: --k 1), traversal (i.i.d. trees), or another registered rule (given without "
                        "--verifier)")
    p.add_argument("--k", default=None, metavar="K", help="drafts per tree node (default 2; --tree dynamic: --k-max)")
    p.add_argument("--depth", type=int, default=None, metavar="L",
                   help="draft tree depth (default 4; --tree dynamic: --max-depth)")
    p.add_argument("--tree", default="full",
                   help="'full' (K-ary tree), 'sequences' (K sequences merged into a trie), a JSON list of paths, "
                        "'auto' (the fastest tree for --profile and the acceptance statistics; K = --k at most), "
                        "or 'dynamic' (per step, drafts per node from the draft distribution; --k-max, --max-nodes, "
                        "--max-depth)")
    p.add_argument("--profile", metavar="FILE", default=None,
                   help="--tree auto: cost profile JSON written by `multidraft profile` (required)")
    p.add_argument("--accept-stats", metavar="FILE", default=None,
                   help="--tree auto: the study's acceptance JSONL (`multidraft experiment paper|acceptance`: "
                        "per-position acceptances of --verifier under its law at --temperature / "
                        "--draft-temperature, rated along the text), or an acceptance statistics JSON "
                        "({'accept': {k: [slot probabilities]}}, e.g. the 'accept_stats' object of a previous "
                        "`decode --tree auto --json`); default: a warm-up decode")
    p.add_argument("--accept-dataset", metavar="NAME", default=None,
                   help="--tree auto with a study JSONL: its data set to take (needed when it has several)")
    p.add_argument("--profile-statistic", default=None, choices=("median", "mean", "min", "stored"),
                   help="--tree auto: recompute the profile's points from its timed samples by this statistic "
                        "(default: median when the profile keeps samples, else its points as stored; a decode pays "
                        "the mean, 'min' is an unloaded machine)")
    p.add_argument("--warmup-tokens", type=int, default=None, metavar="N",
                   help="--tree auto without --accept-stats: tokens of the warm-up decode (K-ary tree of depth 2) "
                        "on the prompt that measures per-node acceptance (default 32)")
    p.add_argument("--max-nodes", type=int, default=None, metavar="N",
                   help="--tree auto / dynamic: node budget per step, root included (auto: <= 64, default 64; "
                        "dynamic: default 16)")
    p.add_argument("--max-depth", type=int, default=None, metavar="L",
                   help="--tree auto / dynamic: largest depth (<= 8, default 8)")
    p.add_argument("--k-max", type=int, default=None, metavar="K",
                   help="--tree dynamic: most drafts at one node (default 4)")
    p.add_argument("--min-gain", type=float, default=None, metavar="G",
                   help="--tree dynamic: grant a draft only if reach x coverage gain, its value in expected "
                        "tokens, is at least G (default 0: until the budget is spent)")
    p.add_argument("--force-tree", action="store_true",
                   help="--tree auto: decode with the best tree even when it is predicted slower than the target alone "
                        "(default: decode target-only then)")
    p.add_argument("--draft-law", default=None, metavar="LAW",
                   help=f"joint law of the drafts at a node: {', '.join(LAW_KINDS)} "
                        "(default: the law the verifier implies; 'iid' for most)")
    p.add_argument("--temperature", type=float, default=1.0, help="target temperature (0 = greedy)")
    p.add_argument("--draft-temperature", default=None, metavar="T2",
                   help="draft temperature (default: --temperature); a comma list t1,...,tK means the independent law")
    p.add_argument("--top-k", type=int, default=None, help="top-k for target and draft")
    p.add_argument("--top-p", type=float, default=None, help="top-p for target and draft")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the tokenizer's end-of-sequence token")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                   help="model dtype (transformers engine)")
    p.add_argument("--engine", default=engine, choices=("transformers", "llama.cpp"),
                   help=f"transformers (model directories) or llama.cpp (GGUF files, the llama extra); default {engine}")
    p.add_argument("--bf16-target", action="store_true",
                   help="llama.cpp: the default target's BF16 GGUF (made once from the Q4_K_M file) instead of Q4_K_M")
    p.add_argument("--draft-ftype", default=None, metavar="FTYPE",
                   help="llama.cpp: the default draft requantized to FTYPE (q4_0: about a third cheaper per draft "
                        "token on AVX2 / AVX-512 CPUs; made once from the Q4_K_M file)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="llama.cpp threads (default: all cores)")


def _draft_temperature(raw):
    if raw is None:
        return None
    vals = float_list(raw, "draft_temperature")
    return vals if "," in str(raw) else vals[0]


def _tree(raw):
    if raw in (None, "full"):
        return None
    if raw in ("sequences", "auto", "dynamic"):
        return raw
    try:
        val = json.loads(raw)
    except json.JSONDecodeError:
        val = None
    if not isinstance(val, list):
        raise ArgumentError("tree", "must be 'full', 'sequences', 'auto', 'dynamic' or a JSON list of paths like "
                                    f"[[0],[1],[0,0]], got {raw!r}")
    return val


# flags that only some --tree modes read: given with another mode they would be ignored, so refused
_AUTO_ONLY = ("profile", "accept_stats", "accept_dataset", "profile_statistic", "warmup_tokens", "force_tree")
_DYNAMIC_ONLY = ("k_max", "min_gain")
_AUTO_OR_DYNAMIC = ("max_nodes", "max_depth")
_FIXED_ONLY = ("depth",)  # --tree auto / dynamic take --max-depth (and dynamic --k-max) instead
_DEFAULTS = dict(k="2", depth=4, warmup_tokens=32, max_depth=8, k_max=4)


def _tree_flags(args) -> None:
    """Refuse a flag that the chosen --tree mode would ignore (one line naming it and the mode
    that reads it), then fill in the defaults of the others."""
    mode = args.tree if args.tree in ("auto", "dynamic") else "fixed"

    def given(name):
        v = getattr(args, name)
        return v is not None and v is not False

    for names, modes, what in ((_AUTO_ONLY, ("auto",), "--tree auto"), (_DYNAMIC_ONLY, ("dynamic",), "--tree dynamic"),
                               (_AUTO_OR_DYNAMIC, ("auto", "dynamic"), "--tree auto or dynamic"),
                               (_FIXED_ONLY, ("fixed",), "fixed trees"),
                               (("k",), ("fixed", "auto"), "fixed trees and --tree auto")):
        for name in names:
            if given(name) and mode not in modes:
                alt = {"k": " (it takes --k-max)", "depth": " (it takes --max-depth)"}.get(name, "")
                raise ValueError(f"--{name.replace('_', '-')} applies to {what} only, not --tree {args.tree}{alt}")
    for name, value in _DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def check_args(args):
    """Every argument checked and resolved once, before any model is loaded:
    ``(settings, draft_temperature, tree, out)`` with ``settings`` the ``decoding.Settings`` that
    ``generate`` will take (``--tree auto``: a full K-ary tree until the tree is chosen).

    A bad argument raises ``ArgumentError`` naming the library argument (the CLI prints it with
    its flag) or a ValueError naming a flag of the CLI alone; one line, exit 2.
    """
    if not args.prompt:
        raise ValueError("--prompt is empty")
    out = check_out_file(args.out)
    settings, draft_temperature, tree = check_settings(args)
    return settings, draft_temperature, tree, out


def check_settings(args):
    """The models, engine and decoding flags (:func:`add_settings_flags`) checked and resolved
    once, before any model is loaded: ``(settings, draft_temperature, tree)`` (see
    :func:`check_args`); ``decode`` and ``serve`` share it."""
    from ..decoding import Settings

    _tree_flags(args)
    ks = k_list(args.k)
    if len(ks) != 1:
        raise ArgumentError("k", f": decode takes one number of drafts, got {args.k!r}")
    if args.engine == "llama.cpp":
        from .. import _optional

        if not _optional.available("llama_cpp"):
            raise ValueError(f"--engine llama.cpp needs llama-cpp-python: {_optional.hint('llama_cpp')}")
        if args.bf16_target and args.target is not None:
            raise ValueError("--bf16-target picks the default target's BF16 GGUF; drop it or --target")
        args.draft_ftype = draft_ftype(args.draft_ftype, args.draft)
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
    else:
        for flag, val in (("--bf16-target", args.bf16_target or None), ("--draft-ftype", args.draft_ftype),
                          ("--threads", args.threads)):
            if val is not None:  # --threads 0 included
                raise ValueError(f"{flag} applies to --engine llama.cpp only")
    draft_temperature = _draft_temperature(args.draft_temperature)
    tree = _tree(args.tree)
    target_only = args.verifier is not None and args.verifier.strip().lower() == "none"
    if target_only and args.rule is not None:
        raise ValueError("--rule verifies draft trees; --verifier none decodes with the target alone: drop one of them")
    if tree == "auto" and target_only:
        raise ValueError("--tree auto needs a --verifier (with 'none' there is no tree to choose)")
    sizes = dict(k=ks[0], depth=1 if tree == "auto" else args.depth)  # auto: a placeholder until chosen
    if tree == "dynamic":
        if target_only:
            raise ValueError("--tree dynamic needs a --verifier (with 'none' there is no tree)")
        if not 1 <= args.max_depth <= 8:
            raise ValueError(f"--max-depth must be in [1, 8], got {args.max_depth}")
        args.arg_mode = "dynamic"  # k and depth come from --k-max and --max-depth (cli.MODE_FLAGS)
        sizes = dict(k=args.k_max, depth=args.max_depth, max_nodes=16 if args.max_nodes is None else args.max_nodes,
                     min_gain=args.min_gain)
    elif args.min_gain is not None:
        raise ValueError("--min-gain applies to --tree dynamic only")
    elif args.max_nodes is None:
        args.max_nodes = 64
    who = {} if args.verifier is None else {"verifier": args.verifier}
    placeholder = None
    if tree == "auto":  # a K-ary tree of depth 1, or one chain for a sequence-level rule, until the tree is chosen
        placeholder = [[0]] if args.rule not in (None, "token_walk") else None
    settings = Settings.from_args(
        **who, rule=args.rule, **sizes, draft_law=args.draft_law, tree=placeholder if tree == "auto" else tree,
        temperature=args.temperature, draft_temperature=draft_temperature, top_k=args.top_k,
        top_p=args.top_p, max_new_tokens=args.max_new_tokens,
    )
    if args.engine == "llama.cpp" and settings.shape is not None:
        from ..trees import LLAMA_CPP_TREE_NODES

        if settings.shape.max_nodes() > LLAMA_CPP_TREE_NODES:
            raise ArgumentError("depth", f": the tree has {settings.shape.max_nodes() - 1} drafted nodes a step; "
                                         f"--engine llama.cpp takes at most {LLAMA_CPP_TREE_NODES - 1} (one batch)")
    check_common(args)  # --seed, --target / --draft
    return settings, draft_temperature, tree


def check_auto(args, settings):
    """--tree auto: ``(profile, stats, along, ks)``: the profile with its points by
    --profile-statistic, the acceptances of --accept-stats (``stats`` and, from a study,
    ``along``; both None without it: a warm-up decode measures them) and ``ks`` the numbers of
    drafts per node the verifier takes with the resolved law (``decoding.node_ks``), all <= --k."""
    from ..decoding import node_ks
    from ..decoding.treeopt import MAX_DEPTH, MAX_NODES, CostProfile

    if args.profile is None:
        raise ValueError("--tree auto needs --profile FILE (write one with `multidraft profile --out FILE`)")
    if not 2 <= args.max_nodes <= MAX_NODES:
        raise ValueError(f"--max-nodes must be in [2, {MAX_NODES}], got {args.max_nodes}")
    if not 1 <= args.max_depth <= MAX_DEPTH:
        raise ValueError(f"--max-depth must be in [1, {MAX_DEPTH}], got {args.max_depth}")
    if args.warmup_tokens < 1:
        raise ValueError(f"--warmup-tokens must be >= 1, got {args.warmup_tokens}")
    if args.accept_dataset is not None and args.accept_stats is None:
        raise ValueError("--accept-dataset needs --accept-stats FILE (a study's acceptance JSONL)")
    try:
        text = Path(args.profile).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--profile: cannot read {args.profile}: {exc.strerror or exc}") from None
    try:
        profile = CostProfile.from_json(text)
    except ValueError as exc:
        raise ValueError(f"--profile: {args.profile}: {exc}") from None
    statistic = args.profile_statistic or "median"
    try:   # the default takes a profile without samples as stored
        profile = profile.with_statistic(statistic, strict=args.profile_statistic is not None)
    except ValueError as exc:
        raise ValueError(f"--profile-statistic {statistic}: {args.profile}: {exc}") from None
    v = settings.verifier
    if v is None:  # a sequence-level rule: the node sizes it supports, rated by the specinfer walk (module notes)
        from ..decoding.settings import AUTO_PROXY, rule_node_ks
        from ..verifiers import get as get_verifier

        if settings.law != "iid":
            raise ArgumentError("rule", f": --tree auto rates trees with the {AUTO_PROXY} walk's i.i.d. acceptances; "
                                        f"rule {settings.rule!r} with the {settings.law!r} law has none: use --draft-law iid")
        ks = rule_node_ks(settings.rule, settings.law, settings.k)
        if not ks:
            raise ArgumentError("rule", f": {settings.rule!r} takes no K-ary tree with K <= {settings.k} "
                                        "(--tree auto chooses among such trees); use a fixed --tree")
        v = get_verifier(AUTO_PROXY)
    else:
        ks = node_ks(v, settings.law, settings.k)
    stats = along = None
    if args.accept_stats is not None:
        from ..experiments.acceptance import tree_acceptance

        td = settings.draft_temps   # per-draft temperatures: the study row's is the target's
        td = td[0] if len(set(td)) == 1 else settings.temperature
        try:
            stats, along = tree_acceptance(args.accept_stats, verifier=v.name, law=settings.law, ks=ks,
                                           t_target=settings.temperature, t_draft=td,
                                           dataset=args.accept_dataset)
        except ValueError as exc:
            raise ValueError(f"--accept-stats: {exc}") from None
    return profile, stats, along, ks


def _auto_tree(args, settings, auto, target, draft, input_ids, eos, log):
    """Acceptance statistics (given or from a warm-up decode) and the tree choice: ``(tree or None, info)``."""
    from .._validate import derive_seed
    from ..decoding import full_tree, generate
    from ..decoding.settings import AUTO_PROXY
    from ..decoding.treeopt import AcceptStats, choose_tree

    profile, stats, along, ks = auto
    if stats is None:
        records: list = []
        warmup = settings.derive(depth=2, tree=full_tree(settings.k, 2), max_new_tokens=args.warmup_tokens,
                                 **({} if settings.verifier is not None else {"verifier": AUTO_PROXY, "rule": None}))
        generate(target, draft, input_ids, warmup, eos_token_id=eos,
                 generator=derive_seed(args.seed, "tree-auto-warmup"), node_log=records)
        if not records:
            raise ValueError("--tree auto: the warm-up decode verified no tree node (it stopped at once); "
                             "give --accept-stats FILE or a longer prompt")
        stats = AcceptStats.from_records(records, max_k=settings.k, source=f"warm-up decode, {len(records)} nodes")
    usable = [k for k in ks if k in stats.accept]
    if not usable:
        raise ValueError(f"--accept-stats: no statistics for any k the verifier takes here ({ks}); have {list(stats.ks)}")
    stats = stats.restrict(usable)
    choice = choose_tree(profile, stats, max_nodes=args.max_nodes, max_depth=args.max_depth, along=along)
    use = choice.tree is not None and (choice.pays or args.force_tree)
    info = {**choice.to_dict(), "accept_stats": stats.to_dict(), "profile": args.profile,
            "profile_statistic": profile.statistic, "target_seconds_1": profile.target_seconds(1),
            "per_step_seconds": profile.per_step_seconds, "per_node_seconds": profile.per_node_seconds,
            "decoded_with": "tree" if use else "target-only", "forced": bool(args.force_tree and not choice.pays)}
    if log is not None:
        pe = profile.meta.get("engine", "transformers")
        pm = profile.meta.get("dtype")
        if pe != args.engine:
            log(f"tree auto: note: the profile was measured on {pe}, decoding on {args.engine}")
        elif pm and args.engine == "transformers" and pm != args.dtype:
            log(f"tree auto: note: the profile was measured in {pm}, decoding in {args.dtype}")
        log(f"tree auto: acceptance from {stats.source} ({choice.model} model); profile points: "
            f"{profile.statistic or 'as stored'} (target forward {1e3 * profile.target_seconds(1):.1f} ms; decoder's own "
            f"time {1e3 * profile.per_step_seconds:.1f} ms a step + {1e3 * profile.per_node_seconds:.2f} ms a node)")
        base = choice.target_only_tokens_per_s
        t = choice.tree
        if t is not None:
            log(f"tree auto: best tree {t.nodes} nodes, depth {t.depth}, E[tokens/step] {t.expected_tokens:.3f}, "
                f"predicted {t.tokens_per_s:.2f} tok/s vs target-only {base:.2f} tok/s ({choice.speedup:.2f}x): "
                f"{json.dumps(t.paths, separators=(',', ':'))}")
        if not choice.pays:
            log("tree auto: no tree beats the target alone under this profile; "
                + ("decoding with the best tree anyway (--force-tree)" if use else
                   "decoding target-only (--force-tree decodes with the best tree)"))
    return (choice.tree.paths if use else None), info


def _progress(enabled: bool):
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=None, desc="decode", unit="tok", file=sys.stderr, leave=False, dynamic_ncols=True)
    state = {"n": 0}

    def cb(done, total):
        bar.total = total
        bar.update(done - state["n"])
        state["n"] = done

    return cb, bar.close


def run(args) -> int:
    settings, draft_temperature, tree, out = check_args(args)
    auto = check_auto(args, settings) if tree == "auto" else None

    import torch

    from ..datasets import encode, has_chat_template
    from ..decoding import generate
    from ..decoding.pair import load_pair

    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.quiet:
        quiet_loading()
    llama = args.engine == "llama.cpp"
    target, draft, tok = load_pair(
        args.engine, target=args.target, draft=args.draft if not settings.target_alone else False,
        dtype=None if llama else getattr(torch, args.dtype), bf16_target=args.bf16_target,
        draft_ftype=args.draft_ftype if not settings.target_alone else None, n_threads=args.threads, log=log)
    coder = target if llama else tok  # the one encoder: the server's chat endpoint encodes a message the same way
    input_ids = torch.tensor([encode(coder, args.prompt, chat=args.chat and has_chat_template(coder))],
                             dtype=torch.long)  # [1, T]
    if llama:
        eos = None if args.ignore_eos else target.eos_token_ids
        detok = target.detokenize
    else:
        eos = None if args.ignore_eos else tok.eos_token_id
        detok = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    if input_ids.shape[1] < 1:
        raise ValueError("--prompt encodes to no tokens")
    auto_info = None
    if auto is not None:  # the chosen tree, or the target alone when no tree pays
        tree, auto_info = _auto_tree(args, settings, auto, target, draft, input_ids, eos, log)
        settings = settings.derive(tree=tree) if tree is not None else settings.derive(verifier=None)
    verifier = settings.verifier.name if settings.verifier is not None else None
    drafting = not settings.target_alone
    cb, close = _progress(not args.quiet)
    try:
        res = generate(target, draft if drafting else None, input_ids, settings,
                       generator=args.seed, eos_token_id=eos, progress=cb)
    finally:
        close()
    text = detok(res.tokens.tolist())
    if args.json or out is not None:
        obj = {
            "text": text,
            **res.to_dict(),
            "seed": args.seed,
            "settings": {
                "target": args.target or "default",
                "draft": (args.draft or "default") if drafting else None,
                "verifier": verifier or ("none" if not drafting else None),
                "rule": settings.rule,
                "law": settings.law if drafting else None,
                "K": settings.k if drafting else None,
                "depth": settings.depth if drafting else None,
                "tree": args.tree,
                "max_nodes": settings.shape.budget if tree == "dynamic" else None,
                "min_gain": settings.shape.min_gain if tree == "dynamic" else None,
                "temperature": args.temperature,
                "draft_temperature": draft_temperature,
                "top_k": args.top_k,
                "top_p": args.top_p,
                "max_new_tokens": args.max_new_tokens,
                "chat": args.chat,
                "engine": args.engine,
                "dtype": args.dtype if args.engine == "transformers" else None,
                "bf16_target": bool(args.bf16_target),
                "draft_ftype": args.draft_ftype,
                "threads": target.n_threads if args.engine == "llama.cpp" else None,
                "prompt": args.prompt,
                "prompt_tokens": int(input_ids.shape[1]),
            },
        }
        if auto_info is not None:
            obj["settings"]["auto"] = auto_info
            if tree is not None:
                obj["settings"]["K"] = max(p[-1] for p in tree) + 1
                obj["settings"]["depth"] = max(len(p) for p in tree)
        line = json.dumps(obj)
        if out is not None:
            try:
                out.write_text(line + "\n", encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"--out: cannot write {out}: {exc.strerror or exc}") from None
    if args.json:
        print(line)
    else:
        print(text)
        if not args.quiet:
            print(
                f"[{res.new_tokens} tokens, {res.target_calls} target calls, block efficiency "
                f"{res.block_efficiency:.2f}, acceptance {res.acceptance_rate:.2f}, {res.tokens_per_s:.1f} tok/s]",
                file=sys.stderr,
            )
    return 0
