"""``multidraft decode``: multi-draft speculative decoding of one prompt on local models.

Models default to the default pair (``multidraft.models.resolve_pair``);
``--target DIR --draft DIR`` take any local Hugging Face causal LM directories sharing a
tokenizer. ``--verifier none`` runs the target alone (the baseline).
"""
from __future__ import annotations

import json
import sys

from ..drafts import LAW_KINDS


def register(sub) -> None:
    p = sub.add_parser(
        "decode",
        help="generate from a prompt with multi-draft speculative decoding",
        description="Lossless multi-draft speculative decoding of one prompt; prints the text (or --json).",
    )
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--target", metavar="DIR", default=None, help="target model directory (default: the default pair)")
    p.add_argument("--draft", metavar="DIR", default=None, help="draft model directory (default: the default pair)")
    p.add_argument("--verifier", default="specinfer", help="registered verifier name, or 'none' for the target alone")
    p.add_argument("--drafts", type=int, default=2, metavar="K", help="drafts per tree node (default 2)")
    p.add_argument("--depth", type=int, default=4, metavar="L", help="draft tree depth (default 4)")
    p.add_argument("--tree", default="full",
                   help="'full' (K-ary tree), 'sequences' (K sequences merged into a trie) or a JSON list of paths")
    p.add_argument("--draft-law", default="iid", choices=LAW_KINDS, help="joint law of the drafts at a node")
    p.add_argument("--temperature", type=float, default=1.0, help="target temperature (0 = greedy)")
    p.add_argument("--draft-temperature", default=None, metavar="T2",
                   help="draft temperature (default: --temperature); a comma list t1,...,tK means the independent law")
    p.add_argument("--top-k", type=int, default=None, help="top-k for target and draft")
    p.add_argument("--top-p", type=float, default=None, help="top-p for target and draft")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the tokenizer's end-of-sequence token")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"), help="model dtype")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def _draft_temperature(raw):
    if raw is None:
        return None
    try:
        vals = [float(x) for x in str(raw).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--draft-temperature must be a number or a comma list of numbers, got {raw!r}") from None
    if not vals:
        raise ValueError("--draft-temperature is empty")
    return vals if "," in str(raw) else vals[0]


def _tree(raw):
    if raw in (None, "full"):
        return None
    if raw == "sequences":
        return "sequences"
    try:
        val = json.loads(raw)
    except json.JSONDecodeError:
        raise ValueError(f"--tree must be 'full', 'sequences' or a JSON list of paths like [[0],[1],[0,0]], got {raw!r}") from None
    if not isinstance(val, list):
        raise ValueError("--tree JSON must be a list of paths")
    return val


def _check_args(args) -> None:
    from .. import verifiers

    if args.verifier.lower() != "none" and args.verifier not in verifiers.names():
        raise ValueError(f"unknown verifier {args.verifier!r}; registered: {', '.join(verifiers.names())}, none")
    for name in ("drafts", "depth", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")


def _progress(enabled: bool):
    if not enabled:
        return None, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        def cb(done, total):
            print(f"\rdecode: {done}/{total} tokens", end="", file=sys.stderr, flush=True)

        return cb, lambda: print(file=sys.stderr)
    bar = tqdm(total=None, desc="decode", unit="tok", file=sys.stderr, leave=False, dynamic_ncols=True)
    state = {"n": 0}

    def cb(done, total):
        bar.total = total
        bar.update(done - state["n"])
        state["n"] = done

    return cb, bar.close


def run(args) -> int:
    import torch

    from ..decoding import generate
    from ..models import resolve_pair

    _check_args(args)
    draft_temperature = _draft_temperature(args.draft_temperature)
    tree = _tree(args.tree)
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    dtype = getattr(torch, args.dtype)
    target, draft, tok = resolve_pair(args.target, args.draft, dtype, log=log)
    if args.chat and getattr(tok, "chat_template", None):
        text_in = tok.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=False, add_generation_prompt=True)
    else:
        text_in = args.prompt
    input_ids = tok(text_in, return_tensors="pt")["input_ids"]
    if input_ids.shape[1] < 1:
        raise ValueError("--prompt encodes to no tokens")
    eos = None if args.ignore_eos else tok.eos_token_id
    verifier = None if args.verifier.lower() == "none" else args.verifier
    cb, close = _progress(not args.quiet)
    try:
        res = generate(
            target, draft if verifier is not None else None, input_ids,
            verifier=verifier, drafts=args.drafts, depth=args.depth, draft_law=args.draft_law, tree=tree,
            temperature=args.temperature, draft_temperature=draft_temperature, top_k=args.top_k, top_p=args.top_p,
            max_new_tokens=args.max_new_tokens, eos_token_id=eos, generator=args.seed, progress=cb,
        )
    finally:
        close()
    text = tok.decode(res.tokens.tolist(), skip_special_tokens=True)
    if args.json:
        obj = {
            "text": text,
            "new_tokens": res.new_tokens,
            "target_calls": res.target_calls,
            "draft_calls": res.draft_calls,
            "block_efficiency": res.block_efficiency,
            "acceptance_rate": res.acceptance_rate,
            "seconds": res.seconds,
            "tokens_per_s": res.tokens_per_s,
            "stop_reason": res.stop_reason,
            "accepted_lengths": res.accepted_lengths,
            "seed": args.seed,
            "settings": {
                "target": args.target or "default",
                "draft": (args.draft or "default") if verifier is not None else None,
                "verifier": verifier or "none",
                "drafts": args.drafts,
                "depth": args.depth,
                "tree": args.tree,
                "draft_law": "independent" if isinstance(draft_temperature, list) else args.draft_law,
                "temperature": args.temperature,
                "draft_temperature": draft_temperature,
                "top_k": args.top_k,
                "top_p": args.top_p,
                "max_new_tokens": args.max_new_tokens,
                "chat": args.chat,
                "dtype": args.dtype,
                "prompt": args.prompt,
                "prompt_tokens": int(input_ids.shape[1]),
            },
        }
        print(json.dumps(obj))
    else:
        print(text)
        if not args.quiet:
            print(
                f"[{res.new_tokens} tokens, {res.target_calls} target calls, block efficiency "
                f"{res.block_efficiency:.2f}, acceptance {res.acceptance_rate:.2f}, {res.tokens_per_s:.1f} tok/s]",
                file=sys.stderr,
            )
    return 0
