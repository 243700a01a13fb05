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
second (``decoding.auto``, with ``decoding.treeopt.choose_tree``) from the cost profile written by ``multidraft
profile`` (its points recomputed from the kept samples by ``--profile-statistic``, default
median) and acceptance statistics: ``--accept-stats FILE``, either a study's acceptance JSONL
(``multidraft experiment paper|acceptance``; the verifier's per-position acceptances under its
law at the decode's temperatures, data set ``--accept-dataset``, rated along the text) or a
statistics JSON, or else a warm-up decode of ``--warmup-tokens`` on the prompt with a K-ary
tree of depth 2 (its own seed stream, so the choice is independent of the decode's randomness
and the decode stays lossless). It prints the tree, its expected tokens per step and the
predicted tokens/s against the target alone; when no tree is predicted faster it decodes
target-only, unless ``--force-tree``.

``--sources`` (a comma list of ``model``, ``lookup``, ``suffix``; default ``model``) names the draft
sources of each step's tree. Without ``model`` (``--sources lookup``, ``suffix`` or
``lookup,suffix``) the free sources draft alone, as vLLM's ``ngram`` method: no draft model is
loaded or run (``--draft`` is then not loaded, with a warning), each step's tree is their copied
chains, verified exactly by the walk's free-first rule, and a step with nothing to copy is one
target step; ``--verifier``, ``--rule``, ``--k``, ``--depth``, ``--tree``, ``--draft-law``,
``--draft-temperature`` and ``--draft-ftype`` shape the draft model's drafts and are refused with it.

``--sources lookup,suffix --tree auto --profile FILE``: free sources alone have no model tree to
choose, so ``--tree auto`` cuts each step's copied chains by cost from the profile
(``decoding.sources.budget.FreeBudget``: a copied token is proposed while its measured chance of
being kept pays for the wider target pass; depth 0 is a plain target step); the flags that rate or
bound a model tree (``--accept-stats``, ``--warmup-tokens``, ``--force-tree``, ``--max-nodes``,
``--max-depth``) are refused with it.

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

from .._errors import ArgumentError
from ._args import check_common, check_out_file, draft_ftype, float_list, k_list, quiet_loading, warn

# drafts.LAW_KINDS, spelled here so that parsing (and a refusal) imports no torch (a test pins them equal)
LAW_KINDS = ("iid", "wor", "greedy", "independent")


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


DEFAULT_CTX = 4096  # llama.cpp's n_ctx of the models (decoding.pair.load_pair's default)
MIN_CTX = 256  # llama.cpp's parallel sequence count: a smaller context aborts it (decoding.llamacpp.LlamaCppModel)
MAX_CTX = 131072  # the largest --ctx-size (Qwen2.5's longest context with YaRN; the KV cells are allocated at load)


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
    p.add_argument("--sources", default=None, metavar="NAMES",
                   help="draft sources of each step's tree, a comma list of model, lookup, suffix (default: model, "
                        "the draft model); without model the free sources draft alone (no draft model loaded)")
    p.add_argument("--temperature", type=float, default=1.0, help="target temperature (0 = greedy)")
    p.add_argument("--draft-temperature", default=None, metavar="T2",
                   help="draft temperature (default: --temperature); a comma list t1,...,tK means the independent law")
    p.add_argument("--top-k", type=int, default=None, help="top-k for target and draft")
    p.add_argument("--top-p", type=float, default=None, help="top-p for target and draft")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the tokenizer's end-of-sequence token")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                   help="model dtype (transformers engine; default bfloat16)")
    p.add_argument("--engine", default=engine, choices=("transformers", "llama.cpp"),
                   help=f"transformers (model directories) or llama.cpp (GGUF files, the llama extra); default {engine}")
    p.add_argument("--bf16-target", action="store_true",
                   help="llama.cpp: the default target's BF16 GGUF (made once from the Q4_K_M file) instead of Q4_K_M")
    p.add_argument("--draft-ftype", default=None, metavar="FTYPE",
                   help="llama.cpp: the default draft requantized to FTYPE (q4_0: about a third cheaper per draft "
                        "token on AVX2 / AVX-512 CPUs; made once from the Q4_K_M file)")
    p.add_argument("--ctx-size", type=int, default=None, metavar="N",
                   help=f"--engine llama.cpp: each model's context in tokens (KV cells; the prompt, the output and one "
                        f"step's draft tree must fit; serve's lanes share them; default {DEFAULT_CTX}, at least {MIN_CTX}, at most "
                        f"{MAX_CTX}, capped by the model's training context)")
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
_DEFAULTS = dict(k="2", depth=4, max_depth=8, k_max=4)  # --warmup-tokens: decoding.auto.WARMUP_TOKENS


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


# flags that only a decode with drafts reads: with --verifier none (the target alone) they would be ignored
_DRAFTING_ONLY = ("k", "depth", "draft_law", "draft_temperature", "sources", "draft_ftype")


