"""Milliseconds per node of every verifier on a GPU, against a torch.softmax of the same rows.

    .venv/bin/python benchmarks/gpu_verify.py [--device cuda] [--vocab 151936] [--batches 1,64]
        [--ks 2,3,4,6,8] [--verifiers ...] [--repeats 5] [--out gpu_verify.jsonl]

For every registered verifier (``lp_optimal`` skipped: an LP over all draft tuples, small V
only), at B = 1 and 64 rows and K = 2..8 drafts (the verifier's implied law at that K; a
(verifier, K) it does not take is skipped), V = 151,936: the median (upper middle) over ``--repeats`` of one
``verify(p, q, drafts, generator, law, validate=False)`` call on tensors that live on the
device, timed with ``torch.cuda.synchronize()`` before and after (wall clock), printed as ms
per batch and ms per node (per row), with ``torch.softmax`` over the same [B, V] logits timed
the same way in the same run as the reference (what the target already pays per step).

Rows: LM-like logits (a peaked head over a Gaussian tail, the draft a noisy tempered copy),
made on the device from a seeded generator on the device; drafts drawn by ``drafts.make`` on
the device. Nothing is moved between host and device inside the timed call except what the
rule itself moves.

Without a CUDA device it exits with a message (status 2). ``--device cpu`` runs the same
script on the CPU (for a smoke test at a tiny size: ``--vocab 64 --batches 1,2 --ks 2``); it
is never run by the tests at full size.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _bench import common_args, provenance, timed, write_jsonl  # noqa: E402
from multidraft import drafts as _drafts  # noqa: E402
from multidraft._validate import derive_seed  # noqa: E402
from multidraft import verifiers as _verifiers  # noqa: E402

SKIP = {"lp_optimal": "a linear program over all draft tuples: small-V reference only"}


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def make_rows(B: int, V: int, dev: torch.device, seed: int):
    """LM-like (logits [B, V], p [B, V], q [B, V]) on dev, float32."""
    g = torch.Generator(device=dev).manual_seed(seed)
    logits = 2.5 * torch.randn(B, V, generator=g, device=dev)
    head = min(64, V)
    logits[:, :head] += 6 * torch.rand(B, head, generator=g, device=dev)
    p = torch.softmax(logits, -1)
    q = torch.softmax((logits + 0.6 * torch.randn(B, V, generator=g, device=dev)) / 1.1, -1)
    return logits, p, q


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a smoke test")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--ks", default="2,3,4,6,8")
    ap.add_argument("--verifiers", default=None, help="comma-separated (default: every registered one but lp_optimal)")
    common_args(ap, repeats=5, seed=0, out=None, helps={"out": "JSONL: one meta line, then one line per (verifier, B, K)"})
    args = ap.parse_args(argv)

    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("gpu_verify: no CUDA device is available here (torch.cuda.is_available() is False); "
              "run it on a machine with a GPU, or pass --device cpu for a smoke test", file=sys.stderr)
        return 2
    V = args.vocab
    batches = [int(x) for x in args.batches.split(",") if x.strip()]
    ks = [int(x) for x in args.ks.split(",") if x.strip()]
    names = args.verifiers.split(",") if args.verifiers else [n for n in _verifiers.names() if n not in SKIP]
    name_dev = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    meta = {"kind": "meta", "benchmark": "gpu_verify", "device": str(dev), "device_name": name_dev, "V": V,
            "batches": batches, "ks": ks, "repeats": args.repeats, "seed": args.seed, "torch": torch.__version__,
            "statistic": "median ms of one verify call (validate=False), synchronised", "skipped": SKIP, **provenance()}
    print(f"device {dev} ({name_dev}), V = {V}, torch {torch.__version__}, {args.repeats} repeats")
    rows = []
    print(f"{'verifier':<15}{'law':<12}{'B':>4}{'K':>3}{'ms/batch':>10}{'ms/node':>9}{'softmax':>9}{'/softmax':>9}")
    for B in batches:
        logits, p, q = make_rows(B, V, dev, args.seed)
        t_soft = timed(lambda: torch.softmax(logits, -1), args.repeats, lambda: sync(dev))
        print(f"{'torch.softmax':<15}{'':<12}{B:>4}{'':>3}{t_soft:10.3f}{t_soft / B:9.3f}")
        for name in names:
            v = _verifiers.get(name)
            for K in ks:
                try:
                    kind = v.implied_law(K)
                except ValueError:
                    continue
                if not v.supports(kind, K):
                    continue
                g = torch.Generator(device=dev).manual_seed(derive_seed(args.seed, 1, rule="linear"))
                law = _drafts.make(kind, q, K) if kind != "independent" else _drafts.independent(q.unsqueeze(-2).expand(B, K, V))
                qk = q if kind != "independent" else q.unsqueeze(-2).expand(B, K, V)
                dr = law.sample(g)
                gv = torch.Generator(device=dev).manual_seed(derive_seed(args.seed, 2, rule="linear"))
                ms = timed(lambda: v.verify(p, qk, dr, generator=gv, law=kind, validate=False), args.repeats, lambda: sync(dev))
                row = {"kind": "verify", "verifier": name, "law": kind, "B": B, "K": K, "ms_per_batch": ms,
                       "ms_per_node": ms / B, "softmax_ms": t_soft, "ratio_to_softmax": ms / t_soft}
                rows.append(row)
                print(f"{name:<15}{kind:<12}{B:>4}{K:>3}{ms:10.3f}{ms / B:9.3f}{t_soft:9.3f}{ms / t_soft:9.2f}", flush=True)
    if args.out:
        write_jsonl(args.out, meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
