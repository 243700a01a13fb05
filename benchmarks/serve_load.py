"""Load test of ``multidraft serve`` against ``llama-server`` and against itself with speculation off.

Servers (``--servers``, comma separated; each started here as a subprocess on its own port,
run through every (temperature, concurrency) cell, then stopped with SIGTERM before the next
starts, so they never compete for the cores):

``ours``          ``multidraft serve`` with the speculative configuration of ``--serve-args``
                  (default: the llama.cpp engine, the default pair as ``serve`` picks it, specinfer
                  K = 2, depth 4)
``ours-nospec``   the same server with ``--verifier none`` (the target alone)
``llama-server``  llama.cpp's server on the same GGUF files with its own draft-model speculation
                  (``-md DRAFT --draft-max D``; ``--llama-args``), built by
                  ``LLAMA_TOOLS_TARGETS=llama-server scripts/build_llama_tools.sh`` from the
                  llama.cpp commit the Python binding vendors. Where the binary is missing the
                  column is skipped with a note saying how to build it.

Workload: ``--clients`` concurrent clients (default 1,4,8), each sending ``--requests`` requests
in turn, streamed, to ``/v1/chat/completions``: HumanEval and MT-bench prompts
(``multidraft.datasets.load_prompts``, alternating), ``max_tokens`` ``--max-tokens``, at each
temperature of ``--temperatures`` (default 0,1), each request with its own seed. Every
response is checked: a 200, a finish_reason, the final ``[DONE]``, the usage object, and, for
``ours``, the request's own seed echoed back (matched to its request, not mixed up). At T = 0,
and for ``ours`` at T = 1 too (a seed fixes the text), each response is compared with the
1-client response to the same request: ``mismatch`` counts the differing texts (0 expected
for ``ours``: one request is decoded at a time and a seed fixes its tokens; llama-server's
batched slots may differ by floating-point reduction order).

Printed per (server, temperature, clients): requests ok / sent, mismatches, p50 and p99
latency, p50 time to first token (streamed), aggregate completion tokens/s (all tokens over
the cell's wall time). ``--out FILE`` writes the rows as JSON; ``--markdown FILE`` the table.

Tiny run (what the shared 2-core machine allows; about 4 minutes):
    .venv/bin/python benchmarks/serve_load.py --clients 1,2 --requests 1 --max-tokens 16
Full run (issue 28):
    .venv/bin/python benchmarks/serve_load.py --clients 1,4,8 --requests 20 --max-tokens 128 \\
        --out docs/results/serve/load.json --markdown docs/results/serve/load.md
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA_SERVER = Path(os.environ.get("MULTIDRAFT_LLAMA_CACHE", Path.home() / ".cache/multidraft/llama.cpp")) \
    / "build-0.3.36/bin/llama-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(n: int) -> list[tuple[str, str]]:
    from multidraft.datasets import instruction_for, load_prompts

    half = (n + 1) // 2
    he = [(i, instruction_for("humaneval") + p) for i, p in load_prompts("humaneval", half)]
    mt = [(i, p) for i, p in load_prompts("mtbench", n - half)]
    out = []
    for a, b in zip(he, mt + [None] * (len(he) - len(mt))):
        out.append(a)
        if b is not None:
            out.append(b)
    return out[:n]


class Server:
    """A server subprocess; ``url`` once /health answers."""

    def __init__(self, name: str, cmd: list[str], port: int, health: str, log_path: Path):
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        import httpx

        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}; see {log_path}")
            try:
                if httpx.get(self.url + health, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > 900:
                raise RuntimeError(f"{name} did not start in 900 s; see {log_path}")
            time.sleep(0.5)
        self.model = httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.log.close()
        return rc


async def one_request(client, srv: Server, text: str, seed: int, args, temperature: float) -> dict:
    body = {"model": srv.model, "messages": [{"role": "user", "content": text}], "max_tokens": args.max_tokens,
            "temperature": temperature, "seed": seed, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    parts, finish, usage, echoed, done = [], None, None, None, False
    try:
        async with client.stream("POST", srv.url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return {"ok": False, "error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                ev = json.loads(data)
                if "error" in ev:
                    return {"ok": False, "error": json.dumps(ev["error"])[:200]}
                echoed = ev.get("seed", echoed)
                if ev.get("usage"):
                    usage = ev["usage"]
                for ch in ev.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content")
                    if piece:
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                        parts.append(piece)
                    finish = ch.get("finish_reason") or finish
    except Exception as exc:  # a lost or cut-off response is a failure of the cell, counted
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    latency = time.perf_counter() - t0
    problems = []
    if not done:
        problems.append("no [DONE]")
    if finish is None:
        problems.append("no finish_reason")
    if usage is None:
        problems.append("no usage")
    if srv.name.startswith("ours") and echoed != seed:
        problems.append(f"seed {echoed} echoed for request seed {seed}")
    return {"ok": not problems, "error": "; ".join(problems) or None, "text": "".join(parts), "finish": finish,
            "tokens": (usage or {}).get("completion_tokens", 0), "latency": latency,
            "ttft": ttft if ttft is not None else latency}


async def run_cell(srv: Server, work: list, clients: int, args, temperature: float) -> tuple[list, float]:
    import httpx

    limits = httpx.Limits(max_connections=clients + 2)
    results: list = [None] * (clients * args.requests)

    async def client_loop(c, client):
        for j in range(args.requests):
            k = c * args.requests + j
            text, seed = work[k % len(work)]
            results[k] = await one_request(client, srv, text, seed + k // len(work), args, temperature)

    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop(c, client) for c in range(clients)))
        wall = time.perf_counter() - t0
    return results, wall


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", default="ours,ours-nospec,llama-server")
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--requests", type=int, default=20, help="requests per client per cell")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a request may take")
    ap.add_argument("--serve-args", default="--engine llama.cpp --verifier specinfer --k 2 --depth 4",
                    help="arguments of `multidraft serve` for 'ours' (quoted)")
    ap.add_argument("--llama-server", default=str(LLAMA_SERVER), help="the llama-server binary")
    ap.add_argument("--llama-args", default="--draft-max 4 --draft-min 0 -c 16384",
                    help="extra llama-server arguments (its draft-model speculation; -c is shared by the -np slots, one per client)")
    ap.add_argument("--threads", type=int, default=None, help="threads of every server (default: all cores)")
    ap.add_argument("--logs", default="/tmp/serve_load_logs", help="directory of the servers' logs")
    ap.add_argument("--out", default=None)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args(argv)
    # SIGTERM (a timeout, a job manager) unwinds like Ctrl-C: the running server is stopped too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    clients = [int(c) for c in args.clients.split(",")]
    temps = [float(t) for t in args.temperatures.split(",")]
    if clients[0] != 1:
        clients = [1] + [c for c in clients if c != 1]  # the 1-client run is every comparison's reference
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    n_work = max(clients) * args.requests
    work = [(text, args.seed * 100_003 + i) for i, (_, text) in enumerate(prompts(n_work))]
    threads = [] if args.threads is None else ["--threads", str(args.threads)]
    notes, rows = [], []
    for name in servers:
        port = free_port()
        if name in ("ours", "ours-nospec"):
            extra = shlex.split(args.serve_args)
            if name == "ours-nospec":
                extra = _without_spec(extra)
            cmd = [sys.executable, "-m", "multidraft", "serve", *extra, *threads, "--port", str(port),
                   "--queue-size", str(max(clients) * 2), "--log-level", "warning"]
            health = "/health"
        elif name == "llama-server":
            binary = Path(args.llama_server)
            if not binary.is_file():
                notes.append(f"llama-server skipped: no binary at {binary}; build it with "
                             f"LLAMA_TOOLS_TARGETS=llama-server scripts/build_llama_tools.sh (about 10 minutes on 2 "
                             f"cores) or pass --llama-server PATH")
                print(notes[-1], file=sys.stderr)
                continue
            from multidraft.models import default_gguf

            t = default_gguf("target", "bf16")
            d = default_gguf("draft", "q4_0")
            t = t if t.is_file() else default_gguf("target")
            d = d if d.is_file() else default_gguf("draft")
            cmd = [str(binary), "-m", str(t), "-md", str(d), "--host", "127.0.0.1", "--port", str(port),
                   "-np", str(max(clients)), *shlex.split(args.llama_args), *(["-t", str(args.threads)] if args.threads else [])]
            health = "/health"
        else:
            raise SystemExit(f"--servers: unknown server {name!r} (ours, ours-nospec, llama-server)")
        print(f"starting {name}: {' '.join(cmd)}", file=sys.stderr)
        srv = Server(name, cmd, port, health, logs / f"{name}.log")
        try:
            # one untimed request first: the weights paged in, the first-call costs paid
            asyncio.run(run_cell(srv, work[:1], 1, argparse.Namespace(**{**vars(args), "requests": 1,
                                                                        "max_tokens": 2}), 0.0))
            for temp in temps:
                ref: dict[int, str] = {}
                for c in clients:
                    res, wall = asyncio.run(run_cell(srv, work, c, args, temp))
                    good = [r for r in res if r and r["ok"]]
                    mismatch = 0
                    for k, r in enumerate(res):
                        if not (r and r["ok"]):
                            continue
                        if c == 1:
                            ref[k] = r["text"]
                        elif k in ref and (temp == 0 or name.startswith("ours")) and r["text"] != ref[k]:
                            mismatch += 1
                    toks = sum(r["tokens"] for r in good)
                    row = dict(server=name, temperature=temp, clients=c, sent=len(res), ok=len(good),
                               mismatch=mismatch, p50_latency_s=pct([r["latency"] for r in good], 50),
                               p99_latency_s=pct([r["latency"] for r in good], 99),
                               p50_ttft_s=pct([r["ttft"] for r in good], 50), tokens=toks, wall_s=wall,
                               tokens_per_s=toks / wall if wall > 0 else float("nan"),
                               errors=sorted({r["error"] for r in res if r and not r["ok"]})[:3])
                    rows.append(row)
                    print(_line(row), file=sys.stderr, flush=True)
        finally:
            rc = srv.stop()
            if rc != 0:
                notes.append(f"{name} exited with {rc} on SIGTERM (see {logs / (name + '.log')})")
    table = _markdown(rows, notes, args)
    print(table)
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows, "notes": notes,
                                              "loadavg": os.getloadavg()}, indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    bad = [r for r in rows if r["ok"] < r["sent"] or (r["server"].startswith("ours") and r["mismatch"])]
    return 1 if bad else 0


def _without_spec(extra: list[str]) -> list[str]:
    """``--serve-args`` with the speculative flags replaced by ``--verifier none``."""
    drop_value = {"--verifier", "--k", "--depth", "--tree", "--draft-law", "--draft-temperature", "--max-nodes",
                  "--max-depth", "--k-max", "--min-gain", "--profile", "--accept-stats", "--draft", "--draft-ftype"}
    out, skip = [], False
    for a in extra:
        if skip:
            skip = False
            continue
        key = a.split("=", 1)[0]
        if key in drop_value:
            skip = "=" not in a
            continue
        if key == "--force-tree":
            continue
        out.append(a)
    return out + ["--verifier", "none"]


def _line(r: dict) -> str:
    return (f"{r['server']:>13} T={r['temperature']:g} clients={r['clients']}: {r['ok']}/{r['sent']} ok, "
            f"{r['mismatch']} mismatched, p50 {r['p50_latency_s']:.2f} s, p99 {r['p99_latency_s']:.2f} s, "
            f"TTFT p50 {r['p50_ttft_s']:.2f} s, {r['tokens_per_s']:.2f} tok/s"
            + (f"  errors: {r['errors']}" if r["errors"] else ""))


def _markdown(rows, notes, args) -> str:
    out = [f"serve_load: {args.requests} requests per client, max_tokens {args.max_tokens}, "
           f"serve args `{args.serve_args}`, llama-server args `{args.llama_args}`", "",
           "| server | T | clients | ok/sent | mismatched | p50 latency s | p99 latency s | p50 TTFT s | tokens/s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['server']} | {r['temperature']:g} | {r['clients']} | {r['ok']}/{r['sent']} | {r['mismatch']} | "
                   f"{r['p50_latency_s']:.2f} | {r['p99_latency_s']:.2f} | {r['p50_ttft_s']:.2f} | "
                   f"{r['tokens_per_s']:.2f} |")
    out += [""] + [f"- {n}" for n in notes]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
