"""Batched decoding against one ``generate`` call per prompt, on tiny random models, one run.

For B lanes (``--lanes``, default 1,2,4,8) the same B prompts and settings (K = 2, depth 3
full trees, specinfer, T = 1, ``--max-new-tokens``) are decoded twice, interleaved
``--reps`` times: by ``generate_batch`` (one shared forward per draft level and per target
pass for all lanes) and by B ``generate`` calls in turn. The tokens of the two are checked
equal (or the lanes that differ counted); the table gives the median wall times and ``speedup = sequential / batched`` (the
reference is measured in the same run: a shared machine's load hits both alike).

Engines (``--engine``): ``transformers`` (a random Qwen2 of ``--hidden`` width and 4 layers,
draft 2 layers, float32 on the CPU, or ``--device cuda``) and ``llama.cpp`` (``multidraft.
testing.tiny_gguf`` files, float32 weights, f16 KV cells, ``--threads``). ``--pair default``:
the project's default pair instead (llama.cpp: the BF16 target and the Q4_0 draft where built,
as ``multidraft serve`` loads them; transformers: bfloat16) and the first HumanEval prompts
through the chat template. ``--out FILE`` also writes the rows as JSONL (meta row: seed,
versions, config, CPU, load average).

    PYTHONPATH=src python benchmarks/batch_decode.py --engine llama.cpp --max-new-tokens 48
    PYTHONPATH=src python benchmarks/batch_decode.py --engine llama.cpp --pair default --threads 2 \
        --lanes 1,2,4 --max-new-tokens 32 --reps 1
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from multidraft.decoding import Settings, generate, generate_batch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import common_args, load_average, provenance  # noqa: E402


def _hf_pair(hidden: int, device: str):
    from transformers import AutoModelForCausalLM, Qwen2Config

    models = []
    for layers, seed in ((4, 0), (2, 1)):
        cfg = Qwen2Config(vocab_size=512, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                          num_attention_heads=max(1, hidden // 32), num_key_value_heads=max(1, hidden // 64),
                          max_position_embeddings=1024, tie_word_embeddings=False, use_sliding_window=False,
                          initializer_range=0.2)
        cfg._attn_implementation = "sdpa"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            models.append(AutoModelForCausalLM.from_config(cfg).eval().to(device))
    return models


def _llama_pair(threads: int, cache_type: str, flash=None):
    from multidraft.decoding.llamacpp import LlamaCppModel
    from multidraft.testing import tiny_gguf

    d = Path(tempfile.mkdtemp())
    kw = dict(n_ctx=4096, n_threads=threads, cache_type=cache_type, flash_attn=None if flash is None else bool(flash))
    return [LlamaCppModel(tiny_gguf(d / "t.gguf", seed=1, n_layer=4), **kw),
            LlamaCppModel(tiny_gguf(d / "d.gguf", seed=2, n_layer=2), **kw)]


def _default_pair(engine: str, threads: int, n: int):
    """The default pair and ``n`` HumanEval prompts through the chat template."""
    from multidraft.datasets import encode_prompt, instruction_for, load_prompts
    from multidraft.decoding.pair import load_pair
    from multidraft.models import default_gguf

    if engine == "llama.cpp":
        t, d, tok = load_pair("llama.cpp", bf16_target=default_gguf("target", "bf16").is_file(),
                              draft_ftype="q4_0" if default_gguf("draft", "q4_0").is_file() else None,
                              n_threads=threads, n_ctx=8192)
    else:
        t, d, tok = load_pair("transformers", dtype=torch.bfloat16)
    prompts = [encode_prompt(tok, text, instruction=instruction_for("humaneval"))
               for _, text in load_prompts("humaneval", n)]
    return t, d, prompts


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("transformers", "llama.cpp"), default="transformers")
    ap.add_argument("--lanes", default="1,2,4,8")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cache-type", choices=("f16", "f32"), default="f16", help="llama.cpp KV cells")
    ap.add_argument("--flash-attn", type=int, choices=(0, 1), default=None, help="llama.cpp flash attention (default: its choice)")
    ap.add_argument("--pair", choices=("tiny", "default"), default="tiny",
                    help="tiny random models (default) or the project's default pair on HumanEval prompts")
    common_args(ap, threads=1, out=None, out_type=str, helps={"out": "also write the rows as JSONL"})
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lanes = [int(x) for x in args.lanes.split(",")]
    if args.pair == "default":
        t, d, prompts = _default_pair(args.engine, args.threads, max(lanes))
    else:
        t, d = _hf_pair(args.hidden, args.device) if args.engine == "transformers" else _llama_pair(args.threads, args.cache_type, args.flash_attn)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(1, 200, (1, 8 + 3 * i), generator=g) for i in range(max(lanes))]
    s = Settings.from_args(verifier="specinfer", k=2, depth=3, temperature=1.0, max_new_tokens=args.max_new_tokens)
    out = open(args.out, "w", encoding="utf-8") if args.out else None
    if out is not None:
        out.write(json.dumps({"type": "meta", "seed": "lane i: seed i", "config": vars(args), **provenance(),
                              "settings": "specinfer, K = 2, depth 3, full tree, T = 1"}) + "\n")
    print(f"engine {args.engine} ({args.pair} pair), {args.max_new_tokens} new tokens per lane, medians of {args.reps}")
    print(f"{'lanes':>5} {'batched s':>10} {'sequential s':>13} {'speedup':>8} {'tokens':>7}")
    for B in lanes:
        tb, ts = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            got = generate_batch(t, d, prompts[:B], s, generator=list(range(B)))
            tb.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ref = [generate(t, d, prompts[i], s, generator=i) for i in range(B)]
            ts.append(time.perf_counter() - t0)
            differ = sum(a.tokens.tolist() != b.tokens.tolist() for a, b in zip(got, ref))
        mb, ms = statistics.median(tb), statistics.median(ts)
        n = sum(r.new_tokens for r in got)
        print(f"{B:>5} {mb:>10.3f} {ms:>13.3f} {ms / mb:>7.2f}x {n:>7}"
              + (f"  ({differ} of {B} lanes' tokens differ from generate's)" if differ else ""), flush=True)
        if out is not None:
            out.write(json.dumps({"type": "row", "lanes": B, "batched_s": tb, "sequential_s": ts, "speedup": ms / mb,
                                  "tokens": n, "lanes_differ": differ, "load_average": load_average()}) + "\n")
            out.flush()
    if out is not None:
        out.close()


if __name__ == "__main__":
    main()