def _target_only_flags(args, target_only: bool) -> list[str]:
    """--verifier none decodes with the target alone: a flag of the drafts is refused (one line
    naming it); ``--draft`` is named in a warning (the draft model is not loaded), returned to
    be printed once every check has passed."""
    if not target_only:
        return []
    for name in _DRAFTING_ONLY:
        if getattr(args, name) is not None:
            raise ValueError(f"--{name.replace('_', '-')} applies to decoding with drafts; --verifier none decodes "
                             "with the target alone: drop one of them")
    if args.tree not in (None, "full", "auto", "dynamic"):  # auto and dynamic are refused by name below
        raise ValueError(f"--tree {args.tree} shapes draft trees; --verifier none decodes with the target alone: "
                         "drop one of them")
    return ["--draft is not loaded: --verifier none decodes with the target alone"] if args.draft is not None else []


def _free_only_flags(args, target_only: bool):
    """``--sources`` without ``model`` (free-only decoding: prompt lookup and / or the suffix index
    alone, no draft model; ``decoding.Settings.from_args`` notes): None for any other decode, else
    the draft model's size flags the user gave (``k``, ``depth``; the settings refuse them, naming
    the flag). A flag that shapes the draft model's tree or loads it is refused here (one line)."""
    if target_only or args.sources is None:
        return None
    if "model" in [s.strip() for s in str(args.sources).split(",")]:
        return None
    for name in ("draft_ftype", "max_nodes", "max_depth", "k_max", "min_gain"):
        if getattr(args, name, None) is not None:
            raise ValueError(f"--{name.replace('_', '-')} applies to the draft model; --sources {args.sources} drafts "
                             "with free sources alone (no draft model): drop one of them, or add model to --sources")
    if args.tree not in (None, "full", "auto"):  # auto: the free chains cut by cost (decoding.auto notes)
        raise ValueError(f"--tree {args.tree} shapes the draft model's trees; --sources {args.sources} drafts with "
                         "free sources alone (each to its own depth, or cut by cost with --tree auto --profile FILE): "
                         "drop one of them, or add model to --sources")
    return tuple(name for name in ("k", "depth") if getattr(args, name) is not None)


def _early_sizes(args) -> None:
    """The signs of the size flags, checked before the decoder's settings are imported (with
    torch): a bad one is refused at once; the settings check them again, fully."""
    for name in ("k", "depth", "k_max", "max_depth", "max_new_tokens", "warmup_tokens"):
        raw = getattr(args, name, None)
        if raw is None:
            continue
        if name == "k":
            vals = k_list(raw)
            bad = next((v for v in vals if v < 1), None)
            if bad is not None:
                raise ArgumentError("k", f"must be >= 1 (number of drafts), got {bad}")
        elif isinstance(raw, int) and raw < 1:
            raise ArgumentError(name, f"must be >= 1, got {raw}")


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
    if settings.free_only and args.draft is not None:
        warn(args, f"--draft is not loaded: --sources {args.sources} drafts with free sources alone")
    return settings, draft_temperature, tree, out


def check_settings(args):
    """The models, engine and decoding flags (:func:`add_settings_flags`) checked and resolved
    once, before any model is loaded: ``(settings, draft_temperature, tree)`` (see
    :func:`check_args`); ``decode`` and ``serve`` share it."""
    target_only = args.verifier is not None and args.verifier.strip().lower() == "none"
    warnings = _target_only_flags(args, target_only)
    free_only = _free_only_flags(args, target_only)
    if args.engine == "llama.cpp" and args.dtype is not None:
        raise ValueError("--dtype applies to --engine transformers only (llama.cpp runs the GGUF's own types)")
    if args.engine != "llama.cpp" and args.dtype is None:
        args.dtype = "bfloat16"
    _tree_flags(args)
    _early_sizes(args)
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
        if args.ctx_size is not None and not MIN_CTX <= args.ctx_size <= MAX_CTX:
            raise ValueError(f"--ctx-size must be in [{MIN_CTX}, {MAX_CTX}], got {args.ctx_size}")
    else:
        for flag, val in (("--bf16-target", args.bf16_target or None), ("--draft-ftype", args.draft_ftype),
                          ("--threads", args.threads), ("--ctx-size", args.ctx_size)):
            if val is not None:  # --threads 0 included
                raise ValueError(f"{flag} applies to --engine llama.cpp only")
    draft_temperature = _draft_temperature(args.draft_temperature)
    draft_ts = [0.0] if draft_temperature is None else list(draft_temperature) if isinstance(draft_temperature, list) \
        else [draft_temperature]
    if args.temperature == 0 and all(t == 0 for t in draft_ts) and (args.top_k is not None or args.top_p is not None):
        warnings.append("--top-k and --top-p change nothing at --temperature 0 with greedy drafts (the argmax is in "
                        "every top-k and top-p set)")
    tree = _tree(args.tree)
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
    if free_only is not None:  # the draft model's sizes only where given (Settings.from_args refuses them, naming the flag)
        sizes = {name: sizes[name] for name in free_only}
    placeholder = None
    if tree == "auto":  # a K-ary tree of depth 1, or one chain for a sequence-level rule, until the tree is chosen
        placeholder = [[0]] if args.rule not in (None, "token_walk") else None
    from ..decoding import Settings  # torch loads here, once the flags above are known good

    settings = Settings.from_args(
        **who, rule=args.rule, **sizes, draft_law=args.draft_law, tree=placeholder if tree == "auto" else tree,
        temperature=args.temperature, draft_temperature=draft_temperature, top_k=args.top_k,
        top_p=args.top_p, max_new_tokens=args.max_new_tokens, sources=args.sources,
    )
    if args.engine == "llama.cpp" and not settings.target_alone:
        from ..trees import LLAMA_CPP_TREE_NODES

        if settings.max_nodes > LLAMA_CPP_TREE_NODES:
            raise ArgumentError("depth" if settings.uses_draft else "sources", f": the tree has {settings.max_nodes - 1} drafted nodes a step "
                                         "(free sources' chains included); "
                                         f"--engine llama.cpp takes at most {LLAMA_CPP_TREE_NODES - 1} (one batch)")
    check_common(args)  # --seed, --target / --draft
    for msg in warnings:
        warn(args, msg)
    return settings, draft_temperature, tree


