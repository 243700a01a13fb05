"""End-to-end decoding speed on the real pair (default: Qwen2.5-Coder 1.5B target / 0.5B draft).

For 8 HumanEval prompts, 128 new tokens, temperature 1 (pure sampling: no top-k/top-p),
every method decodes every prompt in turn (interleaved, so load swings on a shared machine
hit all methods alike):

* ``target-only``     multidraft.generate(verifier=None): the reference for every ratio;
* ``hf-assisted``     transformers' own assisted generation, ``target.generate(...,
                      assistant_model=draft, do_sample=True)`` (its default dynamic number of
                      assistant tokens); target calls are counted with a forward hook
                      (all of them: its first call verifies candidates together with the
                      prompt prefill, which multidraft.generate runs as a separate call);
* ``SD naive K=1``    single-draft speculative decoding, a draft chain of depth L;
* every multi-draft verifier at K = 2, 4 (full K-ary tree of depth L, its default law).

Printed: tokens/s, block efficiency (new tokens per target forward pass), the ratio of
tokens/s to target-only measured in the same run, and the best multi-draft row against
hf-assisted and against single-draft SD. ``--out FILE`` also writes JSONL rows.

    .venv/bin/python benchmarks/decode_speed.py                   # the full run (long on 2 cores)
    .venv/bin/python benchmarks/decode_speed.py --prompts 2 --max-new-tokens 32 --k 2
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from multidraft.cli._args import k_list, name_list
from multidraft.datasets import encode_prompt, load_prompts
from multidraft.decoding import generate
from multidraft.models import resolve_pair
from multidraft.experiments.demo import Method, format_table, plan_methods, summarize
from multidraft.experiments.records import JsonlWriter

HF = Method("hf-assisted", "hf-assisted", 0, "hf")


def _eprint(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class CallCounter:
    """Counts forward passes of a module (pre-hook)."""

    def __init__(self, module):
        self.n = 0
        self._h = module.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.n += 1

    def close(self):
        self._h.remove()


def hf_assisted(target, draft, ids, *, max_new_tokens, temperature, eos, pad, seed) -> dict:
    torch.manual_seed(seed)  # transformers samples from the global RNG
    t_calls, d_calls = CallCounter(target), CallCounter(draft)
    try:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), assistant_model=draft, do_sample=True,
                temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                eos_token_id=eos, pad_token_id=pad,
            )
        secs = time.perf_counter() - t0
    finally:
        t_calls.close()
        d_calls.close()
    new = int(out.shape[1] - ids.shape[1])
    # every target call counts: assisted generation verifies its first candidates in the same
    # forward pass as the prompt prefill, so there is no separate prefill call to exclude
    calls = max(t_calls.n, 1)
    return {"new_tokens": new, "target_calls": calls, "draft_calls": d_calls.n, "seconds": secs,
            "block_efficiency": new / calls, "acceptance_rate": float("nan"),
            "tokens_per_s": new / secs if secs > 0 else float("nan")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="local target model dir (default pair otherwise)")
    ap.add_argument("--draft", default=None, help="local draft model dir")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--k", default="2,4", help="drafts per node for the multi-draft rows, e.g. 2,4 or 2-8 (default 2,4)")
    ap.add_argument("--verifiers", default=None, help="comma-separated multi-draft verifiers (default: all registered)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    ap.add_argument("--no-eos", action="store_true", help="always generate max-new-tokens tokens")
    ap.add_argument("--out", default=None, help="JSONL results file")
    args = ap.parse_args(argv)

    try:
        ks = tuple(k_list(args.k, "--k"))
        verifiers = tuple(name_list(args.verifiers, "--verifiers")) if args.verifiers else None
    except ValueError as exc:
        ap.error(str(exc))
    methods, skipped = plan_methods(ks, verifiers)
    if not args.no_hf:
        methods.insert(1, HF)
    prompts = load_prompts("humaneval", args.prompts)
    target, draft, tok = resolve_pair(args.target, args.draft, log=_eprint)
    eos = None if args.no_eos else tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    encoded = [(tid, encode_prompt(tok, text)) for tid, text in prompts]
    print(f"decode_speed: {len(prompts)} HumanEval prompts, {args.max_new_tokens} new tokens, T={args.temperature:g}, "
          f"depth {args.depth}, K in {list(ks)}, torch threads {torch.get_num_threads()}, seed {args.seed}", flush=True)
    for note in skipped:
        print(f"skipped {note}")

    # warm-up
    ids0 = encoded[0][1]
    generate(target, draft, ids0, verifier=None, max_new_tokens=2, generator=args.seed)
    generate(target, draft, ids0, verifier="naive", k=1, depth=args.depth, max_new_tokens=2, generator=args.seed)
    if not args.no_hf:
        hf_assisted(target, draft, ids0, max_new_tokens=4, temperature=args.temperature, eos=eos, pad=pad, seed=0)

    writer = None
    if args.out:
        cfg = {k: v for k, v in vars(args).items()} | {"methods": [m.label for m in methods]}
        writer = JsonlWriter(Path(args.out), cfg, args.seed, kind="decode_speed", skipped=skipped)
    rows = []
    t_all = time.perf_counter()
    n_runs = len(encoded) * len(methods)
    for pi, (tid, ids) in enumerate(encoded):
        for m in methods:
            seed = args.seed * 1_000_003 + pi
            if m is HF:
                r = hf_assisted(target, draft, ids, max_new_tokens=args.max_new_tokens,
                                temperature=args.temperature, eos=eos, pad=pad, seed=seed)
            else:
                res = generate(target, draft, ids, temperature=args.temperature,
                               max_new_tokens=args.max_new_tokens, eos_token_id=eos,
                               generator=torch.Generator().manual_seed(seed), **m.kwargs(args.depth))
                r = {k: getattr(res, k) for k in ("new_tokens", "target_calls", "draft_calls", "seconds",
                                                  "block_efficiency", "acceptance_rate", "tokens_per_s")}
            row = {"kind": "run", "method": m.label, "verifier": m.verifier if m is not HF else "hf-assisted",
                   "K": m.k, "law": m.law, "depth": args.depth, "prompt": tid,
                   **{k: (float(v) if isinstance(v, float) else int(v)) for k, v in r.items()}}
            rows.append(row)
            if writer:
                writer.write(**row)
            _eprint(f"[{len(rows)}/{n_runs}] {tid} {m.label}: {row['new_tokens']} tokens, "
                    f"{row['tokens_per_s']:.2f} tok/s, block eff {row['block_efficiency']:.2f}")
    summary = summarize(rows, methods)
    if writer:
        for s in summary:
            writer.write(kind="summary", **s)
        writer.close()

    print()
    print(format_table(summary))
    multi = [s for s in summary if s["verifier"] not in (None, "naive", "hf-assisted")]
    by = {s["method"]: s for s in summary}
    if multi:
        best = max(multi, key=lambda s: s["tokens_per_s"])
        best_be = max(multi, key=lambda s: s["block_efficiency"])
        print()
        print(f"best multi-draft by tokens/s: {best['method']} at {best['tokens_per_s']:.2f} tok/s "
              f"({best['speedup']:.2f}x target-only)")
        if "hf-assisted" in by:
            hf = by["hf-assisted"]
            print(f"  vs hf-assisted ({hf['tokens_per_s']:.2f} tok/s, block eff {hf['block_efficiency']:.2f}): "
                  f"{best['tokens_per_s'] / hf['tokens_per_s']:.2f}x tokens/s")
        sd = by.get("SD naive K=1")
        if sd:
            print(f"  vs single-draft SD ({sd['tokens_per_s']:.2f} tok/s): {best['tokens_per_s'] / sd['tokens_per_s']:.2f}x tokens/s; "
                  f"best block efficiency {best_be['method']} {best_be['block_efficiency']:.2f} vs SD {sd['block_efficiency']:.2f}")
    print(f"wall time {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
