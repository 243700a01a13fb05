"""How long ``/health`` of ``multidraft serve`` takes while the server is busy (issue 41, item 4).

A server of the tiny GGUF pair (``multidraft.testing.tiny_gguf``: byte-level BPE, B = 13 bytes a
token; llama.cpp, context ``--ctx`` (at most the files' 512), specinfer K = 2, depth 3, end-of-sequence ignored) runs in
a child process (``--serve``); this process measures ``GET /health`` latency (a fresh
connection each time, as a load balancer's probe) in four phases of ``--seconds`` each:

``idle``        nothing else in flight;
``generate``    ``--streams`` clients streaming long generations (``max_tokens`` = the context - 32)
                back to back;
``big``         one client posting prompts of ``--prompt-mib`` MiB (allowed: under the 4 MiB body
                limit) back to back: each is refused by the byte bound before tokenization
                (``datasets.ByteBound``), or with ``--no-bound`` tokenized by llama.cpp first
                and refused by its exact count (the server before the bound);
``both``        the two at once.

Per phase: health probes, their median, 99th percentile and largest latency in ms, and how many
were answered while a big request was in flight; the big requests' and streams' counts. Rows go
to ``--out`` (JSONL, meta row first) and a table to stdout::

    python benchmarks/serve_health.py --out /tmp/health.jsonl
    python benchmarks/serve_health.py --no-bound --out /tmp/health-nobound.jsonl
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402


def serve(port: int, ctx: int, no_bound: bool) -> int:
    """The child: the tiny GGUF pair served on 127.0.0.1:``port`` until SIGTERM."""
    import logging

    from multidraft.decoding import Settings
    from multidraft.decoding.llamacpp import LlamaCppModel
    from multidraft.serve import ServedModel, TextCodec, run_server
    from multidraft.testing import tiny_gguf

    logging.basicConfig(level="WARNING")
    d = Path(tempfile.mkdtemp(prefix="serve_health_"))
    kw = dict(n_ctx=ctx, n_threads=1)
    target = LlamaCppModel(tiny_gguf(d / "t.gguf", seed=1), **kw)
    draft = LlamaCppModel(tiny_gguf(d / "d.gguf", seed=2), **kw)
    codec = TextCodec("llama.cpp", target, None, draft)
    if no_bound:
        codec.bound = None
    model = ServedModel(name="tiny", engine="llama.cpp", target=target, draft=draft, codec=codec,
                        settings=Settings.from_args(verifier="specinfer", k=2, depth=3), ignore_eos=True)
    return run_server(model, host="127.0.0.1", port=port, queue_size=64, shutdown_grace_s=1, log_level="warning",
                      max_lanes=2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ctx", type=int, default=4096, help="the served context in tokens (default 4096)")
    ap.add_argument("--no-bound", action="store_true", help="serve without the byte bound (tokenize every prompt)")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each phase (default 10)")
    ap.add_argument("--streams", type=int, default=2, help="concurrent streaming generations (default 2)")
    ap.add_argument("--prompt-mib", type=float, default=3.5, help="size of a big prompt in MiB (default 3.5)")
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between health probes (default 0.05)")
    _bench.common_args(ap, out=None)
    args = ap.parse_args()
    if args.serve is not None:
        return serve(args.serve, args.ctx, args.no_bound)
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--ctx", str(args.ctx)]
                             + (["--no-bound"] if args.no_bound else []))
    try:
        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if child.poll() is not None or time.monotonic() - t0 > 120:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        big = json.dumps({"model": "tiny", "prompt": "in the beginning " * int(args.prompt_mib * 2 ** 20 / 17),
                          "max_tokens": 1}).encode()
        context = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["context_length"]
        rows = [phase(url, name, args, big, context) for name in ("idle", "generate", "big", "both")]
    finally:
        child.terminate()
        child.wait(60)
    meta = {"script": "serve_health", "args": {k: str(v) for k, v in vars(args).items()}, **_bench.provenance(),
            "load_average_after": _bench.load_average()}
    print(f"{'phase':<10} {'probes':>6} {'median ms':>10} {'p99 ms':>8} {'max ms':>8} {'during big':>10} "
          f"{'big done':>8} {'streams done':>12}")
    for r in rows:
        print(f"{r['phase']:<10} {r['probes']:>6} {r['median_ms']:>10.1f} {r['p99_ms']:>8.1f} {r['max_ms']:>8.1f} "
              f"{r['during_big']:>10} {r['big_done']:>8} {r['streams_done']:>12}")
    if args.out:
        _bench.write_jsonl(args.out, meta, rows)
    return 0


def phase(url: str, name: str, args, big: bytes, context: int) -> dict:
    import httpx

    stop = threading.Event()
    in_big = threading.Event()
    counts = {"big": 0, "streams": 0, "big_status": set()}

    def big_loop():
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                in_big.set()
                r = c.post(url + "/v1/completions", content=big, headers={"content-type": "application/json"})
                in_big.clear()
                counts["big"] += 1
                counts["big_status"].add(r.status_code)

    def stream_loop():
        body = {"model": "tiny", "prompt": "in the beginning", "max_tokens": context - 32, "stream": True}
        with httpx.Client(timeout=600) as c:
            while not stop.is_set():
                with c.stream("POST", url + "/v1/completions", json=body) as r:
                    assert r.status_code == 200, r.read()
                    for _ in r.iter_lines():
                        if stop.is_set():
                            break
                counts["streams"] += 1

    workers = []
    if name in ("big", "both"):
        workers.append(threading.Thread(target=big_loop, daemon=True))
    if name in ("generate", "both"):
        workers += [threading.Thread(target=stream_loop, daemon=True) for _ in range(args.streams)]
    for w in workers:
        w.start()
    time.sleep(min(1.0, args.seconds / 5))  # let the load start
    lat, during = [], 0
    end = time.monotonic() + args.seconds
    probe = httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))  # a new connection a probe
    while time.monotonic() < end:
        busy = in_big.is_set()
        t = time.perf_counter()
        r = probe.get(url + "/health")
        lat.append(1e3 * (time.perf_counter() - t))
        assert r.status_code == 200, r.text
        during += busy and in_big.is_set()
        time.sleep(args.interval)
    probe.close()
    stop.set()
    for w in workers:
        w.join(120)
    lat.sort()
    return {"phase": name, "probes": len(lat), "median_ms": lat[len(lat) // 2],
            "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))], "max_ms": lat[-1], "during_big": during,
            "big_done": counts["big"], "big_status": sorted(counts["big_status"]), "streams_done": counts["streams"],
            "no_bound": args.no_bound}


if __name__ == "__main__":
    raise SystemExit(main())
