"""Where a llama.cpp decoding step's time goes, and how steady the target alone is.

Two measurements on one HumanEval prompt (chat template), the llama.cpp engine, T = 1:

1. ``breakdown``: single-draft SD (``naive``, a chain of ``--depth``) for ``--max-new-tokens``
   tokens; the step's wall time split into the target's ``llama_decode`` calls, the draft's,
   and everything else (logits processing, sampling, verification, KV-cache bookkeeping,
   Python), per step and per tree node (draft calls + target tokens).
2. ``alternation``: ``--rounds`` pairs of (target alone for 32 tokens, SD for 64 tokens),
   back to back in one process: ms per token of each, the SD step's split, the ratio and the
   load average, one line per pair. On the shared VM the target alone's one-token forward
   switches between two speeds while the SD step barely moves (docs/results/decode_speed/README.md).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/step_breakdown.py --bf16-target --draft-ftype q4_0

Prints only; benchmark only on a quiet machine (llama.cpp's 2-thread decode collapses under load).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from multidraft.datasets import encode_prompt, instruction_for, load_prompts
from multidraft._validate import derive_seed
from multidraft.decoding import generate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import common_args, load_average  # noqa: E402


def _run(target, draft, ids, kw, n, seed):
    target.decode_seconds = 0.0
    if draft is not None:
        draft.decode_seconds = 0.0
    r = generate(target, draft if kw.get("verifier") else None, ids, temperature=1.0, max_new_tokens=n,
                 generator=seed, **kw)
    t_s = target.decode_seconds
    d_s = draft.decode_seconds if kw.get("verifier") else 0.0
    return r, t_s, d_s


def _load1() -> str:
    load = load_average()
    return "unknown" if load is None else f"{load[0]:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bf16-target", action="store_true")
    ap.add_argument("--draft-ftype", default=None)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=10)
    common_args(ap, threads=2, seed=0, helps={"threads": "llama.cpp threads of each model"})
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from multidraft.decoding.pair import load_pair

    target, draft, _ = load_pair("llama.cpp", bf16_target=args.bf16_target, n_threads=args.threads,
                                 draft_ftype=args.draft_ftype)
    text = load_prompts("humaneval", 1)[0][1]
    ids = encode_prompt(target, text, instruction=instruction_for("humaneval"))
    sd = {"verifier": "naive", "k": 1, "depth": args.depth}
    print(f"step_breakdown: {target.path.name} + {draft.path.name}, {args.threads} threads, HumanEval/0, "
          f"seed {args.seed}, load average {_load1()}")
    _run(target, draft, ids, sd, 16, args.seed)  # warm-up

    r, t_s, d_s = _run(target, draft, ids, sd, args.max_new_tokens, args.seed)
    steps = r.target_calls
    nodes = r.draft_calls + r.tree_tokens
    rest = r.seconds - t_s - d_s
    print(f"breakdown, SD depth {args.depth}, {r.new_tokens} tokens, {steps} steps, block efficiency "
          f"{r.block_efficiency:.2f}: {r.seconds:.2f} s = target {t_s:.2f} s + draft {d_s:.2f} s + rest {rest:.2f} s; "
          f"rest {1000 * rest / steps:.1f} ms a step ({100 * rest / r.seconds:.1f}%), "
          f"{1000 * rest / nodes:.2f} ms per node ({nodes} nodes: draft calls + target tokens)")

    print("alternation: target alone 32 tokens | SD 64 tokens")
    for i in range(args.rounds):
        r0, _, _ = _run(target, draft, ids, {"verifier": None}, 32, derive_seed(args.seed, i, rule="linear"))
        r1, t_s, d_s = _run(target, draft, ids, sd, 64, derive_seed(args.seed, i, rule="linear"))
        n = r1.target_calls
        print(f"  target alone {1000 * r0.seconds / r0.new_tokens:6.1f} ms/token | SD {1000 * r1.seconds / r1.new_tokens:5.1f} "
              f"ms/token, step {1000 * r1.seconds / n:4.0f} ms (target {1000 * t_s / n:4.0f}, draft {1000 * d_s / n:3.0f}), "
              f"block eff {r1.block_efficiency:.2f} | ratio {r0.seconds / r0.new_tokens / (r1.seconds / r1.new_tokens):.2f} "
              f"| load {_load1()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