def auto_request(args):
    """--tree auto: the ``decoding.auto.AutoRequest`` of the flags (checked by
    ``decoding.auto.check_auto``, study files read by ``experiments.acceptance.tree_acceptance``);
    ``decode`` and ``serve`` share it."""
    from ..decoding.auto import AutoRequest

    return AutoRequest(
        profile=args.profile, profile_statistic=args.profile_statistic, accept_stats=args.accept_stats,
        accept_dataset=args.accept_dataset, warmup_tokens=args.warmup_tokens, max_nodes=args.max_nodes,
        max_depth=args.max_depth, force_tree=bool(args.force_tree), seed=args.seed, engine=args.engine,
        dtype=args.dtype)


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
    auto = None
    if tree == "auto":  # checked before any model loads
        from ..decoding.auto import check_auto
        from ..experiments.acceptance import tree_acceptance

        auto = check_auto(auto_request(args), settings, read_acceptance=tree_acceptance)

    import torch

    from ..datasets import encode, has_chat_template
    from ..decoding import generate
    from ._args import load_models

    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.quiet:
        quiet_loading()
    llama = args.engine == "llama.cpp"
    target, draft, tok = load_models(
        args.engine, target=args.target, draft=args.draft if settings.uses_draft else False,
        dtype=None if llama else getattr(torch, args.dtype), bf16_target=args.bf16_target,
        draft_ftype=args.draft_ftype if settings.uses_draft else None, n_threads=args.threads, log=log,
        **({"n_ctx": args.ctx_size or DEFAULT_CTX} if llama else {}))
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
        from ..decoding.auto import choose

        tree, auto_info = choose(target, draft, input_ids, settings, auto, eos, log)
        if tree is not None:
            settings = settings.derive(tree=tree)
        elif not auto.free_only:  # free sources alone stay so: the profile cuts their chains as the decode goes
            settings = settings.derive(verifier=None)
    drafting = settings.uses_draft  # the target alone and free-only decoding run no draft model
    cb, close = _progress(not args.quiet)
    try:
        res = generate(target, draft if drafting else None, input_ids, settings,
                       generator=args.seed, eos_token_id=eos, progress=cb,
                       cost_profile=auto.profile if auto is not None and not settings.target_alone else None)
    finally:
        close()
    text = detok(res.tokens.tolist())
    if args.json or out is not None:
        obj = {
            "text": text,
            **res.to_dict(),
            "seed": args.seed,
            "settings": settings.describe(),  # the one description (result rows, the server's speculative object)
            "run": {
                "target": args.target or "default",
                "draft": (args.draft or "default") if drafting else None,
                "engine": args.engine,
                "dtype": args.dtype if args.engine == "transformers" else None,
                "bf16_target": bool(args.bf16_target),
                "draft_ftype": args.draft_ftype,
                "threads": target.n_threads if args.engine == "llama.cpp" else None,
                "chat": args.chat,
                "prompt": args.prompt,
                "prompt_tokens": int(input_ids.shape[1]),
            },
        }
        if auto_info is not None:
            obj["auto"] = auto_info
        line = json.dumps(obj)
        if out is not None:
            from ..experiments.records import write_file

            try:
                write_file(out, line + "\n", "write the --out file")  # the whole line or nothing
            except OSError as exc:
                raise ValueError(f"--out: {out}: {exc.strerror or exc}") from None  # nothing written
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
